//! Passive health (outlier detection, Envoy's model): what the answers of a server tell of
//! it, one [`Outlier`] per server address, shared by every configuration's health record that
//! lists it (a reload keeps it). The exchange reports each attempt's end through the route's
//! pool: a `5xx` response or a failed connection (refused, reset, timed out, TLS) counts one
//! failure in a row, any other response starts the count again. `consecutive_failures` in a
//! row eject the server for `base_ejection` times the number of its ejections, at most
//! `max_ejection`; it returns once that time has passed (logged then, by the first reading that
//! sees it: a request, or the sampler's each second) and stays in while it answers. The count of ejections starts again once a server
//! has been back for `max_ejection`. Which ejected servers a route skips (its share, the panic
//! threshold) is the pool's.
//!
//! The request path reads and writes atomics only: no lock, no allocation; the clock is read
//! only while a server is or was ejected.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::{IntCounter, IntGauge};

use crate::limiter::clock::Clock;
use crate::route::upstream::PassiveHealth;

/// Where a server shows its ejections: `sluice_upstream_ejections_total{server}` and
/// `sluice_upstream_ejected{server}`.
#[derive(Clone)]
pub struct EjectionMeters {
    pub ejections: IntCounter,
    pub ejected: IntGauge,
}

impl EjectionMeters {
    /// Meters registered nowhere, for a record that shows nothing (`sluice -t`, tests).
    pub fn unregistered(_server: SocketAddr) -> EjectionMeters {
        EjectionMeters {
            ejections: IntCounter::new("sluice_upstream_ejections_total", "unregistered")
                .expect("a valid counter name"),
            ejected: IntGauge::new("sluice_upstream_ejected", "unregistered")
                .expect("a valid gauge name"),
        }
    }
}

/// One server's passive health.
pub struct Outlier {
    server: SocketAddr,
    clock: Arc<dyn Clock>,
    /// What the nanosecond readings below count from.
    epoch: Instant,
    /// Failures in a row since the last success or ejection.
    failures: AtomicU32,
    /// Ejections since it was last back for the longest ejection time.
    ejections: AtomicU32,
    /// Nanoseconds from `epoch` until which it is ejected; 0: it is not (it has returned).
    until: AtomicU64,
    /// When it last returned, in nanoseconds from `epoch`.
    returned: AtomicU64,
    meters: EjectionMeters,
}

impl Outlier {
    /// A server never ejected, reading `clock`.
    pub fn new(server: SocketAddr, clock: Arc<dyn Clock>, meters: EjectionMeters) -> Outlier {
        meters.ejected.set(0);
        Outlier {
            server,
            epoch: clock.instant(),
            clock,
            failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            until: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            meters,
        }
    }

    /// Nanoseconds since `epoch`, now, plus one: never 0, which `until` keeps for "not ejected".
    fn now(&self) -> u64 {
        let since = self.clock.instant().saturating_duration_since(self.epoch);
        u64::try_from(since.as_nanos()).map_or(u64::MAX, |nanos| nanos.saturating_add(1))
    }

    /// Whether it is ejected now; an ejection whose time has passed ends here (logged once).
    pub fn ejected(&self) -> bool {
        let until = self.until.load(Ordering::Acquire);
        if until == 0 {
            return false;
        }
        let now = self.now();
        if now < until {
            return true;
        }
        self.end_ejection(until);
        false
    }

