//! serde's messages in an operator's words: the Rust type names serde says it expected become
//! what an operator writes (a whole number, a list, a table), and a value of the wrong type is
//! told as `expected WHAT, got WHAT WAS WRITTEN` ([`misfit`]), and an unknown key with the known
//! key nearest to it, when it is near enough to be a misspelling (`did you mean`).

/// serde's names of the types it expected, and an operator's words for them.
const WORDS: &[(&str, &str)] = &[
    ("u8", "a whole number from 0 to 255"),
    ("u16", "a whole number from 0 to 65535"),
    ("u32", "a whole number from 0 to 4294967295"),
    ("u64", "a whole number ≥ 0"),
    ("usize", "a whole number ≥ 0"),
    ("u128", "a whole number ≥ 0"),
    ("i8", "a whole number from -128 to 127"),
    ("i16", "a whole number from -32768 to 32767"),
    ("i32", "a whole number from -2147483648 to 2147483647"),
    ("i64", "a whole number"),
    ("i128", "a whole number"),
    ("f32", "a number"),
    ("f64", "a number"),
    ("a sequence", "a list"),
    ("a map", "a table (key: value)"),
    ("a boolean", "true or false"),
];

/// serde's message in an operator's words: no Rust type names.
pub fn plain_words(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("expected ") {
        let (before, after) = rest.split_at(at + "expected ".len());
        out.push_str(before);
        rest = after;
        if let Some((rust, plain)) = WORDS.iter().find(|(rust, _)| starts_with_word(after, rust)) {
            out.push_str(plain);
            rest = &after[rust.len()..];
        } else if let Some((kind, name)) = ["struct ", "enum "]
            .iter()
            .find_map(|kind| after.strip_prefix(kind).map(|name| (*kind, name)))
        {
            let end = name
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(name.len());
            out.push_str(if kind == "struct " {
                "a table (key: value)"
            } else {
                "one of the documented values"
            });
            rest = &name[end..];
        }
    }
    out.push_str(rest);
    out.replace("invalid type: sequence", "invalid type: list")
        .replace("invalid type: map", "invalid type: table")
}

/// `text` starts with the whole word `word`.
fn starts_with_word(text: &str, word: &str) -> bool {
    text.strip_prefix(word)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

/// A misfit (a value of the wrong type, a key a table refuses, a key missing) as a problem: its
/// YAML path and what is wrong, in an operator's words.
pub fn misfit(error: &serde_path_to_error::Error<serde_yaml::Error>) -> (String, String) {
    let path = yaml_path(error.path());
    let inner = error.inner();
    let mut message = inner.to_string();
    // serde_yaml's own text: `PATH: MESSAGE at line L column C`, its path the misfit's or,
    // for a key a table refuses, the table's.
    if let Some(rest) = ancestors(&path).find_map(|at| message.strip_prefix(&format!("{at}: "))) {
        message = rest.to_string();
    }
    if let Some(location) = inner.location() {
        let suffix = format!(" at line {} column {}", location.line(), location.column());
        if let Some(rest) = message.strip_suffix(&suffix) {
            message = rest.to_string();
        }
    }
    let key = |text: &str| text.split('`').nth(1).unwrap_or_default().to_string();
    // The key's own path: the misfit's, or below it when the path stops at its table.
    let below = |key: String| {
        if path == key || path.ends_with(&format!(".{key}")) {
            path.clone()
        } else if path.is_empty() {
            key
        } else {
            format!("{path}.{key}")
        }
    };
    if message.starts_with("unknown field") {
        return (below(key(&message)), unknown_key(&message));
    }
    if message.starts_with("missing field") {
        return (below(key(&message)), "required".to_string());
    }
    if message.starts_with("duplicate field") {
        return (below(key(&message)), "written twice".to_string());
    }
    (path, type_error(&message))
}

/// `path` and the paths above it, nearest first (`a.b[0]`, `a.b`, `a`); none for the root.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let cuts = path.rmatch_indices(['.', '[']).map(|(at, _)| at);
    std::iter::once(path.len())
        .chain(cuts)
        .map(move |end| &path[..end])
        .filter(|at| !at.is_empty())
}

/// serde's `unknown field `KEY`, expected one of `A`, `B`` (or `expected `A``, or `there are
/// no fields`) as `unknown key`, with the known key nearest to `KEY` when there is one.
fn unknown_key(message: &str) -> String {
    // The quoted names: the unknown key first, then the keys its table knows.
    let mut quoted = message.split('`').skip(1).step_by(2);
    let unknown = quoted.next().unwrap_or_default();
    match nearest(unknown, quoted) {
        Some(known) => format!("unknown key: did you mean `{known}`?"),
        None => "unknown key".to_string(),
    }
}

/// The name of `known` nearest to `unknown` (Damerau-Levenshtein), if it is at most a third of
/// `unknown`'s characters (at least one) away: a misspelling, not another word. The first
/// listed wins a tie.
pub fn nearest<'a>(unknown: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let most = (unknown.chars().count() / 3).max(1);
    let mut best: Option<(usize, &str)> = None;
    for name in known {
        let distance = strsim::damerau_levenshtein(unknown, name);
        if distance <= most && best.is_none_or(|(least, _)| distance < least) {
            best = Some((distance, name));
        }
    }
    best.map(|(_, name)| name)
}

/// The path of a misfit as the rest of the configuration's problems write it
/// (`routes[0].limits[1].rate`).
fn yaml_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } if out.is_empty() => out.push_str(key),
            Segment::Map { key } => {
                out.push('.');
                out.push_str(key);
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    out
}

