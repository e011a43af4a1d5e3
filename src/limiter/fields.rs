//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers),
//! written in one place for the proxy's responses, a route's policy built at load and the rate
//! limit service's answers: `"name";q=10;w=60` and `"name";r=3;t=12` per limit, items joined by
//! `, `. Written byte by byte, without the formatting machinery: they go on every response of a
//! limited route. Limit names are a safe ASCII subset (checked at load), so the bytes are a
//! valid header value.

/// Appends one limit's item of `RateLimit-Policy`: `quota` units per `window_seconds`.
pub fn push_policy_item(out: &mut Vec<u8>, name: &str, quota: u64, window_seconds: u64) {
    push_name(out, name);
    out.extend_from_slice(b";q=");
    push_decimal(out, quota);
    out.extend_from_slice(b";w=");
    push_decimal(out, window_seconds);
}

/// Appends one limit's item of `RateLimit`: `remaining` units left, its window reset in
/// `reset_after_ms` (rounded up to whole seconds, as `Retry-After` is).
pub fn push_state_item(out: &mut Vec<u8>, name: &str, remaining: u64, reset_after_ms: u64) {
    push_name(out, name);
    out.extend_from_slice(b";r=");
    push_decimal(out, remaining);
    out.extend_from_slice(b";t=");
    push_decimal(out, whole_seconds(reset_after_ms));
}

/// Bytes of a partition key: 72 bits, twelve base64 characters.
const PARTITION_KEY_BYTES: usize = 9;

/// Appends `;pk=:...:`, the item's partition key: which of the limit's buckets the request
/// counted in, as a structured-field byte sequence. Derived from the stored `key` by one more
/// hash, so it never holds a client's bytes (the key's digest is keyed with the gateway's
/// secret) and is not the stored key either; the same bucket always gives the same value.
pub fn push_partition_key(out: &mut Vec<u8>, key: &[u8]) {
    use base64::Engine;
    let digest = xxhash_rust::xxh3::xxh3_128(key).to_be_bytes();
    let mut text = [0u8; 4 * PARTITION_KEY_BYTES / 3];
    let written = base64::engine::general_purpose::STANDARD
        .encode_slice(&digest[..PARTITION_KEY_BYTES], &mut text)
        .unwrap_or(0);
    out.extend_from_slice(b";pk=:");
    out.extend_from_slice(&text[..written]);
    out.push(b':');
}

/// `ms` in whole seconds, rounded up: what `t`, `Retry-After` and the usage API show a client,
/// so a client that waits that long finds the window reset.
pub(crate) fn whole_seconds(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// The item's name, after the separator of the item before it.
fn push_name(out: &mut Vec<u8>, name: &str) {
    if !out.is_empty() {
        out.extend_from_slice(b", ");
    }
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.push(b'"');
}

/// Appends `n` in decimal, without the formatting machinery.
pub(crate) fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_written_as_the_draft_spells_them_and_joined() {
        let mut policy = Vec::new();
        push_policy_item(&mut policy, "per_client", 10, 1);
        push_policy_item(&mut policy, "daily", 1000, 86_400);
        assert_eq!(policy, br#""per_client";q=10;w=1, "daily";q=1000;w=86400"#);
        let mut state = Vec::new();
        push_state_item(&mut state, "per_client", 0, 1);
        push_state_item(&mut state, "daily", 998, 3_600_000);
        push_state_item(&mut state, "now", 5, 0);
        assert_eq!(
            state,
            br#""per_client";r=0;t=1, "daily";r=998;t=3600, "now";r=5;t=0"#
        );
    }
}
