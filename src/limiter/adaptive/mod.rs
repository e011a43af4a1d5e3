//! Adaptive concurrency: how many requests one gateway lets a route's upstream hold at once,
//! following the upstream's latency — a gradient limiter, as Envoy's adaptive concurrency
//! filter and Netflix's concurrency-limits. A baseline latency is measured with admissions
//! pinned to the minimum (a probe: at the start, then every `probe_interval`; only the probe's
//! own requests count against it, so long-lived ones cannot starve it). The baseline is the
//! lower of the last two probes' medians, a windowed minimum as BBR keeps its minimum RTT: one
//! probe read in a moment of noise (a busy host, earlier requests still draining from the
//! upstream) cannot raise the limit for a whole interval. After each sample
//! window the limit is scaled by `baseline × (1 + tolerance) / the window's p90` (between ½ and
//! 2), plus √limit of headroom: raised while latency holds, cut when it grows. It is not raised
//! while the upstream was given less than half of it and nothing was shed (the traffic, not the
//! upstream, was the bound). A request that timed out at the upstream halves it at the window's
//! end. A request holds its place until the upstream's response head (or its failure).
//!
//! Callers rank by priority level (0 the lowest): when the route is at its limit the lowest
//! levels are shed first, and `reserve` of the limit is kept for the highest level alone; the
//! levels between get graded shares.
//!
//! The adaptive concurrency room: the settings, the gradient, the probe, the [`Permit`] a
//! request holds and the meters; its unit tests in `tests.rs`. It reads only the clock of the
//! decision core.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use prometheus::{Gauge, IntGauge};

use super::clock::Clock;

/// The most latencies a sample window or a probe keeps: its percentile reads these.
const MAX_SAMPLES: usize = 1024;
/// The gradient's bounds: one window at most halves or doubles the limit (before headroom).
const MIN_GRADIENT: f64 = 0.5;
const MAX_GRADIENT: f64 = 2.0;

/// A route's `adaptive_concurrency`, compiled.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveSettings {
    /// The limit never goes below this (and is pinned to it while probing the baseline).
    pub min_limit: u32,
    pub max_limit: u32,
    /// How long latencies are gathered before the limit moves.
    pub sample_window: Duration,
    /// How often the baseline is measured again.
    pub probe_interval: Duration,
    /// How many requests' latencies (admitted during the probe) make a baseline: their median.
    pub probe_requests: u32,
    /// How far above the baseline latency may grow before the limit is cut (0.25: 25 %).
    pub tolerance: f64,
    /// The share of the limit kept for the highest priority level (0 to below 1).
    pub reserve: f64,
    /// How many priority levels callers rank in (at least 1).
    pub levels: u8,
}

/// The gauges a limiter keeps current: its limit, and the baseline latency.
#[derive(Clone)]
pub struct AdaptiveMeters {
    pub limit: IntGauge,
    pub baseline_seconds: Gauge,
}

/// Where one route's limiter stands: [`AdaptiveConcurrency::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptiveStats {
    /// The limit admissions meet now (the minimum while probing).
    pub limit: u32,
    /// A baseline is being measured: admissions are pinned to the minimum.
    pub probing: bool,
    /// The baseline latency: the lower of the last two probes' medians; `None` before the
    /// first probe ends.
    pub baseline: Option<Duration>,
    /// Requests admitted and not yet answered by the upstream.
    pub in_flight: u32,
    pub min_limit: u32,
    pub max_limit: u32,
}

