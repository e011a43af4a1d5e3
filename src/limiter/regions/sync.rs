//! One tick of region sync, every exchange period T, on every gateway: note the keys it decided
//! on; then, on the one gateway of the region holding the sync lease, read what the peers
//! published, apply what they gave this region (strict) or counted (approx), give unspent units
//! where they are wanted, and publish this region's records. No gateway ever writes to another
//! region's Redis: [`Here`] is this region's, each [`Peer`] only read.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::ledger::{field, Ledger, Record};
use super::notes::Note;
use super::plan::{self, Give, Heard, Recent};
use super::{Kind, Regions, MAX_REGIONS};
use crate::limiter::error::LimiterError;
use crate::limiter::pairs::{paired, Mismatch};

/// What one region publishes each tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub from: String,
    /// When it was published, on the publisher's clock (us).
    pub at_us: i64,
    /// The digest of the publisher's regions and global limits: a peer whose digest differs is
    /// configured differently, and nothing of it is applied.
    pub digest: String,
    pub records: Vec<Record>,
}

/// A total a peer published, to apply to this region's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Apply {
    pub key: Vec<u8>,
    pub start_us: i64,
    pub end_us: i64,
    /// `i:<giver>` or `r:<region>`.
    pub field: String,
    pub total: u64,
}

/// This region's store (its Redis), as region sync uses it.
pub trait Here: Send + Sync {
    /// Adds `notes` to the region's set of keys touched.
    fn note(&self, notes: &[Note]) -> impl Future<Output = Result<(), LimiterError>> + Send;
    /// Takes or keeps the sync lease for `life` (`Duration::ZERO`: gives it up); whether
    /// `instance` holds it.
    fn hold(
        &self,
        instance: &str,
        life: Duration,
    ) -> impl Future<Output = Result<bool, LimiterError>> + Send;
    /// The keys touched whose period has not ended at `now_us`.
    fn touched(&self, now_us: i64) -> impl Future<Output = Result<Vec<Note>, LimiterError>> + Send;
    /// The ledgers of `keys`, in order (an absent key's is empty).
    fn ledgers(
        &self,
        keys: &[&[u8]],
    ) -> impl Future<Output = Result<Vec<Ledger>, LimiterError>> + Send;
    /// Applies each total; how many changed a key.
    fn apply(&self, applies: &[Apply]) -> impl Future<Output = Result<u64, LimiterError>> + Send;
    /// Gives each; per give, the units given and the taker's new total.
    fn give(
        &self,
        gives: &[Give],
    ) -> impl Future<Output = Result<Vec<(u64, u64)>, LimiterError>> + Send;
    /// Publishes `entry` on this region's stream.
    fn publish(&self, entry: &Entry) -> impl Future<Output = Result<(), LimiterError>> + Send;
}

/// Another region's store, only read: its stream of entries.
pub trait Peer: Send + Sync {
    /// The entries after `cursor` ("0": from the start), each with its own cursor.
    fn read(
        &self,
        cursor: &str,
    ) -> impl Future<Output = Result<Vec<(String, Entry)>, LimiterError>> + Send;
}

/// What region sync knows of one peer.
#[derive(Debug, Clone, Default)]
pub struct PeerState {
    pub cursor: Option<String>,
    /// When its latest entry was published (its clock, us).
    pub last_at_us: Option<i64>,
    /// Its digest differs from this region's.
    pub mismatch: bool,
    /// Units it gave this region, and this region gave it, in total over the process's life
    /// (metrics): grown by each newly applied or given total.
    pub imported: u64,
    pub exported: u64,
    /// Its last read failed.
    pub unreachable: bool,
}

/// What one tick did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tick {
    pub holder: bool,
    pub keys: usize,
    pub applied: u64,
    pub gave: u64,
    pub transfers: u64,
    /// Per limit (by name), where this region stands over its keys in their current periods.
    pub standing: BTreeMap<String, Standing>,
}

/// Where this region stands on one limit's keys, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// What it may count to (its part, moved by transfers; approx: less the others' counts).
    pub room: u64,
    pub used: u64,
    /// Units the other regions gave it, and it gave them, this period.
    pub imported: u64,
    pub exported: u64,
}

/// Region sync's memory, kept by one gateway across ticks.
pub struct RegionSync {
    pub regions: Arc<Regions>,
    instance: String,
    digest: String,
    pub peers: [PeerState; MAX_REGIONS],
    heard: HashMap<Vec<u8>, [Option<Heard>; MAX_REGIONS]>,
    recent: HashMap<Vec<u8>, Recent>,
}

impl RegionSync {
    pub fn new(regions: Arc<Regions>, instance: String, digest: String) -> RegionSync {
        RegionSync {
            regions,
            instance,
            digest,
            peers: Default::default(),
            heard: HashMap::new(),
            recent: HashMap::new(),
        }
    }

    /// How long the lease lives without being kept: three exchange periods.
    pub fn lease_life(&self) -> Duration {
        self.regions.every * 3
    }

