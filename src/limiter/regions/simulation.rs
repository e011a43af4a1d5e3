//! Regions on one manual clock: each with its own store (the twin of what `lua/global.lua` and
//! `lua/regions/` do in its Redis), the real region sync ([`RegionSync`]) ticking every T, and the
//! WAN between them: a delay per direction, jitter that keeps order, partitions and regions
//! killed and restarted. Requests arrive by a pattern; every window's admissions are checked
//! against the limit (strict) or its bound (approx), and compared with what one shared store
//! would have admitted (the requests wrongly refused). Deterministic: a seed replays a run.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::ledger::Ledger;
use super::notes::Note;
use super::plan::Give;
use super::sync::{digest, Apply, Entry, Here, Peer, RegionSync};
use super::{Consistency, Kind, Region, Regions, MAX_REGIONS};
use crate::limiter::error::LimiterError;
use crate::limiter::leased::simulation::Dice;

/// How requests arrive across regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly, each request at a region drawn at random.
    Steady,
    /// 80 % to the first region, 15 % to the second, the rest to the others.
    Skewed,
    /// All to one region, moving to the next every window.
    Shifting,
    /// One client sending to each region in turn (an attacker spreading its load).
    RoundRobin,
}

/// One run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub regions: usize,
    pub consistency: Consistency,
    /// Units per window across regions.
    pub limit: u64,
    pub window: Duration,
    /// T.
    pub every: Duration,
    /// One-way delays, `delays[from][to]`.
    pub delays: [[Duration; MAX_REGIONS]; MAX_REGIONS],
    /// At most this much more, drawn per entry, order kept.
    pub jitter: Duration,
    pub pattern: Pattern,
    /// Requests per window offered, across regions (a multiple of the limit: 3 is three times).
    pub offered_per_window: u64,
    /// Regions cut off from every other: (region, from, until).
    pub cuts: Vec<(usize, Duration, Duration)>,
    /// Regions killed (gateway and store, the store kept as persisted) and back: (region, at, back).
    pub kills: Vec<(usize, Duration, Duration)>,
    pub length: Duration,
    pub seed: u64,
}

/// What one window saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub start: Duration,
    pub offered: u64,
    pub admitted: u64,
    /// What one shared store would have admitted of the same requests.
    pub shared: u64,
    /// The most it may admit: the limit (strict), or the limit and the approx bound.
    pub bound: u64,
    /// A partition or a killed region fell in it.
    pub faulted: bool,
}

/// A run's windows, and the invariant checked after every event.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub windows: Vec<Window>,
    /// The largest sum of parts and units in flight seen (strict; never above the limit).
    pub most_committed: u64,
}

impl Report {
    /// Requests one shared store would have admitted and these regions refused, in percent of
    /// what it admitted.
    pub fn wrongly_refused_percent(&self) -> f64 {
        let shared: u64 = self.windows.iter().map(|w| w.shared).sum();
        let lost: u64 = self
            .windows
            .iter()
            .map(|w| w.shared.saturating_sub(w.admitted))
            .sum();
        100.0 * lost as f64 / shared.max(1) as f64
    }

    /// The first window admitting past its bound.
    pub fn breach(&self) -> Option<&Window> {
        self.windows.iter().find(|w| w.admitted > w.bound)
    }
}

/// One region's store: the ledgers, the keys touched, the sync lease and the stream, with
/// what the twin of each script does.
#[derive(Default)]
struct Store {
    ledgers: BTreeMap<Vec<u8>, Ledger>,
    touched: BTreeMap<String, Note>,
    lease: Option<String>,
    /// Each entry with when each reader may see it.
    stream: Vec<(Entry, [i64; MAX_REGIONS])>,
}

impl Store {
    /// The ledger of `key` in the period `[start, end)`: a new period's replaces the old.
    fn ledger(&mut self, key: &[u8], start_us: i64, end_us: i64) -> &mut Ledger {
        let ledger = self.ledgers.entry(key.to_vec()).or_default();
        if !ledger.is_period(start_us, end_us) {
            *ledger = Ledger {
                start_us,
                end_us,
                ..Ledger::default()
            };
        }
        ledger
    }
}

