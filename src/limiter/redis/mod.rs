//! The Redis room: the backend ([`RedisLimiter`], this file) and the plumbing only it uses —
//! the links ([`link`]: one server, a Cluster, Sentinels; [`direct`]: the decision lane's own
//! connection), the [`topology`], the Lua scripts ([`script`]), the batching of queued
//! decisions ([`coalesce`]), the loading of scripts ahead of use ([`warm`]) and what the
//! masters keep across a restart ([`persistence`]). Of the decision core, only the engine
//! (which builds the backend) and the policy (the script sets, persistence) reach in here.
//!
//! Redis backend: every limit of a route in one call of a decision script (`script.rs`: the
//! one holding exactly the algorithms of the batch), under a deadline; requests that arrive
//! while a call is in flight go together in the next one (`coalesce.rs`). The call is an
//! `FCALL` of the script's function library, loaded on first use (`FUNCTION LOAD`) and then
//! kept by Redis with the dataset, replicated and persisted; a server without functions (before
//! Redis 7) or that refuses to load them gets `EVALSHA` instead, loaded on `NOSCRIPT`.
//!
//! The connection (standalone, cluster or sentinel: `link.rs`) is made lazily on first use,
//! inside the runtime that serves requests (a connection made before Pingora forks or on a
//! runtime that is later dropped is dead). A standalone server over plain TCP also gets the
//! decision lane's own connection (`direct.rs`), made in the background on first use. A call
//! that misses its deadline is abandoned, never retried: it may already have counted.
//!
//! Connections that break while the gateway is idle (a Redis restart, `timeout`, a proxy or
//! firewall dropping quiet connections) are found by [`RedisLimiter::keep_connections`], which
//! checks them every second in the background, not by the next request. The same keeper loads
//! the decision scripts the configuration may call before readiness says ready and before a
//! reload takes effect (`warm.rs`), so the first decision does not pay their load.

pub(crate) mod coalesce;
pub(crate) mod direct;
pub(crate) mod link;
pub mod persistence;
pub mod regions;
pub mod script;
pub(crate) mod topology;
pub(crate) mod warm;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;

