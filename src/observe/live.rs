//! The dashboard's live views, in bounded memory whatever the traffic: each limit's decisions
//! per second over the last [`HISTORY_SECONDS`] (sampled from the counters `/metrics` exports,
//! so the two agree), each upstream server's failed attempts over the last minute (sampled the
//! same way), the most limited keys and consumers (a space-saving top-k, fed only by denials),
//! and the last reloads with their results. One [`LiveViews`] is built at start and handed to
//! every site in turn (`exchange::site::Lasting`), as the clock is: a reload keeps it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How many one-second samples each series keeps: five minutes.
pub const HISTORY_SECONDS: usize = 300;
/// The most series kept (a configuration's `(route, limit)` pairs beyond it are not shown).
pub const MAX_SERIES: usize = 512;
/// How many keys and consumers the top-k follows.
pub const TOP_K: usize = 20;
/// How many reloads are remembered.
pub const RELOADS_KEPT: usize = 10;
/// The longest text one top-k entry keeps (a key, a consumer id), in bytes.
const MAX_ENTRY: usize = 256;

/// Decisions of one limit (in one second, or since the start): what it decided — allowed,
/// limited, shadow-limited — apart from what the failure mode answered while the limiter could
/// not decide (admitted: `error_allowed`, `local_allowed`; refused: `error_denied`,
/// `local_limited`), so an outage never reads as ordinary traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub limited: u64,
    pub shadow: u64,
    pub failure_admitted: u64,
    pub failure_refused: u64,
}

impl Counts {
    /// What was counted after `earlier` (totals read from the same counters).
    pub fn since(self, earlier: Counts) -> Counts {
        Counts {
            allowed: self.allowed.saturating_sub(earlier.allowed),
            limited: self.limited.saturating_sub(earlier.limited),
            shadow: self.shadow.saturating_sub(earlier.shadow),
            failure_admitted: self
                .failure_admitted
                .saturating_sub(earlier.failure_admitted),
            failure_refused: self.failure_refused.saturating_sub(earlier.failure_refused),
        }
    }

    /// Both counted together.
    pub fn plus(self, other: Counts) -> Counts {
        Counts {
            allowed: self.allowed + other.allowed,
            limited: self.limited + other.limited,
            shadow: self.shadow + other.shadow,
            failure_admitted: self.failure_admitted + other.failure_admitted,
            failure_refused: self.failure_refused + other.failure_refused,
        }
    }

    /// What the failure mode answered, admitted or refused.
    pub fn by_failure_mode(self) -> u64 {
        self.failure_admitted + self.failure_refused
    }
}

/// One `(route, limit)` series: its totals at the last sample, and its last seconds.
#[derive(Debug, Clone)]
pub struct Series {
    pub route: Arc<str>,
    pub limit: Arc<str>,
    /// The counters' values at the last sample (what `/metrics` said then).
    pub totals: Counts,
    /// Per second, oldest first: at most [`HISTORY_SECONDS`].
    pub seconds: VecDeque<Counts>,
}

/// Every series' last seconds.
#[derive(Debug, Default)]
pub struct DecisionHistory {
    series: Mutex<Vec<Series>>,
    samples: AtomicU64,
}

impl DecisionHistory {
    /// Records one second: `now`, each series' totals as read from its counters. Series not
    /// in `now` are dropped (a reload removed them); new ones start empty.
    pub fn record(&self, now: impl IntoIterator<Item = (Arc<str>, Arc<str>, Counts)>) {
        let mut series = lock(&self.series);
        let mut next = Vec::with_capacity(series.len());
        for (route, limit, totals) in now.into_iter().take(MAX_SERIES) {
            let kept = series
                .iter()
                .position(|s| s.route == route && s.limit == limit)
                .map(|at| series.swap_remove(at));
            let mut one = kept.unwrap_or_else(|| Series {
                route,
                limit,
                totals,
                seconds: VecDeque::with_capacity(HISTORY_SECONDS),
            });
            let second = totals.since(one.totals);
            if one.seconds.len() == HISTORY_SECONDS {
                one.seconds.pop_front();
            }
            one.seconds.push_back(second);
            one.totals = totals;
            next.push(one);
        }
        *series = next;
        self.samples.fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of every series with its last `seconds` only.
    pub fn recent(&self, seconds: usize) -> Vec<Series> {
        let series = lock(&self.series);
        let recent = series.iter().map(|one| {
            let skip = one.seconds.len().saturating_sub(seconds);
            Series {
                route: Arc::clone(&one.route),
                limit: Arc::clone(&one.limit),
                totals: one.totals,
                seconds: one.seconds.iter().skip(skip).copied().collect(),
            }
        });
        recent.collect()
    }

    /// A copy of every series.
    pub fn series(&self) -> Vec<Series> {
        lock(&self.series).clone()
    }

    /// How many seconds were sampled since the start.
    pub fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }
}