/// A region's store as its own sync sees it, at one instant.
struct HereAt<'a> {
    store: &'a Mutex<Store>,
    regions: &'a Regions,
    now_us: i64,
}

impl HereAt<'_> {
    fn with<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.store.lock().expect("not poisoned"))
    }
}

impl Here for HereAt<'_> {
    async fn note(&self, notes: &[Note]) -> Result<(), LimiterError> {
        self.with(|s| {
            for note in notes {
                s.touched.insert(note.member(), note.clone());
            }
        });
        Ok(())
    }

    async fn hold(&self, instance: &str, life: Duration) -> Result<bool, LimiterError> {
        Ok(self.with(|s| {
            if life.is_zero() {
                s.lease = None;
                return false;
            }
            let holds = s.lease.as_deref().is_none_or(|held| held == instance);
            if holds {
                s.lease = Some(instance.to_string());
            }
            holds
        }))
    }

    async fn touched(&self, now_us: i64) -> Result<Vec<Note>, LimiterError> {
        Ok(self.with(|s| {
            s.touched.retain(|_, note| note.end_us > now_us);
            s.touched.values().cloned().collect()
        }))
    }

    async fn ledgers(&self, keys: &[&[u8]]) -> Result<Vec<Ledger>, LimiterError> {
        Ok(self.with(|s| {
            keys.iter()
                .map(|key| s.ledgers.get(*key).cloned().unwrap_or_default())
                .collect()
        }))
    }

    async fn apply(&self, applies: &[Apply]) -> Result<u64, LimiterError> {
        let regions = self.regions;
        Ok(self.with(|s| {
            let mut changed = 0;
            for apply in applies {
                if apply.end_us <= self.now_us {
                    continue;
                }
                let stored = s.ledgers.get(&apply.key);
                if stored.is_some_and(|l| {
                    !l.is_period(apply.start_us, apply.end_us) && l.start_us >= apply.end_us
                }) {
                    continue;
                }
                let ledger = s.ledger(&apply.key, apply.start_us, apply.end_us);
                let Some((kind, name)) = apply.field.split_once(':') else {
                    continue;
                };
                let Some(at) = regions.index_of(name) else {
                    continue;
                };
                let total = match kind {
                    "i" => &mut ledger.given_in[at],
                    _ => &mut ledger.counted[at],
                };
                if apply.total > *total {
                    *total = apply.total;
                    changed += 1;
                }
            }
            changed
        }))
    }

    async fn give(&self, gives: &[Give]) -> Result<Vec<(u64, u64)>, LimiterError> {
        Ok(self.with(|s| {
            gives
                .iter()
                .map(|give| {
                    let note = &give.note;
                    let ledger = s.ledger(&note.key, note.start_us, note.end_us);
                    let units = give.units.min(ledger.unspent(give.base));
                    ledger.given_out[give.taker] += units;
                    (
                        units,
                        if units > 0 {
                            ledger.given_out[give.taker]
                        } else {
                            0
                        },
                    )
                })
                .collect()
        }))
    }

    async fn publish(&self, entry: &Entry) -> Result<(), LimiterError> {
        // Each reader's visibility is set by the world (`World::publish`).
        self.with(|s| s.stream.push((entry.clone(), [i64::MAX; MAX_REGIONS])));
        Ok(())
    }
}

/// A peer's stream as one reader sees it, at one instant.
struct PeerAt<'a> {
    store: &'a Mutex<Store>,
    reader: usize,
    now_us: i64,
    cut: bool,
}

impl Peer for PeerAt<'_> {
    async fn read(&self, cursor: &str) -> Result<Vec<(String, Entry)>, LimiterError> {
        if self.cut {
            return Err(LimiterError::Timeout(0));
        }
        let after: usize = cursor.parse().unwrap_or(0);
        let store = self.store.lock().expect("not poisoned");
        Ok(store
            .stream
            .iter()
            .enumerate()
            .skip(after)
            .take_while(|(_, (_, visible))| visible[self.reader] <= self.now_us)
            .map(|(at, (entry, _))| ((at + 1).to_string(), entry.clone()))
            .collect())
    }
}