/// How often idle connections are checked (`keep_connections`).
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long the keeper may spend loading the decision scripts in one go (loading is not a
/// decision: the decision deadline does not bound it).
const LOAD_BOUND: Duration = Duration::from_secs(2);

/// How long reading what every master persists may take (two commands per master; not a
/// decision, so not its deadline).
const PERSISTENCE_BOUND: Duration = Duration::from_secs(2);

use super::admin::{self, AdminTables, Credited, Listed, Put, QuotaStore, Restored};
use super::algorithm::Algorithm;
use super::backend::{Backend, Limiter, Readiness, ReleaseSlots, SettleUnits, Settlement};
use super::clock::{Clock, SystemClock};
use super::decision::{Decision, Statuses};
use super::error::{ErrorKind, LimiterError};
use super::pairs::paired_mut;
use super::regions::notes::Notes;
use super::request::LimitRequest;
use coalesce::{Coalescer, Coalescing, Execute};
use direct::{DirectLink, Loan, Resp};
use link::{Answered, Connection, Link};
use persistence::{Kept, Persistence};
use script::{AdminScripts, Algorithms, Call, DecisionScript, Invoke};
use topology::{RedisAuth, Topology};
use warm::{Scripts, Warmth};

/// Times a batch is sent while Redis answers that it does not know the script or function. A
/// refused call never ran, so each try is safe; a flush that lands between a load and its call
/// refuses it again, and on a starved CPU that window can span several flushes (seen with one
/// every 25 ms). Eight tries; the call's deadline bounds them all the same.
const NOSCRIPT_ATTEMPTS: u32 = 8;

/// The clock argument of an admin script (`lua/admin/`): empty, so the script reads Redis's
/// `TIME`. Overrides expire on Redis's clock, the one every gateway reads them by.
const REDIS_CLOCK: &str = "";

pub struct RedisLimiter {
    link: Arc<Link>,
    /// The decision lane's own connection (a standalone server over plain TCP).
    direct: Option<Arc<DirectLink>>,
    /// Some task keeps the connections already (`keep_connections`).
    keeping: AtomicBool,
    /// Where the server is (`redis at 127.0.0.1:6379`), for messages.
    target: String,
    /// The decision scripts the configuration may call, and those the server holds.
    warmth: Arc<Warmth>,
    decisions: Coalescer<Dispatch>,
    release: redis::Script,
    settle: redis::Script,
    /// The quota admin API's writes, one script each (`lua/admin/`).
    admin: AdminScripts,
    deadline: Duration,
    /// The clock decisions and settlements run on: `None`, Redis's own (`TIME`, production);
    /// else this one, sent with each call (deterministic tests, servers that forbid `TIME`).
    clock: Option<Arc<dyn Clock>>,
    /// What every master persists, as last read (`persistence`).
    persistence: ArcSwapOption<Persistence>,
    /// The keys of limits kept across regions it decided on, for region sync
    /// (`runtime::regions`); empty without them.
    notes: Arc<Notes>,
}

/// What a batch of decisions needs to reach Redis: the link, the lane's direct connection (a
/// standalone server over plain TCP: `direct.rs`), and whether the server runs function
/// libraries (until it says it does not).
struct Dispatch {
    link: Arc<Link>,
    direct: Option<Arc<DirectLink>>,
    functions: AtomicBool,
    /// Told when a call finds its script missing: the server lost what it held.
    warmth: Arc<Warmth>,
    /// The clock sent with each call (`RedisLimiter::clock`); `None`: Redis's own.
    clock: Option<Arc<dyn Clock>>,
}

impl Dispatch {
    /// The time sent with a call: `None` lets the script read Redis's clock.
    fn now_us(&self) -> Option<u64> {
        script_now(self.clock.as_deref())
    }
}

/// The time to send with a script call on `clock`, if any (`None`: Redis's `TIME`).
fn script_now(clock: Option<&dyn Clock>) -> Option<u64> {
    clock.map(|clock| u64::try_from(clock.now_us()).unwrap_or(0))
}

impl Execute for Dispatch {
    async fn execute(&self, calls: &[&Call], deadline: Duration) -> Result<Vec<i64>, LimiterError> {
        let call = async {
            let mut channel = match self.direct.as_ref().and_then(DirectLink::lend) {
                Some(lease) => Channel::Direct(lease),
                None => Channel::Shared(self.link.connection().await?),
            };
            let decision = script::script_for(calls);
            // A call Redis refused (no such function or script) never ran, so loading it and
            // sending the call again cannot count twice; a flush in between refuses it again,
            // hence a few tries.
            let mut attempts = NOSCRIPT_ATTEMPTS;
            loop {
                attempts -= 1;
                let invoke = if self.functions.load(Ordering::Relaxed) {
                    Invoke::Function
                } else {
                    Invoke::Script
                };
                let error = match channel.decide(decision, invoke, calls, self.now_us()).await {
                    Err(error) if attempts > 0 => error,
                    reply => return reply.map_err(classify),
                };
                let refusal = NotLoaded::of(&error);
                if refusal.is_none() {
                    return Err(classify(error));
                }
                let mut connection = self.link.connection().await?;
                match (invoke, refusal) {
                    (Invoke::Function, Some(NotLoaded::FunctionMissing))
                    | (Invoke::Script, Some(NotLoaded::ScriptMissing)) => {
                        // A restarted or flushed server: the keeper loads the others again.
                        self.warmth.forget();
                        self.load(&mut connection, decision).await?;
                    }
                    (Invoke::Function, Some(NotLoaded::FunctionsUnknown)) => {
                        self.use_scripts("the server has no functions (Redis before 7.0)");
                    }
                    _ => return Err(classify(error)),
                }
            }
        };
        within(&self.link, deadline, call).await
    }
}

/// The connection a decision call goes over.
enum Channel<'a> {
    /// The lane's own (`direct.rs`).
    Direct(Loan<'a>),
    /// redis-rs's, shared with every other command.
    Shared(Connection),
}

impl Channel<'_> {
    /// The flat reply of the call of `decision` deciding `calls`.
    async fn decide(
        &mut self,
        decision: &DecisionScript,
        invoke: Invoke,
        calls: &[&Call],
        now_us: Option<u64>,
    ) -> Result<Vec<i64>, redis::RedisError> {
        match self {
            Channel::Direct(lease) => {
                lease
                    .integers(|out| {
                        let mut command = Resp::command(out, script::batch_arguments(calls));
                        script::write_batch(&mut command, decision, invoke, calls, now_us);
                    })
                    .await
            }
            Channel::Shared(connection) => {
                script::batch_command(decision, invoke, calls, now_us)
                    .query_async(connection)
                    .await
            }
        }
    }
}

