//! Region sync on Redis: this region's store ([`RegionStore`], the gateway's own Redis: the set
//! of keys touched, the sync lease, the ledgers, gives and applies by `lua/regions/`, and the
//! stream it publishes) and another region's ([`RegionPeer`], only read: its stream, its clock).
//!
//! Keys, under the key prefix and the region's name: `<prefix>:regions:<region>:touched` (a
//! sorted set of notes by their period's end), `:sync` (the lease) and `:out` (the stream of
//! entries, trimmed to about [`TICKS_KEPT`] ticks).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use super::link::Link;
use super::topology::{RedisAuth, Topology};
use super::{classify, within};
use crate::limiter::clock::Clock;
use crate::limiter::error::LimiterError;
use crate::limiter::regions::ledger::{Ledger, Record};
use crate::limiter::regions::notes::{Note, MAX_NOTED};
use crate::limiter::regions::plan::Give;
use crate::limiter::regions::sync::{Apply, Entry, Here};
use crate::limiter::regions::Regions;

/// About how many ticks a region's stream keeps: each entry holds every key the region
/// touched, so a reader needs only the latest; these few cover a reader a little behind.
pub const TICKS_KEPT: u64 = 20;

/// The most records one entry carries; more are published as several entries.
const RECORDS_PER_ENTRY: usize = 1000;

/// The most entries one read takes of a peer's stream.
const READ_COUNT: usize = 500;

const GIVE_SOURCE: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    "\n",
    include_str!("../../../lua/global.lua"),
    "\n",
    include_str!("../../../lua/regions/give.lua"),
);
const APPLY_SOURCE: &str = concat!(
    include_str!("../../../lua/prelude.lua"),
    "\n",
    include_str!("../../../lua/regions/apply.lua"),
);
const LEASE_SOURCE: &str = include_str!("../../../lua/regions/lease.lua");

/// The keys of region `name`'s sync under `prefix`.
fn key(prefix: &str, name: &str, what: &str) -> String {
    format!("{prefix}:regions:{name}:{what}")
}

/// This region's Redis, as region sync uses it.
pub struct RegionStore {
    link: Arc<Link>,
    regions: Arc<Regions>,
    touched: String,
    lease: String,
    out: String,
    give: redis::Script,
    apply: redis::Script,
    hold: redis::Script,
    /// The scripts are loaded on every master (else the next call loads them first).
    loaded: AtomicBool,
    deadline: Duration,
    /// The clock the scripts run on: `None`, Redis's (`TIME`, production); else this one's
    /// time, sent with each call, as the backend's decisions are (tests).
    clock: Option<Arc<dyn Clock>>,
}

impl RegionStore {
    pub fn new(
        link: Arc<Link>,
        prefix: &str,
        regions: Arc<Regions>,
        deadline: Duration,
        clock: Option<Arc<dyn Clock>>,
    ) -> RegionStore {
        let name = regions.this_name().to_string();
        RegionStore {
            link,
            touched: key(prefix, &name, "touched"),
            lease: key(prefix, &name, "sync"),
            out: key(prefix, &name, "out"),
            regions,
            give: redis::Script::new(GIVE_SOURCE),
            apply: redis::Script::new(APPLY_SOURCE),
            hold: redis::Script::new(LEASE_SOURCE),
            loaded: AtomicBool::new(false),
            deadline,
            clock,
        }
    }

    /// The `now` argument of a script: the clock's time, or "" for Redis's.
    fn now(&self) -> String {
        self.clock
            .as_ref()
            .map_or_else(String::new, |clock| clock.now_us().to_string())
    }

    /// The stream this region publishes on (tests read it).
    pub fn stream(&self) -> &str {
        &self.out
    }

