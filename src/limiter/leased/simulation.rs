//! Test support, for this crate's property test of leases and `tests/leases.rs` (not used by the
//! gateway): gateways leasing one route's limits from one backend on one timeline, a traffic
//! of bursts and silences at random gateways, clients and costs, and the ledger that holds what
//! the backend stores to what its limits admitted (issue 50):
//! * a window's or calendar period's count is what it admitted plus what the gateways hold (in
//!   its last milliseconds held units may lapse a little early: up to what they can hold more);
//! * at quiescence (every key idle, its units given back) exactly what it admitted;
//! * sliding windows and logs count exactly what they admitted;
//! * a GCRA key's TAT covers every unit it admitted, and no interval admits more than its
//!   allowance.
//!
//! A request's time is known within the reading of the clock before and after its decision
//! (equal on a manual clock): where a window's bound falls between the two, the check allows
//! either side.

use std::future::Future;
use std::sync::Arc;

use super::{Leased, IDLE, SWEEP_EVERY};
use crate::limiter::algorithm::{Algorithm, Period, State};
use crate::limiter::backend::{Limiter, SettleUnits};
use crate::limiter::clock::{Clock, ManualClock};
use crate::limiter::id::RequestId;
use crate::limiter::limit::{Leasing, Limit, AUTO_MIN_UNITS};
use crate::limiter::local::LocalLimiter;
use crate::limiter::rate::Rate;
use crate::limiter::request::{Entry, LimitRequest};

/// An algorithm of the mix.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Gcra,
    FixedWindow,
    Calendar,
    SlidingWindow,
    SlidingLog,
}

/// A limit's `mode`.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    Exact,
    Auto,
    Leased,
}

/// One limit of the route: its algorithm at one of three sizes, its mode, whether each client
/// has its own key (else one key for all), and whether it is a shadow limit (decided and
/// counted, never denying: it consumes only what it allows).
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub kind: Kind,
    pub size: usize,
    pub mode: Mode,
    pub per_client: bool,
    pub shadow: bool,
}

impl Spec {
    /// Sizes: small limits that refuse often and lease one unit at a time, up to large ones
    /// that lease many; windows from a few hundred milliseconds (they turn over) to a day.
    pub fn algorithm(self) -> Algorithm {
        let ms = 1_000;
        let size = self.size.min(2);
        match self.kind {
            Kind::Gcra => {
                let (per_second, burst) = [(20, 5), (200, 40), (1_000, 200)][size];
                let emission_us = 1_000_000 / per_second;
                Algorithm::Gcra {
                    emission_us,
                    tolerance_us: emission_us * (burst + 1),
                    max_delay_us: 0,
                }
            }
            Kind::FixedWindow => {
                let (limit, window_ms) = [(10, 300), (60, 1_000), (400, 3_600_000)][size];
                Algorithm::FixedWindow {
                    limit,
                    window_us: window_ms * ms,
                }
            }
            Kind::Calendar => {
                let (limit, length_ms) = [(10, 500), (60, 2_000), (400, 86_400_000)][size];
                let period = Period::Aligned {
                    length_us: length_ms * ms,
                };
                Algorithm::Calendar { limit, period }
            }
            Kind::SlidingWindow | Kind::SlidingLog => {
                let (limit, window_ms) = [(10, 500), (60, 1_000), (400, 2_000)][size];
                let window_us = window_ms * ms;
                match self.kind {
                    Kind::SlidingWindow => Algorithm::SlidingWindow { limit, window_us },
                    _ => Algorithm::SlidingLog { limit, window_us },
                }
            }
        }
    }

    /// The limit as `config/limits.rs` compiles it: leased where its mode asks and leases
    /// apply (a tenth of its capacity; under `auto`, not below `AUTO_MIN_UNITS`).
    pub fn limit(self, index: usize) -> Limit {
        let algorithm = self.algorithm();
        let rate = Rate::new(1, std::time::Duration::from_secs(1)).expect("a rate");
        let mut limit = Limit::new(&format!("l{index}"), algorithm, 1, rate);
        limit.shadow = self.shadow;
        let leasable = matches!(
            algorithm,
            Algorithm::Gcra { .. } | Algorithm::FixedWindow { .. } | Algorithm::Calendar { .. }
        );
        let max_units = (algorithm.capacity() / 10).max(1);
        limit.leased = match self.mode {
            Mode::Exact => None,
            _ if !leasable => None,
            Mode::Auto => (max_units >= AUTO_MIN_UNITS).then_some(Leasing {
                max_units,
                min_units: AUTO_MIN_UNITS,
            }),
            Mode::Leased => Some(Leasing {
                max_units,
                min_units: 1,
            }),
        };
        limit
    }
}

