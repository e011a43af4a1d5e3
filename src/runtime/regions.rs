//! Region sync's task (`limiter::regions::sync`): every exchange period T, one tick on this
//! region's Redis, and one reader per peer region, each on its own connection, that waits on
//! the peer's stream (`XREAD BLOCK`) and hands what it read to the next tick. A peer that is
//! slow or cut off delays nothing but its own reader. Every ten reads (about ten exchange
//! periods) each reader also reads its peer's clock, for the skew
//! (`sluice_region_clock_skew_seconds`). A gateway that does not hold the sync lease drops what
//! its readers read: the holder's records are whole each tick, so a gateway that takes the
//! lease over needs only the next ones.
//!
//! `regions:` is restart-only: what this task reads of it is the configuration it started
//! with. The sync lease of a gateway that stops lapses within three ticks, and another gateway
//! of the region takes over.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::{Config, RegionsSettings};
use crate::limiter::clock::{Clock, SystemClock};
use crate::limiter::redis::regions::RegionPeer;
use crate::limiter::regions::notes::MAX_NOTED;
use crate::limiter::regions::sync::{self, Entry, Peer, RegionSync, Tick};
use crate::limiter::regions::Regions;
use crate::limiter::{LimiterError, Policy};
use crate::observe::metrics;
use crate::runtime::snapshot::InForce;

/// Ticks between two readings of a peer's clock.
const SKEW_EVERY: u32 = 10;

/// What a reader read of its peer since the last tick took it.
#[derive(Default)]
struct Inbox {
    entries: Mutex<Vec<(String, Entry)>>,
    /// Its last read failed, and why.
    failing: Mutex<Option<LimiterError>>,
    /// Its peer's clock less this one's, in us (0 until read).
    skew_us: Mutex<i64>,
}

impl Peer for Inbox {
    async fn read(&self, _cursor: &str) -> Result<Vec<(String, Entry)>, LimiterError> {
        let entries = std::mem::take(&mut *self.entries.lock().unwrap_or_else(|e| e.into_inner()));
        if entries.is_empty() {
            if let Some(error) = self
                .failing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
            {
                return Err(error);
            }
        }
        Ok(entries)
    }
}

/// Runs region sync for as long as the runtime does (started once, by `runtime::background`);
/// returns at once without `regions:` or without Redis.
pub async fn keep(policy: Arc<Policy>, live: InForce) {
    let snapshot = live.load_full();
    let config = &snapshot.site.config;
    let (Some(settings), Some(redis), Some(redis_settings)) = (
        config.regions.clone(),
        policy.redis(),
        config.redis.as_ref(),
    ) else {
        return;
    };
    let regions = Arc::clone(&settings.regions);
    let prefix = redis_settings.key_prefix.clone();
    let store = redis.region_store(&prefix, Arc::clone(&regions));
    let inboxes = start_readers(&settings);
    let digest = sync::digest(&regions, &digest_text(config, &prefix));
    let mut sync = RegionSync::new(Arc::clone(&regions), instance(), digest);
    log::info!(
        "region sync: region {} of {}, every {} ms",
        regions.this_name(),
        regions.list.len(),
        regions.every.as_millis()
    );
    let mut ticks = tokio::time::interval(regions.every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        let notes = redis.notes().take();
        let links: Vec<(usize, &Inbox)> = inboxes.iter().map(|(i, inbox)| (*i, &**inbox)).collect();
        let now_us = SystemClock.now_us();
        let ticked = sync.tick(&store, &links, &notes, now_us).await;
        match (ticked, failing) {
            (Ok(tick), _) => {
                if failing {
                    log::info!("region sync: this region's redis answers again");
                }
                failing = false;
                after_tick(&sync, &tick, &inboxes, now_us).await;
            }
            (Err(error), false) => {
                log::warn!("region sync: this region's redis: {error}; retried every tick");
                failing = true;
                failed_tick();
            }
            (Err(_), true) => failed_tick(),
        }
    }
}

/// One reader per peer region, each on its own connection, handing what it reads to an inbox.
fn start_readers(settings: &RegionsSettings) -> Vec<(usize, Arc<Inbox>)> {
    let regions = &settings.regions;
    // A read waits up to T on the stream, then crosses the WAN; connecting takes round trips.
    let deadline = regions.every + regions.max_delay * 4 + Duration::from_secs(2);
    let mut inboxes = Vec::new();
    for (index, peer) in &settings.peers {
        let name = &regions.list[*index].name;
        let (prefix, count) = (&peer.key_prefix, regions.list.len());
        match RegionPeer::new(&peer.topology, &peer.auth, prefix, name, count, deadline) {
            Ok(link) => {
                let inbox = Arc::new(Inbox::default());
                tokio::spawn(read(link, Arc::clone(&inbox), regions.every));
                inboxes.push((*index, inbox));
            }
            Err(error) => log::error!("region sync: region {name}'s redis: {error}; not read"),
        }
    }
    inboxes
}