    /// Ends the ejection that lasted until `until`, unless another reading did.
    fn end_ejection(&self, until: u64) {
        let ended = self
            .until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Acquire);
        if ended.is_ok() {
            self.returned.store(until, Ordering::Release);
            self.meters.ejected.set(0);
            log::info!(
                "upstream server {} returns from its ejection (passive health): requests may \
                 dial it again",
                self.server
            );
        }
    }

    /// An attempt on it got an answer that was not a failure: the failures in a row start again.
    pub fn succeeded(&self) {
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// An attempt on it failed (a `5xx`, a failed connection); `rule` says when that ejects
    /// it. Whether this failure ejected it.
    pub fn failed(&self, rule: &PassiveHealth) -> bool {
        if self.ejected() {
            // Requests sent before the ejection: it is out already.
            return false;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures < rule.consecutive_failures {
            return false;
        }
        self.eject(rule)
    }

    /// Ejects it for the base time times its ejections (capped), unless another failure just
    /// did: each ejection is counted and logged once.
    fn eject(&self, rule: &PassiveHealth) -> bool {
        let now = self.now();
        let returned = self.returned.load(Ordering::Acquire);
        let back_for = Duration::from_nanos(now.saturating_sub(returned));
        if back_for >= rule.max_ejection {
            self.ejections.store(0, Ordering::Relaxed);
        }
        let times = self.ejections.load(Ordering::Relaxed).saturating_add(1);
        let time = rule
            .base_ejection
            .saturating_mul(times)
            .min(rule.max_ejection);
        let until = now.saturating_add(u64::try_from(time.as_nanos()).unwrap_or(u64::MAX));
        let ejected = self
            .until
            .compare_exchange(0, until, Ordering::AcqRel, Ordering::Acquire);
        if ejected.is_err() {
            return false;
        }
        self.ejections.store(times, Ordering::Relaxed);
        self.failures.store(0, Ordering::Relaxed);
        self.meters.ejections.inc();
        self.meters.ejected.set(1);
        log::warn!(
            "upstream server {} ejected for {} ms (passive health: {} failed attempts in a row; \
             ejection {times} in a row)",
            self.server,
            time.as_millis(),
            rule.consecutive_failures,
        );
        true
    }

    /// How many times it was ejected since it was last back for the longest ejection time.
    #[cfg(test)]
    fn ejections(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::clock::ManualClock;

    const SECOND: i64 = 1_000_000;

    fn outlier() -> (Outlier, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000 * SECOND));
        let server = SocketAddr::from(([127, 0, 0, 1], 1));
        let meters = EjectionMeters::unregistered(server);
        (Outlier::new(server, clock.clone(), meters), clock)
    }

    fn fail(outlier: &Outlier, times: u32) -> bool {
        let rule = PassiveHealth::DEFAULT;
        (0..times).fold(false, |ejected, _| outlier.failed(&rule) || ejected)
    }

    #[test]
    fn consecutive_failures_eject_and_a_success_starts_the_count_again() {
        let (outlier, _clock) = outlier();
        assert!(!fail(&outlier, 4), "four in a row do not eject");
        outlier.succeeded();
        assert!(!fail(&outlier, 4), "the count started again");
        assert!(!outlier.ejected());
        assert!(
            outlier.failed(&PassiveHealth::DEFAULT),
            "the fifth in a row"
        );
        assert!(outlier.ejected());
        assert_eq!(outlier.meters.ejections.get(), 1);
        assert_eq!(outlier.meters.ejected.get(), 1);
        assert!(
            !fail(&outlier, 10),
            "failures while out eject it no further"
        );
        assert_eq!(outlier.meters.ejections.get(), 1, "counted once");
    }

    #[test]
    fn the_ejection_time_grows_with_each_ejection_up_to_its_cap() {
        let (outlier, clock) = outlier();
        for times in 1..=12 {
            assert!(fail(&outlier, 5), "ejection {times}");
            assert_eq!(outlier.ejections(), times as u32);
            let seconds = (30 * times).min(300);
            clock.advance(seconds * SECOND - 1);
            assert!(outlier.ejected(), "out for {seconds} s on ejection {times}");
            clock.advance(1);
            assert!(
                !outlier.ejected(),
                "back after {seconds} s on ejection {times}"
            );
            assert_eq!(outlier.meters.ejected.get(), 0);
        }
        assert_eq!(
            outlier.meters.ejections.get(),
            12,
            "each ejection counted once"
        );
    }

    #[test]
    fn a_server_back_for_the_longest_ejection_time_starts_at_the_base_again() {
        let (outlier, clock) = outlier();
        assert!(fail(&outlier, 5));
        clock.advance(30 * SECOND);
        assert!(!outlier.ejected(), "back after 30 s");
        outlier.succeeded();
        assert!(fail(&outlier, 5));
        assert_eq!(outlier.ejections(), 2, "soon after: the second in a row");
        clock.advance(60 * SECOND);
        assert!(!outlier.ejected(), "back after 60 s");
        clock.advance(300 * SECOND);
        assert!(fail(&outlier, 5));
        assert_eq!(
            outlier.ejections(),
            1,
            "back long enough: the base time again"
        );
        clock.advance(30 * SECOND);
        assert!(!outlier.ejected());
    }
}