    async fn query<T: redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T, LimiterError> {
        within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            cmd.query_async(&mut connection).await.map_err(classify)
        })
        .await
    }

    /// Runs `pipe` of script calls, loading the scripts first where the server lacks them.
    async fn scripted<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> Result<T, LimiterError> {
        if !self.loaded.load(Ordering::Relaxed) {
            for source in [GIVE_SOURCE, APPLY_SOURCE, LEASE_SOURCE] {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(source);
                for (_, answered) in self.link.on_every_master(&load).await? {
                    answered.map_err(LimiterError::Reply)?;
                }
            }
            self.loaded.store(true, Ordering::Relaxed);
        }
        let result = within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            pipe.query_async(&mut connection).await.map_err(classify)
        })
        .await;
        if let Err(LimiterError::Server {
            kind: crate::limiter::ErrorKind::Noscript,
            ..
        }) = &result
        {
            self.loaded.store(false, Ordering::Relaxed);
        }
        result
    }
}

impl Here for RegionStore {
    async fn note(&self, notes: &[Note]) -> Result<(), LimiterError> {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&self.touched);
        for note in notes {
            zadd.arg(note.end_us / 1000).arg(note.member());
        }
        self.query::<i64>(&zadd).await.map(|_| ())
    }

    async fn hold(&self, instance: &str, life: Duration) -> Result<bool, LimiterError> {
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(self.hold.get_hash())
            .arg(1)
            .arg(&self.lease)
            .arg(instance)
            .arg(life.as_millis() as u64);
        let (held,): (i64,) = self.scripted(&pipe).await?;
        Ok(held == 1)
    }

    async fn touched(&self, now_us: i64) -> Result<Vec<Note>, LimiterError> {
        let mut pipe = redis::pipe();
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&self.touched)
            .arg("-inf")
            .arg(now_us / 1000)
            .ignore()
            .cmd("ZRANGE")
            .arg(&self.touched)
            .arg(0)
            .arg(MAX_NOTED as i64 - 1);
        let (members,): (Vec<String>,) = within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            pipe.query_async(&mut connection).await.map_err(classify)
        })
        .await?;
        Ok(members.iter().filter_map(|m| Note::of_member(m)).collect())
    }

    async fn ledgers(&self, keys: &[&[u8]]) -> Result<Vec<Ledger>, LimiterError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("HGETALL").arg(*key);
        }
        let hashes: Vec<BTreeMap<String, i64>> = within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            pipe.query_async(&mut connection).await.map_err(classify)
        })
        .await?;
        Ok(hashes
            .iter()
            .map(|fields| {
                Ledger::of_fields(&self.regions, fields.iter().map(|(f, v)| (f.as_str(), *v)))
            })
            .collect())
    }

    async fn apply(&self, applies: &[Apply]) -> Result<u64, LimiterError> {
        if applies.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        for apply in applies {
            pipe.cmd("EVALSHA")
                .arg(self.apply.get_hash())
                .arg(1)
                .arg(&apply.key)
                .arg(self.now())
                .arg(apply.start_us)
                .arg(apply.end_us)
                .arg(&apply.field)
                .arg(apply.total);
        }
        let changed: Vec<i64> = self.scripted(&pipe).await?;
        Ok(changed.iter().filter(|c| **c == 1).count() as u64)
    }

    async fn give(&self, gives: &[Give]) -> Result<Vec<(u64, u64)>, LimiterError> {
        if gives.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for give in gives {
            let taker = &self.regions.list[give.taker].name;
            pipe.cmd("EVALSHA")
                .arg(self.give.get_hash())
                .arg(1)
                .arg(&give.note.key)
                .arg(self.now())
                .arg(give.base)
                .arg(give.note.start_us)
                .arg(give.note.end_us)
                .arg(format!("o:{taker}"))
                .arg(give.units);
        }
        let given: Vec<(u64, u64)> = self.scripted(&pipe).await?;
        Ok(given)
    }

    async fn publish(&self, entry: &Entry) -> Result<(), LimiterError> {
        let regions = self.regions.list.len();
        let chunks: Vec<&[Record]> = if entry.records.is_empty() {
            vec![&[]]
        } else {
            entry.records.chunks(RECORDS_PER_ENTRY).collect()
        };
        let kept = TICKS_KEPT * chunks.len() as u64;
        let mut pipe = redis::pipe();
        for chunk in chunks {
            let mut text = String::new();
            for record in chunk {
                record.write(regions, &mut text);
            }
            pipe.cmd("XADD")
                .arg(&self.out)
                .arg("MAXLEN")
                .arg("~")
                .arg(kept)
                .arg("*")
                .arg("v")
                .arg(1)
                .arg("from")
                .arg(&entry.from)
                .arg("at")
                .arg(entry.at_us)
                .arg("digest")
                .arg(&entry.digest)
                .arg("records")
                .arg(text)
                .ignore();
        }
        within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            pipe.query_async::<()>(&mut connection)
                .await
                .map_err(classify)
        })
        .await
    }
}

