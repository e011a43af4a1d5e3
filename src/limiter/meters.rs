//! Counters and histograms kept per thread ([`PerThread`]) and summed when scraped, for the
//! meters every decision writes whatever its route: how long deciding took, how many decisions
//! one Redis call carried, a deny-cache hit, a decision paid from leases held. Through
//! prometheus's own handles each of these was a few atomic writes (a histogram's count, bucket
//! and `f64` sum, the sum a compare-and-swap loop) on lines that every core of the process
//! wrote for every request. Here a decision's writes stay on its thread's slot, and a
//! [`Family`] (a prometheus `Collector`) sums the slots at a scrape: the same names, help,
//! labels and buckets as before.
//!
//! Kept for the process-wide series only: each series costs a slot per thread that writes it
//! (128 bytes, more for a histogram), which a family with a series per route and limit would
//! multiply by the routes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};

use super::per_thread::PerThread;

/// One series of a family, as a scrape writes it.
pub trait Series: Clone + Send + Sync + 'static {
    const KIND: MetricType;

    /// Writes the series' value, summed over the threads, into `metric`.
    fn write(&self, metric: &mut proto::Metric);
}

/// A counter kept per thread.
#[derive(Clone, Default)]
pub struct Counter(Arc<PerThread<AtomicU64>>);

impl Counter {
    pub fn inc(&self) {
        self.0
            .local(AtomicU64::default)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The count so far, summed over the threads.
    pub fn get(&self) -> u64 {
        let slots = self.0.made();
        slots.map(|count| count.load(Ordering::Relaxed)).sum()
    }
}

impl Series for Counter {
    const KIND: MetricType = MetricType::COUNTER;

    fn write(&self, metric: &mut proto::Metric) {
        let mut counter = proto::Counter::default();
        counter.set_value(self.get() as f64);
        metric.set_counter(counter);
    }
}

/// A histogram kept per thread: prometheus's buckets (`le`, inclusive) and sum.
#[derive(Clone)]
pub struct Histogram(Arc<HistogramSlots>);

/// A histogram's bounds and every thread's share of it.
struct HistogramSlots {
    /// The upper bounds, ascending; values above the last count in `+Inf`.
    bounds: Arc<[f64]>,
    slots: PerThread<Slot>,
}

/// One thread's share of a histogram.
struct Slot {
    /// A count per bound, then `+Inf`'s: made by the slot's thread, as the slot is, so on
    /// memory its allocator keeps apart from other threads' (not on the slot's own line).
    counts: Box<[AtomicU64]>,
    /// The sum of the values, as `f64` bits: only its thread writes it, so its update loop
    /// finds the line its own.
    sum: AtomicU64,
}

impl Histogram {
    /// A histogram of upper bounds `bounds` (ascending), registered nowhere until a family
    /// holds it.
    pub fn new(bounds: &[f64]) -> Histogram {
        Histogram(Arc::new(HistogramSlots {
            bounds: bounds.into(),
            slots: PerThread::new(),
        }))
    }

    pub fn observe(&self, value: f64) {
        let buckets = &*self.0;
        let bounds = buckets.bounds.len();
        let slot = buckets.slots.local(|| Slot {
            counts: (0..=bounds).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        });
        // `le` is inclusive; NaN is below no bound, so only in `+Inf` (as prometheus counts it).
        let bucket = if value.is_nan() {
            bounds
        } else {
            buckets.bounds.partition_point(|bound| *bound < value)
        };
        if let Some(count) = slot.counts.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        let add = |bits: u64| Some((f64::from_bits(bits) + value).to_bits());
        let _ = slot
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, add);
    }

    /// The values observed so far, summed over the threads.
    pub fn get_sample_count(&self) -> u64 {
        let slots = self.0.slots.made();
        let counts = slots.flat_map(|slot| slot.counts.iter());
        counts.map(|count| count.load(Ordering::Relaxed)).sum()
    }