/// Runs a future that never waits (every store here answers at once).
fn ready<T>(future: impl Future<Output = T>) -> T {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("the simulation's stores never wait"),
    }
}

/// The regions of a scenario, weighted equally, region 0 home.
pub fn regions_of(scenario: &Scenario, this: usize) -> Regions {
    let names = ["us-east", "eu-west", "ap-south", "sa-east"];
    Regions {
        this,
        list: (0..scenario.regions)
            .map(|r| Region {
                name: names[r].into(),
                weight: 1,
            })
            .collect(),
        every: scenario.every,
        max_delay: scenario
            .delays
            .iter()
            .flatten()
            .max()
            .copied()
            .unwrap_or_default(),
        home: 0,
        seed_percent: 1,
    }
}

const KEY: &[u8] = b"sluice:{global}:k";

/// Runs `scenario`.
pub fn run(scenario: &Scenario) -> Report {
    World::new(scenario).play()
}

struct World<'a> {
    scenario: &'a Scenario,
    regions: Vec<Arc<Regions>>,
    stores: Vec<Mutex<Store>>,
    syncs: Vec<Option<RegionSync>>,
    notes: Vec<Vec<Note>>,
    dice: Dice,
    last_visible: [[i64; MAX_REGIONS]; MAX_REGIONS],
    report: Report,
}