    /// One tick at `now_us`: `notes` are this gateway's since the last.
    pub async fn tick<H: Here, P: Peer>(
        &mut self,
        here: &H,
        peers: &[(usize, &P)],
        notes: &[Note],
        now_us: i64,
    ) -> Result<Tick, LimiterError> {
        if !notes.is_empty() {
            here.note(notes).await?;
        }
        let mut tick = Tick::default();
        if !here.hold(&self.instance, self.lease_life()).await? {
            return Ok(tick);
        }
        tick.holder = true;
        let touched = latest_periods(here.touched(now_us).await?);
        let (applies, touched) = self.hear(peers, now_us, touched).await;
        tick.applied = here.apply(&applies).await?;
        let keys: Vec<&[u8]> = touched.iter().map(|n| n.key.as_slice()).collect();
        let ledgers = here.ledgers(&keys).await?;
        let mut keyed: Vec<(Note, Ledger)> = paired("keys and their ledgers", &touched, &ledgers)
            .map_err(mismatched)?
            .map(|(note, ledger)| (note.clone(), ledger.clone()))
            .collect();
        let gives = self.plan(&keyed, now_us);
        let given = here.give(&gives).await?;
        for (give, &(units, total)) in paired("gives and their answers", &gives, &given)
            .map_err(mismatched)?
            .filter(|(_, (units, _))| *units > 0)
        {
            tick.gave += units;
            tick.transfers += 1;
            self.peers[give.taker].exported += units;
            if let Some((_, ledger)) = keyed.iter_mut().find(|(n, _)| n.key == give.note.key) {
                ledger.given_out[give.taker] = total;
            }
        }
        tick.keys = keyed.len();
        tick.standing = self.standing(&keyed);
        here.publish(&self.entry(&keyed, now_us)).await?;
        self.forget_ended(now_us, &touched);
        Ok(tick)
    }

    /// What this region gives this tick, of every strict key (`plan::gives`), each key's
    /// recent count remembered.
    fn plan(&mut self, keyed: &[(Note, Ledger)], now_us: i64) -> Vec<Give> {
        let mut gives = Vec::new();
        let empty: [Option<Heard>; MAX_REGIONS] = Default::default();
        for (note, ledger) in keyed {
            let recent = self.recent.entry(note.key.clone()).or_default();
            let heard = self.heard.get(&note.key).unwrap_or(&empty);
            let regions = &self.regions;
            gives.extend(plan::gives(regions, now_us, note, ledger, heard, recent));
            plan::remember(recent, ledger.used, now_us);
        }
        gives
    }

    /// Reads every peer's entries since its cursor: what to apply here, and every key a peer
    /// published that this region must publish and give of too.
    async fn hear<P: Peer>(
        &mut self,
        peers: &[(usize, &P)],
        now_us: i64,
        touched: Vec<Note>,
    ) -> (Vec<Apply>, Vec<Note>) {
        let mut touched = Touched::new(touched);
        let mut applies = Vec::new();
        for &(peer, link) in peers {
            let cursor = self.peers[peer]
                .cursor
                .clone()
                .unwrap_or_else(|| "0".into());
            let entries = match link.read(&cursor).await {
                Ok(entries) => entries,
                Err(error) => {
                    if !self.peers[peer].unreachable {
                        log::warn!(
                            "region sync: region {} is unreachable: {error}",
                            self.regions.list[peer].name
                        );
                    }
                    self.peers[peer].unreachable = true;
                    continue;
                }
            };
            self.peers[peer].unreachable = false;
            for (cursor, entry) in entries {
                self.peers[peer].cursor = Some(cursor);
                self.hear_entry(peer, entry, now_us, &mut touched, &mut applies);
            }
        }
        (applies, touched.notes)
    }

    fn hear_entry(
        &mut self,
        peer: usize,
        entry: Entry,
        now_us: i64,
        touched: &mut Touched,
        applies: &mut Vec<Apply>,
    ) {
        let state = &mut self.peers[peer];
        if entry.digest != self.digest {
            if !state.mismatch {
                log::error!(
                    "region sync: region {} is configured differently (its regions or global limits differ): nothing it publishes is applied",
                    entry.from
                );
            }
            state.mismatch = true;
            return;
        }
        state.mismatch = false;
        state.last_at_us = Some(state.last_at_us.map_or(entry.at_us, |t| t.max(entry.at_us)));
        let regions = Arc::clone(&self.regions);
        let (this, name) = (regions.this, &regions.list[peer].name);
        for record in entry.records.into_iter().filter(|r| r.note.end_us > now_us) {
            let (field, total) = match record.note.kind {
                Kind::Approx => (field('r', name), record.used),
                Kind::Strict | Kind::Quota => (field('i', name), record.given_out[this]),
            };
            if total > 0 {
                applies.push(Apply {
                    key: record.note.key.clone(),
                    start_us: record.note.start_us,
                    end_us: record.note.end_us,
                    field,
                    total,
                });
            }
            touched.add(&record);
            self.remember_heard(peer, record, entry.at_us);
        }
    }