/// Why Redis refused to run a decision call: the call never ran.
enum NotLoaded {
    /// `ERR Function not found`: the library is not loaded on this server (new, flushed).
    FunctionMissing,
    /// `ERR unknown command 'FCALL'`: a server before Redis 7.
    FunctionsUnknown,
    /// `NOSCRIPT`: the script is not in this server's cache.
    ScriptMissing,
}

impl NotLoaded {
    fn of(error: &redis::RedisError) -> Option<NotLoaded> {
        let detail = error.detail().unwrap_or_default();
        match error.code() {
            Some("NOSCRIPT") => Some(NotLoaded::ScriptMissing),
            Some("ERR") if detail.starts_with("Function not found") => {
                Some(NotLoaded::FunctionMissing)
            }
            Some("ERR") if detail.starts_with("unknown command") => {
                Some(NotLoaded::FunctionsUnknown)
            }
            _ => None,
        }
    }
}

impl Dispatch {
    /// Loads `decision` the way calls run it: its library, or its script once the server has
    /// refused functions (then the library's refusal switches every call to scripts).
    async fn load(
        &self,
        connection: &mut Connection,
        decision: &DecisionScript,
    ) -> Result<(), LimiterError> {
        if self.functions.load(Ordering::Relaxed) {
            self.load_library(connection, decision).await?;
            if self.functions.load(Ordering::Relaxed) {
                return Ok(());
            }
        }
        decision
            .script
            .load_async(connection)
            .await
            .map(|_| ())
            .map_err(classify)
    }

    /// Loads the decision library; a server that refuses it (an ACL without `FUNCTION`, a
    /// proxy that does not pass it) gets scripts from then on.
    async fn load_library(
        &self,
        connection: &mut Connection,
        decision: &DecisionScript,
    ) -> Result<(), LimiterError> {
        let loaded = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&decision.library)
            .query_async::<()>(connection)
            .await;
        match loaded {
            Ok(()) => Ok(()),
            Err(error) if error.code().is_some() => {
                self.use_scripts(&format!("FUNCTION LOAD was refused: {error}"));
                Ok(())
            }
            Err(error) => Err(classify(error)),
        }
    }

    fn use_scripts(&self, why: &str) {
        if self.functions.swap(false, Ordering::Relaxed) {
            log::warn!("redis: decisions use EVALSHA scripts instead of functions: {why}");
            // What the server held were libraries; its scripts are still to load.
            self.warmth.forget();
        }
    }
}

/// Runs `call` under `deadline`; a call that misses it is abandoned, never retried. A failure
/// is reported to the link (which reconnects or asks the sentinels again).
async fn within<T>(
    link: &Link,
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, LimiterError>>,
) -> Result<T, LimiterError> {
    let result = match tokio::time::timeout(deadline, call).await {
        Ok(Err(LimiterError::Timeout(_))) | Err(_) => {
            Err(LimiterError::Timeout(deadline.as_millis() as u64))
        }
        Ok(result) => result,
    };
    if let Err(error) = &result {
        link.failed(error);
    }
    result
}

