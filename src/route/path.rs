//! Request paths as decided on: one spelling per resource.
//!
//! Routes match and keys hash the *normalized* path, and the upstream receives that same path, so
//! a resource can never be reached under two keys by spelling its path differently:
//! * percent-escapes of unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, other escapes
//!   are kept with uppercase hex; a malformed escape is a `400`;
//! * duplicate slashes are collapsed and `.` / `..` segments resolved (never above the root;
//!   `%2E%2E` is decoded first, so it cannot hide a `..`);
//! * an encoded slash `%2F`, backslash `%5C` or NUL `%00` is rejected with `400` (default), or
//!   with `path.encoded_slash: keep` kept opaque: `%2F` stays `%2F`, never becomes a separator;
//! * forms that backends resolve as traversal where sluice sees none are refused with `400`, as
//!   the hardening guides of nginx and Envoy advise: a backslash (a separator to IIS and other
//!   Windows servers: `/api\..\admin`), and a dot segment with parameters (`/api/..;/admin`:
//!   Tomcat and other servlet containers drop `;...` from each segment before they resolve dot
//!   segments, so the upstream would serve `/admin` under the `/api` route's limits).
//!
//! The query string is not touched.

use std::borrow::Cow;

/// How encoded slashes and NULs are treated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathRules {
    pub keep_encoded_slash: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("The request path must start with '/'.")]
    NotAbsolute,
    #[error("The request path has a malformed percent-escape.")]
    BadEscape,
    #[error(
        "The request path has an encoded slash, backslash or NUL, which this gateway refuses."
    )]
    EncodedSeparator,
    #[error("The request path has a backslash, which some servers read as a separator.")]
    Backslash,
    #[error("The request path has a dot segment with parameters (..;), which servlet containers resolve as a dot segment.")]
    DotSegmentParameters,
}

impl PathError {
    /// The problem detail sent to the client.
    pub fn detail(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "The request path must start with '/'.",
            PathError::BadEscape => "The request path has a malformed percent-escape.",
            PathError::EncodedSeparator => {
                "The request path has an encoded slash, backslash or NUL, which this gateway refuses."
            }
            PathError::Backslash => {
                "The request path has a backslash, which some servers read as a separator."
            }
            PathError::DotSegmentParameters => {
                "The request path has a dot segment with parameters (..;), which servlet containers resolve as a dot segment."
            }
        }
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes unreserved escapes and uppercases the others.
fn decode_unreserved(path: &str, policy: PathRules) -> Result<String, PathError> {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let bytes = path.as_bytes();
    let mut out = String::with_capacity(path.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            // Everything up to the next escape is copied as it is: its bytes, not a Latin-1
            // reading of them.
            let run = path[i..].find('%').map_or(path.len(), |at| i + at);
            out.push_str(&path[i..run]);
            i = run;
            continue;
        }
        let (Some(&hi), Some(&lo)) = (bytes.get(i + 1), bytes.get(i + 2)) else {
            return Err(PathError::BadEscape);
        };
        let value = match (hex_value(hi), hex_value(lo)) {
            (Some(hi), Some(lo)) => hi * 16 + lo,
            _ => return Err(PathError::BadEscape),
        };
        if matches!(value, b'/' | b'\\' | 0) && !policy.keep_encoded_slash {
            return Err(PathError::EncodedSeparator);
        }
        if is_unreserved(value) {
            out.push(char::from(value));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(value >> 4)]));
            out.push(char::from(HEX[usize::from(value & 0xf)]));
        }
        i += 3;
    }
    Ok(out)
}

/// `.;x` or `..;x` (or with `;` escaped as `%3B`, which some containers decode first): a dot
/// segment once a servlet container has dropped the segment's parameters.
fn dot_segment_with_parameters(segment: &str) -> bool {
    let rest = segment
        .strip_prefix("..")
        .or_else(|| segment.strip_prefix('.'))
        .unwrap_or(segment);
    rest.len() < segment.len() && (rest.starts_with(';') || rest.starts_with("%3B"))
}

