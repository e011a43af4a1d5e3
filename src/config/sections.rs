//! Reading a file whose YAML has a type error (`listen: 5`, `rate: [1]`) section by section, so
//! that one bad section does not hide the others.
//!
//! serde stops at the first type error. When it does, each top-level section (and each item of
//! `routes:`) is read alone, from the original text with every other section blanked out: the
//! errors keep their YAML path and their line. What reads is kept and compiled; what does not
//! is reported. A file that is not a plain block mapping (flow style at the top) is reported with
//! the first error only.

use super::problem::Problems;
use super::raw::RawConfig;

/// A top-level section: the lines `start..end` of the file, and its key.
struct Section<'a> {
    key: &'a str,
    start: usize,
    end: usize,
}

/// The text of every section that reads (the others blanked), and the positions in `routes:`
/// of the routes kept when some did not read; each section or route that does not read is added
/// to `p` with its path and line. `None` when the file cannot be split into sections.
pub fn read_by_section(text: &str, p: &mut Problems) -> Option<(String, Option<Vec<usize>>)> {
    let lines: Vec<&str> = text.lines().collect();
    let sections = split(&lines)?;
    let mut kept = vec![false; lines.len()];
    let mut route_positions = None;
    for section in &sections {
        let alone = only(&lines, section.start..section.end, None);
        match serde_yaml::from_str::<RawConfig>(&alone) {
            Ok(_) => kept[section.start..section.end].fill(true),
            Err(e) => match (section.key == "routes")
                .then(|| read_routes(&lines, section))
                .flatten()
            {
                Some(RoutesRead {
                    positions,
                    items,
                    errors,
                }) if !errors.is_empty() => {
                    kept[section.start] = true;
                    for item in items {
                        kept[item].fill(true);
                    }
                    for error in errors {
                        p.add("", error);
                    }
                    route_positions = Some(positions);
                }
                _ => p.add("", super::wording::plain_words(&e.to_string())),
            },
        }
    }
    Some((only(&lines, 0..0, Some(&kept)), route_positions))
}

/// The top-level sections: each starts at a line in column 0 holding `key:`.
fn split<'a>(lines: &[&'a str]) -> Option<Vec<Section<'a>>> {
    let mut sections: Vec<Section<'a>> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let first = line.chars().next();
        if line.trim().is_empty() || first == Some('#') || first.is_some_and(char::is_whitespace) {
            continue;
        }
        if *line == "---" && sections.is_empty() {
            continue;
        }
        let (key, _) = line.split_once(':')?;
        if key.starts_with(['{', '[', '-', '"', '\'']) {
            return None;
        }
        if let Some(last) = sections.last_mut() {
            last.end = i;
        }
        sections.push(Section {
            key: key.trim(),
            start: i,
            end: lines.len(),
        });
    }
    Some(sections)
}

/// The text with only the lines of `range` (or those marked in `kept`), the others blank so
/// that line numbers stay those of the file.
fn only(lines: &[&str], range: std::ops::Range<usize>, kept: Option<&[bool]>) -> String {
    let mut text = String::new();
    for (i, line) in lines.iter().enumerate() {
        let keep = kept.map_or(range.contains(&i), |kept| kept[i]);
        if keep {
            text.push_str(line);
        }
        text.push('\n');
    }
    text
}

/// The items of `routes:`, each read alone.
struct RoutesRead {
    /// The index of each route that reads...
    positions: Vec<usize>,
    /// ...its lines...
    items: Vec<std::ops::Range<usize>>,
    /// ...and what is wrong with each of the others, with its own index.
    errors: Vec<String>,
}

/// Each item of a block-style `routes:` read alone; `None` when the items cannot be told apart.
fn read_routes(lines: &[&str], section: &Section<'_>) -> Option<RoutesRead> {
    let mut errors = Vec::new();
    let body = section.start + 1..section.end;
    let indent = body.clone().find_map(|i| {
        let trimmed = lines[i].trim_start();
        (trimmed.starts_with('-')).then(|| lines[i].len() - trimmed.len())
    })?;
    let starts: Vec<usize> = body
        .clone()
        .filter(|&i| {
            let line = lines[i];
            line.len() > indent
                && line[..indent].trim().is_empty()
                && line[indent..].starts_with('-')
        })
        .collect();
    let mut positions = Vec::new();
    let mut items = Vec::new();
    for (index, &start) in starts.iter().enumerate() {
        let end = starts.get(index + 1).copied().unwrap_or(body.end);
        let mut kept = vec![false; lines.len()];
        kept[section.start] = true;
        kept[start..end].fill(true);
        match serde_yaml::from_str::<RawConfig>(&only(lines, 0..0, Some(&kept))) {
            Ok(_) => {
                positions.push(index);
                items.push(start..end);
            }
            Err(e) => {
                let message = super::wording::plain_words(&e.to_string());
                let message = match message.strip_prefix("routes[0]") {
                    Some(rest) => format!("routes[{index}]{rest}"),
                    None => format!("routes[{index}]: {message}"),
                };
                errors.push(message);
            }
        }
    }
    Some(RoutesRead {
        positions,
        items,
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bad_section_and_route_is_reported_and_the_rest_is_read() {
        let text = "listen: 5\nadmin:\n  listen: 127.0.0.1:9\nroutes:\n  - name: a\n    limits: [{ rate: [1] }]\n  - name: b\n    upstream: { servers: [127.0.0.1:1] }\nipv6_prefix: 300\n";
        let mut p = Problems::default();
        let (merged, positions) = read_by_section(text, &mut p).expect("block mapping");
        assert_eq!(positions, Some(vec![1]));
        let raw: RawConfig = serde_yaml::from_str(&merged).expect("what is kept reads");
        assert_eq!(raw.routes.len(), 1);
        assert_eq!(raw.routes[0].name.as_deref(), Some("b"));
        assert!(raw.admin.is_some() && raw.listen.is_empty());
    }
}