impl RedisLimiter {
    /// Validates the addresses; connects nothing yet. Scripts read Redis's clock.
    pub fn new(
        topology: &Topology,
        auth: &RedisAuth,
        deadline: Duration,
        coalescing: Coalescing,
    ) -> Result<RedisLimiter, redis::RedisError> {
        RedisLimiter::on_clock(topology, auth, deadline, coalescing, None)
    }

    /// As [`RedisLimiter::new`], with decisions and settlements run at `clock`'s time (sent
    /// with each call) instead of Redis's `TIME` when `clock` is given: every gateway of a
    /// test on one manual clock, Redis included.
    pub fn on_clock(
        topology: &Topology,
        auth: &RedisAuth,
        deadline: Duration,
        coalescing: Coalescing,
        clock: Option<Arc<dyn Clock>>,
    ) -> Result<RedisLimiter, redis::RedisError> {
        let link = Arc::new(Link::new(topology, auth, deadline)?);
        let direct = link.standalone_server().and_then(DirectLink::to);
        let warmth = Arc::new(Warmth::default());
        let dispatch = Dispatch {
            direct: direct.clone(),
            link: Arc::clone(&link),
            functions: AtomicBool::new(true),
            warmth: Arc::clone(&warmth),
            clock: clock.clone(),
        };
        let by_slot = matches!(topology, Topology::Cluster { .. });
        Ok(RedisLimiter {
            link,
            direct,
            keeping: AtomicBool::new(false),
            target: topology.describe(),
            warmth,
            decisions: Coalescer::new(dispatch, by_slot, coalescing),
            release: redis::Script::new(script::RELEASE_SOURCE),
            settle: redis::Script::new(script::SETTLE_SOURCE),
            admin: AdminScripts::new(),
            deadline,
            clock,
            persistence: ArcSwapOption::empty(),
            notes: Arc::default(),
        })
    }

    /// The keys of limits kept across regions it decided on since region sync last took them.
    pub fn notes(&self) -> &Arc<Notes> {
        &self.notes
    }

    /// This region's store for region sync, under `prefix`, on this backend's link.
    /// Its scripts run on this backend's clock (Redis's in production).
    pub fn region_store(
        &self,
        prefix: &str,
        regions: Arc<super::regions::Regions>,
    ) -> regions::RegionStore {
        let clock = self.clock.clone();
        regions::RegionStore::new(
            Arc::clone(&self.link),
            prefix,
            regions,
            self.deadline,
            clock,
        )
    }

    fn deadline_ms(&self) -> u64 {
        self.deadline.as_millis() as u64
    }

