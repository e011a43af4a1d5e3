//! The dashboard's HTML, written by hand: escaping, the page around each view (the navigation,
//! the stylesheet and the script, all served from the binary), tables.

use std::fmt::Write;

/// `text` safe inside HTML text and double-quoted attributes, with its bidirectional controls
/// neutralised: each is written as visible text (`[U+202E]`), so a consumer id or a key can
/// neither reorder what follows it on the page nor pass for another name.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if is_bidi_control(c) => {
                let _ = write!(out, "[U+{:04X}]", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// The characters that change the direction of the text around them: the Arabic letter mark,
/// the left-to-right and right-to-left marks, embeddings, overrides and isolates (Unicode
/// bidirectional algorithm, UAX #9).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// The views, in the navigation's order: path and title.
pub const VIEWS: [(&str, &str); 5] = [
    ("/ui/", "Overview"),
    ("/ui/routes", "Routes"),
    ("/ui/live", "Live decisions"),
    ("/ui/top", "Most limited"),
    ("/ui/explain", "Explain"),
];

/// A whole page: `title`, the navigation with `active` marked, and `body`.
pub fn page(title: &str, active: &str, body: &str) -> String {
    let mut nav = String::new();
    for (path, name) in VIEWS {
        let current = if path == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{path}\"{current}>{name}</a>");
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · sluice</title>\
         <link rel=\"icon\" href=\"/ui/favicon.svg\" type=\"image/svg+xml\">\
         <link rel=\"stylesheet\" href=\"/ui/style.css\">\
         <script src=\"/ui/app.js\" defer></script></head>\
         <body><header><span class=\"brand\">sluice</span><nav>{nav}</nav></header>\
         <main><h1>{title}</h1>{body}</main>\
         <footer>Read-only: nothing on these pages changes the gateway.</footer></body></html>\n",
        title = esc(title)
    )
}

/// A table of `head` and `rows` (cells already HTML).
pub fn table(head: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = String::from("<table><thead><tr>");
    for cell in head {
        let _ = write!(out, "<th>{}</th>", esc(cell));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A definition list of `(term, description)`, descriptions already HTML.
pub fn facts(pairs: &[(&str, String)]) -> String {
    let mut out = String::from("<dl>");
    for (term, description) in pairs {
        let _ = write!(out, "<dt>{}</dt><dd>{description}</dd>", esc(term));
    }
    out.push_str("</dl>");
    out
}

/// The classes of a bar's parts, bottom to top: allowed, limited, answered by the failure mode.
const BAR_PARTS: [&str; 3] = ["allowed", "limited", "failure"];

/// Per-second stacked bars of `values` (oldest first; each second allowed, limited and
/// answered by the failure mode) as an inline SVG, scaled to the largest second.
pub fn bars(values: &[[u64; 3]], class: &str) -> String {
    let top = values
        .iter()
        .map(|v| v.iter().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut out = format!(
        "<svg class=\"bars {class}\" viewBox=\"0 0 {} 30\" preserveAspectRatio=\"none\" role=\"img\" aria-label=\"per second\">",
        values.len().max(1)
    );
    for (x, second) in values.iter().enumerate() {
        let mut bottom = 30.0;
        for (i, part) in BAR_PARTS.iter().enumerate() {
            let height = match second[i] {
                0 => continue,
                n => (n as f64 * 30.0 / top as f64).max(1.0),
            };
            bottom -= height;
            let _ = write!(
                out,
                "<rect class=\"{part}\" x=\"{x}\" y=\"{bottom:.2}\" width=\"1\" height=\"{height:.2}\"/>"
            );
        }
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_are_shown_not_obeyed() {
        let id = "evil\u{202E}gpj.exe";
        assert_eq!(esc(id), "evil[U+202E]gpj.exe");
        let every = "\u{061C}\u{200E}\u{200F}\u{202A}\u{202B}\u{202C}\u{202D}\u{202E}\u{2066}\u{2067}\u{2068}\u{2069}";
        let shown = esc(every);
        assert!(shown.chars().all(|c| c.is_ascii_graphic()), "{shown}");
        assert_eq!(shown.matches("[U+").count(), 12, "{shown}");
        assert_eq!(
            esc("<a href=\"x\">é</a>"),
            "&lt;a href=&quot;x&quot;&gt;é&lt;/a&gt;"
        );
    }

    #[test]
    fn a_seconds_bar_stacks_allowed_limited_and_the_failure_modes_answers() {
        let svg = bars(&[[2, 1, 3], [0, 0, 0]], "");
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}");
        for (part, y, height) in [
            ("allowed", "20.00", "10.00"),
            ("limited", "15.00", "5.00"),
            ("failure", "0.00", "15.00"),
        ] {
            let rect =
                format!("class=\"{part}\" x=\"0\" y=\"{y}\" width=\"1\" height=\"{height}\"");
            assert!(svg.contains(&rect), "{part}: {svg}");
        }
    }
}
