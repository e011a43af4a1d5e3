//! The verdict's one home. Given a request's limits, each compiled limit paired with the
//! request's record of it ([`Asked`]), the policy calls the limiter, writes what each limit
//! said into its record, applies the failure mode when the limiter cannot decide (allow, deny,
//! or this gateway's share in-process), and returns one [`Verdict`]: the metric outcome (which
//! says whether it goes upstream) and what answered. Limits local to this gateway
//! (`scope: local`) beside a shared engine are decided first, in-process; the shared ones only
//! if those pass, and a shared denial gives the local units back. When the request ends, it gives back the
//! concurrency slots to whoever took them and settles what the response said it cost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;

use smallvec::SmallVec;

use super::admin::QuotaStore;
use super::algorithm::{Algorithm, Change};
use super::backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
use super::clock::Clock;
use super::decision::{Decision, Source};
use super::engine::Engine;
use super::error::{ErrorKind, LimiterError};
use super::guard::BreakerState;
use super::id::RequestId;
use super::limit::{Limit, Scope, LIMITS_INLINE};
use super::local::LocalLimiter;
use super::meters::Histogram;
use super::record::{Asked, LimitRecord, Scale};
use super::redis::persistence::Persistence;
use super::redis::script::Algorithms;
use super::request::{Entries, Entry, LimitRequest};
use super::rules::{FailureMode, LimitRules};
use super::verdict::{Decider, Outcome, Verdict};

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
        let histogram = || Histogram::new(prometheus::DEFAULT_BUCKETS);
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
    /// Decides the limits local to this gateway (`scope: local`), before the engine decides
    /// the shared ones; `None` when the engine is itself in-process (it decides all at once).
    local_scope: Option<LocalLimiter>,
    clock: Arc<dyn Clock>,
    meters: PolicyMeters,
    /// The limiter errors warned about: at most one line a second per consequence.
    warnings: Warnings,
}

/// How a request's limits are split between this gateway's own limiter and the engine
/// ([`Policy::split`]).
#[derive(Clone, Copy)]
enum Split<'a> {
    /// One part: every limit goes to the engine (limits local to this gateway are the
    /// engine's own when it is in-process).
    Whole,
    /// Two parts: the limits local to this gateway, decided first by its own limiter, then
    /// the shared ones by the engine.
    InTwo(&'a LocalLimiter),
}

/// What is done with a request's limits after its decision, part by part with whoever took
/// their units ([`Policy::with_takers`]).
#[derive(Clone, Copy)]
enum After {
    /// Give back the concurrency slots.
    Release,
    /// Give back or charge what the change says of each limit.
    Settle(SettleBy),
}

/// Where the engine's limits live: what an admin write reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// In a store every gateway shares (Redis); limits local to each gateway (`scope: local`)
    /// are decided beside it, in-process.
    Shared,
    /// In this process: the engine is in-process, and holds every limit.
    PerGateway,
}

/// The quota admin API's operations where the limits live, which the policy offers so that no
/// caller reaches its engine.
impl Policy<Engine> {
    /// Where the limits live, as the quota admin API writes it (`admin/`'s [`QuotaStore`]):
    /// resets and credits, the admin epoch that announces them, and the store of overrides.
    pub fn quota_store(&self) -> &impl QuotaStore {
        &self.engine
    }

    /// Forgets the denials this gateway cached: an admin change may have lifted them.
    pub fn forget_denials(&self) {
        self.engine.forget_denials();
    }

    /// The Redis backend, where limits live in Redis (region sync works on it).
    pub fn redis(&self) -> Option<&Arc<crate::limiter::redis::RedisLimiter>> {
        match &self.engine {
            Engine::Redis(redis) => Some(&redis.backend),
            Engine::Local(_) => None,
        }
    }
}

/// Who decided an admitted request's limits, and so gives back and settles what they took.
#[derive(Clone, Copy)]
enum Taker<'a> {
    Engine,
    /// The in-process fallback, or the limiter of the limits local to this gateway.
    InProcess(&'a LocalLimiter),
}

impl<E: Limiter + ReleaseSlots + SettleUnits + Backend> Policy<E> {
    /// A policy deciding by `engine`, with `fallback` for `failure_mode: local` when the
    /// engine is not in-process; limits local to this gateway then get a limiter of their own.
    pub fn new(
        engine: E,
        fallback: Option<Arc<LocalLimiter>>,
        clock: Arc<dyn Clock>,
        meters: PolicyMeters,
    ) -> Policy<E> {
        let local_scope = fallback
            .as_ref()
            .map(|_| LocalLimiter::new(Arc::clone(&clock), super::local::DEFAULT_MAX_KEYS));
        Policy {
            engine,
            fallback,
            local_scope,
            clock,
            meters,
            warnings: Warnings::default(),
        }
    }

    /// Whether the engine's limits are shared by every gateway (Redis) or this gateway's own
    /// (in-process): set by [`Policy::new`] from what it built, never told by a backend's name.
    pub fn sharing(&self) -> Sharing {
        match self.local_scope {
            Some(_) => Sharing::Shared,
            None => Sharing::PerGateway,
        }
    }

    /// Whether a write where the limits live (the quota admin API's reset, credit and
    /// override) reaches `limit` for every gateway: a shared limit's state is the engine's; a
    /// limit local to each gateway (`scope: local`) beside a shared engine is this gateway's
    /// own, which no one write reaches on the others. An in-process engine holds every limit.
    pub fn admin_reaches(&self, limit: &Limit) -> bool {
        limit.scope == Scope::Shared || self.sharing() == Sharing::PerGateway
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

    /// The verdict on a request's `asked` limits: what each limit said goes into its record.
    pub async fn decide(&self, asked: &mut Asked<'_>) -> Verdict {
        if asked.limits.is_empty() {
            return Verdict::unlimited();
        }
        let id = if asked.rules.needs_request_id {
            RequestId::random()
        } else {
            RequestId::default()
        };
        match self.split(&asked.rules) {
            Split::InTwo(local) => self.decide_in_two(local, asked, id).await,
            Split::Whole => self.decide_by_engine(asked, id).await,
        }
    }

    /// How `rules`' limits are split: in two parts when some are local to this gateway and
    /// the engine is shared. Deciding, reading, releasing and settling all ask this, and go
    /// through the parts in its order.
    fn split(&self, rules: &LimitRules) -> Split<'_> {
        match self.local_scope.as_ref().filter(|_| rules.has_local_scope) {
            Some(local) => Split::InTwo(local),
            None => Split::Whole,
        }
    }