/// How many seconds of upstream errors are kept per server and kind: the dashboard's "recent".
pub const ERROR_SECONDS: usize = 60;

/// One server's failed attempts of one kind: the counter's value at the last sample, and how
/// many each second added.
#[derive(Debug, Clone)]
struct ErrorSeries {
    server: Arc<str>,
    kind: &'static str,
    total: u64,
    seconds: VecDeque<u64>,
}

/// A server's failed upstream attempts of one kind: in the last [`ERROR_SECONDS`], and since
/// the start (the counter at the last sample).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerErrorCount {
    pub kind: &'static str,
    pub recent: u64,
    pub total: u64,
}

/// Every upstream server's failed attempts per kind over the last [`ERROR_SECONDS`], sampled
/// from `sluice_upstream_server_errors_total` (so the two agree), at most [`MAX_SERIES`]
/// series.
#[derive(Debug, Default)]
pub struct ErrorHistory {
    series: Mutex<Vec<ErrorSeries>>,
}

impl ErrorHistory {
    /// Records one second: each `(server, kind, total)` as read from its counter. Series not
    /// in `now` are dropped (a reload removed the server); new ones start at their total.
    pub fn record(&self, now: impl IntoIterator<Item = (Arc<str>, &'static str, u64)>) {
        let mut series = lock(&self.series);
        let mut next = Vec::with_capacity(series.len());
        for (server, kind, total) in now.into_iter().take(MAX_SERIES) {
            let kept = series
                .iter()
                .position(|s| s.server == server && s.kind == kind)
                .map(|at| series.swap_remove(at));
            let mut one = kept.unwrap_or_else(|| ErrorSeries {
                server,
                kind,
                total,
                seconds: VecDeque::with_capacity(ERROR_SECONDS),
            });
            if one.seconds.len() == ERROR_SECONDS {
                one.seconds.pop_front();
            }
            one.seconds.push_back(total.saturating_sub(one.total));
            one.total = total;
            next.push(one);
        }
        *series = next;
    }

    /// The kinds of failed attempts `server` has had since the start, with how many were in
    /// the last [`ERROR_SECONDS`].
    pub fn of(&self, server: &str) -> Vec<ServerErrorCount> {
        let series = lock(&self.series);
        let of_server = series
            .iter()
            .filter(|s| &*s.server == server && s.total > 0);
        of_server
            .map(|s| ServerErrorCount {
                kind: s.kind,
                recent: s.seconds.iter().sum(),
                total: s.total,
            })
            .collect()
    }
}

/// One entry of a top-k: what it names and how often it was limited (an over-estimate of at
/// most `error`, as space-saving counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heavy {
    pub name: String,
    pub count: u64,
    pub error: u64,
}

/// The `TOP_K` names seen most often (space-saving, Metwally et al.): a name not followed
/// takes the place of the least counted, inheriting its count as its error. Counted on the
/// denial path: a count that finds the list busy is skipped (and itself counted) rather than
/// waited for, so a flood of denials on every thread never queues on it.
#[derive(Debug, Default)]
pub struct TopK {
    entries: Mutex<Vec<Heavy>>,
    skipped: AtomicU64,
}

