//! The bearer token of a request: `Authorization: Bearer <token>` (RFC 6750), read in place.

/// The longest token accepted; a longer one is refused before any decoding.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Why the `Authorization` header gives no usable bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BearerProblem {
    /// More than one `Authorization` header.
    Repeated,
    /// Another scheme (`Basic ...`): not a bearer credential at all.
    OtherScheme,
    /// `Bearer` with no token after it.
    NoToken,
    /// Longer than [`MAX_TOKEN_BYTES`].
    TooLong,
    /// Bytes a token cannot hold (RFC 6750 `b64token`).
    Invalid,
}

impl BearerProblem {
    pub fn label(self) -> &'static str {
        match self {
            BearerProblem::Repeated => "repeated_authorization",
            BearerProblem::OtherScheme => "other_scheme",
            BearerProblem::NoToken => "no_token",
            BearerProblem::TooLong => "token_too_long",
            BearerProblem::Invalid => "malformed",
        }
    }

    pub fn detail(self) -> &'static str {
        match self {
            BearerProblem::Repeated => "more than one Authorization header",
            BearerProblem::OtherScheme => {
                "the Authorization header carries another scheme than Bearer"
            }
            BearerProblem::NoToken => "the Authorization header has no token after Bearer",
            BearerProblem::TooLong => "the bearer token is too long",
            BearerProblem::Invalid => "the bearer token holds characters a token cannot",
        }
    }
}

/// The token of the request's `Authorization` header values (`values` yields each header's
/// bytes): `Ok(None)` without the header, the token when it is one `Bearer` header.
pub fn bearer_token<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<&'a str>, BearerProblem> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(BearerProblem::Repeated);
    }
    let value = trim(value);
    let scheme_end = value.iter().position(|b| *b == b' ').unwrap_or(value.len());
    if !value[..scheme_end].eq_ignore_ascii_case(b"bearer") {
        return Err(BearerProblem::OtherScheme);
    }
    let token = trim(&value[scheme_end..]);
    if token.is_empty() {
        return Err(BearerProblem::NoToken);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(BearerProblem::TooLong);
    }
    if !token.iter().all(|b| is_token_byte(*b)) {
        return Err(BearerProblem::Invalid);
    }
    std::str::from_utf8(token)
        .map_err(|_| BearerProblem::Invalid)
        .map(Some)
}

/// RFC 6750 `b64token`: `ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/"`, then `=`s.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = bytes.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(start), Some(end)) => &bytes[start..=end],
        _ => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(values: &[&str]) -> Result<Option<&'static str>, BearerProblem> {
        let leaked: &'static [&'static [u8]] = Box::leak(
            values
                .iter()
                .map(|v| &*Box::leak(v.as_bytes().to_vec().into_boxed_slice()))
                .collect::<Vec<&[u8]>>()
                .into_boxed_slice(),
        );
        bearer_token(leaked.iter().copied())
    }

    #[test]
    fn the_scheme_is_case_insensitive_and_the_token_is_read_in_place() {
        assert_eq!(token(&["Bearer a.b.c"]), Ok(Some("a.b.c")));
        assert_eq!(token(&["bEaReR   a.b-_c  "]), Ok(Some("a.b-_c")));
        assert_eq!(token(&[]), Ok(None));
    }

    #[test]
    fn a_repeated_header_another_scheme_or_an_oversized_token_are_refused() {
        assert_eq!(
            token(&["Bearer a.b.c", "Bearer d.e.f"]),
            Err(BearerProblem::Repeated)
        );
        assert_eq!(
            token(&["Basic dXNlcjpwdw=="]),
            Err(BearerProblem::OtherScheme)
        );
        assert_eq!(token(&["Bearer"]), Err(BearerProblem::NoToken));
        assert_eq!(token(&["Bearer   "]), Err(BearerProblem::NoToken));
        assert_eq!(token(&["Bearertoken"]), Err(BearerProblem::OtherScheme));
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert_eq!(token(&[&long]), Err(BearerProblem::TooLong));
        let longest = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES));
        assert!(token(&[&longest]).is_ok());
        assert_eq!(token(&["Bearer a b"]), Err(BearerProblem::Invalid));
        assert_eq!(token(&["Bearer a\"b"]), Err(BearerProblem::Invalid));
    }
}