    /// Keeps `record` as `peer`'s latest of its key, with its count before (for its rate), and
    /// counts what it newly gave this region.
    fn remember_heard(&mut self, peer: usize, record: Record, at_us: i64) {
        let this = self.regions.this;
        let heard = self.heard.entry(record.note.key.clone()).or_default();
        let same = heard[peer]
            .as_ref()
            .filter(|h| h.record.note.end_us == record.note.end_us);
        let before = same.map(|h| (h.record.used, h.at_us));
        let had = same.map_or(0, |h| h.record.given_out[this]);
        self.peers[peer].imported += record.given_out[this].saturating_sub(had);
        heard[peer] = Some(Heard {
            record,
            at_us,
            before,
        });
    }

    /// Per limit, the sums of its keys' ledgers.
    fn standing(&self, keyed: &[(Note, Ledger)]) -> BTreeMap<String, Standing> {
        let mut standing: BTreeMap<String, Standing> = BTreeMap::new();
        for (note, ledger) in keyed {
            let base = note.kind.base(&self.regions, self.regions.this, note.whole);
            let sums = standing.entry(note.limit.clone()).or_default();
            let known = ledger.is_period(note.start_us, note.end_us);
            sums.room += if known { ledger.room(base) } else { base };
            if known {
                sums.used += ledger.used;
                sums.imported += ledger.given_in.iter().sum::<u64>();
                sums.exported += ledger.given_out.iter().sum::<u64>();
            }
        }
        standing
    }

    /// This region's entry: a record per key touched.
    fn entry(&self, keyed: &[(Note, Ledger)], now_us: i64) -> Entry {
        let records = keyed
            .iter()
            .map(|(note, ledger)| {
                let base = note.kind.base(&self.regions, self.regions.this, note.whole);
                let known = ledger.is_period(note.start_us, note.end_us);
                Record {
                    note: note.clone(),
                    used: if known { ledger.used } else { 0 },
                    room: ledger.room(base),
                    given_in: ledger.given_in,
                    given_out: ledger.given_out,
                }
            })
            .collect();
        Entry {
            from: self.regions.this_name().to_string(),
            at_us: now_us,
            digest: self.digest.clone(),
            records,
        }
    }

    /// Forgets what peers said of periods that ended, and the recent counts of keys no longer
    /// touched.
    fn forget_ended(&mut self, now_us: i64, touched: &[Note]) {
        self.heard.retain(|_, peers| {
            peers
                .iter()
                .flatten()
                .any(|heard| heard.record.note.end_us > now_us)
        });
        let live: std::collections::HashSet<&[u8]> =
            touched.iter().map(|n| n.key.as_slice()).collect();
        self.recent.retain(|key, _| live.contains(key.as_slice()));
    }

    /// How old the latest entry of `peer` is at `now_us` (its clock against this one's).
    pub fn staleness_us(&self, peer: usize, now_us: i64) -> Option<i64> {
        self.peers[peer].last_at_us.map(|at| (now_us - at).max(0))
    }
}

/// The keys region sync keeps this tick: those touched here, and those a peer published.
struct Touched {
    notes: Vec<Note>,
    keys: std::collections::HashSet<Vec<u8>>,
}

impl Touched {
    fn new(notes: Vec<Note>) -> Touched {
        let keys = notes.iter().map(|n| n.key.clone()).collect();
        Touched { notes, keys }
    }

    /// Adds the key of `record`, unless it is kept already.
    fn add(&mut self, record: &Record) {
        if self.keys.insert(record.note.key.clone()) {
            self.notes.push(record.note.clone());
        }
    }
}

/// A store's answers that do not pair with what was asked (a bug of the store).
fn mismatched(mismatch: Mismatch) -> LimiterError {
    LimiterError::Reply(format!(
        "region sync: {} do not pair: {} and {}",
        mismatch.at, mismatch.left, mismatch.right
    ))
}

/// One note per key: the one of its latest period (a key noted in two periods, or under two
/// wholes across a reload, is kept in its latest).
fn latest_periods(notes: Vec<Note>) -> Vec<Note> {
    let mut latest: std::collections::BTreeMap<Vec<u8>, Note> = Default::default();
    for note in notes {
        match latest.get(&note.key) {
            Some(kept) if kept.end_us >= note.end_us => {}
            _ => {
                latest.insert(note.key.clone(), note);
            }
        }
    }
    latest.into_values().collect()
}

/// The digest of what regions must agree on: the regions, their weights and order, home and
/// seed, and `more` (the global limits' keys and wholes, the key prefix's keyed hash).
pub fn digest(regions: &Regions, more: &str) -> String {
    let mut text = String::new();
    for region in &regions.list {
        text.push_str(&format!("{}={};", region.name, region.weight));
    }
    text.push_str(&format!(
        "home={};seed={};{more}",
        regions.list[regions.home].name, regions.seed_percent
    ));
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
}