impl TopK {
    /// Counts one more of the name `parts` make, one after the other, cut to [`MAX_ENTRY`]
    /// bytes; written out only when it is new to the list.
    pub fn count(&self, parts: &[&str]) {
        let mut entries = match self.entries.try_lock() {
            Ok(entries) => entries,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        if let Some(entry) = entries.iter_mut().find(|e| names(&e.name, parts)) {
            entry.count += 1;
            return;
        }
        let name = cut(&parts.concat()).to_string();
        if entries.len() < TOP_K {
            entries.push(Heavy {
                name,
                count: 1,
                error: 0,
            });
            return;
        }
        if let Some(least) = entries.iter_mut().min_by_key(|e| e.count) {
            *least = Heavy {
                name,
                count: least.count + 1,
                error: least.count,
            };
        }
    }

    /// The entries, most counted first.
    pub fn top(&self) -> Vec<Heavy> {
        let mut entries = lock(&self.entries).clone();
        entries.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
        entries
    }

    /// How many counts found the list busy and were skipped.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

/// Whether `name` is what `parts` make, cut as a stored name is: compared without writing the
/// whole name out.
fn names(name: &str, parts: &[&str]) -> bool {
    let whole: usize = parts.iter().map(|part| part.len()).sum();
    let stored = name.as_bytes();
    // A name past the bound is stored cut on a character boundary: within 3 bytes of it.
    let length_fits = match whole > MAX_ENTRY {
        true => stored.len() <= MAX_ENTRY && stored.len() + 3 >= MAX_ENTRY,
        false => stored.len() == whole,
    };
    let mut joined = parts.iter().flat_map(|part| part.bytes());
    length_fits && stored.iter().all(|b| joined.next() == Some(*b))
}

/// `text` cut to at most [`MAX_ENTRY`] bytes, on a character boundary.
fn cut(text: &str) -> &str {
    let mut end = text.len().min(MAX_ENTRY);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// What one reload did.
#[derive(Debug, Clone)]
pub struct Reload {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// What asked for it: `SIGHUP`, or the watched file that changed.
    pub cause: String,
    /// `None`: it took effect; else every problem, one per line.
    pub error: Option<String>,
}

/// The reloads since the start: how many took effect, and the last [`RELOADS_KEPT`].
#[derive(Debug, Default)]
pub struct Reloads {
    state: Mutex<(u64, VecDeque<Reload>)>,
}

impl Reloads {
    /// Remembers a reload for `cause` that ended with `error` (`None`: in force).
    pub fn record(&self, cause: &str, error: Option<String>) {
        let mut state = lock(&self.state);
        if error.is_none() {
            state.0 += 1;
        }
        if state.1.len() == RELOADS_KEPT {
            state.1.pop_front();
        }
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        state.1.push_back(Reload {
            at: at.as_secs(),
            cause: cut(cause).to_string(),
            error,
        });
    }

    /// The configuration's generation (1: the one started with; each reload that took effect
    /// adds one) and the last reloads, newest first.
    pub fn history(&self) -> (u64, Vec<Reload>) {
        let state = lock(&self.state);
        (state.0 + 1, state.1.iter().rev().cloned().collect())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The dashboard's live views of one process, built once at start and handed down (never a
/// static): what the exchange counts into, the sampler records, a reload notes and the
/// dashboard shows.
#[derive(Debug)]
pub struct LiveViews {
    /// Each limit's decisions per second (fed by `runtime::sampler`).
    pub decisions: DecisionHistory,
    /// The keys limits denied most: `route/limit key`.
    pub limited_keys: TopK,
    /// The consumers denied most.
    pub limited_consumers: TopK,
    /// Each upstream server's failed attempts per second (fed by `runtime::sampler`).
    pub server_errors: ErrorHistory,
    /// The reloads since the start.
    pub reloads: Reloads,
    /// When the process started (the dashboard's uptime).
    pub started: SystemTime,
}

impl LiveViews {
    /// Empty views, the uptime counting from now.
    pub fn new() -> LiveViews {
        LiveViews {
            decisions: DecisionHistory::default(),
            limited_keys: TopK::default(),
            limited_consumers: TopK::default(),
            server_errors: ErrorHistory::default(),
            reloads: Reloads::default(),
            started: SystemTime::now(),
        }
    }
}

impl Default for LiveViews {
    fn default() -> LiveViews {
        LiveViews::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_k_keeps_the_heaviest_names_in_bounded_space() {
        let top = TopK::default();
        for round in 0..50u64 {
            top.count(&["heavy"]);
            top.count(&["light-", &round.to_string()]);
        }
        let entries = top.top();
        assert_eq!(entries.len(), TOP_K, "bounded");
        assert_eq!(entries[0].name, "heavy");
        assert_eq!((entries[0].count, entries[0].error), (50, 0));
        let long = "é".repeat(5_000);
        top.count(&["r/l ", &long]);
        top.count(&["r/l ", &long]);
        top.count(&["r/l ", "short"]);
        let entries = top.top();
        assert!(entries.iter().all(|e| e.name.len() <= MAX_ENTRY));
        let cut = entries
            .iter()
            .find(|e| e.name.starts_with("r/l "))
            .expect("counted");
        assert_eq!(
            cut.count - cut.error,
            2,
            "a name past the bound is still one name"
        );
        assert!(
            entries.iter().any(|e| e.name == "r/l short"),
            "a prefix is another name"
        );
        assert_eq!(top.skipped(), 0);
    }

    #[test]
    fn a_history_keeps_seconds_as_differences_of_totals_and_drops_retired_series() {
        let history = DecisionHistory::default();
        let totals = |allowed, limited| Counts {
            allowed,
            limited,
            ..Counts::default()
        };
        let (r, a, b): (Arc<str>, Arc<str>, Arc<str>) = ("r".into(), "a".into(), "b".into());
        history.record([(r.clone(), a.clone(), totals(5, 1))]);
        history.record([
            (r.clone(), a.clone(), totals(9, 4)),
            (r.clone(), b.clone(), totals(1, 0)),
        ]);
        let series = history.series();
        assert_eq!(series[0].seconds, [Counts::default(), totals(4, 3)]);
        assert_eq!(series[0].totals, totals(9, 4));
        let outage = Counts {
            failure_admitted: 6,
            failure_refused: 2,
            ..totals(9, 4)
        };
        history.record([
            (r.clone(), a.clone(), outage),
            (r.clone(), b.clone(), totals(1, 0)),
        ]);
        let second = history.series()[0].seconds[2];
        assert_eq!(
            (second.allowed, second.limited, second.by_failure_mode()),
            (0, 0, 8),
            "answers of the failure mode are neither allowed nor limited"
        );
        for _ in 0..HISTORY_SECONDS + 5 {
            history.record([(r.clone(), b.clone(), totals(1, 0))]);
        }
        let series = history.series();
        assert_eq!(series.len(), 1, "a retired, b kept");
        assert_eq!(series[0].seconds.len(), HISTORY_SECONDS, "bounded");
        assert_eq!(history.samples(), HISTORY_SECONDS as u64 + 8);
    }

    #[test]
    fn a_servers_recent_errors_are_those_of_its_last_minute() {
        let history = ErrorHistory::default();
        let (a, b): (Arc<str>, Arc<str>) = ("10.0.0.1:80".into(), "10.0.0.2:80".into());
        history.record([(a.clone(), "refused", 4), (b.clone(), "refused", 0)]);
        assert_eq!(
            history.of("10.0.0.1:80"),
            [ServerErrorCount {
                kind: "refused",
                recent: 0,
                total: 4
            }],
            "counted before the first sample: not recent"
        );
        history.record([(a.clone(), "refused", 6), (b.clone(), "refused", 0)]);
        assert_eq!(history.of("10.0.0.1:80")[0].recent, 2);
        assert!(
            history.of("10.0.0.2:80").is_empty(),
            "no error, nothing to say"
        );
        for _ in 0..ERROR_SECONDS {
            history.record([(a.clone(), "refused", 6)]);
        }
        assert_eq!(
            history.of("10.0.0.1:80"),
            [ServerErrorCount {
                kind: "refused",
                recent: 0,
                total: 6
            }],
            "a minute later"
        );
    }

    #[test]
    fn reloads_count_generations_and_keep_the_last_few() {
        let reloads = Reloads::default();
        reloads.record("SIGHUP", None);
        for _ in 0..RELOADS_KEPT {
            reloads.record("SIGHUP", Some("conf.yaml: routes[0]: bad".into()));
        }
        let (generation, last) = reloads.history();
        assert_eq!(generation, 2);
        assert_eq!(last.len(), RELOADS_KEPT);
        assert!(last.iter().all(|r| r.error.is_some()), "newest first");
    }
}