    /// The sum of the values observed so far, over the threads.
    pub fn get_sample_sum(&self) -> f64 {
        let slots = self.0.slots.made();
        slots
            .map(|slot| f64::from_bits(slot.sum.load(Ordering::Relaxed)))
            .sum()
    }
}

impl Series for Histogram {
    const KIND: MetricType = MetricType::HISTOGRAM;

    fn write(&self, metric: &mut proto::Metric) {
        let buckets = &*self.0;
        let mut counts = vec![0u64; buckets.bounds.len() + 1];
        let mut sum = 0.0;
        for slot in buckets.slots.made() {
            for (i, total) in counts.iter_mut().enumerate() {
                *total += slot.counts[i].load(Ordering::Relaxed);
            }
            sum += f64::from_bits(slot.sum.load(Ordering::Relaxed));
        }
        let bounds = buckets.bounds.iter().copied();
        metric.set_histogram(summed_histogram(bounds, &counts, sum));
    }
}

/// A histogram as a scrape shows it, from each bucket's own count (one per bound of `bounds`,
/// then `+Inf`'s) summed over the threads, and the sum of the values.
pub fn summed_histogram(
    bounds: impl Iterator<Item = f64>,
    counts: &[u64],
    sum: f64,
) -> proto::Histogram {
    let mut cumulative = 0;
    let buckets = bounds.enumerate().map(|(i, bound)| {
        cumulative += counts.get(i).copied().unwrap_or(0);
        let mut bucket = proto::Bucket::default();
        bucket.set_upper_bound(bound);
        bucket.set_cumulative_count(cumulative);
        bucket
    });
    let mut histogram = proto::Histogram::default();
    histogram.set_bucket(buckets.collect());
    histogram.set_sample_count(counts.iter().sum());
    histogram.set_sample_sum(sum);
    histogram
}

/// A family of series of `M`, one per set of label values, made by `make` when first asked
/// for (when a configuration is loaded, never by a request): a collector for a registry.
#[derive(Clone)]
pub struct Family<M>(Arc<FamilyOf<M>>);

type Make<M> = Box<dyn Fn() -> M + Send + Sync>;

/// One series: its label values, in the family's label order, and its meter.
type Labelled<M> = (Box<[Box<str>]>, M);

struct FamilyOf<M> {
    desc: Desc,
    make: Make<M>,
    series: Mutex<Vec<Labelled<M>>>,
}

impl<M: Series> Family<M> {
    /// A family named `name` (sluice's own names, so valid), its series labelled `labels`. A
    /// family of no labels has its one series from the start, so a scrape shows it at zero
    /// (as prometheus's own unlabelled counters and histograms are).
    pub fn new(
        name: &str,
        help: &str,
        labels: &[&str],
        make: impl Fn() -> M + Send + Sync + 'static,
    ) -> Family<M> {
        let family = Family(Arc::new(FamilyOf {
            desc: desc(name, help, labels),
            make: Box::new(make),
            series: Mutex::default(),
        }));
        if labels.is_empty() {
            family.with_label_values(&[]);
        }
        family
    }

    fn series(&self) -> MutexGuard<'_, Vec<Labelled<M>>> {
        self.0.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The series labelled `values` (the family's labels, in order): the same one every time,
    /// so a reload keeps its count.
    pub fn with_label_values(&self, values: &[&str]) -> M {
        debug_assert_eq!(
            values.len(),
            self.0.desc.variable_labels.len(),
            "{}: one value per label",
            self.0.desc.fq_name
        );
        let mut series = self.series();
        let same =
            |(labels, _): &&Labelled<M>| labels.iter().map(|l| &**l).eq(values.iter().copied());
        if let Some((_, found)) = series.iter().find(same) {
            return found.clone();
        }
        let made = (self.0.make)();
        series.push((values.iter().map(|v| (*v).into()).collect(), made.clone()));
        made
    }
}

impl<M: Series> Collector for Family<M> {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let desc = &self.0.desc;
        let series = self.series();
        let metrics = series.iter().map(|(values, series)| {
            let values: Vec<&str> = values.iter().map(|v| &**v).collect();
            let mut metric = labelled(desc, &values);
            series.write(&mut metric);
            metric
        });
        vec![family(desc, M::KIND, metrics.collect())]
    }
}