/// Another region's Redis: its stream and its clock, only read.
pub struct RegionPeer {
    link: Link,
    out: String,
    regions: usize,
    deadline: Duration,
}

impl RegionPeer {
    /// Region `name`'s Redis at `topology`; `deadline` bounds each read.
    pub fn new(
        topology: &Topology,
        auth: &RedisAuth,
        prefix: &str,
        name: &str,
        regions: usize,
        deadline: Duration,
    ) -> Result<RegionPeer, redis::RedisError> {
        Ok(RegionPeer {
            link: Link::new(topology, auth, deadline)?,
            out: key(prefix, name, "out"),
            regions,
            deadline,
        })
    }

    async fn query(&self, cmd: &Cmd) -> Result<Value, LimiterError> {
        within(&self.link, self.deadline, async {
            let mut connection = self.link.connection().await?;
            cmd.query_async(&mut connection).await.map_err(classify)
        })
        .await
    }

    /// Its clock (`TIME`), in us.
    pub async fn time(&self) -> Result<i64, LimiterError> {
        let value = self.query(&redis::cmd("TIME")).await?;
        let (seconds, micros): (i64, i64) =
            redis::from_redis_value(value).map_err(|e| LimiterError::Reply(e.to_string()))?;
        Ok(seconds * 1_000_000 + micros)
    }
}

impl RegionPeer {
    /// The entries after `cursor` ("0": none read yet), each with its id, waiting up to `block`
    /// for one. A reader that has read nothing yet starts from the latest entries: each entry
    /// holds every key its region touched, so the latest are all there is to know.
    pub async fn read_waiting(
        &self,
        cursor: &str,
        block: Duration,
    ) -> Result<Vec<(String, Entry)>, LimiterError> {
        if cursor == "0" {
            let mut latest = redis::cmd("XREVRANGE");
            latest.arg(&self.out).arg("+").arg("-").arg("COUNT").arg(20);
            let mut entries = entries_of(&self.query(&latest).await?, self.regions)?;
            entries.reverse();
            return Ok(entries);
        }
        let mut read = redis::cmd("XREAD");
        read.arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&self.out)
            .arg(cursor);
        // nil (nothing within `block`), or [[stream, entries]].
        let Value::Array(streams) = self.query(&read).await? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for stream in streams {
            if let Value::Array(mut pair) = stream {
                if pair.len() == 2 {
                    out.extend(entries_of(&pair.swap_remove(1), self.regions)?);
                }
            }
        }
        Ok(out)
    }
}

/// The entries of a stream reply (`[[id, [field, value, ...]], ...]`); an entry not well formed
/// is skipped with a warning.
fn entries_of(reply: &Value, regions: usize) -> Result<Vec<(String, Entry)>, LimiterError> {
    let raw: Vec<(String, Vec<(String, String)>)> = redis::from_redis_value(reply.clone())
        .map_err(|e| LimiterError::Reply(format!("a region's stream: {e}")))?;
    let mut out = Vec::new();
    for (id, fields) in raw {
        let field = |name: &str| {
            fields
                .iter()
                .find(|(f, _)| f == name)
                .map(|(_, v)| v.as_str())
        };
        let entry = (|| {
            Some(Entry {
                from: field("from")?.to_string(),
                at_us: field("at")?.parse().ok()?,
                digest: field("digest")?.to_string(),
                records: Record::read_all(field("records")?, regions)?,
            })
        })();
        match entry {
            Some(entry) => out.push((id, entry)),
            None => log::warn!("region sync: entry {id} of a region's stream is not one this release reads; skipped"),
        }
    }
    Ok(out)
}