/// serde's `invalid type: FOUND, expected WHAT` (or `invalid value: ...`) as `expected WHAT,
/// got FOUND` in plain words; other messages in plain words as they are.
fn type_error(message: &str) -> String {
    if message.starts_with("data did not match any variant of untagged enum OneOrMany") {
        return "expected a string or a list of strings".to_string();
    }
    let invalid = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "));
    let Some((found, expected)) = invalid.and_then(|rest| rest.split_once(", expected ")) else {
        return plain_words(message);
    };
    let expected = plain_words(&format!("expected {expected}"));
    match found_in_words(found) {
        None => format!("is empty, {expected}"),
        Some(found) => format!("{expected}, got {found}"),
    }
}

/// What serde says was written, as an operator wrote it; `None` for nothing at all.
fn found_in_words(found: &str) -> Option<String> {
    let quoted = |prefix: &str| {
        found
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('`'))
            .and_then(|rest| rest.split('`').next())
            .map(str::to_string)
    };
    if found == "unit value" {
        return None;
    }
    if let Some(number) = quoted("integer ") {
        let too_large = found.ends_with("as u128") || found.ends_with("as i128");
        return Some(if too_large {
            format!("{number} (too large)")
        } else {
            number
        });
    }
    if let Some(number) = quoted("floating point ") {
        return Some(format!("{number} (a decimal)"));
    }
    if let Some(value) = quoted("boolean ") {
        return Some(value);
    }
    Some(match found {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        other => other.strip_prefix("string ").unwrap_or(other).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_type_names_become_plain_words() {
        assert_eq!(
            plain_words("redis.timeout_ms: invalid type: string \"fast\", expected u64 at line 4 column 15"),
            "redis.timeout_ms: invalid type: string \"fast\", expected a whole number ≥ 0 at line 4 column 15"
        );
        assert_eq!(
            plain_words("ipv6_prefix: invalid value: integer `300`, expected u8 at line 1 column 14"),
            "ipv6_prefix: invalid value: integer `300`, expected a whole number from 0 to 255 at line 1 column 14"
        );
        assert_eq!(
            plain_words("routes[0].upstream: invalid type: sequence, expected struct RawUpstream at line 3 column 5"),
            "routes[0].upstream: invalid type: list, expected a table (key: value) at line 3 column 5"
        );
        assert_eq!(
            plain_words(
                "listen: invalid type: integer `5`, expected a sequence at line 1 column 9"
            ),
            "listen: invalid type: integer `5`, expected a list at line 1 column 9"
        );
    }

    /// The misfit serde reports reading `text` as a `T`.
    fn misfit_of<T: serde::de::DeserializeOwned + std::fmt::Debug>(text: &str) -> (String, String) {
        let deserializer = serde_yaml::Deserializer::from_str(text);
        let error = serde_path_to_error::deserialize::<_, T>(deserializer).expect_err("a misfit");
        misfit(&error)
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Shape {
        count: Option<u64>,
        small: Option<u8>,
        name: Option<String>,
        list: Option<Vec<String>>,
        on: Option<bool>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Strict {
        known: Option<u64>,
    }

    #[test]
    fn misfits_say_what_was_expected_and_what_was_written() {
        for (text, path, message) in [
            ("count: -1", "count", "expected a whole number ≥ 0, got -1"),
            (
                "count: 1.5",
                "count",
                "expected a whole number ≥ 0, got 1.5 (a decimal)",
            ),
            (
                "count: fast",
                "count",
                "expected a whole number ≥ 0, got \"fast\"",
            ),
            (
                "count: 99999999999999999999",
                "count",
                "expected a whole number ≥ 0, got 99999999999999999999 (too large)",
            ),
            (
                "count: [1]",
                "count",
                "expected a whole number ≥ 0, got a list",
            ),
            (
                "small: 300",
                "small",
                "expected a whole number from 0 to 255, got 300",
            ),
            ("name: [a]", "name", "expected a string, got a list"),
            ("list: 5", "list", "expected a list, got 5"),
            ("on: maybe", "on", "expected true or false, got \"maybe\""),
            ("list: [a, [b]]", "list[1]", "expected a string, got a list"),
        ] {
            assert_eq!(
                misfit_of::<Shape>(text),
                (path.to_string(), message.to_string()),
                "{text}"
            );
        }
        assert_eq!(
            misfit_of::<Strict>("known: 1\nknwon: 2"),
            (
                "knwon".to_string(),
                "unknown key: did you mean `known`?".to_string()
            )
        );
        assert_eq!(
            misfit_of::<Strict>("known: 1\nother: 2"),
            ("other".to_string(), "unknown key".to_string())
        );
    }

    #[test]
    fn the_nearest_known_key_is_suggested_only_when_near_enough() {
        let known = ["algorithm", "access_log", "rate", "burst", "max_delay"];
        assert_eq!(nearest("algoritm", known), Some("algorithm"));
        assert_eq!(nearest("acess_log", known), Some("access_log"));
        assert_eq!(nearest("brust", known), Some("burst"), "a swap is one edit");
        assert_eq!(nearest("rte", known), Some("rate"));
        assert_eq!(nearest("colour", known), None);
        assert_eq!(nearest("ab", known), None, "a short key needs a near name");
        assert_eq!(
            unknown_key("unknown field `algoritm`, expected one of `name`, `algorithm`, `rate`"),
            "unknown key: did you mean `algorithm`?"
        );
        assert_eq!(
            unknown_key("unknown field `lsten`, expected `listen`"),
            "unknown key: did you mean `listen`?"
        );
        assert_eq!(
            unknown_key("unknown field `x`, there are no fields"),
            "unknown key"
        );
    }
}
