//! The verdict's one home. Given a route's limits ([`LimitSet`]) and what the request asks of
//! each ([`Ask`]), the policy calls the limiter, applies the route's failure mode when the
//! limiter cannot decide (allow, deny, or this gateway's share in-process), and returns one
//! [`Verdict`]: the decision and the metric outcome (which says whether it goes upstream). When the request
//! ends, it gives back the concurrency slots to whoever took them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, HistogramOpts, IntCounter};

use smallvec::SmallVec;

use super::algorithm::{Algorithm, Change};
use super::backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Source};
use super::engine::Engine;
use super::error::{ErrorKind, LimiterError};
use super::id::{RequestId, RequestIds};
use super::limit::{CostReport, Limit, LIMITS_INLINE};
use super::local::LocalLimiter;
use super::request::{entries, Ask, LimitRequest};
use super::verdict::{Decider, Outcome, Verdict};

/// What a request gets when the limiter cannot decide (Redis error or deadline missed). Its
/// snake_case name (`allow`, `deny`, `local`) is what the configuration says (`FromStr`, the
/// names listed by `VariantNames`) and what logs and labels show (`label()`, `Display`).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    strum::EnumString,
    strum::VariantNames,
    strum::IntoStaticStr,
    strum::Display,
)]
#[strum(serialize_all = "snake_case")]
pub enum FailureMode {
    Allow,
    Deny,
    /// Enforce the limits in-process at `limit / instances` while Redis is unavailable.
    Local,
}

impl FailureMode {
    /// The name, as the configuration spells it.
    pub fn label(self) -> &'static str {
        self.into()
    }

    /// Whether requests are refused while the limiter is unreachable.
    pub fn refuses(self) -> bool {
        self == FailureMode::Deny
    }
}

/// Every limit of one route as the policy applies them, compiled once at config load.
#[derive(Debug, Clone)]
pub struct LimitSet {
    limits: Box<[Limit]>,
    /// The limits scaled to one gateway's share (`limit / instances`), for `failure_mode: local`.
    local_shares: Box<[Limit]>,
    failure_mode: FailureMode,
    /// Overrides the backend's deadline for this route's calls.
    deadline: Option<Duration>,
    /// Some limit stores per-request entries (sliding log, concurrency): calls need an id.
    needs_request_id: bool,
    /// Some limit is a concurrency limit: admitted requests give their slot back when done.
    holds_slots: bool,
    /// Some limit is priced by the response: admitted requests are settled when it ends.
    priced_by_response: bool,
}

impl LimitSet {
    pub fn new(
        limits: Vec<Limit>,
        instances: u64,
        failure_mode: FailureMode,
        deadline: Option<Duration>,
    ) -> LimitSet {
        LimitSet {
            local_shares: limits.iter().map(|l| l.share(instances)).collect(),
            needs_request_id: limits.iter().any(|l| l.algorithm.needs_request_id()),
            holds_slots: limits
                .iter()
                .any(|l| matches!(l.algorithm, Algorithm::Concurrency { .. })),
            priced_by_response: limits.iter().any(|l| l.priced_by_response.is_some()),
            limits: limits.into(),
            failure_mode,
            deadline,
        }
    }

    /// A set without limits: every request is admitted without asking a limiter.
    pub fn none() -> LimitSet {
        LimitSet::new(Vec::new(), 1, FailureMode::Allow, None)
    }

    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    pub fn failure_mode(&self) -> FailureMode {
        self.failure_mode
    }

    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    pub fn len(&self) -> usize {
        self.limits.len()
    }

    /// Some limit is priced by the response (`cost_from_response`).
    pub fn priced_by_response(&self) -> bool {
        self.priced_by_response
    }
}

/// What the policy counts: how long deciding takes (by what answered), and why it failed.
#[derive(Clone)]
pub struct PolicyMeters {
    /// `sluice_limiter_duration_seconds` of the configured backend.
    pub duration: Histogram,
    /// The same, for decisions the deny cache answered.
    pub deny_cache_duration: Histogram,
    /// The same, for decisions paid from leases held.
    pub lease_duration: Histogram,
    /// `sluice_limiter_errors_total`, one handle per [`ErrorKind`], in its order.
    pub errors: Vec<IntCounter>,
}