impl<'a> World<'a> {
    fn new(scenario: &'a Scenario) -> World<'a> {
        let regions: Vec<Arc<Regions>> = (0..scenario.regions)
            .map(|r| Arc::new(regions_of(scenario, r)))
            .collect();
        let syncs = regions.iter().map(|r| Some(sync_of(r))).collect();
        World {
            scenario,
            stores: (0..scenario.regions).map(|_| Mutex::default()).collect(),
            syncs,
            notes: vec![Vec::new(); scenario.regions],
            regions,
            dice: Dice(scenario.seed | 1),
            last_visible: [[0; MAX_REGIONS]; MAX_REGIONS],
            report: Report::default(),
        }
    }

    fn at(&self, faults: &[(usize, Duration, Duration)], region: usize, now_us: i64) -> bool {
        faults.iter().any(|&(r, from, until)| {
            r == region && (from.as_micros() as i64) <= now_us && now_us < until.as_micros() as i64
        })
    }

    fn dead(&self, region: usize, now_us: i64) -> bool {
        self.at(&self.scenario.kills, region, now_us)
    }

    fn cut(&self, a: usize, b: usize, now_us: i64) -> bool {
        self.at(&self.scenario.cuts, a, now_us)
            || self.at(&self.scenario.cuts, b, now_us)
            || self.dead(a, now_us)
            || self.dead(b, now_us)
    }

    fn play(mut self) -> Report {
        let s = self.scenario;
        let window_us = s.window.as_micros() as i64;
        let every_us = s.every.as_micros() as i64;
        let length_us = s.length.as_micros() as i64;
        let gap_us = (window_us / s.offered_per_window.max(1) as i64).max(1);
        // Events: ticks of each region (phases spread over T), arrivals every gap.
        let mut next_tick: Vec<i64> = (0..s.regions)
            .map(|r| every_us * (r as i64 + 1) / (s.regions as i64 + 1))
            .collect();
        let mut arrival = 0i64;
        let mut sent = 0u64;
        let mut shared_count = (i64::MIN, 0u64);
        let mut window = self.new_window(0);
        while arrival < length_us {
            let tick = next_tick
                .iter()
                .enumerate()
                .min_by_key(|(_, t)| **t)
                .map(|(r, t)| (r, *t));
            if let Some((region, at)) = tick.filter(|(_, at)| *at <= arrival) {
                self.tick(region, at);
                next_tick[region] += every_us;
                continue;
            }
            let now = arrival;
            if now / window_us != window.start.as_micros() as i64 / window_us {
                self.close(window);
                window = self.new_window(now - now % window_us);
            }
            let region = self.pick(sent, now, window_us);
            sent += 1;
            arrival += gap_us;
            window.offered += 1;
            let (start, end) = (now - now % window_us, now - now % window_us + window_us);
            if shared_count.0 != start {
                shared_count = (start, 0);
            }
            if shared_count.1 < s.limit {
                shared_count.1 += 1;
                window.shared += 1;
            }
            if self.dead(region, now) {
                continue;
            }
            if self.admit(region, start, end) {
                window.admitted += 1;
            }
            self.check_invariant(start, end);
        }
        self.close(window);
        self.report
    }

    fn new_window(&self, start_us: i64) -> Window {
        Window {
            start: Duration::from_micros(start_us as u64),
            offered: 0,
            admitted: 0,
            shared: 0,
            bound: self.scenario.limit,
            faulted: false,
        }
    }

    /// Closes `window`: its bound, and whether a fault fell in it.
    fn close(&mut self, mut window: Window) {
        let s = self.scenario;
        let (from, until) = (window.start, window.start + s.window);
        window.faulted = s
            .cuts
            .iter()
            .chain(&s.kills)
            .any(|&(_, a, b)| a < until && b > from);
        if s.consistency == Consistency::Approx {
            window.bound = s.limit + approx_excess(s, window.offered, window.faulted);
        }
        self.report.windows.push(window);
    }

    fn pick(&mut self, sent: u64, now_us: i64, window_us: i64) -> usize {
        let n = self.scenario.regions as u64;
        match self.scenario.pattern {
            Pattern::Steady => self.dice.below(n) as usize,
            Pattern::Skewed => match self.dice.below(100) {
                0..80 => 0,
                80..95 => 1,
                _ => (2 + self.dice.below(n.saturating_sub(2).max(1))) as usize % n as usize,
            },
            Pattern::Shifting => ((now_us / window_us) as u64 % n) as usize,
            Pattern::RoundRobin => (sent % n) as usize,
        }
    }

    fn admit(&mut self, region: usize, start: i64, end: i64) -> bool {
        let regions = &self.regions[region];
        let kind = kind_of(self.scenario.consistency);
        let base = kind.base(regions, region, self.scenario.limit);
        let mut store = self.stores[region].lock().expect("not poisoned");
        let ledger = store.ledger(KEY, start, end);
        let admitted = ledger.used < ledger.room(base);
        if admitted {
            ledger.used += 1;
        }
        drop(store);
        self.notes[region].push(Note {
            key: KEY.to_vec(),
            limit: "global".into(),
            kind,
            whole: self.scenario.limit,
            start_us: start,
            end_us: end,
        });
        admitted
    }

    fn tick(&mut self, region: usize, now_us: i64) {
        if self.dead(region, now_us) {
            // Its gateway is gone, and its memory with it.
            self.syncs[region] = None;
            self.notes[region].clear();
            return;
        }
        let regions = Arc::clone(&self.regions[region]);
        let mut sync = self.syncs[region]
            .take()
            .unwrap_or_else(|| sync_of(&regions));
        let cut: Vec<bool> = (0..self.scenario.regions)
            .map(|p| self.cut(region, p, now_us))
            .collect();
        let notes = std::mem::take(&mut self.notes[region]);
        let here = HereAt {
            store: &self.stores[region],
            regions: &regions,
            now_us,
        };
        let peers: Vec<(usize, PeerAt<'_>)> = (0..self.scenario.regions)
            .filter(|&p| p != region)
            .map(|p| {
                let peer = PeerAt {
                    store: &self.stores[p],
                    reader: region,
                    now_us,
                    cut: cut[p],
                };
                (p, peer)
            })
            .collect();
        let links: Vec<(usize, &PeerAt<'_>)> = peers.iter().map(|(p, l)| (*p, l)).collect();
        let published =
            ready(sync.tick(&here, &links, &notes, now_us)).is_ok_and(|tick| tick.holder);
        drop(links);
        drop(peers);
        self.syncs[region] = Some(sync);
        if published {
            self.stamp(region, now_us);
        }
    }

    /// Sets when each reader may see `region`'s latest entry: its delay, plus jitter, never
    /// before the entry before it (the WAN keeps order).
    fn stamp(&mut self, region: usize, now_us: i64) {
        let s = self.scenario;
        let jitter_us = s.jitter.as_micros() as u64;
        let mut visible = [i64::MAX; MAX_REGIONS];
        for (reader, slot) in visible.iter_mut().enumerate().take(s.regions) {
            let delay = s.delays[region][reader].as_micros() as i64;
            let jitter = self.dice.below(jitter_us + 1) as i64;
            let at = (now_us + delay + jitter).max(self.last_visible[region][reader]);
            self.last_visible[region][reader] = at;
            *slot = at;
        }
        let mut store = self.stores[region].lock().expect("not poisoned");
        if let Some(last) = store.stream.last_mut() {
            last.1 = visible;
        }
    }

    /// Strict: the regions' rooms and the units in flight never sum past the limit.
    fn check_invariant(&mut self, start: i64, end: i64) {
        if self.scenario.consistency != Consistency::Strict {
            return;
        }
        let kind = kind_of(self.scenario.consistency);
        let ledgers: Vec<Ledger> = self
            .stores
            .iter()
            .map(|s| {
                let mut store = s.lock().expect("not poisoned");
                store.ledger(KEY, start, end).clone()
            })
            .collect();
        let mut committed = 0u64;
        for (r, ledger) in ledgers.iter().enumerate() {
            let base = kind.base(&self.regions[r], r, self.scenario.limit);
            committed += ledger.room(base).max(ledger.used);
            for (t, other) in ledgers.iter().enumerate() {
                committed += ledger.given_out[t].saturating_sub(other.given_in[r]);
            }
        }
        self.report.most_committed = self.report.most_committed.max(committed);
    }
}

fn kind_of(consistency: Consistency) -> Kind {
    match consistency {
        Consistency::Strict => Kind::Strict,
        Consistency::Approx => Kind::Approx,
    }
}

fn sync_of(regions: &Arc<Regions>) -> RegionSync {
    let name = regions.this_name().to_string();
    RegionSync::new(Arc::clone(regions), name, digest(regions, ""))
}

/// Approx's bound on the excess of one window: the others' admissions within the staleness of
/// a count, `rate × (2T + d + jitter)`, at most `(N − 1) × limit`; with a partition or a lost
/// region in the window, only the latter.
pub fn approx_excess(s: &Scenario, offered: u64, faulted: bool) -> u64 {
    let cap = (s.regions as u64 - 1) * s.limit;
    if faulted {
        return cap;
    }
    let d = s.delays.iter().flatten().max().copied().unwrap_or_default();
    let staleness = 2 * s.every + d + s.jitter;
    let rate = offered as f64 / s.window.as_secs_f64();
    ((rate * staleness.as_secs_f64()).ceil() as u64).min(cap)
}

/// Delays of `ms` one way between every pair.
pub fn uniform_delays(ms: u64) -> [[Duration; MAX_REGIONS]; MAX_REGIONS] {
    let mut delays = [[Duration::ZERO; MAX_REGIONS]; MAX_REGIONS];
    for (from, row) in delays.iter_mut().enumerate() {
        for (to, delay) in row.iter_mut().enumerate() {
            if from != to {
                *delay = Duration::from_millis(ms);
            }
        }
    }
    delays
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn scenario(pattern: Pattern, consistency: Consistency) -> Scenario {
        let mut delays = uniform_delays(150);
        (delays[0][1], delays[1][0]) = (Duration::from_millis(80), Duration::from_millis(80));
        (delays[0][2], delays[2][0]) = (Duration::from_millis(250), Duration::from_millis(250));
        Scenario {
            regions: 3,
            consistency,
            limit: 1000,
            window: Duration::from_secs(60),
            every: Duration::from_secs(1),
            delays,
            jitter: Duration::from_millis(10),
            pattern,
            offered_per_window: 3000,
            cuts: Vec::new(),
            kills: Vec::new(),
            length: Duration::from_secs(300),
            seed: 7,
        }
    }

    /// The table of docs/multi-region.md's simulation section: `cargo test --lib
    /// regions::simulation -- --nocapture` prints it.
    #[test]
    fn every_pattern_keeps_its_bound_and_the_requests_wrongly_refused_are_told() {
        println!(
            "| consistency | pattern | faults | most admitted / window | bound | wrongly refused |"
        );
        println!("| --- | --- | --- | --- | --- | --- |");
        for consistency in [Consistency::Strict, Consistency::Approx] {
            for pattern in [
                Pattern::Steady,
                Pattern::Skewed,
                Pattern::Shifting,
                Pattern::RoundRobin,
            ] {
                for faults in [false, true] {
                    let mut s = scenario(pattern, consistency);
                    if faults {
                        s.cuts = vec![(1, Duration::from_secs(70), Duration::from_secs(80))];
                        s.kills = vec![(2, Duration::from_secs(150), Duration::from_secs(170))];
                    }
                    let report = run(&s);
                    assert_eq!(
                        report.breach(),
                        None,
                        "{consistency:?} {pattern:?} {faults}"
                    );
                    let most = report.windows.iter().map(|w| w.admitted).max().unwrap_or(0);
                    let bound = report.windows.iter().map(|w| w.bound).max().unwrap_or(0);
                    let refused = report.wrongly_refused_percent();
                    println!(
                        "| {} | {pattern:?} | {} | {most} | {bound} | {refused:.1} % |",
                        consistency.name(),
                        if faults {
                            "cut 10 s, region lost 20 s"
                        } else {
                            "none"
                        },
                    );
                    if !faults && pattern == Pattern::Steady && consistency == Consistency::Strict {
                        assert!(
                            refused <= 5.0,
                            "steady traffic: {refused:.1} % wrongly refused"
                        );
                    }
                }
            }
        }
    }

    fn scenarios() -> impl Strategy<Value = Scenario> {
        let delay = prop::sample::select(vec![80u64, 150, 250]);
        (
            2usize..=4,
            prop::bool::ANY,
            prop::sample::select(vec![
                Pattern::Steady,
                Pattern::Skewed,
                Pattern::Shifting,
                Pattern::RoundRobin,
            ]),
            prop::sample::select(vec![100u64, 250, 500, 1000]),
            prop::collection::vec(delay, 16),
            0u64..=30,
            50u64..=1000,
            1u64..=5,
            prop::collection::vec((0usize..4, 0u64..40, 1u64..=10), 0..=2),
            prop::collection::vec((0usize..4, 0u64..40, 1u64..=15), 0..=1),
            any::<u64>(),
        )
            .prop_map(
                |(
                    regions,
                    approx,
                    pattern,
                    every,
                    delays,
                    jitter,
                    limit,
                    times,
                    cuts,
                    kills,
                    seed,
                )| {
                    let mut table = [[Duration::ZERO; MAX_REGIONS]; MAX_REGIONS];
                    for from in 0..regions {
                        for to in 0..regions {
                            if from != to {
                                table[from][to] = Duration::from_millis(delays[from * 4 + to]);
                            }
                        }
                    }
                    let faults = |list: Vec<(usize, u64, u64)>| {
                        list.into_iter()
                            .map(|(r, at, len)| {
                                (
                                    r % regions,
                                    Duration::from_secs(at),
                                    Duration::from_secs(at + len),
                                )
                            })
                            .collect()
                    };
                    Scenario {
                        regions,
                        consistency: if approx {
                            Consistency::Approx
                        } else {
                            Consistency::Strict
                        },
                        limit,
                        window: Duration::from_secs(10),
                        every: Duration::from_millis(every),
                        delays: table,
                        jitter: Duration::from_millis(jitter),
                        pattern,
                        offered_per_window: limit * times,
                        cuts: faults(cuts),
                        kills: faults(kills),
                        length: Duration::from_secs(50),
                        seed,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// Strict never admits past the limit in any window, and its parts and the units in
        /// flight never sum past it; approx stays within its bound. Under any delays, jitter,
        /// period, partitions and lost regions.
        #[test]
        fn no_window_admits_past_its_bound(s in scenarios()) {
            let report = run(&s);
            prop_assert_eq!(report.breach(), None);
            if s.consistency == Consistency::Strict {
                prop_assert!(report.most_committed <= s.limit, "{} > {}", report.most_committed, s.limit);
            }
        }
    }
}
