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