impl PolicyMeters {
    /// Handles registered nowhere (tests and tools).
    pub fn unregistered() -> PolicyMeters {
        let histogram = || {
            Histogram::with_opts(HistogramOpts::new("duration", "unregistered"))
                .expect("a valid histogram")
        };
        PolicyMeters {
            duration: histogram(),
            deny_cache_duration: histogram(),
            lease_duration: histogram(),
            errors: ErrorKind::ALL
                .iter()
                .map(|kind| IntCounter::new(kind.label(), "unregistered").expect("a valid counter"))
                .collect(),
        }
    }

    fn error(&self, error: &LimiterError) {
        if let Some(counter) = self.errors.get(error.kind().index()) {
            counter.inc();
        }
    }
}

/// Decides requests against their route's limits, and settles them when they end. `E` is what
/// decides: the configured [`Engine`], or a stand-in in tests.
pub struct Policy<E = Engine> {
    engine: E,
    /// Decides `failure_mode: local` requests while the engine cannot; `None` when the engine
    /// is itself in-process.
    fallback: Option<Arc<LocalLimiter>>,
    clock: Arc<dyn Clock>,
    ids: RequestIds,
    meters: PolicyMeters,
    /// Unix second of the last limiter error logged: at most one line per second.
    last_error_log: AtomicU64,
}

/// Who decided an admitted request, and so gives back and settles what it took.
enum Taker<'a> {
    Engine,
    Fallback(&'a LocalLimiter),
}

impl<E: Limiter + ReleaseSlots + SettleUnits + Backend> Policy<E> {
    pub fn new(
        engine: E,
        fallback: Option<Arc<LocalLimiter>>,
        clock: Arc<dyn Clock>,
        meters: PolicyMeters,
    ) -> Policy<E> {
        Policy {
            engine,
            fallback,
            clock,
            ids: RequestIds::new(),
            meters,
            last_error_log: AtomicU64::new(0),
        }
    }