/// A stretch of traffic: `requests` requests, gaps random between 0 and twice `spacing_us`;
/// or silence.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    Burst { requests: u64, spacing_us: u64 },
    Silence { ms: i64 },
}

/// One run: the route's limits, how many gateways, the traffic, and the seed of its choices.
#[derive(Debug, Clone)]
pub struct Case {
    pub specs: Vec<Spec>,
    pub gateways: usize,
    pub phases: Vec<Phase>,
    pub seed: u64,
}

/// Clients a per-client limit tells apart.
pub const CLIENTS: u64 = 3;

/// A small deterministic generator (xorshift64*), so a failing traffic pattern replays.
#[derive(Debug, Clone)]
pub struct Dice(pub u64);

impl Dice {
    pub fn roll(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.roll() % n.max(1)
    }
}

/// What a key stores, read the way the backend keeps it.
pub trait Stored: Send + Sync {
    fn stored(&self, key: &[u8], now_us: i64) -> impl Future<Output = Option<State>> + Send;
}

impl Stored for LocalLimiter {
    async fn stored(&self, key: &[u8], now_us: i64) -> Option<State> {
        self.state_at(key, now_us)
    }
}

/// A clock the simulation moves on: a manual one, or one that also runs by itself.
pub trait Timeline: Clock {
    /// Moves the clock on to `now_us` if it is not there already.
    fn reach(&self, now_us: i64);
}

impl Timeline for ManualClock {
    fn reach(&self, now_us: i64) {
        if now_us > self.now_us() {
            self.set(now_us);
        }
    }
}

/// One request of one limit admitted: when (between the two readings), at what cost, for which
/// client.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    from_us: i64,
    to_us: i64,
    cost: u64,
    client: u64,
}

/// Gateways leasing from one backend on one timeline, and what each limit admitted.
pub struct World<L, S, B> {
    clock: Arc<dyn Timeline>,
    store: Arc<B>,
    gateways: Vec<Leased<L, S>>,
    specs: Vec<Spec>,
    limits: Vec<Limit>,
    /// Each key's name: `<prefix>l<limit>` (`:c<client>` per client).
    prefix: String,
    admitted: Vec<Vec<Admitted>>,
    /// Requests sent: each has an id of its own (a sliding log's members).
    requests: u64,
    next_sweep: i64,
    dice: Dice,
}

