//! The quota admin API's writes where the limits live: resetting limits' keys, crediting units
//! back once per caller-supplied id, and the store of temporary overrides. Each is one atomic
//! step: one call of the operation's own script in Redis (`lua/admin/reset.lua`, `credit.lua`,
//! `override_put.lua`, `override_restore.lua`, `override_delete.lua`, `announce.lua`, each
//! composed with the parts it uses: `epoch.lua`, `overrides.lua`), or under the in-process
//! backend's locks (its [`AdminBook`] keeps the credit ids and overrides Redis would, and
//! mirrors those scripts).
//!
//! The admin store's room: the [`QuotaStore`] seam both backends implement, the in-process
//! [`AdminBook`], and the encodings the Redis side shares with `lua/admin/`; its unit tests
//! in `tests.rs`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_128;

use super::algorithm::Algorithm;
use super::error::LimiterError;

/// How long a credit's id is remembered: a credit sent again within it changes nothing.
pub const CREDIT_MEMORY: Duration = Duration::from_secs(24 * 3600);

/// The most overrides in force at once (a bound on every gateway's per-request tables).
pub const MAX_OVERRIDES: usize = 1000;

/// The most credit ids the in-process backend remembers at once.
const MAX_CREDIT_IDS: usize = 100_000;

/// What a credit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credited {
    /// The key's usage went down.
    Changed,
    /// Nothing was used: the key is full already (no state, or a window already over).
    NothingUsed,
    /// Its id was seen within [`CREDIT_MEMORY`]: nothing changed this time.
    Repeated,
}

/// What storing an override did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    /// Stored, in place of `previous` (the value in force under its field, if any).
    Stored { previous: Option<String> },
    /// Not stored: [`MAX_OVERRIDES`] are in force.
    Full,
}

/// What writing an override back did (see [`QuotaStore::restore_override`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// Written: its field held no override in force.
    Written,
    /// Not written: its field holds one in force (written back by another gateway, or set
    /// anew since).
    Present,
    /// Not written: [`MAX_OVERRIDES`] are in force.
    Full,
}

/// One override in force as stored: which route, limit and consumer (`field`), what it says
/// (`value`, JSON), and how long it has left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOverride {
    pub field: String,
    pub value: String,
    pub left_ms: u64,
}

/// How a limit's usage is credited, when it can be: a GCRA's TAT moves back by the units'
/// emission time (`gcra`, the emission interval); a fixed window's or calendar period's count
/// drops (`count`). Other algorithms keep no single count to credit.
pub fn credit_kind(algorithm: &Algorithm) -> Option<(&'static str, u64)> {
    match *algorithm {
        Algorithm::Gcra { emission_us, .. } => Some(("gcra", emission_us)),
        Algorithm::FixedWindow { .. } | Algorithm::Calendar { .. } => Some(("count", 1)),
        _ => None,
    }
}

/// The key that remembers credit `id` of `key`: the state key (so the same hash tag, one
/// Cluster slot) and a hash of the id's bytes (any bytes: two ids that differ in one byte are
/// two credits), never the caller's bytes. A UTF-8 id hashes its text's bytes, as it always did.
pub fn credit_id_key(key: &[u8], id: &[u8]) -> Vec<u8> {
    let mut remembered = Vec::with_capacity(key.len() + 40);
    remembered.extend_from_slice(key);
    remembered.extend_from_slice(b":credit:");
    remembered.extend_from_slice(format!("{:032x}", xxh3_128(id)).as_bytes());
    remembered
}

/// The overrides of `stored` (field, `"<expiry in ms> <JSON>"`) in force at `now_ms` (Redis's
/// clock): each with the time it has left.
pub fn in_force(stored: Vec<(String, String)>, now_ms: u64) -> Vec<StoredOverride> {
    let live = stored.into_iter().filter_map(|(field, value)| {
        let (expiry, json) = value.split_once(' ')?;
        let left_ms = expiry
            .parse::<u64>()
            .ok()?
            .checked_sub(now_ms)
            .filter(|&ms| ms > 0)?;
        Some(StoredOverride {
            field,
            value: json.to_string(),
            left_ms,
        })
    });
    live.collect()
}

/// Where the admin API keeps what every gateway reads: the overrides table, and the epoch that
/// counts resets and credits (a gateway that sees it change forgets the denials it cached).
/// One hash tag, so one Cluster slot: `{PREFIX:admin}:overrides`, `{PREFIX:admin}:epoch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTables {
    pub overrides: String,
    pub epoch: String,
}

impl AdminTables {
    /// The tables under the configuration's key prefix.
    pub fn under(prefix: &str) -> AdminTables {
        AdminTables {
            overrides: format!("{{{prefix}:admin}}:overrides"),
            epoch: format!("{{{prefix}:admin}}:epoch"),
        }
    }
}

/// The overrides in force and the admin epoch, as one read saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    pub epoch: u64,
    pub overrides: Vec<StoredOverride>,
}

/// The admin API's writes, implemented by each backend holding limits' state.
pub trait QuotaStore: Send + Sync {
    /// Deletes `keys` (a deleted key is a full quota): how many existed.
    fn reset(&self, keys: &[&[u8]]) -> impl Future<Output = Result<u64, LimiterError>> + Send;