    /// The backend's name (`redis`, `local`).
    pub fn backend(&self) -> &'static str {
        self.engine.name()
    }

    pub async fn readiness(&self) -> Readiness {
        self.engine.readiness().await
    }

    /// Connects the backend, then keeps its connections usable while idle, for as long as the
    /// runtime it runs on (`Backend::keep`).
    pub async fn keep_connections(&self) {
        self.engine.readiness().await;
        self.engine.keep().await;
    }

    /// The verdict on a request asking `asks` (one per limit of `set`, in order).
    pub async fn decide(&self, set: &LimitSet, asks: &[Ask]) -> Verdict {
        if set.is_empty() {
            return Verdict::unlimited();
        }
        let id = if set.needs_request_id {
            self.ids.next()
        } else {
            RequestId::default()
        };
        let entries = entries(&set.limits, asks);
        let request = LimitRequest {
            entries: &entries,
            id,
            deadline: set.deadline,
        };
        let started = self.clock.instant();
        let result = self.engine.check(&request).await;
        let limiter_time = self.clock.instant().saturating_duration_since(started);
        let histogram = match result.as_ref().map(|d| d.source) {
            Ok(Source::DenyCache) => &self.meters.deny_cache_duration,
            Ok(Source::Leases) => &self.meters.lease_duration,
            _ => &self.meters.duration,
        };
        histogram.observe(limiter_time.as_secs_f64());
        let verdict = match result {
            Ok(decision) => judged(decision, Decider::Backend),
            Err(error) => self.unavailable(set, asks, id, error).await,
        };
        Verdict {
            limiter_time,
            id,
            ..verdict
        }
    }

    /// What the backend holds for each of `set`'s limits at `asks`' keys, consuming nothing:
    /// every ask costs 0 and leased limits are read where their units are counted (the
    /// backend), so units leased out to gateways count as used. The usage API's read.
    pub async fn peek(&self, set: &LimitSet, asks: &[Ask]) -> Result<Decision, LimiterError> {
        let limits: Vec<Limit> = set
            .limits
            .iter()
            .map(|limit| Limit {
                leased: None,
                ..limit.clone()
            })
            .collect();
        let peeks: Vec<Ask> = asks
            .iter()
            .map(|ask| Ask {
                key: ask.key.clone(),
                cost: 0,
            })
            .collect();
        let entries = entries(&limits, &peeks);
        let request = LimitRequest {
            entries: &entries,
            id: self.ids.next(),
            deadline: set.deadline,
        };
        self.engine.check(&request).await
    }

    /// The limiter could not decide: the route's failure mode does.
    async fn unavailable(
        &self,
        set: &LimitSet,
        asks: &[Ask],
        id: RequestId,
        error: LimiterError,
    ) -> Verdict {
        self.report(&error, set.failure_mode);
        let refused = Verdict::undecided(Outcome::ErrorDenied);
        if error.always_denies() {
            return refused;
        }
        match (set.failure_mode, &self.fallback) {
            (FailureMode::Allow, _) => Verdict::undecided(Outcome::ErrorAllowed),
            (FailureMode::Deny, _) | (FailureMode::Local, None) => refused,
            (FailureMode::Local, Some(fallback)) => {
                let entries = entries(&set.local_shares, asks);
                let shares = LimitRequest {
                    entries: &entries,
                    id,
                    deadline: set.deadline,
                };
                match fallback.check(&shares).await {
                    Ok(decision) => judged(decision, Decider::Fallback),
                    Err(error) => {
                        self.report(&error, set.failure_mode);
                        refused
                    }
                }
            }
        }
    }

    /// The request has ended (response finished or client gone): gives back the concurrency
    /// slots it took, to whoever decided it.
    pub async fn finish(&self, set: &LimitSet, asks: &[Ask], verdict: &Verdict) {
        if !set.holds_slots || !verdict.admitted() {
            return;
        }
        let Some((limits, taker)) = self.taker(set, verdict.decider) else {
            return;
        };
        let entries = entries(limits, asks);
        let request = LimitRequest {
            entries: &entries,
            id: verdict.id,
            deadline: set.deadline,
        };
        let released = match taker {
            Taker::Engine => self.engine.release(&request).await,
            Taker::Fallback(fallback) => fallback.release(&request).await,
        };
        if let Err(error) = released {
            self.report(&error, set.failure_mode);
        }
    }

    /// Who decided by `decider`, and the limits it decided by.
    fn taker<'a>(
        &'a self,
        set: &'a LimitSet,
        decider: Decider,
    ) -> Option<(&'a [Limit], Taker<'a>)> {
        match (decider, &self.fallback) {
            (Decider::Backend, _) => Some((&set.limits, Taker::Engine)),
            (Decider::Fallback, Some(fallback)) => {
                Some((&set.local_shares, Taker::Fallback(fallback)))
            }
            (Decider::Nobody, _) | (Decider::Fallback, None) => None,
        }
    }

    /// An admitted request will not go on (its client left while it was held for shaping):
    /// gives back the units its call took from each exact GCRA and fixed-window limit, quoting
    /// the call's marks so nothing another request consumed since is given back. Other limits
    /// keep what they counted (a sliding window or log cannot give back exactly; a leased limit's
    /// units go back with its lease); concurrency slots go back with [`Policy::finish`].
    pub async fn give_back_abandoned(&self, set: &LimitSet, asks: &[Ask], verdict: &Verdict) {
        self.settle(set, asks, verdict, |_, limit, ask, mark_us| {
            (limit.leased.is_none() && ask.cost > 0).then_some(Change::GiveBack {
                units: ask.cost,
                mark_us,
            })
        })
        .await;
    }

    /// An admitted request's response has ended: each limit priced by the response
    /// (`cost_from_response`) whose cost it reported (`reports`, one per limit of `set`) is
    /// settled against the estimate its call took: the difference is charged, or given back.
    /// A limit whose cost was not reported keeps the estimate.
    pub async fn settle_response(
        &self,
        set: &LimitSet,
        asks: &[Ask],
        verdict: &Verdict,
        reports: &[CostReport],
    ) {
        if !set.priced_by_response {
            return;
        }
        self.settle(set, asks, verdict, |index, limit, ask, mark_us| {
            limit.priced_by_response.as_ref()?;
            let spent = reports.get(index)?.units()?;
            let taken = ask.cost;
            match spent.cmp(&taken) {
                std::cmp::Ordering::Greater => Some(Change::Charge {
                    units: spent - taken,
                }),
                std::cmp::Ordering::Less => Some(Change::GiveBack {
                    units: taken - spent,
                    mark_us,
                }),
                std::cmp::Ordering::Equal => None,
            }
        })
        .await;
    }

    /// Settles, in one call to whoever decided the admitted request, the change `change` says
    /// for each limit (by index, with what the request asked and the mark its call replied).
    /// Only GCRA and fixed-window limits whose call wrote their key (a mark) are settled: a
    /// shadow limit that denied took nothing.
    async fn settle(
        &self,
        set: &LimitSet,
        asks: &[Ask],
        verdict: &Verdict,
        change: impl Fn(usize, &Limit, &Ask, i64) -> Option<Change>,
    ) {
        let Some(decision) = verdict.decision.as_ref().filter(|_| verdict.admitted()) else {
            return;
        };
        let Some((limits, taker)) = self.taker(set, verdict.decider) else {
            return;
        };
        let settlements: SmallVec<[Settlement<'_>; LIMITS_INLINE]> = limits
            .iter()
            .zip(asks)
            .zip(&decision.statuses)
            .enumerate()
            .filter(|(_, ((limit, _), status))| {
                status.mark_us > 0
                    && matches!(
                        limit.algorithm,
                        Algorithm::Gcra { .. } | Algorithm::FixedWindow { .. }
                    )
            })
            .filter_map(|(index, ((limit, ask), status))| {
                Some(Settlement {
                    algorithm: &limit.algorithm,
                    key: &ask.key,
                    change: change(index, limit, ask, status.mark_us)?,
                })
            })
            .collect();
        if settlements.is_empty() {
            return;
        }
        let settled = match taker {
            Taker::Engine => self.engine.settle(&settlements).await,
            Taker::Fallback(fallback) => fallback.settle(&settlements).await,
        };
        if let Err(error) = settled {
            self.report(&error, set.failure_mode);
        }
    }

    /// Counts an error by kind and logs it, at most once a second.
    fn report(&self, error: &LimiterError, failure_mode: FailureMode) {
        self.meters.error(error);
        let second = (self.clock.now_us() / 1_000_000).max(0) as u64;
        if self.last_error_log.swap(second, Ordering::Relaxed) != second {
            log::warn!(
                "rate limiter unavailable ({}): {}: {error}; failure_mode={} applies",
                error.kind(),
                self.engine.target(),
                failure_mode.label()
            );
        }
    }
}