/// One route's adaptive concurrency limit on this gateway.
pub struct AdaptiveConcurrency {
    settings: AdaptiveSettings,
    clock: Arc<dyn Clock>,
    /// The limit outside probes (a probe pins admissions to `min_limit` without changing it).
    limit: AtomicU32,
    /// Every request admitted and not yet ended.
    in_flight: AtomicU32,
    /// The probe in progress (its epoch), or 0: the one record of whether a probe runs, read
    /// without the lock by admissions and changed only under it.
    probing: AtomicU64,
    /// The requests admitted during the probe in progress and not yet ended: only they count
    /// against its pinned limit, so requests that outlive their admission (streams, long
    /// polls) cannot keep a probe from its samples.
    probe_in_flight: AtomicU32,
    /// The epoch of the last probe begun.
    epochs: AtomicU64,
    /// The most requests in flight at once since the sample window began.
    peak: AtomicU32,
    /// A request was shed since the sample window began: the demand exceeded the limit.
    shed: AtomicBool,
    /// A request timed out at the upstream since the sample window began: the limit is cut.
    timed_out: AtomicBool,
    /// The baseline latency in microseconds (0: none measured yet), read without the lock.
    baseline_us: AtomicU64,
    state: Mutex<Gradient>,
    meters: AdaptiveMeters,
}

/// What the limit is worked out from: the window's latencies, the baseline, the probe.
struct Gradient {
    samples: Vec<Duration>,
    window_started: Instant,
    /// The lower of the last two probes' medians.
    baseline: Option<Duration>,
    /// The median the last probe measured.
    last_probe: Option<Duration>,
    /// The latencies of the probe in progress (`AdaptiveConcurrency::probing` says which
    /// one, if any): only requests admitted during it are its samples.
    probe_samples: Vec<Duration>,
    next_probe: Instant,
}

/// A request admitted to the upstream: it counts in flight until dropped.
#[must_use = "a permit counts its request in flight until it is dropped"]
pub struct Permit {
    owner: Arc<AdaptiveConcurrency>,
    /// The probe it was admitted in, or 0.
    epoch: u64,
}

impl Permit {
    /// The request's upstream answered after `latency`: a sample of the limit.
    pub fn answered(self, latency: Duration) {
        self.owner.sample(self.epoch, Some(latency));
    }

    /// The request's upstream timed out: the window closes with the limit halved (as an AIMD
    /// limiter cuts on a drop). A probe never takes it for a latency.
    pub fn timed_out(self) {
        if self.epoch == 0 {
            self.owner.timed_out.store(true, Ordering::Release);
            self.owner.sample(0, None);
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let owner = &self.owner;
        decrement(&owner.in_flight);
        if self.epoch != 0 && owner.probing.load(Ordering::Acquire) == self.epoch {
            decrement(&owner.probe_in_flight);
        }
    }
}

/// `counter` less one, never below 0 (a probe's counter starts anew at each probe).
fn decrement(counter: &AtomicU32) {
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
}

/// Adds one to `counter` while it is below `threshold`: whether it did, and its value before.
fn take(counter: &AtomicU32, threshold: u32) -> Result<u32, u32> {
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < threshold).then_some(n + 1)
    })
}

impl AdaptiveConcurrency {
    /// A limiter starting with a probe (admissions at its minimum until a baseline is known).
    pub fn new(
        settings: AdaptiveSettings,
        clock: Arc<dyn Clock>,
        meters: AdaptiveMeters,
    ) -> AdaptiveConcurrency {
        let now = clock.instant();
        meters.limit.set(i64::from(settings.min_limit));
        meters.baseline_seconds.set(0.0);
        AdaptiveConcurrency {
            limit: AtomicU32::new(settings.min_limit),
            in_flight: AtomicU32::new(0),
            probing: AtomicU64::new(1),
            probe_in_flight: AtomicU32::new(0),
            epochs: AtomicU64::new(1),
            peak: AtomicU32::new(0),
            shed: AtomicBool::new(false),
            timed_out: AtomicBool::new(false),
            baseline_us: AtomicU64::new(0),
            state: Mutex::new(Gradient {
                samples: Vec::new(),
                window_started: now,
                baseline: None,
                last_probe: None,
                probe_samples: Vec::new(),
                next_probe: now,
            }),
            settings,
            clock,
            meters,
        }
    }

    pub fn settings(&self) -> &AdaptiveSettings {
        &self.settings
    }

