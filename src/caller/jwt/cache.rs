//! Tokens already verified, so that a client presenting the same token again (as clients do, for
//! its whole lifetime) costs a hash lookup instead of a signature check (RS256 ~190 µs, ES256
//! ~330 µs with the pure-Rust backend; docs/performance.md). Like Envoy's `jwt_cache_config`.
//!
//! What is kept is what the signature, issuer and audience checks concluded; the time checks
//! (`exp`, `nbf`, with the leeway) are made again on every hit against the time given. Entries
//! are keyed by the whole token (compared in full, never by a digest alone) and belong to the
//! key set they were verified with: installing other keys (a JWKS fetch that dropped a key)
//! empties the cache, and a verification that began under the old keys cannot add to it after.
//! Bounded: when full, expired entries are swept, and if none was, new tokens are simply not
//! cached. Only successes are cached; a forged token is checked each time it is sent.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use super::rejection::{JwtRejection, VerifiedToken};

/// Tokens held at most.
pub const CAPACITY: usize = 4096;
/// Longer tokens are verified every time rather than held (bounds the cache's memory to about
/// `CAPACITY × MAX_CACHED_TOKEN_BYTES`, 8 MiB).
pub const MAX_CACHED_TOKEN_BYTES: usize = 2048;

/// When a verified token is valid: its `exp` and `nbf` with the leeway already applied.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validity {
    /// Refused from this time on (`exp + leeway`).
    pub until: f64,
    /// Refused before this time (`nbf - leeway`), if it has an `nbf`.
    pub from: Option<f64>,
}

impl Validity {
    /// The time check of a verified token at `now`.
    pub fn check(&self, now: f64) -> Result<(), JwtRejection> {
        if now >= self.until {
            return Err(JwtRejection::Expired);
        }
        if self.from.is_some_and(|from| now < from) {
            return Err(JwtRejection::NotYetValid);
        }
        Ok(())
    }
}

struct Entry {
    verified: VerifiedToken,
    validity: Validity,
    generation: u64,
}

/// Verified tokens of one verifier.
#[derive(Default)]
pub struct VerifiedTokens {
    entries: DashMap<Box<str>, Entry>,
    /// Bumped each time other keys are installed; entries of an older one are never used.
    generation: AtomicU64,
}

impl VerifiedTokens {
    /// The generation to verify under: read before the keys are loaded.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Other keys are in force: nothing verified before counts.
    pub fn keys_changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.entries.clear();
    }

    /// `token`'s earlier verification, checked again against `now`; `None` when not held.
    pub fn get(&self, token: &str, now: f64) -> Option<Result<VerifiedToken, JwtRejection>> {
        let entry = self.entries.get(token)?;
        if entry.generation != self.generation() {
            return None;
        }
        Some(entry.validity.check(now).map(|()| entry.verified.clone()))
    }

    /// Holds `token`'s verification, made under `generation`, if there is room.
    pub fn insert(
        &self,
        token: &str,
        verified: &VerifiedToken,
        validity: Validity,
        generation: u64,
        now: f64,
    ) {
        if token.len() > MAX_CACHED_TOKEN_BYTES || generation != self.generation() {
            return;
        }
        if self.entries.len() >= CAPACITY {
            self.entries.retain(|_, entry| entry.validity.until > now);
            if self.entries.len() >= CAPACITY {
                return;
            }
        }
        self.entries.insert(
            token.into(),
            Entry {
                verified: verified.clone(),
                validity,
                generation,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}
