//! serde's messages in an operator's words: the Rust type names serde says it expected become
//! what an operator writes (a whole number, a list, a table).

/// serde's names of the types it expected, and an operator's words for them.
const WORDS: &[(&str, &str)] = &[
    ("u8", "a whole number from 0 to 255"),
    ("u16", "a whole number from 0 to 65535"),
    ("u32", "a whole number from 0 to 4294967295"),
    ("u64", "a whole number from 0 to 18446744073709551615"),
    ("usize", "a whole number from 0 to 18446744073709551615"),
    ("u128", "a whole number, 0 or more"),
    ("i8", "a whole number from -128 to 127"),
    ("i16", "a whole number from -32768 to 32767"),
    ("i32", "a whole number from -2147483648 to 2147483647"),
    (
        "i64",
        "a whole number from -9223372036854775808 to 9223372036854775807",
    ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_type_names_become_plain_words() {
        assert_eq!(
            plain_words("redis.timeout_ms: invalid type: string \"fast\", expected u64 at line 4 column 15"),
            "redis.timeout_ms: invalid type: string \"fast\", expected a whole number from 0 to 18446744073709551615 at line 4 column 15"
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
}