impl<L: Limiter, S: SettleUnits + 'static, B: Stored> World<L, S, B> {
    /// `gateways` (built by the caller, swept by hand) on `clock`, whose backend `store` reads;
    /// keys start with `prefix`.
    pub fn new(
        case: &Case,
        clock: Arc<dyn Timeline>,
        store: Arc<B>,
        gateways: Vec<Leased<L, S>>,
        prefix: &str,
    ) -> World<L, S, B> {
        World {
            next_sweep: clock.now_us() + SWEEP_EVERY.as_micros() as i64,
            clock,
            store,
            gateways,
            specs: case.specs.clone(),
            limits: (0..case.specs.len())
                .map(|index| case.specs[index].limit(index))
                .collect(),
            prefix: prefix.to_string(),
            admitted: vec![Vec::new(); case.specs.len()],
            requests: 0,
            dice: Dice(case.seed | 1),
        }
    }

    fn key(&self, limit: usize, client: u64) -> Vec<u8> {
        let prefix = &self.prefix;
        match self.specs[limit].per_client {
            true => format!("{prefix}l{limit}:c{client}").into_bytes(),
            false => format!("{prefix}l{limit}").into_bytes(),
        }
    }

    /// Plays `case`'s traffic, checking every key after each request and sweep, then lets every
    /// key turn idle and checks that nothing is held and every count is exact.
    pub async fn play(mut self, case: &Case) {
        for phase in &case.phases {
            match *phase {
                Phase::Burst {
                    requests,
                    spacing_us,
                } => {
                    for _ in 0..requests {
                        let gap = self.dice.below(2 * spacing_us) as i64 + 1;
                        self.advance(gap).await;
                        self.request().await;
                    }
                }
                Phase::Silence { ms } => self.advance(ms * 1_000).await,
            }
        }
        self.advance((IDLE + 2 * SWEEP_EVERY).as_micros() as i64)
            .await;
        for gateway in &self.gateways {
            assert_eq!(gateway.held(), 0, "every unit given back or lapsed");
        }
        self.check().await;
        self.check_allowances();
    }

    /// One request at a random gateway, from a random client, at random costs (mostly 1).
    async fn request(&mut self) {
        let gateway = self.dice.below(self.gateways.len() as u64) as usize;
        let client = self.dice.below(CLIENTS);
        let keys: Vec<Vec<u8>> = (0..self.limits.len())
            .map(|limit| self.key(limit, client))
            .collect();
        let costs: Vec<u64> = (0..self.limits.len())
            .map(|_| match self.dice.below(4) {
                0 => 1 + self.dice.below(3),
                _ => 1,
            })
            .collect();
        let entries: Vec<Entry<'_>> = (0..self.limits.len())
            .map(|limit| Entry {
                limit: &self.limits[limit],
                key: &keys[limit],
                cost: costs[limit],
            })
            .collect();
        self.requests += 1;
        let request = LimitRequest {
            entries: &entries,
            id: RequestId(u128::from(self.requests) | (u128::from(self.dice.roll()) << 64)),
            deadline: None,
        };
        let from_us = self.clock.now_us();
        let decision = self.gateways[gateway]
            .check(&request)
            .await
            .expect("the backend decides");
        let to_us = self.clock.now_us();
        if decision.allowed() {
            for (limit, &cost) in costs.iter().enumerate() {
                // A shadow limit that denied consumed nothing.
                let consumed = decision.statuses.get(limit).is_some_and(|s| s.allowed);
                if self.specs[limit].shadow && !consumed {
                    continue;
                }
                self.admitted[limit].push(Admitted {
                    from_us,
                    to_us,
                    cost,
                    client,
                });
            }
        }
        self.check().await;
    }

    /// Moves the clock on by `us`, sweeping idle keys every `SWEEP_EVERY` as the sweeper does.
    async fn advance(&mut self, us: i64) {
        let target = self.clock.now_us() + us;
        while self.next_sweep <= target {
            self.clock.reach(self.next_sweep);
            for gateway in &self.gateways {
                gateway.return_idle_units(self.clock.instant()).await;
            }
            self.check().await;
            self.next_sweep += SWEEP_EVERY.as_micros() as i64;
        }
        self.clock.reach(target);
    }

    async fn check(&self) {
        for limit in 0..self.limits.len() {
            let clients = match self.specs[limit].per_client {
                true => 0..CLIENTS,
                false => 0..1,
            };
            for client in clients {
                self.check_key(limit, client).await;
            }
        }
    }

    /// What `limit` admitted for `client` (for all, if the limit does not tell them apart).
    fn admitted(&self, limit: usize, client: u64) -> impl Iterator<Item = &Admitted> {
        let per_client = self.specs[limit].per_client;
        self.admitted[limit]
            .iter()
            .filter(move |a| !per_client || a.client == client)
    }

    async fn check_key(&self, limit: usize, client: u64) {
        let key = self.key(limit, client);
        // The state first, then the time: a clock that runs by itself may pass a key's end
        // while it is read, and a state read as of an earlier time could be gone by then.
        let state = self.store.stored(&key, self.clock.now_us()).await;
        let now = self.clock.now_us();
        let state = state.filter(|state| live(state, now));
        let held: u64 = self.gateways.iter().map(|g| g.held_units(&key)).sum();
        let (what, served) = (format!("{:?} at {now}", self.specs[limit]), |from, to| {
            self.served(limit, client, from, to)
        });
        match (self.limits[limit].algorithm, state) {
            (Algorithm::FixedWindow { window_us, .. }, Some(State::Window { end_us, count })) => {
                let window = served(end_us - window_us as i64, end_us);
                self.check_count(&what, count, window, held, end_us - now);
            }
            (
                Algorithm::Calendar { .. },
                Some(State::Period {
                    start_us,
                    end_us,
                    count,
                }),
            ) => {
                let period = served(start_us, end_us);
                self.check_count(&what, count, period, held, end_us - now);
            }
            (Algorithm::FixedWindow { .. } | Algorithm::Calendar { .. }, _) => {
                assert_eq!(held, 0, "{what}: units held for a window no longer stored");
            }
            (
                Algorithm::SlidingLog { window_us, .. }
                | Algorithm::SlidingWindow { window_us, .. },
                state,
            ) => {
                self.check_sliding(&what, (limit, client), window_us as i64, state, now);
            }
            (Algorithm::Gcra { emission_us, .. }, state) => {
                let replay = self.replay(limit, client, emission_us);
                let tat = match state {
                    Some(State::Gcra { tat_us }) => tat_us,
                    _ => now,
                };
                assert!(
                    tat >= replay,
                    "{what}: TAT {tat} below {replay}, its admissions' cost"
                );
            }
            (_, _) => {}
        }
    }

    /// A sliding log's units within its window, or a sliding window's two counters (while
    /// the current one is open), against what was served.
    fn check_sliding(&self, what: &str, of: (usize, u64), w: i64, state: Option<State>, now: i64) {
        let served = |from, to| self.served(of.0, of.1, from, to);
        match state {
            Some(State::Log { stamps }) => {
                let stamps = stamps.iter().filter(|&&t| t > now - w).count() as u64;
                within(what, stamps, served(now - w + 1, now + 1));
            }
            Some(State::Sliding {
                start_us,
                previous,
                current,
            }) if now < start_us + w => {
                within(what, current, served(start_us, start_us + w));
                within(what, previous, served(start_us - w, start_us));
            }
            Some(State::Sliding { .. }) => {}
            _ if matches!(self.limits[of.0].algorithm, Algorithm::SlidingLog { .. }) => {
                within(what, 0, served(now - w + 1, now + 1));
            }
            _ => {}
        }
    }

    /// Units `limit` admitted for `client` within `[from, to)`: surely, and perhaps (a request
    /// whose readings fall on both sides of a bound).
    fn served(&self, limit: usize, client: u64, from: i64, to: i64) -> (u64, u64) {
        let (mut surely, mut perhaps) = (0, 0);
        for a in self.admitted(limit, client) {
            if from <= a.from_us && a.to_us < to {
                surely += a.cost;
            } else if a.to_us >= from && a.from_us < to {
                perhaps += a.cost;
            }
        }
        (surely, surely + perhaps)
    }

    /// The tightest GCRA timeline of what `limit` admitted for `client`, each request at its
    /// earliest reading: the TAT every admitted unit needs at least.
    fn replay(&self, limit: usize, client: u64, emission_us: u64) -> i64 {
        let mut replay = i64::MIN;
        for a in self.admitted(limit, client) {
            replay = replay.max(a.from_us) + (emission_us * a.cost) as i64;
        }
        replay
    }

    /// A window's count against what it admitted (`served`: surely, perhaps) and what the
    /// gateways hold: equal, except in its last milliseconds, when held units may lapse before
    /// it closes (their deadlines are read from replies in whole milliseconds, rounded early).
    fn check_count(&self, what: &str, count: u64, served: (u64, u64), held: u64, left_us: i64) {
        let (surely, perhaps) = served;
        let holdable = if left_us > 2_000 {
            0
        } else {
            self.gateways.len() as u64 * 400
        };
        assert!(
            (surely + held..=perhaps + held + holdable).contains(&count),
            "{what}: count {count}, served {surely}..={perhaps}, held {held}"
        );
    }

    /// No interval admitted more than a GCRA's allowance (within the clock's readings).
    fn check_allowances(&self) {
        for (limit, spec) in self.specs.iter().enumerate() {
            let Algorithm::Gcra {
                emission_us,
                tolerance_us,
                ..
            } = self.limits[limit].algorithm
            else {
                continue;
            };
            for client in 0..CLIENTS {
                let admitted: Vec<&Admitted> = self.admitted(limit, client).collect();
                let slack = admitted
                    .iter()
                    .map(|a| a.to_us - a.from_us)
                    .max()
                    .unwrap_or(0);
                let units: Vec<i64> = admitted
                    .iter()
                    .flat_map(|a| std::iter::repeat_n(a.from_us, a.cost as usize))
                    .collect();
                let excess = gcra_excess(&units, emission_us, tolerance_us, slack);
                assert_eq!(excess, None, "{spec:?}: beyond the allowance");
            }
        }
    }
}