/// After a tick: a gateway not holding the lease drops what its readers read (the holder's
/// next records are whole); the metrics.
async fn after_tick(sync: &RegionSync, tick: &Tick, inboxes: &[(usize, Arc<Inbox>)], now_us: i64) {
    if !tick.holder {
        for (_, inbox) in inboxes {
            let _ = inbox.read("").await;
        }
    }
    if tick.keys >= MAX_NOTED {
        log::warn!("region sync: {MAX_NOTED} keys of global limits touched in this region: those whose periods end last wait until the set is smaller");
    }
    record(&sync.regions, sync, tick, inboxes, now_us);
}

fn failed_tick() {
    metrics::REGION_SYNC_HOLDER.set(0);
    metrics::REGION_SYNC_TICKS
        .with_label_values(&["failed"])
        .inc();
}

/// Reads `peer`'s stream for ever: each read waits up to `every` for entries, hands them to
/// the next tick, and every [`SKEW_EVERY`] reads the peer's clock too.
async fn read(peer: RegionPeer, inbox: Arc<Inbox>, every: Duration) {
    let mut cursor = "0".to_string();
    let mut reads = 0u32;
    loop {
        if reads % SKEW_EVERY == 0 {
            if let Some(skew) = skew(&peer).await {
                *inbox.skew_us.lock().unwrap_or_else(|e| e.into_inner()) = skew;
            }
        }
        reads = reads.wrapping_add(1);
        match peer.read_waiting(&cursor, every).await {
            Ok(entries) => {
                *inbox.failing.lock().unwrap_or_else(|e| e.into_inner()) = None;
                if let Some((last, _)) = entries.last() {
                    cursor = last.clone();
                }
                inbox
                    .entries
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(entries);
            }
            Err(error) => {
                *inbox.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                tokio::time::sleep(every).await;
            }
        }
    }
}

/// The peer's clock less this one's (us), from one `TIME` round trip: `t_peer - (t0 + t1) / 2`.
async fn skew(peer: &RegionPeer) -> Option<i64> {
    let before = SystemClock.now_us();
    let theirs = peer.time().await.ok()?;
    let after = SystemClock.now_us();
    Some(theirs - (before + after) / 2)
}

/// Metrics of one tick.
fn record(
    regions: &Regions,
    sync: &RegionSync,
    tick: &Tick,
    inboxes: &[(usize, Arc<Inbox>)],
    now_us: i64,
) {
    metrics::REGION_SYNC_HOLDER.set(i64::from(tick.holder));
    let result = if tick.holder { "synced" } else { "standby" };
    metrics::REGION_SYNC_TICKS
        .with_label_values(&[result])
        .inc();
    for (peer, inbox) in inboxes {
        let name: &str = &regions.list[*peer].name;
        let skew_us = *inbox.skew_us.lock().unwrap_or_else(|e| e.into_inner());
        metrics::REGION_CLOCK_SKEW
            .with_label_values(&[name])
            .set(skew_us as f64 / 1e6);
        let state = &sync.peers[*peer];
        if let Some(stale) = sync.staleness_us(*peer, now_us) {
            metrics::REGION_PEER_STALENESS
                .with_label_values(&[name])
                .set(stale as f64 / 1e6);
        }
        metrics::REGION_PEER_MISMATCH
            .with_label_values(&[name])
            .set(i64::from(state.mismatch));
        for (direction, total) in [("in", state.imported), ("out", state.exported)] {
            let counter = metrics::REGION_TRANSFERRED.with_label_values(&[name, direction]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
    if !tick.holder {
        metrics::REGION_LIMIT_UNITS.reset();
    }
    for (limit, standing) in &tick.standing {
        let units = [
            ("room", standing.room),
            ("used", standing.used),
            ("imported", standing.imported),
            ("exported", standing.exported),
        ];
        for (what, value) in units {
            metrics::REGION_LIMIT_UNITS
                .with_label_values(&[limit.as_str(), what])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        }
    }
}

/// What regions must agree on beyond the list: the key prefix, a keyed hash of the key secret
/// (different secrets make different keys) and every global limit with its whole.
fn digest_text(config: &Config, prefix: &str) -> String {
    let (k0, k1) = config.key_secret.keys();
    let secret = xxhash_rust::xxh3::xxh3_64(&[k0.to_le_bytes(), k1.to_le_bytes()].concat());
    format!("{prefix};{secret:x};{}", config.global_limits().join(","))
}

/// This process, among the region's gateways: host and pid.
fn instance() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "gateway".into());
    format!("{host}:{}", std::process::id())
}