    /// The limit admissions meet now: the minimum while probing.
    pub fn limit(&self) -> u32 {
        match self.probing.load(Ordering::Acquire) {
            0 => self.limit.load(Ordering::Acquire),
            _ => self.settings.min_limit,
        }
    }

    /// Where the limiter stands now, read without its lock (each number as it is at its read):
    /// what the dashboard shows.
    pub fn stats(&self) -> AdaptiveStats {
        let baseline_us = self.baseline_us.load(Ordering::Acquire);
        AdaptiveStats {
            limit: self.limit(),
            probing: self.probing.load(Ordering::Acquire) != 0,
            baseline: (baseline_us > 0).then(|| Duration::from_micros(baseline_us)),
            in_flight: self.in_flight.load(Ordering::Acquire),
            min_limit: self.settings.min_limit,
            max_limit: self.settings.max_limit,
        }
    }

    /// Admits a request of priority `level` while fewer than its level's share of the limit
    /// are in flight (while probing: of the minimum, among the probe's own requests); `None`:
    /// shed it.
    pub fn admit(self: &Arc<Self>, level: u8) -> Option<Permit> {
        let probe = self.probing.load(Ordering::Acquire);
        let admitted = match probe {
            0 => {
                let threshold = self.threshold(self.limit.load(Ordering::Acquire), level);
                let before = take(&self.in_flight, threshold);
                if let Ok(before) = before {
                    self.peak.fetch_max(before + 1, Ordering::AcqRel);
                }
                before.is_ok()
            }
            _ => {
                let threshold = self.threshold(self.settings.min_limit, level);
                let taken = take(&self.probe_in_flight, threshold).is_ok();
                if taken {
                    self.in_flight.fetch_add(1, Ordering::AcqRel);
                }
                taken
            }
        };
        if !admitted {
            self.shed.store(true, Ordering::Release);
            return None;
        }
        Some(Permit {
            owner: Arc::clone(self),
            epoch: probe,
        })
    }

    /// Counts in flight a request that is never shed (a caller exempt by its address).
    pub fn enter(self: &Arc<Self>) -> Permit {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.peak.fetch_max(before + 1, Ordering::AcqRel);
        Permit {
            owner: Arc::clone(self),
            epoch: 0,
        }
    }

    /// How many requests may be in flight when one of `level` arrives: the whole limit for
    /// the highest level, `1 − reserve` of it for the lowest, graded between.
    pub fn threshold(&self, limit: u32, level: u8) -> u32 {
        let top = self.settings.levels.saturating_sub(1);
        if top == 0 || level >= top {
            return limit;
        }
        let below_top = f64::from(top - level) / f64::from(top);
        let share = 1.0 - self.settings.reserve * below_top;
        ((f64::from(limit) * share).floor() as u32).max(1)
    }