/// What a decision means for the request.
fn judged(decision: Decision, decider: Decider) -> Verdict {
    let locally = decider == Decider::Fallback;
    if !decision.allowed() {
        return Verdict {
            decision: Some(decision),
            decider,
            ..Verdict::undecided(if locally {
                Outcome::LocalLimited
            } else {
                Outcome::Limited
            })
        };
    }
    let outcome = match (locally, decision.shadow_denied_by.is_some()) {
        (true, _) => Outcome::LocalAllowed,
        (false, true) => Outcome::ShadowLimited,
        (false, false) => Outcome::Allowed,
    };
    Verdict {
        outcome,
        delay: Duration::from_millis(decision.delay_ms()),
        decision: Some(decision),
        decider,
        ..Verdict::unlimited()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::clock::ManualClock;
    use crate::limiter::testing::{asks, concurrency, gcra, limit, Unavailable};

    fn timeout() -> LimiterError {
        LimiterError::Timeout(25)
    }

    struct Fixture<E = Engine> {
        policy: Policy<E>,
        clock: Arc<ManualClock>,
        meters: PolicyMeters,
    }

    /// A policy whose backend fails with `error`, with the in-process fallback on a manual clock.
    fn unavailable(error: fn() -> LimiterError) -> Fixture<Unavailable> {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let engine = Unavailable(error);
        let fallback = Arc::new(LocalLimiter::new(clock.clone(), 1000));
        let meters = PolicyMeters::unregistered();
        Fixture {
            policy: Policy::new(engine, Some(fallback), clock.clone(), meters.clone()),
            clock,
            meters,
        }
    }

    /// A policy deciding in-process on a manual clock.
    fn in_process() -> Fixture {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let local = Arc::new(LocalLimiter::new(clock.clone(), 1000));
        let meters = PolicyMeters::unregistered();
        Fixture {
            policy: Policy::new(Engine::local(local), None, clock.clone(), meters.clone()),
            clock,
            meters,
        }
    }

    /// 10/s with no burst, shaping up to 500 ms: the second request at once waits 100 ms.
    fn shaped() -> Limit {
        let mut shaped = limit("s", gcra(10, 0));
        shaped.algorithm = crate::limiter::algorithm::Algorithm::Gcra {
            emission_us: 100_000,
            tolerance_us: 100_000,
            max_delay_us: 500_000,
        };
        shaped
    }

    fn set(limits: Vec<Limit>, mode: FailureMode) -> LimitSet {
        LimitSet::new(limits, 2, mode, None)
    }

    fn errors(meters: &PolicyMeters, kind: &str) -> u64 {
        let kind = ErrorKind::ALL.iter().find(|k| k.label() == kind).unwrap();
        meters.errors[kind.index()].get()
    }

    #[tokio::test]
    async fn allow_admits_what_the_limiter_cannot_decide_and_counts_why() {
        let f = unavailable(timeout);
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Allow);
        let verdict = f.policy.decide(&routes, &asks(&[b"k"], &[1])).await;
        assert_eq!(
            (verdict.outcome, verdict.decision.clone()),
            (Outcome::ErrorAllowed, None)
        );
        assert!(verdict.admitted());
        assert_eq!(errors(&f.meters, "timeout"), 1);
    }

    #[tokio::test]
    async fn deny_refuses_what_the_limiter_cannot_decide() {
        let f = unavailable(timeout);
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Deny);
        let verdict = f.policy.decide(&routes, &asks(&[b"k"], &[1])).await;
        assert_eq!(verdict.outcome, Outcome::ErrorDenied);
        assert!(!verdict.admitted());
        assert_eq!(errors(&f.meters, "timeout"), 1);
    }

    #[tokio::test]
    async fn local_enforces_this_gateways_share_in_process() {
        let f = unavailable(timeout);
        // 10 per second with a burst of 9, shared by 2 gateways: 5 per second each.
        let routes = set(vec![limit("l", gcra(10, 9))], FailureMode::Local);
        let ask = asks(&[b"k"], &[1]);
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(f.policy.decide(&routes, &ask).await.outcome);
        }
        assert_eq!(outcomes[..5], [Outcome::LocalAllowed; 5]);
        let denied = f.policy.decide(&routes, &ask).await;
        assert_eq!(
            (denied.outcome, denied.decider),
            (Outcome::LocalLimited, Decider::Fallback)
        );
        assert!(denied.decision.is_some_and(|d| !d.allowed()));
        // The share refills at 5 per second: one unit every 200 ms of the manual clock.
        f.clock.advance_by(Duration::from_millis(200));
        assert_eq!(
            f.policy.decide(&routes, &ask).await.outcome,
            Outcome::LocalAllowed
        );
    }

    #[tokio::test]
    async fn an_untrackable_request_is_refused_whatever_the_failure_mode() {
        let f = unavailable(|| LimiterError::LocalCapacity(1));
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Allow);
        let verdict = f.policy.decide(&routes, &asks(&[b"k"], &[1])).await;
        assert_eq!(verdict.outcome, Outcome::ErrorDenied);
        assert_eq!(errors(&f.meters, "local_capacity"), 1);
    }

    #[tokio::test]
    async fn slots_go_back_to_whoever_took_them() {
        slots_go_back(unavailable(timeout)).await;
        slots_go_back(in_process()).await;
    }

    async fn slots_go_back<E: Limiter + ReleaseSlots + SettleUnits + Backend>(f: Fixture<E>) {
        // One in flight per key (the share of 2 gateways keeps at least one slot).
        let routes = set(vec![limit("c", concurrency(1))], FailureMode::Local);
        let ask = asks(&[b"k"], &[1]);
        let first = f.policy.decide(&routes, &ask).await;
        assert!(first.admitted());
        assert_ne!(first.decider, Decider::Nobody);
        assert!(!f.policy.decide(&routes, &ask).await.admitted(), "full");
        f.policy.finish(&routes, &ask, &first).await;
        assert!(f.policy.decide(&routes, &ask).await.admitted(), "freed");
    }

    #[tokio::test]
    async fn decisions_carry_shadow_denials_and_shaping_delays() {
        let f = in_process();
        let mut shadow = limit("candidate", gcra(1, 0));
        shadow.shadow = true;
        let routes = set(vec![limit("l", gcra(10, 9)), shadow], FailureMode::Deny);
        let ask = asks(&[b"a", b"b"], &[1, 1]);
        assert_eq!(
            f.policy.decide(&routes, &ask).await.outcome,
            Outcome::Allowed
        );
        let shadowed = f.policy.decide(&routes, &ask).await;
        assert_eq!(shadowed.outcome, Outcome::ShadowLimited);
        assert!(shadowed.admitted());

        let routes = set(vec![shaped()], FailureMode::Deny);
        let ask = asks(&[b"s"], &[1]);
        assert!(f.policy.decide(&routes, &ask).await.delay.is_zero());
        assert_eq!(
            f.policy.decide(&routes, &ask).await.delay,
            Duration::from_millis(100),
            "the second request waits for its slot"
        );
        assert_eq!(f.meters.duration.get_sample_count(), 4);
    }

    #[tokio::test]
    async fn a_held_request_whose_client_left_gives_its_units_back() {
        let f = in_process();
        let routes = set(vec![shaped()], FailureMode::Deny);
        let ask = asks(&[b"s"], &[1]);
        assert!(f.policy.decide(&routes, &ask).await.delay.is_zero());
        let held = f.policy.decide(&routes, &ask).await;
        assert_eq!(held.delay, Duration::from_millis(100));
        // Its client leaves before its turn: the slot it reserved goes back, and the next
        // request gets the same turn instead of the one after.
        f.policy.give_back_abandoned(&routes, &ask, &held).await;
        assert_eq!(
            f.policy.decide(&routes, &ask).await.delay,
            Duration::from_millis(100)
        );
    }

    #[tokio::test]
    async fn a_route_without_limits_asks_nobody() {
        let f = unavailable(timeout);
        let verdict = f.policy.decide(&LimitSet::none(), &[]).await;
        assert_eq!(verdict, Verdict::unlimited());
        assert_eq!(errors(&f.meters, "timeout"), 0);
    }

    /// A limit of 100 units an hour priced by the response, reserving `estimate` per request.
    fn priced(estimate: u64) -> Limit {
        use crate::limiter::limit::{Cost, ResponsePrice};
        Limit {
            cost: Cost::Fixed(estimate),
            priced_by_response: Some(ResponsePrice { max: 100 }),
            ..limit("tokens", crate::limiter::testing::window(100))
        }
    }

    #[tokio::test]
    async fn responses_settle_their_estimate_up_or_down_and_a_missing_report_keeps_it() {
        let f = in_process();
        let routes = set(
            vec![priced(10), limit("plain", gcra(1000, 999))],
            FailureMode::Deny,
        );
        let ask = asks(&[b"k", b"p"], &[10, 1]);
        let remaining =
            |verdict: &Verdict| verdict.decision.as_ref().unwrap().statuses[0].remaining;

        let first = f.policy.decide(&routes, &ask).await;
        assert_eq!(remaining(&first), 90, "the estimate is reserved");
        let reports = [CostReport::Reported(45), CostReport::Missing];
        f.policy
            .settle_response(&routes, &ask, &first, &reports)
            .await;
        let second = f.policy.decide(&routes, &ask).await;
        assert_eq!(remaining(&second), 45, "charged 35 more, then 10 reserved");
        f.policy
            .settle_response(&routes, &ask, &second, &[CostReport::Reported(2)])
            .await;
        let third = f.policy.decide(&routes, &ask).await;
        assert_eq!(remaining(&third), 43, "8 given back, then 10 reserved");
        f.policy
            .settle_response(&routes, &ask, &third, &[CostReport::Missing])
            .await;
        f.policy
            .settle_response(&routes, &ask, &third, &[CostReport::Invalid])
            .await;
        let fourth = f.policy.decide(&routes, &ask).await;
        assert_eq!(remaining(&fourth), 33, "no report: the estimate stands");
        // The plain limit is never settled: it took one unit per request.
        let plain = fourth.decision.as_ref().unwrap().statuses[1].remaining;
        assert_eq!(plain, 996);

        // A charge lands past the limit: the key is in debt and refuses until the window ends.
        f.policy
            .settle_response(&routes, &ask, &fourth, &[CostReport::Capped(100)])
            .await;
        let refused = f.policy.decide(&routes, &ask).await;
        assert_eq!(refused.outcome, Outcome::Limited);
        // A refused request settles nothing.
        f.policy
            .settle_response(&routes, &ask, &refused, &[CostReport::Reported(0)])
            .await;
        f.clock.advance_by(Duration::from_secs(3600));
        assert_eq!(remaining(&f.policy.decide(&routes, &ask).await), 90);
    }

    #[tokio::test]
    async fn the_fallback_settles_what_it_decided() {
        let f = unavailable(timeout);
        let routes = set(vec![priced(5)], FailureMode::Local);
        let ask = asks(&[b"k"], &[5]);
        let verdict = f.policy.decide(&routes, &ask).await;
        assert_eq!(verdict.decider, Decider::Fallback);
        let remaining =
            |verdict: &Verdict| verdict.decision.as_ref().unwrap().statuses[0].remaining;
        assert_eq!(
            remaining(&verdict),
            45,
            "half of 100 for each of 2 instances, 5 reserved"
        );
        f.policy
            .settle_response(&routes, &ask, &verdict, &[CostReport::Reported(25)])
            .await;
        assert_eq!(remaining(&f.policy.decide(&routes, &ask).await), 20);
    }
}
