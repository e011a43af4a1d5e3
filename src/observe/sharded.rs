//! The meters every proxied request writes, sharded per thread: its decision, its response's
//! status class, its duration and its upstream time, and the route's requests in flight. Each
//! thread counts into its own slot of the route (a [`PerThread`]: made by that thread on its
//! first request, on lines of its own), and a scrape sums the slots. Through
//! prometheus's own handles every core wrote the same cache lines for every request: about a
//! dozen atomic read-modify-writes, two of them `f64` compare-and-swap loops, on lines that
//! moved between cores. Here a request's writes stay on its core's lines, and a histogram's sum
//! is whole nanoseconds, so no loop. What a scrape shows is the same families, labels and
//! buckets, each series there from the route's first configuration (at zero), and kept across
//! reloads until a configuration drops the route.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use crate::limiter::meters::{desc, family, labelled, summed_histogram};
use crate::limiter::per_thread::PerThread;

/// The status classes a response is counted under, by `status / 100 - 1`.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The duration histograms' upper bounds, in nanoseconds (0.5 ms to 30 s).
const BOUNDS_NANOS: [u64; 15] = [
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// One thread's share of a duration histogram: a count per bucket (the last is `+Inf`) and the
/// sum in nanoseconds.
#[derive(Default)]
struct Buckets {
    counts: [AtomicU64; BOUNDS_NANOS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Buckets {
    fn observe(&self, duration: Duration) {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let bucket = BOUNDS_NANOS.partition_point(|bound| *bound < nanos);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

/// A histogram summed over the slots.
#[derive(Default)]
struct Summed {
    counts: [u64; BOUNDS_NANOS.len() + 1],
    sum_nanos: u64,
}

impl Summed {
    fn add(&mut self, buckets: &Buckets) {
        for (i, total) in self.counts.iter_mut().enumerate() {
            *total += buckets.counts[i].load(Ordering::Relaxed);
        }
        self.sum_nanos = self
            .sum_nanos
            .wrapping_add(buckets.sum_nanos.load(Ordering::Relaxed));
    }

    fn metric(&self) -> proto::Histogram {
        let seconds = BOUNDS_NANOS.iter().map(|bound| *bound as f64 / 1e9);
        summed_histogram(seconds, &self.counts, self.sum_nanos as f64 / 1e9)
    }
}

/// One thread's share of a route's request meters.
struct Slot {
    decisions: Box<[AtomicU64]>,
    classes: [AtomicU64; STATUS_CLASSES.len()],
    durations: [Buckets; STATUS_CLASSES.len()],
    upstream: Buckets,
    /// Entered on this slot less left on it: negative where a request moved threads.
    in_flight: AtomicI64,
}

impl Slot {
    fn new(decisions: usize) -> Slot {
        Slot {
            decisions: (0..decisions).map(|_| AtomicU64::new(0)).collect(),
            classes: Default::default(),
            durations: Default::default(),
            upstream: Buckets::default(),
            in_flight: AtomicI64::new(0),
        }
    }
}

/// One route's request meters: a slot per thread, made on the thread's first request.
pub struct RouteRequests {
    /// The `decision` label of each decision counter, in index order.
    decisions: Box<[&'static str]>,
    slots: PerThread<Slot>,
}

impl RouteRequests {
    fn new(decisions: &[&'static str]) -> RouteRequests {
        RouteRequests {
            decisions: decisions.into(),
            slots: PerThread::new(),
        }
    }

    /// This thread's slot.
    fn mine(&self) -> &Slot {
        self.slots.local(|| Slot::new(self.decisions.len()))
    }

    fn made(&self) -> impl Iterator<Item = &Slot> {
        self.slots.made()
    }

    /// A request decided as `decisions[decision]`.
    pub fn count(&self, decision: usize) {
        if let Some(counter) = self.mine().decisions.get(decision) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An upstream response of status class `STATUS_CLASSES[class]`.
    pub fn count_class(&self, class: usize) {
        if let Some(counter) = self.mine().classes.get(class) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request answered with status class `STATUS_CLASSES[class]` after `duration`.
    pub fn observe_duration(&self, class: usize, duration: Duration) {
        if let Some(buckets) = self.mine().durations.get(class) {
            buckets.observe(duration);
        }
    }

    /// A proxied request's time from its first upstream attempt to the response head.
    pub fn observe_upstream(&self, duration: Duration) {
        self.mine().upstream.observe(duration);
    }

    pub fn enter(&self) {
        self.mine().in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub fn leave(&self) {
        self.mine().in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// The requests decided as `decisions[decision]` so far, summed over the threads.
    pub fn decided(&self, decision: usize) -> u64 {
        let counts = self.made().filter_map(|slot| slot.decisions.get(decision));
        counts.map(|count| count.load(Ordering::Relaxed)).sum()
    }

    /// The route's requests in flight now, summed over the threads.
    ///
    /// The slots are read one after the other: a request that entered on a slot already read
    /// and left on one read later would count -1, so the sum is never shown below zero.
    pub fn in_flight(&self) -> i64 {
        let counts = self
            .made()
            .map(|slot| slot.in_flight.load(Ordering::Relaxed));
        counts.sum::<i64>().max(0)
    }
}

/// The five families [`RouteRequests`] feed, and every route's meters by name: a collector in
/// the default registry.
pub struct RequestFamilies {
    requests: Desc,
    responses: Desc,
    durations: Desc,
    upstream: Desc,
    in_flight: Desc,
    routes: Mutex<BTreeMap<Box<str>, Arc<RouteRequests>>>,
}

impl RequestFamilies {
    pub fn new() -> RequestFamilies {
        RequestFamilies {
            requests: desc(
                "sluice_requests_total",
                "Requests by route and limiter decision (allowed, limited, error_allowed, error_denied, no_route, bad_request, shadow_limited, local_allowed, local_limited, forbidden, exempt).",
                &["route", "decision"],
            ),
            responses: desc(
                "sluice_upstream_responses_total",
                "Responses to proxied requests by route and status class (1xx..5xx).",
                &["route", "status_class"],
            ),
            durations: desc(
                "sluice_request_duration_seconds",
                "Requests from their head read to their last byte written, by route and status class (1xx..5xx).",
                &["route", "status_class"],
            ),
            upstream: desc(
                "sluice_upstream_duration_seconds",
                "Proxied requests from the first upstream connection attempt to the upstream's response head (connect, retries and time to first byte), by route.",
                &["route"],
            ),
            in_flight: desc(
                "sluice_requests_in_flight",
                "Requests of a route that have been routed and have not ended.",
                &["route"],
            ),
            routes: Mutex::default(),
        }
    }

    fn routes(&self) -> MutexGuard<'_, BTreeMap<Box<str>, Arc<RouteRequests>>> {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The meters of `route`, whose decisions are labelled `decisions`: the same as before
    /// when a configuration already had the route, so a reload keeps its counts.
    pub fn route(&self, route: &str, decisions: &[&'static str]) -> Arc<RouteRequests> {
        let mut routes = self.routes();
        let meters = routes
            .entry(route.into())
            .or_insert_with(|| Arc::new(RouteRequests::new(decisions)));
        Arc::clone(meters)
    }

    /// Stops exporting `route`'s series (a reload removed it).
    pub fn retire(&self, route: &str) {
        self.routes().remove(route);
    }
}

impl Default for RequestFamilies {
    fn default() -> RequestFamilies {
        RequestFamilies::new()
    }
}

/// A counter series labelled `values`, at `value`.
fn counted(desc: &Desc, values: &[&str], value: u64) -> proto::Metric {
    let mut metric = labelled(desc, values);
    let mut counter = proto::Counter::default();
    counter.set_value(value as f64);
    metric.set_counter(counter);
    metric
}

/// The five families' series, as they are being summed.
#[derive(Default)]
struct Collected {
    requests: Vec<proto::Metric>,
    responses: Vec<proto::Metric>,
    durations: Vec<proto::Metric>,
    upstream: Vec<proto::Metric>,
    in_flight: Vec<proto::Metric>,
}

impl RequestFamilies {
    /// Sums `meters`' slots into the series of `route`.
    fn collect_route(&self, route: &str, meters: &RouteRequests, into: &mut Collected) {
        let slots: Vec<&Slot> = meters.made().collect();
        for (i, decision) in meters.decisions.iter().enumerate() {
            let total = meters.decided(i);
            into.requests
                .push(counted(&self.requests, &[route, decision], total));
        }
        for (i, class) in STATUS_CLASSES.iter().enumerate() {
            let count = slots
                .iter()
                .map(|slot| slot.classes[i].load(Ordering::Relaxed));
            let total = count.sum();
            into.responses
                .push(counted(&self.responses, &[route, class], total));
            let mut summed = Summed::default();
            slots.iter().for_each(|slot| summed.add(&slot.durations[i]));
            let mut metric = labelled(&self.durations, &[route, class]);
            metric.set_histogram(summed.metric());
            into.durations.push(metric);
        }
        let mut summed = Summed::default();
        slots.iter().for_each(|slot| summed.add(&slot.upstream));
        let mut metric = labelled(&self.upstream, &[route]);
        metric.set_histogram(summed.metric());
        into.upstream.push(metric);
        let mut metric = labelled(&self.in_flight, &[route]);
        let mut gauge = proto::Gauge::default();
        gauge.set_value(meters.in_flight() as f64);
        metric.set_gauge(gauge);
        into.in_flight.push(metric);
    }
}

impl Collector for RequestFamilies {
    fn desc(&self) -> Vec<&Desc> {
        vec![
            &self.requests,
            &self.responses,
            &self.durations,
            &self.upstream,
            &self.in_flight,
        ]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let routes: Vec<(Box<str>, Arc<RouteRequests>)> = self
            .routes()
            .iter()
            .map(|(name, meters)| (name.clone(), Arc::clone(meters)))
            .collect();
        let mut collected = Collected::default();
        for (route, meters) in &routes {
            self.collect_route(route, meters, &mut collected);
        }
        vec![
            family(&self.requests, MetricType::COUNTER, collected.requests),
            family(&self.responses, MetricType::COUNTER, collected.responses),
            family(&self.durations, MetricType::HISTOGRAM, collected.durations),
            family(&self.upstream, MetricType::HISTOGRAM, collected.upstream),
            family(&self.in_flight, MetricType::GAUGE, collected.in_flight),
        ]
    }
}

/// The families as registered: the one instance lives for the process.
impl Collector for &'static RequestFamilies {
    fn desc(&self) -> Vec<&Desc> {
        (**self).desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        (**self).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECISIONS: &[&str] = &["allowed", "limited"];

    fn family<'a>(families: &'a [MetricFamily], name: &str) -> &'a MetricFamily {
        let found = families.iter().find(|f| f.name() == name);
        found.unwrap_or_else(|| panic!("{name} collected"))
    }

    #[test]
    fn a_scrape_sums_what_every_thread_counted() {
        let families = RequestFamilies::new();
        let meters = families.route("r", DECISIONS);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        meters.count(1);
                        meters.count_class(1);
                        meters.observe_duration(1, Duration::from_micros(700));
                        meters.observe_upstream(Duration::from_secs(40));
                    }
                    meters.enter();
                });
            }
        });
        meters.leave();
        assert_eq!((meters.decided(0), meters.decided(1)), (0, 4000));
        assert_eq!(
            meters.in_flight(),
            3,
            "entered on four threads, left on one"
        );
        let collected = families.collect();
        let requests = family(&collected, "sluice_requests_total").get_metric();
        let values: Vec<f64> = requests.iter().map(|m| m.get_counter().value()).collect();
        assert_eq!(
            values,
            [0.0, 4000.0],
            "every decision exported, zero or not"
        );
        let labels: Vec<&str> = requests[1].get_label().iter().map(|l| l.value()).collect();
        assert_eq!(labels, ["r", "limited"]);
        let durations = family(&collected, "sluice_request_duration_seconds").get_metric();
        assert_eq!(durations.len(), STATUS_CLASSES.len());
        let histogram = durations[1].get_histogram();
        assert_eq!(histogram.get_sample_count(), 4000);
        assert!(
            (histogram.get_sample_sum() - 2.8).abs() < 1e-9,
            "4000 × 0.7 ms"
        );
        let cumulative: Vec<u64> = histogram
            .get_bucket()
            .iter()
            .map(|b| b.cumulative_count())
            .collect();
        assert_eq!(
            &cumulative[..3],
            [0, 4000, 4000],
            "0.7 ms is ≤ 1 ms, not ≤ 0.5 ms"
        );
        let upstream = family(&collected, "sluice_upstream_duration_seconds").get_metric();
        let upstream = upstream[0].get_histogram();
        assert_eq!(
            upstream.get_sample_count(),
            4000,
            "past the last bound: +Inf only"
        );
        assert_eq!(
            upstream.get_bucket().last().map(|b| b.cumulative_count()),
            Some(0)
        );
        let in_flight = family(&collected, "sluice_requests_in_flight").get_metric();
        assert_eq!(in_flight[0].get_gauge().value(), 3.0);
    }

    #[test]
    fn the_in_flight_gauge_never_reads_below_zero() {
        let meters = RequestFamilies::new().route("r", DECISIONS);
        // As a scrape sees a request that entered on a slot it had already read.
        meters.leave();
        assert_eq!(meters.in_flight(), 0);
        meters.enter();
        meters.enter();
        assert_eq!(meters.in_flight(), 1);
    }

    #[test]
    fn a_bound_itself_falls_in_its_own_bucket() {
        let buckets = Buckets::default();
        buckets.observe(Duration::from_micros(500));
        buckets.observe(Duration::from_micros(501));
        let mut summed = Summed::default();
        summed.add(&buckets);
        assert_eq!(&summed.counts[..3], [1, 1, 0], "le=0.0005 holds 0.5 ms");
    }

    #[test]
    fn a_route_kept_by_a_reload_keeps_its_counts_and_a_retired_one_is_gone() {
        let families = RequestFamilies::new();
        families.route("kept", DECISIONS).count(0);
        families.route("gone", DECISIONS).count(0);
        assert_eq!(families.route("kept", DECISIONS).decided(0), 1);
        families.retire("gone");
        let collected = families.collect();
        let routes: Vec<&str> = family(&collected, "sluice_requests_in_flight")
            .get_metric()
            .iter()
            .map(|m| m.get_label()[0].value())
            .collect();
        assert_eq!(routes, ["kept"]);
        assert_eq!(
            families.route("gone", DECISIONS).decided(0),
            0,
            "a new series"
        );
    }
}
