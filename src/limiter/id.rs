//! Request ids: 128 bits drawn from a cryptographic generator, so none can be guessed from
//! another. They are the id a request gets when it brings none (`X-Request-Id`), the members of
//! sliding logs and the holders of concurrency slots; unique across gateways because a repeat
//! is as likely as guessing one (2^-128 for a given pair).

use std::fmt;

use rand::Rng;

use super::key::write_hex;

/// A unique request identity: members of sliding logs and concurrency leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RequestId(pub u128);

impl RequestId {
    /// A new id: 128 bits from this thread's generator (rand's `ThreadRng`: ChaCha12, seeded
    /// from the operating system's `getrandom` on its first use in each thread and again after
    /// every 64 KiB it gives). No state is shared between threads, and none is drawn before
    /// `sluice -d` forks: the threads that serve start after it.
    pub fn random() -> RequestId {
        let mut rng = rand::rng();
        RequestId(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()))
    }

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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn request_ids_print_as_fixed_width_hex() {
        assert_eq!(
            RequestId(255).to_string(),
            "000000000000000000000000000000ff"
        );
    }

    /// 4 threads × 25,000 ids: all distinct.
    #[test]
    fn ids_are_distinct_across_threads() {
        let drawn: Vec<Vec<RequestId>> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..25_000).map(|_| RequestId::random()).collect()))
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let all: HashSet<RequestId> = drawn.iter().flatten().copied().collect();
        assert_eq!(all.len(), 100_000);
    }

    /// Consecutive ids share no prefix (the ids of a per-process prefix and a counter shared
    /// their first 16 hex digits), and every one of the 128 bits is set in about half of them: nothing of an id
    /// tells the next.
    #[test]
    fn every_bit_of_an_id_is_random() {
        let ids: Vec<u128> = (0..10_000).map(|_| RequestId::random().0).collect();
        for pair in ids.windows(2) {
            let (a, b) = (RequestId(pair[0]).hex(), RequestId(pair[1]).hex());
            // By chance: 1 in 2^64 a pair.
            assert_ne!(a[..16], b[..16], "{pair:x?}");
        }
        for bit in 0..128 {
            let set = ids.iter().filter(|id| *id >> bit & 1 == 1).count();
            // 5,000 ± 50 expected: 10 standard deviations either side.
            assert!((4_500..=5_500).contains(&set), "bit {bit} set in {set}");
        }
    }
}