    /// Does `after` on each part of `asked` that holds something `verdict` took, with whoever
    /// took it: the whole set with the request's decider, or the limits local to this gateway
    /// with its own limiter (when they held units) and then the shared ones with the decider.
    async fn with_takers(&self, asked: &mut Asked<'_>, verdict: &Verdict, after: After) {
        let decider = self.taker(verdict.decider);
        match self.split(&asked.rules) {
            Split::Whole => self.after(asked, verdict, decider, after).await,
            Split::InTwo(local) => {
                if verdict.local_scope_held {
                    let here = Some((Scale::Exact, Taker::InProcess(local)));
                    self.after(&asked.scoped(Scope::Local), verdict, here, after)
                        .await;
                }
                self.after(&asked.scoped(Scope::Shared), verdict, decider, after)
                    .await;
            }
        }
    }

    /// Does `after` on `asked`'s limits with `taker`, who decided them.
    async fn after(
        &self,
        asked: &Asked<'_>,
        verdict: &Verdict,
        taker: Option<(Scale, Taker<'_>)>,
        after: After,
    ) {
        match after {
            After::Release => self.release(asked, verdict, taker).await,
            After::Settle(change) => self.settle_part(asked, verdict, taker, change).await,
        }
    }

    /// The limits local to this gateway first, in-process: when one denies, the shared limits
    /// are not asked (a flood stopped here costs the backend nothing). Then the shared ones:
    /// when one denies, what the local ones took goes back, so all or nothing holds across both.
    async fn decide_in_two(
        &self,
        local: &LocalLimiter,
        asked: &mut Asked<'_>,
        id: RequestId,
    ) -> Verdict {
        let here = self
            .decide_in_process(local, &mut asked.scoped(Scope::Local), id)
            .await;
        if !here.admitted() {
            return here;
        }
        let shared = {
            let mut shared = asked.scoped(Scope::Shared);
            match shared.limits.is_empty() {
                true => Verdict::unlimited(),
                false => self.decide_by_engine(&mut shared, id).await,
            }
        };
        let held = here.answered.is_some();
        if !shared.admitted() {
            if held {
                self.give_back_here(local, &mut asked.scoped(Scope::Local), &here)
                    .await;
            }
            return shared;
        }
        Verdict {
            outcome: match shared.outcome {
                Outcome::Allowed => here.outcome,
                outcome => outcome,
            },
            // The failure mode admitted: no limit's numbers are told (as without local limits),
            // and the shared limits count the failure mode's outcome.
            answered: match shared.outcome {
                Outcome::ErrorAllowed => None,
                _ => shared.answered.or(here.answered),
            },
            delay: shared.delay.max(here.delay),
            limiter_time: shared.limiter_time + here.limiter_time,
            id,
            local_scope_held: held,
            ..shared
        }
    }

    /// The verdict of this gateway's own limiter on `asked` (limits local to it). It fails only
    /// when its table is full of live keys: the request is then refused, as in-process
    /// limiters refuse what they cannot track.
    async fn decide_in_process(
        &self,
        local: &LocalLimiter,
        asked: &mut Asked<'_>,
        id: RequestId,
    ) -> Verdict {
        let started = self.clock.instant();
        let result = {
            let entries = asked.entries(Scale::Exact);
            let request = LimitRequest {
                entries: &entries,
                id,
                deadline: asked.rules.deadline(),
            };
            local.check(&request).await
        };
        let limiter_time = self.clock.instant().saturating_duration_since(started);
        match result.and_then(|decision| judged(asked, decision, Decider::Backend)) {
            Ok(verdict) => Verdict {
                limiter_time,
                id,
                ..verdict
            },
            Err(error) => {
                self.meters.error(&error);
                if self
                    .warnings
                    .first_this_second(Consequence::AlwaysRefused, self.second())
                {
                    log::warn!("limits local to this gateway: {error}; the request is refused");
                }
                Verdict::undecided(Outcome::ErrorDenied)
            }
        }
    }

    /// A shared limit denied a request the limits local to this gateway admitted (`here`):
    /// their units and slots go back.
    async fn give_back_here(&self, local: &LocalLimiter, asked: &mut Asked<'_>, here: &Verdict) {
        let taker = Some((Scale::Exact, Taker::InProcess(local)));
        self.settle_part(asked, here, taker, given_back).await;
        self.release(asked, here, taker).await;
        // What the `RateLimit` fields say of the rates counts the units as back.
        for asked in asked.limits.iter_mut() {
            let returned = matches!(
                asked.limit.exact.algorithm,
                Algorithm::Gcra { .. } | Algorithm::FixedWindow { .. }
            );
            let status = asked.record.status.as_mut();
            if let Some(status) = status.filter(|s| returned && s.allowed && s.mark_us > 0) {
                status.remaining += asked.record.ask.cost;
            }
        }
    }

    /// The engine's verdict on `asked` (the failure mode's when it cannot decide).
    async fn decide_by_engine(&self, asked: &mut Asked<'_>, id: RequestId) -> Verdict {
        let rules = asked.rules;
        let started = self.clock.instant();
        let result = {
            let entries = asked.entries(Scale::Exact);
            let request = LimitRequest {
                entries: &entries,
                id,
                deadline: rules.deadline(),
            };
            self.engine.check(&request).await
        };
        let limiter_time = self.clock.instant().saturating_duration_since(started);
        let histogram = match result.as_ref().map(|d| d.source) {
            Ok(Source::DenyCache) => &self.meters.deny_cache_duration,
            Ok(Source::Leases) => &self.meters.lease_duration,
            _ => &self.meters.duration,
        };
        histogram.observe(limiter_time.as_secs_f64());
        let verdict = match result {
            Ok(decision) => match judged(asked, decision, Decider::Backend) {
                Ok(verdict) => verdict,
                Err(error) => self.unavailable(asked, id, error).await,
            },
            Err(error) => self.unavailable(asked, id, error).await,
        };
        Verdict {
            limiter_time,
            id,
            ..verdict
        }
    }

    /// What the backend holds for each of `asked`'s limits at their keys, consuming nothing:
    /// every ask costs 0 and leased limits are read where their units are counted (the
    /// backend), plus the units this gateway holds of them: units other gateways hold count as
    /// used. Limits local to this gateway are read from its own limiter. The usage API's read:
    /// the statuses go into the records.
    pub async fn peek(&self, asked: &mut Asked<'_>) -> Result<(), LimiterError> {
        let Split::InTwo(local) = self.split(&asked.rules) else {
            return self.peek_engine(asked).await;
        };
        {
            let mut here = asked.scoped(Scope::Local);
            let decision = read(local, &here, RequestId::random()).await?;
            here.take(decision)?;
        }
        let mut shared = asked.scoped(Scope::Shared);
        match shared.limits.is_empty() {
            true => Ok(()),
            false => self.peek_engine(&mut shared).await,
        }
    }

    /// [`Policy::peek`] of limits the engine decides.
    async fn peek_engine(&self, asked: &mut Asked<'_>) -> Result<(), LimiterError> {
        let decision = read(&self.engine, asked, RequestId::random()).await?;
        // Statuses the limits do not match one for one are refused by `take`; those taken are
        // each in its limit's record.
        asked.take(decision)?;
        for asked in &mut asked.limits {
            let Some(status) = asked.record.status.as_mut() else {
                continue;
            };
            if asked.limit.exact.leased.is_some() {
                status.remaining += self.engine.held_units(&asked.record.ask.key);
            }
        }
        Ok(())
    }

    /// The limiter could not decide: the route's failure mode does.
    async fn unavailable(
        &self,
        asked: &mut Asked<'_>,
        id: RequestId,
        error: LimiterError,
    ) -> Verdict {
        let rules = asked.rules;
        let consequence = Consequence::of(&error, rules.failure_mode(), self.fallback.is_some());
        self.report(&error, consequence);
        let refused = Verdict::undecided(Outcome::ErrorDenied);
        match (consequence, &self.fallback) {
            (Consequence::Admitted, _) => Verdict::undecided(Outcome::ErrorAllowed),
            (Consequence::InProcess, Some(fallback)) => {
                let result = {
                    let entries = asked.entries(Scale::Share);
                    let shares = LimitRequest {
                        entries: &entries,
                        id,
                        deadline: rules.deadline(),
                    };
                    fallback.check(&shares).await
                };
                match result.and_then(|decision| judged(asked, decision, Decider::Fallback)) {
                    Ok(verdict) => verdict,
                    Err(error) => {
                        self.report(&error, Consequence::Refused(FailureMode::Fallback));
                        refused
                    }
                }
            }
            _ => refused,
        }
    }

    /// The request has ended: gives back the concurrency slots it took (to whoever decided
    /// it), then, unless it was `abandoned` (its units went back already), settles what its
    /// response said it cost.
    pub async fn end(&self, asked: &mut Asked<'_>, verdict: &Verdict, abandoned: bool) {
        self.finish(asked, verdict).await;
        if !abandoned {
            self.settle_response(asked, verdict).await;
        }
    }

    /// The request has ended (response finished or client gone): gives back the concurrency
    /// slots it took, to whoever decided it.
    pub async fn finish(&self, asked: &mut Asked<'_>, verdict: &Verdict) {
        self.with_takers(asked, verdict, After::Release).await;
    }

    /// Gives back the concurrency slots `asked`'s limits took, to `taker` (who decided them).
    async fn release(
        &self,
        asked: &Asked<'_>,
        verdict: &Verdict,
        taker: Option<(Scale, Taker<'_>)>,
    ) {
        if !asked.rules.holds_slots || !verdict.admitted() {
            return;
        }
        let Some((scale, taker)) = taker else {
            return;
        };
        let entries = asked.entries(scale);
        let request = LimitRequest {
            entries: &entries,
            id: verdict.id,
            deadline: asked.rules.deadline(),
        };
        let released = match taker {
            Taker::Engine => self.engine.release(&request).await,
            Taker::InProcess(limiter) => limiter.release(&request).await,
        };
        if let Err(error) = released {
            self.report(&error, Consequence::NotReleased);
        }
    }

    /// Who decided by `decider`, and under which form of the limits.
    fn taker(&self, decider: Decider) -> Option<(Scale, Taker<'_>)> {
        match (decider, &self.fallback) {
            (Decider::Backend, _) => Some((Scale::Exact, Taker::Engine)),
            (Decider::Fallback, Some(fallback)) => Some((Scale::Share, Taker::InProcess(fallback))),
            (Decider::Nobody, _) | (Decider::Fallback, None) => None,
        }
    }

    /// An admitted request will not go on (its client left while it was held for shaping):
    /// gives back the units its call took from each GCRA, fixed-window and calendar limit,
    /// quoting the call's marks so nothing another request consumed since is given back; a
    /// leased window's or period's unit goes back to the window it counted in, whether the
    /// call or a lease paid it. A leased GCRA unit stays where it is (its slot is not the key's
    /// last, so the TAT cannot move back for it; it frees itself when its slot passes), and
    /// sliding windows and logs keep what they counted (they cannot give back exactly);
    /// concurrency slots go back with [`Policy::finish`].
    pub async fn give_back_abandoned(&self, asked: &mut Asked<'_>, verdict: &Verdict) {
        self.settle(asked, verdict, given_back).await;
    }

    /// An admitted request's response has ended: each limit priced by the response
    /// (`cost_from_response`) whose cost it reported (its record's report) is settled against
    /// the estimate its call took: the difference is charged, or given back. A limit whose
    /// cost was not reported keeps the estimate.
    pub async fn settle_response(&self, asked: &mut Asked<'_>, verdict: &Verdict) {
        if !asked.rules.priced_by_response {
            return;
        }
        self.settle(asked, verdict, priced).await;
    }

    /// Settles what `change` says of each of `asked`'s limits with whoever decided it: this
    /// gateway's own limiter for limits local to it (when they were decided apart), the
    /// request's decider for the others.
    async fn settle(&self, asked: &mut Asked<'_>, verdict: &Verdict, change: SettleBy) {
        self.with_takers(asked, verdict, After::Settle(change))
            .await;
    }

    /// Settles, in one call to `taker` (who decided the admitted request), the change `change`
    /// says for each limit (with its record and the mark its call replied). Only GCRA,
    /// fixed-window and calendar limits whose call wrote their key (a mark) are settled: a
    /// shadow limit that denied took nothing.
    async fn settle_part(
        &self,
        asked: &Asked<'_>,
        verdict: &Verdict,
        taker: Option<(Scale, Taker<'_>)>,
        change: SettleBy,
    ) {
        if verdict.answered.is_none() || !verdict.admitted() {
            return;
        }
        let Some((scale, taker)) = taker else {
            return;
        };
        let settlements: SmallVec<[Settlement<'_>; LIMITS_INLINE]> = asked
            .limits
            .iter()
            .filter_map(|asked| {
                let limit = match scale {
                    Scale::Exact => &asked.limit.exact,
                    Scale::Share => &asked.limit.share,
                };
                let record = &*asked.record;
                let mark_us = record.status.as_ref()?.mark_us;
                let settled = matches!(
                    limit.algorithm,
                    Algorithm::Gcra { .. }
                        | Algorithm::FixedWindow { .. }
                        | Algorithm::Calendar { .. }
                );
                if mark_us <= 0 || !settled {
                    return None;
                }
                Some(Settlement {
                    algorithm: &limit.algorithm,
                    key: &record.ask.key,
                    change: change(limit, record, mark_us)?,
                })
            })
            .collect();
        if settlements.is_empty() {
            return;
        }
        let settled = match taker {
            Taker::Engine => self.engine.settle(&settlements).await,
            Taker::InProcess(limiter) => limiter.settle(&settlements).await,
        };
        if let Err(error) = settled {
            self.report(&error, Consequence::NotSettled);
        }
    }

    /// The Unix second now, by the policy's clock.
    fn second(&self) -> u64 {
        (self.clock.now_us() / 1_000_000).max(0) as u64
    }

    /// Counts an error by kind and logs it with what it meant for requests, at most once a
    /// second for each [`Consequence`].
    fn report(&self, error: &LimiterError, consequence: Consequence) {
        self.meters.error(error);
        if self.warnings.first_this_second(consequence, self.second()) {
            log::warn!(
                "rate limiter unavailable ({}): {}: {error}; {}",
                error.kind(),
                self.engine.target(),
                consequence.words()
            );
        }
    }
}

/// What a limiter error meant for the requests that met it. Each is warned about apart, so
/// an outage on routes that fail open never hides one on routes that fail closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Consequence {
    /// `failure_mode: allow`: the request went upstream without its limits.
    Admitted,
    /// The failure mode refused the request (`503`): `deny`, or `local` when the in-process
    /// fallback could not decide either.
    Refused(FailureMode),
    /// An error that refuses whatever the failure mode: the in-process limiter cannot track
    /// more keys.
    AlwaysRefused,
    /// `failure_mode: local`: the in-process fallback decided, at this gateway's share.
    InProcess,
    /// An ended request's units were not settled (given back or charged).
    NotSettled,
    /// An ended request's concurrency slots were not released.
    NotReleased,
}

impl Consequence {
    const COUNT: usize = 6;

    /// What `error` means for a request of a route failing by `mode`, when the policy has an
    /// in-process fallback or not.
    fn of(error: &LimiterError, mode: FailureMode, fallback: bool) -> Consequence {
        match (error.always_denies(), mode) {
            (true, _) => Consequence::AlwaysRefused,
            (false, FailureMode::Allow) => Consequence::Admitted,
            (false, FailureMode::Fallback) if fallback => Consequence::InProcess,
            (false, mode) => Consequence::Refused(mode),
        }
    }

    /// Its place among the warnings' seconds.
    fn slot(self) -> usize {
        match self {
            Consequence::Admitted => 0,
            Consequence::Refused(_) => 1,
            Consequence::AlwaysRefused => 2,
            Consequence::InProcess => 3,
            Consequence::NotSettled => 4,
            Consequence::NotReleased => 5,
        }
    }

    /// The warning's words for it.
    fn words(self) -> String {
        match self {
            Consequence::Admitted => "failure_mode=allow: requests admitted unchecked".into(),
            Consequence::Refused(mode) => {
                format!("failure_mode={}: requests refused with 503", mode.label())
            }
            Consequence::AlwaysRefused => {
                "requests refused with 503 whatever the failure mode".into()
            }
            Consequence::InProcess => {
                "failure_mode=local: limits enforced in-process at this gateway's share".into()
            }
            Consequence::NotSettled => {
                "units of ended requests not settled (given back or charged)".into()
            }
            Consequence::NotReleased => "concurrency slots of ended requests not released".into(),
        }
    }
}

/// The Unix second each [`Consequence`] was last warned about.
#[derive(Default)]
struct Warnings {
    last: [AtomicU64; Consequence::COUNT],
}

impl Warnings {
    /// Whether `consequence` was not warned about yet in `second` (and now it is).
    fn first_this_second(&self, consequence: Consequence, second: u64) -> bool {
        self.last[consequence.slot()].swap(second, Ordering::Relaxed) != second
    }
}

/// What a settlement changes of one limit (given its record and the mark its call replied),
/// if anything.
type SettleBy = fn(&Limit, &LimitRecord, i64) -> Option<Change>;

/// An abandoned request's (or a shared denial's) change: the units its call took from a limit
/// go back, unless the limit is a leased GCRA (see [`Policy::give_back_abandoned`]).
fn given_back(limit: &Limit, record: &LimitRecord, mark_us: i64) -> Option<Change> {
    let leased_gcra = limit.leased.is_some() && matches!(limit.algorithm, Algorithm::Gcra { .. });
    (!leased_gcra && record.ask.cost > 0).then_some(Change::GiveBack {
        units: record.ask.cost,
        mark_us,
    })
}

/// A response's change (`cost_from_response`): what it reported beyond the estimate its call
/// took is charged, what it reported below it given back; no report keeps the estimate.
fn priced(limit: &Limit, record: &LimitRecord, mark_us: i64) -> Option<Change> {
    limit.priced_by_response.as_ref()?;
    let spent = record.report.units()?;
    let taken = record.ask.cost;
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
}

/// [`Policy::peek`]'s call to `limiter`: every limit of `asked` read at no cost, unleased.
async fn read(
    limiter: &impl Limiter,
    asked: &Asked<'_>,
    id: RequestId,
) -> Result<Decision, LimiterError> {
    let limits: SmallVec<[Limit; LIMITS_INLINE]> = asked
        .limits
        .iter()
        .map(|asked| Limit {
            leased: None,
            ..asked.limit.exact.clone()
        })
        .collect();
    let entries: Entries<'_> = asked
        .limits
        .iter()
        .enumerate()
        .filter_map(|(index, asked)| {
            Some(Entry {
                limit: limits.get(index)?,
                key: &asked.record.ask.key,
                cost: 0,
            })
        })
        .collect();
    let request = LimitRequest {
        entries: &entries,
        id,
        deadline: asked.rules.deadline(),
    };
    limiter.check(&request).await
}

/// What a decision means for the request; what each limit said goes into its record.
fn judged(
    asked: &mut Asked<'_>,
    decision: Decision,
    decider: Decider,
) -> Result<Verdict, LimiterError> {
    let by_fallback = decider == Decider::Fallback;
    let outcome = match (
        decision.allowed(),
        by_fallback,
        decision.shadow_denied_by.is_some(),
    ) {
        (false, true, _) => Outcome::FallbackLimited,
        (false, false, _) => Outcome::Limited,
        (true, true, _) => Outcome::FallbackAllowed,
        (true, false, true) => Outcome::ShadowLimited,
        (true, false, false) => Outcome::Allowed,
    };
    let delay = Duration::from_millis(decision.delay_ms());
    let answered = asked.take(decision)?;
    Ok(Verdict {
        outcome,
        delay,
        answered: Some(answered),
        decider,
        ..Verdict::unlimited()
    })
}

/// What only the configured engine does.
impl Policy<Engine> {
    /// The configuration in force uses `algorithms` (at start, and on each reload before it
    /// takes effect): their decision scripts are loaded before readiness says ready.
    pub fn want_scripts(&self, algorithms: Algorithms) {
        self.engine.want_scripts(algorithms);
    }

    /// Waits, at most `bound`, until every decision script wanted is loaded: whether it is.
    pub async fn scripts_loaded_within(&self, bound: Duration) -> bool {
        self.engine.scripts_loaded_within(bound).await
    }

    /// Reads what the limits' store keeps across a restart (Redis: every master), and keeps
    /// the reading; `None` when the limits live in this process.
    pub async fn check_persistence(&self) -> Option<Result<Arc<Persistence>, LimiterError>> {
        self.engine.check_persistence().await
    }

    /// What the limits' store keeps across a restart, as last read (`None`: not read yet, or
    /// in-process).
    pub fn persistence(&self) -> Option<Arc<Persistence>> {
        self.engine.persistence()
    }

    /// The state of the circuit breaker in front of the shared engine; `None` in-process.
    pub fn breaker_state(&self) -> Option<BreakerState> {
        self.engine.breaker_state()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::admin::{AdminTables, Put};
    use crate::limiter::clock::ManualClock;
    use crate::limiter::limit::CostReport;
    use crate::limiter::record::{Deciding, PolicyLimit};
    use crate::limiter::rules::LimitRules;
    use crate::limiter::testing::{self, concurrency, gcra, limit, window, Unavailable};

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

    /// Limits as a route compiles them, shared by 2 gateways.
    struct Set {
        rules: LimitRules,
        limits: Vec<PolicyLimit>,
    }

    fn set(limits: Vec<Limit>, mode: FailureMode) -> Set {
        Set {
            rules: LimitRules::new(&limits, mode, None),
            limits: limits.into_iter().map(|l| PolicyLimit::new(l, 2)).collect(),
        }
    }

    /// A request's records: one per key, at the matching cost.
    fn asks(keys: &[&[u8]], costs: &[u64]) -> Vec<LimitRecord> {
        testing::asks(keys, costs)
            .into_iter()
            .map(|ask| LimitRecord::new(ask.key, ask.cost))
            .collect()
    }

    /// A request decided: its verdict, and its records as the policy left them.
    struct Decided {
        verdict: Verdict,
        records: Vec<LimitRecord>,
    }

    impl std::ops::Deref for Decided {
        type Target = Verdict;
        fn deref(&self) -> &Verdict {
            &self.verdict
        }
    }

    impl Set {
        fn asked<'a>(&'a self, records: &'a mut [LimitRecord]) -> Asked<'a> {
            let pairs = crate::limiter::pairs::paired_mut("test", &self.limits, records);
            Asked::new(&self.rules, pairs.expect("one record per limit"))
        }

        async fn decide<E: Limiter + ReleaseSlots + SettleUnits + Backend>(
            &self,
            policy: &Policy<E>,
            ask: &[LimitRecord],
        ) -> Decided {
            let mut records = ask.to_vec();
            let verdict = policy.decide(&mut self.asked(&mut records)).await;
            Decided { verdict, records }
        }

        async fn finish<E: Limiter + ReleaseSlots + SettleUnits + Backend>(
            &self,
            policy: &Policy<E>,
            decided: &mut Decided,
        ) {
            let verdict = decided.verdict.clone();
            policy
                .finish(&mut self.asked(&mut decided.records), &verdict)
                .await;
        }

        /// Settles `decided` as if its response reported `reports`, one per limit.
        async fn settle<E: Limiter + ReleaseSlots + SettleUnits + Backend>(
            &self,
            policy: &Policy<E>,
            decided: &mut Decided,
            reports: &[CostReport],
        ) {
            for (record, report) in decided.records.iter_mut().zip(reports) {
                record.report = *report;
            }
            let verdict = decided.verdict.clone();
            let mut asked = self.asked(&mut decided.records);
            policy.settle_response(&mut asked, &verdict).await;
        }
    }

    fn remaining(decided: &Decided, index: usize) -> u64 {
        decided.records[index].status.as_ref().unwrap().remaining
    }

    fn errors(meters: &PolicyMeters, kind: &str) -> u64 {
        let kind = ErrorKind::ALL.iter().find(|k| k.label() == kind).unwrap();
        meters.errors[kind.index()].get()
    }

    #[tokio::test]
    async fn allow_admits_what_the_limiter_cannot_decide_and_counts_why() {
        let f = unavailable(timeout);
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Allow);
        let verdict = routes.decide(&f.policy, &asks(&[b"k"], &[1])).await;
        assert_eq!(
            (verdict.outcome, verdict.answered),
            (Outcome::ErrorAllowed, None)
        );
        assert!(verdict.admitted());
        assert_eq!(errors(&f.meters, "timeout"), 1);
    }

    #[tokio::test]
    async fn deny_refuses_what_the_limiter_cannot_decide() {
        let f = unavailable(timeout);
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Deny);
        let verdict = routes.decide(&f.policy, &asks(&[b"k"], &[1])).await;
        assert_eq!(verdict.outcome, Outcome::ErrorDenied);
        assert!(!verdict.admitted());
        assert_eq!(errors(&f.meters, "timeout"), 1);
    }

    #[tokio::test]
    async fn local_enforces_this_gateways_share_in_process() {
        let f = unavailable(timeout);
        // 10 per second with a burst of 9, shared by 2 gateways: 5 per second each.
        let routes = set(vec![limit("l", gcra(10, 9))], FailureMode::Fallback);
        let ask = asks(&[b"k"], &[1]);
        let mut outcomes = Vec::new();
        for _ in 0..6 {
            outcomes.push(routes.decide(&f.policy, &ask).await.outcome);
        }
        assert_eq!(outcomes[..5], [Outcome::FallbackAllowed; 5]);
        let denied = routes.decide(&f.policy, &ask).await;
        assert_eq!(
            (denied.outcome, denied.decider),
            (Outcome::FallbackLimited, Decider::Fallback)
        );
        assert!(denied.records[0]
            .status
            .as_ref()
            .is_some_and(|s| !s.allowed));
        // The share refills at 5 per second: one unit every 200 ms of the manual clock.
        f.clock.advance_by(Duration::from_millis(200));
        assert_eq!(
            routes.decide(&f.policy, &ask).await.outcome,
            Outcome::FallbackAllowed
        );
    }

    #[tokio::test]
    async fn an_untrackable_request_is_refused_whatever_the_failure_mode() {
        let f = unavailable(|| LimiterError::LocalCapacity(1));
        let routes = set(vec![limit("l", gcra(1, 0))], FailureMode::Allow);
        let verdict = routes.decide(&f.policy, &asks(&[b"k"], &[1])).await;
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
        let routes = set(vec![limit("c", concurrency(1))], FailureMode::Fallback);
        let ask = asks(&[b"k"], &[1]);
        let mut first = routes.decide(&f.policy, &ask).await;
        assert!(first.admitted());
        assert_ne!(first.decider, Decider::Nobody);
        assert!(!routes.decide(&f.policy, &ask).await.admitted(), "full");
        routes.finish(&f.policy, &mut first).await;
        assert!(routes.decide(&f.policy, &ask).await.admitted(), "freed");
    }

    #[tokio::test]
    async fn decisions_carry_shadow_denials_and_shaping_delays() {
        let f = in_process();
        let mut shadow = limit("candidate", gcra(1, 0));
        shadow.shadow = true;
        let routes = set(vec![limit("l", gcra(10, 9)), shadow], FailureMode::Deny);
        let ask = asks(&[b"a", b"b"], &[1, 1]);
        assert_eq!(
            routes.decide(&f.policy, &ask).await.outcome,
            Outcome::Allowed
        );
        let shadowed = routes.decide(&f.policy, &ask).await;
        assert_eq!(shadowed.outcome, Outcome::ShadowLimited);
        assert!(shadowed.admitted());

        let routes = set(vec![shaped()], FailureMode::Deny);
        let ask = asks(&[b"s"], &[1]);
        assert!(routes.decide(&f.policy, &ask).await.delay.is_zero());
        assert_eq!(
            routes.decide(&f.policy, &ask).await.delay,
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
        assert!(routes.decide(&f.policy, &ask).await.delay.is_zero());
        let mut held = routes.decide(&f.policy, &ask).await;
        assert_eq!(held.delay, Duration::from_millis(100));
        // Its client leaves before its turn: the slot it reserved goes back, and the next
        // request gets the same turn instead of the one after.
        let verdict = held.verdict.clone();
        f.policy
            .give_back_abandoned(&mut routes.asked(&mut held.records), &verdict)
            .await;
        assert_eq!(
            routes.decide(&f.policy, &ask).await.delay,
            Duration::from_millis(100)
        );
    }

    #[tokio::test]
    async fn a_route_without_limits_asks_nobody() {
        let f = unavailable(timeout);
        let verdict = set(Vec::new(), FailureMode::Allow)
            .decide(&f.policy, &[])
            .await
            .verdict;
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

        let mut first = routes.decide(&f.policy, &ask).await;
        assert_eq!(remaining(&first, 0), 90, "the estimate is reserved");
        let reports = [CostReport::Reported(45), CostReport::Missing];
        routes.settle(&f.policy, &mut first, &reports).await;
        let mut second = routes.decide(&f.policy, &ask).await;
        assert_eq!(
            remaining(&second, 0),
            45,
            "charged 35 more, then 10 reserved"
        );
        routes
            .settle(&f.policy, &mut second, &[CostReport::Reported(2)])
            .await;
        let mut third = routes.decide(&f.policy, &ask).await;
        assert_eq!(remaining(&third, 0), 43, "8 given back, then 10 reserved");
        routes
            .settle(&f.policy, &mut third, &[CostReport::Missing])
            .await;
        routes
            .settle(&f.policy, &mut third, &[CostReport::Invalid])
            .await;
        let mut fourth = routes.decide(&f.policy, &ask).await;
        assert_eq!(remaining(&fourth, 0), 33, "no report: the estimate stands");
        // The plain limit is never settled: it took one unit per request.
        let plain = remaining(&fourth, 1);
        assert_eq!(plain, 996);

        // A charge lands past the limit: the key is in debt and refuses until the window ends.
        routes
            .settle(&f.policy, &mut fourth, &[CostReport::Capped(100)])
            .await;
        let mut refused = routes.decide(&f.policy, &ask).await;
        assert_eq!(refused.outcome, Outcome::Limited);
        // A refused request settles nothing.
        routes
            .settle(&f.policy, &mut refused, &[CostReport::Reported(0)])
            .await;
        f.clock.advance_by(Duration::from_secs(3600));
        assert_eq!(remaining(&routes.decide(&f.policy, &ask).await, 0), 90);
    }

    #[tokio::test]
    async fn the_fallback_settles_what_it_decided() {
        let f = unavailable(timeout);
        let routes = set(vec![priced(5)], FailureMode::Fallback);
        let ask = asks(&[b"k"], &[5]);
        let mut verdict = routes.decide(&f.policy, &ask).await;
        assert_eq!(verdict.decider, Decider::Fallback);
        assert_eq!(
            remaining(&verdict, 0),
            45,
            "half of 100 for each of 2 instances, 5 reserved"
        );
        routes
            .settle(&f.policy, &mut verdict, &[CostReport::Reported(25)])
            .await;
        assert_eq!(remaining(&routes.decide(&f.policy, &ask).await, 0), 20);
    }

    /// A policy whose engine is shared (it stands for Redis: in-process here, counted by its
    /// duration histogram), so limits local to the gateway get their own limiter.
    fn shared_engine() -> Fixture {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let shared = Arc::new(LocalLimiter::new(clock.clone(), 1000));
        let fallback = Arc::new(LocalLimiter::new(clock.clone(), 1000));
        let meters = PolicyMeters::unregistered();
        let policy = Policy::new(
            Engine::local(shared),
            Some(fallback),
            clock.clone(),
            meters.clone(),
        );
        Fixture {
            policy,
            clock,
            meters,
        }
    }

    fn local(limit: Limit) -> Limit {
        Limit {
            scope: Scope::Local,
            ..limit
        }
    }

    #[test]
    fn an_admin_write_reaches_what_every_gateway_shares() {
        let (shared, per_gateway) = (limit("quota", window(1)), local(limit("g", gcra(1, 2))));
        let beside_a_shared_engine = shared_engine();
        assert!(beside_a_shared_engine.policy.admin_reaches(&shared));
        assert!(!beside_a_shared_engine.policy.admin_reaches(&per_gateway));
        let in_process = in_process();
        assert!(
            in_process.policy.admin_reaches(&per_gateway),
            "one gateway holds all"
        );
        assert_eq!(beside_a_shared_engine.policy.sharing(), Sharing::Shared);
        assert_eq!(in_process.policy.sharing(), Sharing::PerGateway);
    }

    #[tokio::test]
    async fn the_policy_offers_the_admin_operations_where_the_limits_live() {
        let f = in_process();
        let tables = AdminTables::under("t");
        let lifetime = Duration::from_secs(60);
        let put = f
            .policy
            .quota_store()
            .put_override(&tables, "r/l/", "{}", lifetime);
        assert_eq!(put.await.unwrap(), Put::Stored { previous: None });
        let listed = f.policy.quota_store().overrides(&tables).await.unwrap();
        assert_eq!(listed.overrides.len(), 1);
        assert_eq!(listed.overrides[0].field, "r/l/");
        let epoch = f.policy.quota_store().epoch(&tables).await.unwrap();
        f.policy.quota_store().announce(&tables).await.unwrap();
        assert_eq!(
            f.policy.quota_store().epoch(&tables).await.unwrap(),
            epoch + 1
        );
        let removed = f
            .policy
            .quota_store()
            .delete_override(&tables, "r/l/")
            .await
            .unwrap();
        assert_eq!(removed.as_deref(), Some("{}"));
        assert_eq!(
            f.policy
                .quota_store()
                .delete_override(&tables, "r/l/")
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            f.policy
                .quota_store()
                .reset(&[b"nothing".as_slice()])
                .await
                .unwrap(),
            0
        );
    }

    #[tokio::test]
    async fn a_local_denial_never_asks_the_engine_and_a_shared_one_gives_local_units_back() {
        let f = shared_engine();
        // 3 at once per gateway, then 1 per hour per caller across gateways.
        let set = set(
            vec![
                local(limit("gateway", gcra(1, 2))),
                limit("quota", window(1)),
            ],
            FailureMode::Allow,
        );
        let engine_calls = || f.meters.duration.get_sample_count();
        let a = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(a.outcome, Outcome::Allowed);
        assert!(a.local_scope_held);
        for _ in 0..5 {
            let again = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
            assert_eq!(again.outcome, Outcome::Limited, "the quota denies");
            assert_eq!(again.records[1].deciding, Some(Deciding::Denied));
            assert!(!again.local_scope_held, "the local unit went back");
            assert_eq!(remaining(&again, 0), 2, "and the local limit says so");
        }
        assert_eq!(engine_calls(), 6);
        // Two callers more pass: the local limit holds only the units of admitted requests.
        for caller in [b"b", b"c"] {
            let passed = set
                .decide(&f.policy, &asks(&[b"gw", caller], &[1, 1]))
                .await;
            assert_eq!(passed.outcome, Outcome::Allowed);
        }
        let flood = set.decide(&f.policy, &asks(&[b"gw", b"d"], &[1, 1])).await;
        assert_eq!(flood.outcome, Outcome::Limited);
        assert_eq!(flood.records[0].deciding, Some(Deciding::Denied));
        assert_eq!(flood.records[1].status, None, "the quota was not asked");
        assert_eq!(engine_calls(), 8, "the local denial made no engine call");
        f.clock.advance(1_000_000);
        let refilled = set.decide(&f.policy, &asks(&[b"gw", b"d"], &[1, 1])).await;
        assert_eq!(refilled.outcome, Outcome::Allowed);
    }

    #[tokio::test]
    async fn a_local_slot_goes_back_on_a_shared_denial_and_when_the_request_ends() {
        let f = shared_engine();
        let set = set(
            vec![
                local(limit("inflight", concurrency(1))),
                limit("quota", window(1)),
            ],
            FailureMode::Allow,
        );
        let mut first = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(first.outcome, Outcome::Allowed);
        let busy = set.decide(&f.policy, &asks(&[b"gw", b"b"], &[1, 1])).await;
        assert_eq!(busy.outcome, Outcome::Limited, "the one slot is held");
        assert_eq!(busy.records[0].deciding, Some(Deciding::Denied));
        set.finish(&f.policy, &mut first).await;
        let denied = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(
            denied.records[1].deciding,
            Some(Deciding::Denied),
            "a's quota is spent"
        );
        let mut next = set.decide(&f.policy, &asks(&[b"gw", b"b"], &[1, 1])).await;
        assert_eq!(
            next.outcome,
            Outcome::Allowed,
            "the denied request's slot went back"
        );
        set.finish(&f.policy, &mut next).await;
    }

    #[tokio::test]
    async fn local_limits_are_decided_with_the_others_when_the_engine_is_in_process() {
        let f = in_process();
        let set = set(
            vec![
                local(limit("gateway", gcra(1, 0))),
                limit("quota", window(5)),
            ],
            FailureMode::Allow,
        );
        let first = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(first.outcome, Outcome::Allowed);
        assert!(!first.local_scope_held, "one call decided both");
        let second = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(second.records[0].deciding, Some(Deciding::Denied));
        assert_eq!(f.meters.duration.get_sample_count(), 2);
    }

    #[tokio::test]
    async fn when_the_shared_engine_fails_its_limits_count_the_failure_mode_beside_local_ones() {
        let f = unavailable(timeout);
        let set = set(
            vec![
                local(limit("gateway", gcra(1, 2))),
                limit("quota", window(5)),
            ],
            FailureMode::Allow,
        );
        let decided = set.decide(&f.policy, &asks(&[b"gw", b"a"], &[1, 1])).await;
        assert_eq!(decided.outcome, Outcome::ErrorAllowed);
        assert_eq!(decided.answered, None, "no limit's numbers are told");
        assert!(decided.local_scope_held);
        let outcome = |i: usize| decided.records[i].outcome(&set.limits[i].exact, &decided);
        assert_eq!(
            outcome(0),
            Some(Outcome::Allowed),
            "the local limit decided"
        );
        assert_eq!(outcome(1), Some(Outcome::ErrorAllowed));
        assert_eq!(errors(&f.meters, "timeout"), 1);
    }

    #[test]
    fn each_consequence_of_an_outage_is_warned_in_its_own_words_and_second() {
        let down = || LimiterError::Timeout(25);
        let of = |mode, fallback| Consequence::of(&down(), mode, fallback);
        assert_eq!(of(FailureMode::Allow, true), Consequence::Admitted);
        assert_eq!(
            of(FailureMode::Deny, true),
            Consequence::Refused(FailureMode::Deny)
        );
        assert_eq!(of(FailureMode::Fallback, true), Consequence::InProcess);
        let full = LimiterError::LocalCapacity(1);
        let always = Consequence::of(&full, FailureMode::Allow, true);
        assert_eq!(always, Consequence::AlwaysRefused);
        assert_eq!(
            Consequence::Admitted.words(),
            "failure_mode=allow: requests admitted unchecked"
        );
        assert_eq!(
            Consequence::Refused(FailureMode::Deny).words(),
            "failure_mode=deny: requests refused with 503"
        );
        assert_eq!(
            Consequence::InProcess.words(),
            "failure_mode=local: limits enforced in-process at this gateway's share"
        );
        let warnings = Warnings::default();
        assert!(warnings.first_this_second(Consequence::Admitted, 7));
        assert!(
            !warnings.first_this_second(Consequence::Admitted, 7),
            "once a second"
        );
        let refused = Consequence::Refused(FailureMode::Deny);
        assert!(
            warnings.first_this_second(refused, 7),
            "a route failing closed is told in the same second as one failing open"
        );
        for other in [
            Consequence::InProcess,
            Consequence::NotSettled,
            Consequence::NotReleased,
        ] {
            assert!(warnings.first_this_second(other, 7), "{other:?}");
        }
        assert!(
            warnings.first_this_second(Consequence::Admitted, 8),
            "and again the next second"
        );
    }
}
