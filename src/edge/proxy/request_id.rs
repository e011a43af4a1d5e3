//! The request id: kept from the caller when `request_id.accept` trusts it and it is well
//! formed, made here otherwise; the upstream gets it, the client gets it back (gateway answers
//! included), and the access log records it.

use http::{HeaderMap, HeaderValue};

use crate::config::observe::{AcceptRequestId, RequestIdSettings};
use crate::limiter::RequestId;

/// The longest incoming id that is kept.
const MAX_ID_BYTES: usize = 128;

/// An id safe to pass on and to log: 1 to 128 visible ASCII characters, no quote or backslash
/// (so it never needs escaping in a JSON log line or a problem body).
fn well_formed(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    (1..=MAX_ID_BYTES).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| (0x21..=0x7e).contains(b) && *b != b'"' && *b != b'\\')
}

/// The request's id: the incoming one when accepted from this peer and well formed, a new
/// one (32 random hex digits, [`RequestId::random`]) otherwise.
pub fn assign(
    settings: &RequestIdSettings,
    headers: &HeaderMap,
    trusted_peer: bool,
) -> HeaderValue {
    let accepted = match settings.accept {
        AcceptRequestId::Always => true,
        AcceptRequestId::Trusted => trusted_peer,
        AcceptRequestId::Never => false,
    };
    if accepted {
        if let Some(incoming) = headers.get(&settings.header).filter(|v| well_formed(v)) {
            return incoming.clone();
        }
    }
    HeaderValue::from_bytes(&RequestId::random().hex())
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn settings(accept: AcceptRequestId) -> RequestIdSettings {
        RequestIdSettings {
            header: HeaderName::from_static("x-request-id"),
            spelling: bytes::Bytes::from_static(b"X-Request-Id"),
            accept,
        }
    }

    fn with_id(id: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_bytes(id).unwrap());
        headers
    }

    #[test]
    fn a_trusted_well_formed_id_is_kept_and_anything_else_replaced() {
        let trusted = settings(AcceptRequestId::Trusted);
        let kept = assign(&trusted, &with_id(b"abc-123"), true);
        assert_eq!(kept, "abc-123");
        let made = assign(&trusted, &with_id(b"abc-123"), false);
        assert_eq!(
            made.len(),
            32,
            "a client that is not a trusted proxy gets a new id"
        );
        for bad in [&b"has space"[..], b"quote\"d", b"back\\slash", &[b'a'; 129]] {
            let replaced = assign(&trusted, &with_id(bad), true);
            assert_eq!(replaced.len(), 32, "{:?}", String::from_utf8_lossy(bad));
        }
        let always = assign(&settings(AcceptRequestId::Always), &with_id(b"x"), false);
        assert_eq!(always, "x");
        let never = assign(&settings(AcceptRequestId::Never), &with_id(b"x"), true);
        assert_eq!(never.len(), 32);
        assert_ne!(made, never, "new ids differ");
    }
}