    /// Gives `units` back to `key` of a limit deciding by `algorithm` (see [`credit_kind`]),
    /// unless credit `id` was seen within [`CREDIT_MEMORY`].
    fn credit(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
        id: &[u8],
    ) -> impl Future<Output = Result<Credited, LimiterError>> + Send;

    /// Counts a reset or credit in the admin epoch (overrides set or removed count too).
    fn announce(
        &self,
        tables: &AdminTables,
    ) -> impl Future<Output = Result<(), LimiterError>> + Send;

    /// The admin epoch: what every gateway reads each second (one `GET`), and reads the
    /// overrides only when it changed.
    fn epoch(&self, tables: &AdminTables)
        -> impl Future<Output = Result<u64, LimiterError>> + Send;

    /// Stores override `value` under `field` of the overrides table for `lifetime`, with the
    /// previous value in force, if any; [`Put::Full`] when [`MAX_OVERRIDES`] are in force.
    fn put_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> impl Future<Output = Result<Put, LimiterError>> + Send;

    /// Writes override `value` back under `field` for `lifetime` (what it had left), only
    /// where the field holds no override in force: the table was lost (a Redis restarted
    /// without persistence) and the gateways hold what was in force. Idempotent: of several
    /// gateways writing the same override back, one write lands. Counts a change in the epoch
    /// when written.
    fn restore_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> impl Future<Output = Result<Restored, LimiterError>> + Send;

    /// Removes `field`'s override: the value it had, if it was in force.
    fn delete_override(
        &self,
        tables: &AdminTables,
        field: &str,
    ) -> impl Future<Output = Result<Option<String>, LimiterError>> + Send;

    /// The overrides in force (the expired ones left out) and the admin epoch: plain reads.
    fn overrides(
        &self,
        tables: &AdminTables,
    ) -> impl Future<Output = Result<Listed, LimiterError>> + Send;
}

/// What the in-process backend remembers for the admin API: credit ids and overrides, each
/// with its expiry (microseconds on the backend's clock).
#[derive(Debug, Default)]
pub struct AdminBook {
    credits: HashMap<u128, i64>,
    overrides: BTreeMap<String, (String, i64)>,
    /// Changes counted: resets and credits announced, overrides set and removed.
    pub epoch: u64,
}

impl AdminBook {
    /// Remembers credit `id` of `key` for [`CREDIT_MEMORY`]: false when it is remembered
    /// already (an id counts once per key, as in Redis). Refused when [`MAX_CREDIT_IDS`] are
    /// remembered after the expired ones are dropped.
    pub fn remember_credit(
        &mut self,
        key: &[u8],
        id: &[u8],
        now_us: i64,
    ) -> Result<bool, LimiterError> {
        let hash = xxh3_128(&credit_id_key(key, id));
        if self.credits.get(&hash).is_some_and(|&until| until > now_us) {
            return Ok(false);
        }
        if self.credits.len() >= MAX_CREDIT_IDS {
            self.credits.retain(|_, &mut until| until > now_us);
            if self.credits.len() >= MAX_CREDIT_IDS {
                return Err(LimiterError::LocalCapacity(MAX_CREDIT_IDS));
            }
        }
        let memory = CREDIT_MEMORY.as_micros() as i64;
        self.credits.insert(hash, now_us + memory);
        Ok(true)
    }

    /// Stores an override (see [`QuotaStore::put_override`]).
    pub fn put_override(
        &mut self,
        field: &str,
        value: &str,
        lifetime: Duration,
        now_us: i64,
    ) -> Put {
        self.drop_expired(now_us);
        if !self.overrides.contains_key(field) && self.overrides.len() >= MAX_OVERRIDES {
            return Put::Full;
        }
        let until = now_us.saturating_add(lifetime.as_micros() as i64);
        self.epoch += 1;
        let previous = self
            .overrides
            .insert(field.to_string(), (value.to_string(), until));
        Put::Stored {
            previous: previous.map(|(value, _)| value),
        }
    }

    /// Writes an override back where none is in force (see
    /// [`QuotaStore::restore_override`]).
    pub fn restore_override(
        &mut self,
        field: &str,
        value: &str,
        lifetime: Duration,
        now_us: i64,
    ) -> Restored {
        self.drop_expired(now_us);
        if self.overrides.contains_key(field) {
            return Restored::Present;
        }
        match self.put_override(field, value, lifetime, now_us) {
            Put::Stored { .. } => Restored::Written,
            Put::Full => Restored::Full,
        }
    }

    /// Removes an override (see [`QuotaStore::delete_override`]).
    pub fn delete_override(&mut self, field: &str, now_us: i64) -> Option<String> {
        self.drop_expired(now_us);
        let removed = self.overrides.remove(field).map(|(value, _)| value);
        self.epoch += u64::from(removed.is_some());
        removed
    }

    /// The overrides in force.
    pub fn overrides(&mut self, now_us: i64) -> Vec<StoredOverride> {
        self.drop_expired(now_us);
        let stored = self.overrides.iter().map(|(field, (value, until))| {
            let left_ms = (until - now_us).max(0) as u64 / 1000;
            StoredOverride {
                field: field.clone(),
                value: value.clone(),
                left_ms,
            }
        });
        stored.collect()
    }

    fn drop_expired(&mut self, now_us: i64) {
        self.overrides.retain(|_, (_, until)| *until > now_us);
    }
}

#[cfg(test)]
mod tests;