/// A stored count against what was served (surely, perhaps).
fn within(what: &str, count: u64, served: (u64, u64)) {
    let (surely, perhaps) = served;
    assert!(
        (surely..=perhaps).contains(&count),
        "{what}: stored {count}, served {surely}..={perhaps}"
    );
}

/// Whether `state` still stands at `now_us` (a TAT ahead, a window or period not yet over).
pub fn live(state: &State, now_us: i64) -> bool {
    match *state {
        State::Gcra { tat_us } => tat_us > now_us,
        State::Window { end_us, .. } => end_us > now_us,
        State::Period { end_us, .. } => end_us == 0 || end_us > now_us,
        _ => true,
    }
}

/// GCRA's allowance: over any interval of `len`, at most `floor((len + slack) / emission) +
/// tolerance / emission` units (the burst plus the rate times the length, the length read
/// `slack` longer where times are known only that well). The first interval that admitted more.
pub fn gcra_excess(
    admitted: &[i64],
    emission_us: u64,
    tolerance_us: u64,
    slack: i64,
) -> Option<(i64, i64)> {
    let (e, capacity) = (emission_us as i64, (tolerance_us / emission_us) as i64);
    for (i, &from) in admitted.iter().enumerate() {
        for (j, &to) in admitted.iter().enumerate().skip(i) {
            if (j - i + 1) as i64 > (to - from + slack) / e + capacity {
                return Some((from, to));
            }
        }
    }
    None
}