    /// A request admitted in probe `epoch` (0: none) was answered after `latency` (`None`: it
    /// timed out). A sample that finds another being taken is dropped: responses never wait
    /// for each other.
    fn sample(&self, epoch: u64, latency: Option<Duration>) {
        let mut state = match self.state.try_lock() {
            Ok(state) => state,
            // A panic while holding it leaves numbers, never a broken invariant.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let now = self.clock.instant();
        if self.probing.load(Ordering::Acquire) != 0 {
            if let Some(latency) = latency {
                self.probe_sample(&mut state, epoch, latency, now);
            }
            return;
        }
        if let Some(latency) = latency.filter(|_| state.samples.len() < MAX_SAMPLES) {
            state.samples.push(latency);
        }
        if now.saturating_duration_since(state.window_started) < self.settings.sample_window {
            return;
        }
        if now >= state.next_probe {
            self.begin_probe(&mut state);
            return;
        }
        let peak = self
            .peak
            .swap(self.in_flight.load(Ordering::Acquire), Ordering::AcqRel);
        let shed = self.shed.swap(false, Ordering::AcqRel);
        let limit = self.limit.load(Ordering::Acquire);
        if self.timed_out.swap(false, Ordering::AcqRel) {
            let halved = (f64::from(limit) * MIN_GRADIENT) as u32;
            self.set_limit(halved.max(self.settings.min_limit));
        } else if let Some(p90) = percentile(&mut state.samples, 0.9) {
            let limit = self.next_limit(limit, p90, state.baseline, peak, shed);
            self.set_limit(limit);
        }
        state.samples.clear();
        state.window_started = now;
    }

    /// The limit after a window whose p90 latency was `p90`, with `peak` requests in flight
    /// at most, and some `shed`.
    fn next_limit(
        &self,
        limit: u32,
        p90: Duration,
        baseline: Option<Duration>,
        peak: u32,
        shed: bool,
    ) -> u32 {
        let Some(baseline) = baseline else {
            return limit;
        };
        let target = baseline.as_secs_f64() * (1.0 + self.settings.tolerance);
        let gradient = (target / p90.as_secs_f64().max(1e-6)).clamp(MIN_GRADIENT, MAX_GRADIENT);
        let current = f64::from(limit);
        // The traffic, not the upstream, bounded this window: nothing says more would hold.
        if gradient >= 1.0 && f64::from(peak) < current / 2.0 && !shed {
            return limit;
        }
        let scaled = current * gradient;
        let next = scaled + scaled.sqrt();
        let (min, max) = (self.settings.min_limit, self.settings.max_limit);
        (next.round() as u32).clamp(min, max)
    }

    fn set_limit(&self, limit: u32) {
        self.limit.store(limit, Ordering::Release);
        self.meters.limit.set(i64::from(limit));
    }

    /// Pins admissions to the minimum and measures the baseline again.
    fn begin_probe(&self, state: &mut Gradient) {
        let epoch = self.epochs.fetch_add(1, Ordering::AcqRel) + 1;
        state.probe_samples.clear();
        state.samples.clear();
        self.probe_in_flight.store(0, Ordering::Release);
        self.probing.store(epoch, Ordering::Release);
        self.meters.limit.set(i64::from(self.settings.min_limit));
    }

    /// A sample during a probe: once it has enough of its own, their median is measured (the
    /// baseline: the lower of it and the last probe's) and admissions meet the limit again.
    fn probe_sample(&self, state: &mut Gradient, epoch: u64, latency: Duration, now: Instant) {
        let probing = self.probing.load(Ordering::Acquire);
        if probing == 0 || epoch != probing {
            return;
        }
        if state.probe_samples.len() < MAX_SAMPLES {
            state.probe_samples.push(latency);
        }
        if state.probe_samples.len() < self.settings.probe_requests as usize {
            return;
        }
        let measured = percentile(&mut state.probe_samples, 0.5);
        state.probe_samples.clear();
        if let Some(measured) = measured {
            let baseline = state.last_probe.map_or(measured, |last| last.min(measured));
            state.last_probe = Some(measured);
            state.baseline = Some(baseline);
            self.meters.baseline_seconds.set(baseline.as_secs_f64());
            let micros = u64::try_from(baseline.as_micros()).unwrap_or(u64::MAX);
            self.baseline_us.store(micros.max(1), Ordering::Release);
        }
        state.next_probe = now + self.settings.probe_interval;
        state.window_started = now;
        self.peak
            .store(self.in_flight.load(Ordering::Acquire), Ordering::Release);
        self.shed.store(false, Ordering::Release);
        self.timed_out.store(false, Ordering::Release);
        self.probing.store(0, Ordering::Release);
        self.set_limit(self.limit.load(Ordering::Acquire));
    }
}

/// The `quantile` (0 to 1) of `samples`, reordering them; `None` when there are none.
fn percentile(samples: &mut [Duration], quantile: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    let rank = ((samples.len() - 1) as f64 * quantile).round() as usize;
    let (_, value, _) = samples.select_nth_unstable(rank.min(samples.len() - 1));
    Some(*value)
}

#[cfg(test)]
mod tests;