/// One family's description (the names are sluice's own, so valid).
pub fn desc(name: &str, help: &str, labels: &[&str]) -> Desc {
    let labels = labels.iter().map(|label| label.to_string()).collect();
    Desc::new(name.into(), help.into(), labels, Default::default())
        .unwrap_or_else(|e| panic!("{name}'s description: {e}"))
}

/// A family of `desc`'s name and help, of `kind`, holding `metrics`.
pub fn family(desc: &Desc, kind: MetricType, metrics: Vec<proto::Metric>) -> MetricFamily {
    let mut family = MetricFamily::default();
    family.set_name(desc.fq_name.clone());
    family.set_help(desc.help.clone());
    family.set_field_type(kind);
    family.set_metric(metrics);
    family
}

/// A series labelled `values`, by `desc`'s label names in order.
pub fn labelled(desc: &Desc, values: &[&str]) -> proto::Metric {
    let names = desc.variable_labels.iter().enumerate();
    let pairs = names.filter_map(|(i, name)| {
        let mut pair = LabelPair::default();
        pair.set_name(name.clone());
        pair.set_value(values.get(i)?.to_string());
        Some(pair)
    });
    proto::Metric::from_label(pairs.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_sums_every_thread_and_a_bound_falls_in_its_own_bucket() {
        let family = Family::new("h", "help", &["backend"], || Histogram::new(&[0.001, 0.01]));
        let redis = family.with_label_values(&["redis"]);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    redis.observe(0.001);
                    redis.observe(0.005);
                    redis.observe(1.0);
                });
            }
        });
        let again = family.with_label_values(&["redis"]);
        assert_eq!(again.get_sample_count(), 12, "the same series");
        let collected = family.collect();
        let metric = &collected[0].get_metric()[0];
        assert_eq!(metric.get_label()[0].value(), "redis");
        let histogram = metric.get_histogram();
        let cumulative: Vec<u64> = histogram
            .get_bucket()
            .iter()
            .map(|b| b.cumulative_count())
            .collect();
        assert_eq!(cumulative, [4, 8], "0.001 is in le=0.001");
        assert_eq!(histogram.get_sample_count(), 12);
        assert!((histogram.get_sample_sum() - 4.024).abs() < 1e-9);
        let odd = Histogram::new(&[0.001, 0.01]);
        odd.observe(f64::NAN);
        let mut metric = proto::Metric::default();
        odd.write(&mut metric);
        let buckets = metric.get_histogram().get_bucket();
        assert_eq!(buckets[0].cumulative_count(), 0, "NaN is in +Inf alone");
        assert_eq!(buckets[1].cumulative_count(), 0);
        assert_eq!(metric.get_histogram().get_sample_count(), 1);
    }

    #[test]
    fn a_counter_sums_every_thread_and_each_label_set_is_its_own() {
        let family = Family::new("c", "help", &[], Counter::default);
        let before = family.collect();
        let zero = &before[0].get_metric()[0];
        assert_eq!(
            zero.get_counter().value(),
            0.0,
            "an unlabelled family shows at zero"
        );
        let hits = family.with_label_values(&[]);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| (0..1000).for_each(|_| hits.inc()));
            }
        });
        assert_eq!(family.with_label_values(&[]).get(), 3000);
        let collected = family.collect();
        assert_eq!(collected[0].get_field_type(), MetricType::COUNTER);
        assert_eq!(collected[0].get_metric()[0].get_counter().value(), 3000.0);
        let other = Family::new("d", "help", &["kind"], Counter::default);
        other.with_label_values(&["a"]).inc();
        assert_eq!(other.with_label_values(&["b"]).get(), 0);
        assert_eq!(other.collect()[0].get_metric().len(), 2);
    }
}
