//! Request ids unique across gateways: the members of sliding logs and the holders of
//! concurrency slots.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::key::write_hex;

/// A unique request identity: members of sliding logs and concurrency leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RequestId(pub u128);

impl RequestId {
    /// 32 lowercase hex digits, on the stack (the scripts' request id argument).
    pub fn hex(&self) -> [u8; 32] {
        let mut out = [0; 32];
        write_hex(&mut out, &self.0.to_be_bytes());
        out
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always ASCII hex digits.
        f.write_str(std::str::from_utf8(&self.hex()).unwrap_or_default())
    }
}

/// Hands out request ids unique across gateways: a random 64-bit prefix per process and a
/// counter.
#[derive(Debug)]
pub struct RequestIds {
    prefix: u64,
    counter: AtomicU64,
}

impl RequestIds {
    pub fn new() -> RequestIds {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let seed = format!(
            "{nanos}:{}:{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        RequestIds {
            prefix: xxhash_rust::xxh3::xxh3_64(seed.as_bytes()),
            counter: AtomicU64::new(0),
        }
    }

    pub fn next(&self) -> RequestId {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        RequestId((u128::from(self.prefix) << 64) | u128::from(n))
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_print_as_fixed_width_hex() {
        assert_eq!(
            RequestId(255).to_string(),
            "000000000000000000000000000000ff"
        );
    }

    #[test]
    fn ids_of_one_process_are_distinct() {
        let ids = RequestIds::new();
        assert_ne!(ids.next(), ids.next());
    }
}
