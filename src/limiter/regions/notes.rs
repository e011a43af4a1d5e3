//! The global keys this gateway decided on since region sync last looked: what sync publishes
//! and rebalances. Bounded: past [`MAX_NOTED`] keys a tick, a new key is not noted (it is again
//! at its next decision after the tick); the region's set of keys touched is read up to the
//! same bound, soonest-ending periods first, and the holder logs when it is full.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Consistency, Kind};
use crate::limiter::algorithm::{Algorithm, Period};
use crate::limiter::key::write_hex;
use crate::limiter::limit::Limit;

/// The most keys noted between two ticks of region sync.
pub const MAX_NOTED: usize = 10_000;

/// One global key in one period.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Note {
    pub key: Vec<u8>,
    /// The limit's name (metrics; names have no spaces).
    pub limit: String,
    pub kind: Kind,
    pub whole: u64,
    pub start_us: i64,
    pub end_us: i64,
}

impl Note {
    /// Its member of the region's set of keys touched: every
    /// gateway of the region notes there, and the sync holder reads it. `kind whole start end
    /// limit hexkey`.
    pub fn member(&self) -> String {
        let mut hex = vec![0; 2 * self.key.len()];
        write_hex(&mut hex, &self.key);
        format!(
            "{} {} {} {} {} {}",
            self.kind.letter(),
            self.whole,
            self.start_us,
            self.end_us,
            self.limit,
            String::from_utf8_lossy(&hex)
        )
    }

    /// Whether `other` is of the same period (either bound the same).
    pub fn same_period(&self, other: &Note) -> bool {
        self.end_us == other.end_us || self.start_us == other.start_us
    }

    /// The note a member names; `None` for one not well formed.
    pub fn of_member(text: &str) -> Option<Note> {
        let mut parts = text.split(' ');
        let kind = Kind::of_letter(parts.next()?)?;
        let whole = parts.next()?.parse().ok()?;
        let start_us = parts.next()?.parse().ok()?;
        let end_us = parts.next()?.parse().ok()?;
        let limit = parts.next()?.to_string();
        let key = unhex(parts.next()?)?;
        Some(Note {
            key,
            limit,
            kind,
            whole,
            start_us,
            end_us,
        })
    }
}

/// The bytes hex digits spell; `None` for text that is not two digits per byte.
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = text.as_bytes();
    if bytes.len() % 2 != 0 {
        return None;
    }
    bytes
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

/// The keys noted since the last [`Notes::take`].
#[derive(Debug, Default)]
pub struct Notes {
    noted: Mutex<HashMap<Vec<u8>, Note>>,
}

impl Notes {
    /// Notes `key` of a global limit of `kind` and `whole` units, in the period `bounds`.
    pub fn note(&self, key: &[u8], limit: &str, kind: Kind, whole: u64, bounds: (i64, i64)) {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(note) = noted.get_mut(key) {
            note.start_us = bounds.0;
            note.end_us = bounds.1;
            return;
        }
        if noted.len() < MAX_NOTED {
            let note = Note {
                key: key.to_vec(),
                limit: limit.to_string(),
                kind,
                whole,
                start_us: bounds.0,
                end_us: bounds.1,
            };
            noted.insert(key.to_vec(), note);
        }
    }

    /// Notes `key` of `limit` (kept across regions) at `now_us`.
    pub fn note_limit(&self, limit: &Limit, key: &[u8], now_us: i64) {
        let (Some(global), Algorithm::Calendar { period, .. }) = (limit.global, limit.algorithm)
        else {
            return;
        };
        let kind = match (global.consistency, period) {
            (Consistency::Approx, _) => Kind::Approx,
            (Consistency::Strict, Period::Calendar(_)) => Kind::Quota,
            (Consistency::Strict, Period::Aligned { .. }) => Kind::Strict,
        };
        self.note(key, &limit.name, kind, global.whole, period.bounds(now_us));
    }

    /// Every key noted, forgotten here.
    pub fn take(&self) -> Vec<Note> {
        let mut noted = self.noted.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *noted).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_reads_back_from_its_member_and_each_key_is_noted_once() {
        let notes = Notes::default();
        notes.note(b"k\x00", "monthly", Kind::Quota, 100, (1, 2));
        notes.note(b"k\x00", "monthly", Kind::Quota, 100, (2, 3));
        let taken = notes.take();
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].start_us, taken[0].end_us), (2, 3));
        assert_eq!(Note::of_member(&taken[0].member()), Some(taken[0].clone()));
        assert!(notes.take().is_empty());
    }
}