/// The normalized form of `path` (borrowed when it already is).
pub fn normalize(path: &str, policy: PathRules) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    if path.contains('\\') {
        return Err(PathError::Backslash);
    }
    if !path.contains('%') && !path.contains("//") && !path.contains("/.") {
        return Ok(Cow::Borrowed(path));
    }
    let decoded = decode_unreserved(path, policy)?;
    let mut segments: Vec<&str> = Vec::new();
    let mut trailing_slash = false;
    for segment in decoded.split('/').skip(1) {
        trailing_slash = true;
        if dot_segment_with_parameters(segment) {
            return Err(PathError::DotSegmentParameters);
        }
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => {
                segments.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut normalized = String::with_capacity(decoded.len());
    for segment in &segments {
        normalized.push('/');
        normalized.push_str(segment);
    }
    if trailing_slash || segments.is_empty() {
        normalized.push('/');
    }
    Ok(Cow::Owned(normalized))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path, PathRules::default()).map(Cow::into_owned)
    }

    #[test]
    fn bytes_beyond_ascii_are_kept_as_they_are() {
        assert_eq!(norm("/caf\u{e9}/./x").unwrap(), "/caf\u{e9}/x");
        assert_eq!(norm("/caf%c3%a9//x").unwrap(), "/caf%C3%A9/x");
        assert_eq!(norm("/\u{65e5}\u{672c}").unwrap(), "/\u{65e5}\u{672c}");
    }

    #[test]
    fn every_spelling_of_a_resource_is_one_path() {
        for spelling in [
            "/api/users",
            "//api/users",
            "/api/./users",
            "/api/x/../users",
            "/api/%75sers",
            "/api//users",
            "/%61pi/%2E/users",
            "/../api/users",
        ] {
            assert_eq!(norm(spelling).unwrap(), "/api/users", "{spelling}");
        }
    }

    #[test]
    fn trailing_slashes_and_the_root_are_kept() {
        assert_eq!(norm("/api/").unwrap(), "/api/");
        assert_eq!(norm("/api/x/..").unwrap(), "/api/");
        assert_eq!(norm("/").unwrap(), "/");
        assert_eq!(norm("/..").unwrap(), "/");
        assert_eq!(norm("//").unwrap(), "/");
    }

    #[test]
    fn reserved_escapes_stay_escaped_in_uppercase() {
        assert_eq!(norm("/a%3fb%20c").unwrap(), "/a%3Fb%20c");
        assert!(matches!(
            normalize("/plain/path", PathRules::default()),
            Ok(Cow::Borrowed(_))
        ));
    }

    #[test]
    fn encoded_slashes_and_nul_are_refused_or_kept_opaque() {
        assert_eq!(norm("/a%2Fb"), Err(PathError::EncodedSeparator));
        assert_eq!(norm("/a%00b"), Err(PathError::EncodedSeparator));
        let keep = PathRules {
            keep_encoded_slash: true,
        };
        assert_eq!(normalize("/a%2fb/../c", keep).unwrap(), "/c");
        assert_eq!(normalize("/a%2f..%2fb", keep).unwrap(), "/a%2F..%2Fb");
    }

    #[test]
    fn what_backends_read_as_traversal_is_refused() {
        for (path, error) in [
            ("/api/..;/admin", PathError::DotSegmentParameters),
            ("/api/.;/admin", PathError::DotSegmentParameters),
            (
                "/api/..;jsessionid=x/admin",
                PathError::DotSegmentParameters,
            ),
            ("/api/%2e%2e;/admin", PathError::DotSegmentParameters),
            ("/api/..%3b/admin", PathError::DotSegmentParameters),
            ("/api/%5c..%5cadmin", PathError::EncodedSeparator),
            ("/api/%5C..%5Cadmin", PathError::EncodedSeparator),
            ("/api\\..\\admin", PathError::Backslash),
        ] {
            assert_eq!(norm(path), Err(error), "{path}");
        }
        // Parameters on other segments, and dots inside names, are a resource's own.
        assert_eq!(norm("/api/users;v=1").unwrap(), "/api/users;v=1");
        assert_eq!(norm("/api/...;x/a").unwrap(), "/api/...;x/a");
        assert_eq!(norm("/api/.well-known;x").unwrap(), "/api/.well-known;x");
        let keep = PathRules {
            keep_encoded_slash: true,
        };
        assert_eq!(normalize("/a%5c..%5cb", keep).unwrap(), "/a%5C..%5Cb");
    }

    #[test]
    fn malformed_escapes_and_relative_paths_are_refused() {
        for bad in ["/a%", "/a%4", "/a%zz", "/a%%41"] {
            assert_eq!(norm(bad), Err(PathError::BadEscape), "{bad}");
        }
        assert_eq!(norm("api/users"), Err(PathError::NotAbsolute));
        assert_eq!(norm("*"), Err(PathError::NotAbsolute));
    }
}