    /// Connects, then checks the connections every second for as long as its runtime runs: a
    /// `PING` over the shared connection (a broken one fails it, and redis-rs, or the link for
    /// a Sentinel master, connects again in the background), the decision lane's idle
    /// connection (dropped if the server closed it, made again when absent), and that the
    /// Sentinels still name the master connected to (`Link::verify`). So a connection
    /// that broke while no request used it is replaced before one needs it. After each
    /// answered `PING` it loads the decision scripts wanted that the server does not hold,
    /// woken at once when a reload wants more (`warm.rs`). One task per backend: later calls
    /// return at once.
    pub async fn keep_connections(&self) {
        if self.keeping.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut every = tokio::time::interval(IDLE_CHECK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => {}
                () = self.warmth.woken() => {}
            }
            if let Some(direct) = &self.direct {
                direct.check_idle();
            }
            let pinged = self.within_deadline(None, self.ping()).await;
            self.warmth.answering(pinged.is_ok());
            match pinged {
                Ok(_) => {
                    let _ = self.load_missing_scripts().await;
                }
                // A new connection may reach a restarted server that lost the scripts.
                Err(LimiterError::Connection(_)) => self.warmth.forget(),
                Err(_) => {}
            }
            self.link.verify().await;
        }
    }

    /// The configuration in force uses `algorithms`: the scripts of every set of them are
    /// loaded before readiness says ready, by the keeper (which this wakes) or readiness itself.
    pub fn want_scripts(&self, algorithms: Algorithms) {
        self.warmth.want(Scripts::of_every_subset(algorithms));
    }

    /// Waits, at most `bound`, until the server holds every script wanted: whether it does.
    pub async fn scripts_loaded_within(&self, bound: Duration) -> bool {
        self.warmth.held_within(bound).await
    }

    /// Loads the scripts wanted that the server is not known to hold, within [`LOAD_BOUND`];
    /// the keeper and readiness both may (a script loaded twice is replaced by itself).
    async fn load_missing_scripts(&self) -> Result<(), String> {
        let missing = self.warmth.missing();
        if missing.is_empty() {
            return Ok(());
        }
        let dispatch = self.decisions.executor();
        let loading = async {
            let mut connection = self.link.connection().await?;
            for algorithms in missing.iter() {
                dispatch
                    .load(&mut connection, script::decision_script(algorithms))
                    .await?;
                self.warmth.loaded(Scripts::one(algorithms));
            }
            Ok::<(), LimiterError>(())
        };
        let failed = match tokio::time::timeout(LOAD_BOUND, loading).await {
            Ok(Ok(())) => {
                log::info!(
                    "redis: {} decision script(s) loaded into {}",
                    missing.len(),
                    self.target
                );
                return Ok(());
            }
            Ok(Err(e)) => format!("cannot load its decision scripts: {e}"),
            Err(_) => format!(
                "loading its decision scripts took over {} ms",
                LOAD_BOUND.as_millis()
            ),
        };
        log::warn!("redis: {}: {failed}", self.target);
        Err(failed)
    }

    async fn ping(&self) -> Result<String, LimiterError> {
        let mut connection = self.link.connection().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .map_err(classify)
    }

    async fn release_leases(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        let mut invocation = self.release.prepare_invoke();
        let mut any = false;
        for entry in request.entries {
            if let Algorithm::Concurrency { .. } = entry.limit.algorithm {
                invocation.key(entry.key);
                any = true;
            }
        }
        if !any {
            return Ok(());
        }
        invocation.arg(&request.id.hex()[..]);
        self.run_for_effect(&invocation).await.map(|_| ())
    }

    /// Runs a script whose integer reply only says how many keys it changed.
    async fn run_for_effect(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<u64, LimiterError> {
        let mut connection = self.link.connection().await?;
        let changed = invocation
            .invoke_async::<i64>(&mut connection)
            .await
            .map_err(classify)?;
        Ok(u64::try_from(changed).unwrap_or(0))
    }

    async fn settle_keys(&self, settlements: &[Settlement<'_>]) -> Result<u64, LimiterError> {
        let mut invocation = self.settle.prepare_invoke();
        for settlement in settlements {
            invocation.key(settlement.key);
        }
        match script_now(self.clock.as_deref()) {
            Some(now_us) => invocation.arg(now_us),
            None => invocation.arg(""),
        };
        for settlement in settlements {
            invocation.arg(script::settle_args(settlement.algorithm, settlement.change));
        }
        self.run_for_effect(&invocation).await
    }

    /// Runs `call` under `deadline`, or the backend's.
    async fn within_deadline<T>(
        &self,
        deadline: Option<Duration>,
        call: impl std::future::Future<Output = Result<T, LimiterError>>,
    ) -> Result<T, LimiterError> {
        within(&self.link, deadline.unwrap_or(self.deadline), call).await
    }
}

/// Maps a redis-rs error to our error, with a stable `kind` for the metric label and a message
/// in words (redis-rs's own text names its Rust error kinds).
pub fn classify(error: redis::RedisError) -> LimiterError {
    if error.is_timeout() {
        return LimiterError::Timeout(0);
    }
    if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal() {
        return LimiterError::Connection(error.to_string());
    }
    if error.kind() == redis::ErrorKind::AuthenticationFailed {
        return LimiterError::Server {
            kind: ErrorKind::Auth,
            message: "the server refused the configured credentials (redis.password, \
                      redis.username or the URL's)"
                .to_string(),
        };
    }
    let kind = match error.code() {
        Some("NOSCRIPT") => ErrorKind::Noscript,
        Some("READONLY") => ErrorKind::Readonly,
        Some("LOADING") => ErrorKind::Loading,
        Some("BUSY") => ErrorKind::Busy,
        Some("OOM") => ErrorKind::Oom,
        Some("CROSSSLOT") => ErrorKind::Crossslot,
        Some("MOVED") | Some("ASK") | Some("TRYAGAIN") | Some("CLUSTERDOWN") => ErrorKind::Cluster,
        Some("NOPERM") | Some("NOAUTH") | Some("WRONGPASS") => ErrorKind::Auth,
        Some(_) => ErrorKind::Server,
        None => return LimiterError::Reply(in_words(&error)),
    };
    LimiterError::Server {
        kind,
        message: error.to_string(),
    }
}

/// redis-rs's text of `error` without the name of its Rust error kind (`Response was of
/// incompatible type - TypeError: ...` reads `Response was of incompatible type: ...`).
fn in_words(error: &redis::RedisError) -> String {
    let text = error.to_string();
    let kind = format!(" - {:?}", error.kind());
    text.replacen(&kind, "", 1)
}

impl Limiter for RedisLimiter {
    async fn check(&self, request: &LimitRequest<'_>) -> Result<Decision, LimiterError> {
        let deadline = request.deadline.unwrap_or(self.deadline);
        let call = match &self.clock {
            Some(clock) => Call::at(request, clock.now_us()),
            None => Call::of(request),
        };
        let (mut statuses, batch) = self.decisions.decide(call, deadline).await?;
        self.across_regions(request, &mut statuses)?;
        Ok(Decision {
            batch,
            ..request.decision(statuses)
        })
    }
}

impl RedisLimiter {
    /// For each limit kept across regions: notes its key for region sync, and caps a strict
    /// denial's retry at when units another region gives may arrive (`Global::cap_retry`).
    fn across_regions(
        &self,
        request: &LimitRequest<'_>,
        statuses: &mut Statuses,
    ) -> Result<(), LimiterError> {
        let pairs = paired_mut("limits and statuses", request.entries, statuses)
            .map_err(|m| LimiterError::Reply(format!("{}: {} and {}", m.at, m.left, m.right)))?;
        for (entry, status) in pairs {
            let Some(global) = entry.limit.global.filter(|g| g.synced) else {
                continue;
            };
            let now_us = self
                .clock
                .as_ref()
                .map_or_else(|| SystemClock.now_us(), |c| c.now_us());
            self.notes.note_limit(entry.limit, entry.key, now_us);
            global.cap_retry(status, entry.cost);
        }
        Ok(())
    }
}

impl ReleaseSlots for RedisLimiter {
    async fn release(&self, request: &LimitRequest<'_>) -> Result<(), LimiterError> {
        self.within_deadline(request.deadline, self.release_leases(request))
            .await
    }
}

impl SettleUnits for RedisLimiter {
    async fn settle(&self, settlements: &[Settlement<'_>]) -> Result<u64, LimiterError> {
        if settlements.is_empty() {
            return Ok(0);
        }
        self.within_deadline(None, self.settle_keys(settlements))
            .await
    }
}

impl RedisLimiter {
    /// Runs admin script `script` (one of [`AdminScripts`]) on `keys` with `args`, under the
    /// backend's deadline; loaded first when Redis does not hold it (`NOSCRIPT`).
    async fn run_admin<T: redis::FromRedisValue>(
        &self,
        script: &redis::Script,
        keys: &[&[u8]],
        args: &[&str],
    ) -> Result<T, LimiterError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let call = async {
            let mut connection = self.link.connection().await?;
            invocation
                .invoke_async::<T>(&mut connection)
                .await
                .map_err(classify)
        };
        self.within_deadline(None, call).await
    }
}

impl RedisLimiter {
    /// Reads what every master keeps across a restart (`INFO persistence`, `CONFIG GET save`),
    /// and keeps the reading for [`RedisLimiter::last_persistence`]. `Err`: a master did not
    /// answer.
    pub async fn persistence(&self) -> Result<Arc<Persistence>, LimiterError> {
        let read = async {
            let info = self
                .link
                .on_every_master(redis::cmd("INFO").arg("persistence"))
                .await?;
            let save = self
                .link
                .on_every_master(redis::cmd("CONFIG").arg("GET").arg("save"))
                .await?;
            Ok((info, save))
        };
        let bound = self.deadline.max(PERSISTENCE_BOUND);
        let (info, save) = self.within_deadline(Some(bound), read).await?;
        let reading = Arc::new(self.reading(info, save));
        self.persistence.store(Some(Arc::clone(&reading)));
        Ok(reading)
    }

    /// What every master persists, as [`RedisLimiter::persistence`] last read it.
    pub fn last_persistence(&self) -> Option<Arc<Persistence>> {
        self.persistence.load_full()
    }

    /// Each master's `INFO persistence` and `CONFIG GET save` replies, by its address (this
    /// backend's target for the one master of a server or Sentinel set).
    fn reading(&self, info: Vec<Answered>, save: Vec<Answered>) -> Persistence {
        let name = |address: Option<String>| address.unwrap_or_else(|| self.target.clone());
        let mut saves: Vec<(String, Result<redis::Value, String>)> = save
            .into_iter()
            .map(|(a, reply)| (name(a), reply))
            .collect();
        let masters = info.into_iter().map(|(address, info)| {
            let address = name(address);
            let text =
                info.and_then(|v| redis::from_redis_value::<String>(v).map_err(|e| e.to_string()));
            let at = saves.iter().position(|(a, _)| *a == address);
            let save = at.map(|at| saves.swap_remove(at).1);
            let save = save.unwrap_or_else(|| Err("no answer".into()));
            let kept = Kept::of(
                text.as_deref().map_err(String::as_str),
                save.as_ref().map_err(String::as_str),
            );
            (address, kept)
        });
        Persistence {
            masters: masters.collect(),
        }
    }
}

impl QuotaStore for RedisLimiter {
    async fn reset(&self, keys: &[&[u8]]) -> Result<u64, LimiterError> {
        if keys.is_empty() {
            return Ok(0);
        }
        self.run_admin(&self.admin.reset, keys, &[]).await
    }

    async fn credit(
        &self,
        algorithm: &Algorithm,
        key: &[u8],
        units: u64,
        id: &[u8],
    ) -> Result<Credited, LimiterError> {
        let Some((kind, emission_us)) = admin::credit_kind(algorithm) else {
            return Err(LimiterError::Reply(format!(
                "{} limits cannot be credited",
                algorithm.script_name()
            )));
        };
        let remembered = admin::credit_id_key(key, id);
        let memory = admin::CREDIT_MEMORY.as_millis().to_string();
        let (emission, units) = (emission_us.to_string(), units.to_string());
        let args = [REDIS_CLOCK, kind, &emission, &units, &memory];
        let keys = [key, &remembered];
        let reply: i64 = self.run_admin(&self.admin.credit, &keys, &args).await?;
        Ok(match reply {
            -1 => Credited::Repeated,
            0 => Credited::NothingUsed,
            _ => Credited::Changed,
        })
    }

    async fn announce(&self, tables: &AdminTables) -> Result<(), LimiterError> {
        let keys = [tables.epoch.as_bytes()];
        let _: i64 = self
            .run_admin(&self.admin.announce, &keys, &[REDIS_CLOCK])
            .await?;
        Ok(())
    }

    async fn put_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> Result<Put, LimiterError> {
        let lifetime = lifetime.as_millis().max(1).to_string();
        let most = admin::MAX_OVERRIDES.to_string();
        let args = [REDIS_CLOCK, field, value, &lifetime, &most];
        let keys = [tables.overrides.as_bytes(), tables.epoch.as_bytes()];
        // 1 and the previous value ("" for none), or 0 when the table is full.
        let (stored, previous): (i64, String) = self
            .run_admin(&self.admin.override_put, &keys, &args)
            .await?;
        Ok(match stored {
            0 => Put::Full,
            _ => Put::Stored {
                previous: (!previous.is_empty()).then_some(previous),
            },
        })
    }

    async fn restore_override(
        &self,
        tables: &AdminTables,
        field: &str,
        value: &str,
        lifetime: Duration,
    ) -> Result<Restored, LimiterError> {
        let lifetime = lifetime.as_millis().max(1).to_string();
        let most = admin::MAX_OVERRIDES.to_string();
        let args = [REDIS_CLOCK, field, value, &lifetime, &most];
        let keys = [tables.overrides.as_bytes(), tables.epoch.as_bytes()];
        let written: i64 = self
            .run_admin(&self.admin.override_restore, &keys, &args)
            .await?;
        Ok(match written {
            1 => Restored::Written,
            0 => Restored::Present,
            _ => Restored::Full,
        })
    }

    async fn delete_override(
        &self,
        tables: &AdminTables,
        field: &str,
    ) -> Result<Option<String>, LimiterError> {
        let keys = [tables.overrides.as_bytes(), tables.epoch.as_bytes()];
        let args = [REDIS_CLOCK, field];
        self.run_admin(&self.admin.override_delete, &keys, &args)
            .await
    }

    async fn epoch(&self, tables: &AdminTables) -> Result<u64, LimiterError> {
        let read = async {
            let mut connection = self.link.connection().await?;
            redis::cmd("GET")
                .arg(&tables.epoch)
                .query_async::<Option<u64>>(&mut connection)
                .await
                .map_err(classify)
        };
        Ok(self.within_deadline(None, read).await?.unwrap_or(0))
    }

    async fn overrides(&self, tables: &AdminTables) -> Result<Listed, LimiterError> {
        // The epoch first: a change landing in between leaves a list newer than its epoch,
        // which the next check reads once more, never one older.
        type Read = (Option<u64>, Vec<(String, String)>, (u64, u64));
        let read = async {
            let mut connection = self.link.connection().await?;
            redis::pipe()
                .cmd("GET")
                .arg(&tables.epoch)
                .cmd("HGETALL")
                .arg(&tables.overrides)
                .cmd("TIME")
                .query_async::<Read>(&mut connection)
                .await
                .map_err(classify)
        };
        let (epoch, all, (seconds, micros)) = self.within_deadline(None, read).await?;
        let now_ms = seconds * 1000 + micros / 1000;
        Ok(Listed {
            epoch: epoch.unwrap_or(0),
            overrides: admin::in_force(all, now_ms),
        })
    }
}

impl Backend for RedisLimiter {
    async fn readiness(&self) -> Readiness {
        match tokio::time::timeout(self.deadline, self.ping()).await {
            // Ready once the scripts its decisions may call are loaded, too.
            Ok(Ok(_)) => match self.load_missing_scripts().await {
                Ok(()) => Readiness::Ready,
                Err(why) => Readiness::Unavailable(format!("{}: {why}", self.target)),
            },
            Ok(Err(e)) => Readiness::Unavailable(format!("{}: {e}", self.target)),
            Err(_) => Readiness::Unavailable(format!(
                "{}: PING exceeded the {} ms deadline",
                self.target,
                self.deadline_ms()
            )),
        }
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    fn target(&self) -> &str {
        &self.target
    }

    async fn keep(&self) {
        self.keep_connections().await;
    }
}
