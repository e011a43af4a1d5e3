//! Group commit of decisions: while one script call is in flight on a lane, the requests that
//! arrive wait, and the next call carries all of them (up to `max_batch`), each decided in
//! arrival order as if it were alone (`lua/check.lua`). There is no timer: a lone request goes at
//! once, from its own task, and batches form only when requests arrive faster than Redis
//! answers, which is when one call per request would cost the most; a draining task sends them.
//!
//! A lane is where one call at a time may be in flight: the one connection of a standalone or
//! Sentinel-managed Redis, or one Cluster slot (a script's keys must share a slot). Each request
//! keeps its own deadline: it stops waiting when it passes, and a request that gave up before its
//! batch left is never sent. The batch itself runs in its own task until the latest deadline
//! among its requests, so no request's cancellation strands the others. If that task panics, a
//! guard fails the requests of its lane (the batch's and those queued behind it) and frees the
//! lane, so the next request starts a new task instead of queueing forever.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use smallvec::SmallVec;
use tokio::sync::oneshot;

use super::script::{self, Call};
use crate::limiter::decision::Statuses;
use crate::limiter::error::LimiterError;
use crate::limiter::meters::Histogram;

/// Redis Cluster's number of hash slots.
const SLOTS: usize = 16_384;

/// Runs one script call for a batch of calls that share a lane.
pub trait Execute: Send + Sync + 'static {
    /// The flat reply of one call deciding `calls` in order, within `deadline`.
    fn execute(
        &self,
        calls: &[&Call],
        deadline: Duration,
    ) -> impl Future<Output = Result<Vec<i64>, LimiterError>> + Send;
}

/// A request's statuses, and how many requests the call that decided it carried.
pub type Batched = (Statuses, usize);

/// One request waiting in a lane.
struct Job {
    call: Call,
    deadline: Instant,
    reply: oneshot::Sender<Result<Batched, LimiterError>>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Job>,
    /// A task is draining this lane (a call is in flight, or about to be).
    draining: bool,
}

#[derive(Default)]
struct Lane {
    queue: Mutex<Queue>,
}

impl Lane {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where calls queue: one lane, or one per Cluster slot (made on first use).
enum Lanes {
    One(Arc<Lane>),
    BySlot(Box<[OnceLock<Arc<Lane>>]>),
}

impl Lanes {
    /// The lane of `call`, borrowed: only a draining task takes an `Arc` of it, so a call that
    /// finds its lane idle writes no count shared with every other core's calls.
    fn lane(&self, call: &Call) -> &Arc<Lane> {
        match self {
            Lanes::One(lane) => lane,
            Lanes::BySlot(lanes) => {
                let slot = usize::from(cluster_slot(call.first_key()));
                lanes[slot].get_or_init(Arc::default)
            }
        }
    }
}

/// The Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the first non-empty `{...}`), or of
/// the whole key, modulo 16384. redis-rs computes the same (`cluster_routing::Slot::for_key`, the
/// test below checks it) but keeps the slot's number private, and lanes are indexed by it.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS as u16
}

/// How requests are coalesced: the largest batch, and where batch sizes are counted.
#[derive(Clone)]
pub struct Coalescing {
    pub max_batch: usize,
    pub sizes: Histogram,
}

/// Queues decisions per lane and sends them in batches through `E`.
pub struct Coalescer<E> {
    executor: Arc<E>,
    lanes: Lanes,
    coalescing: Coalescing,
}

impl<E: Execute> Coalescer<E> {
    /// `by_slot`: a lane per Cluster slot; otherwise one lane.
    pub fn new(executor: E, by_slot: bool, coalescing: Coalescing) -> Coalescer<E> {
        let lanes = if by_slot {
            Lanes::BySlot((0..SLOTS).map(|_| OnceLock::new()).collect())
        } else {
            Lanes::One(Arc::default())
        };
        Coalescer {
            executor: Arc::new(executor),
            lanes,
            coalescing: Coalescing {
                max_batch: coalescing.max_batch.max(1),
                ..coalescing
            },
        }
    }

    /// What executes its batches.
    pub fn executor(&self) -> &E {
        &self.executor
    }

    /// Decides `call` in the next batch of its lane; waits at most `deadline`. On an idle lane
    /// the call goes at once, from the caller's own task (no hand-off, no extra wake-up); the
    /// requests that arrive meanwhile wait and go together when it is answered.
    ///
    /// Not an `async fn`: one moves each argument to a second place in its future (rustc does
    /// not overlap the two), so the call would be held twice by this future and by every one
    /// above it, each moved whole when it is made. The block below owns the call once: it is
    /// moved out only into the queue, and read in place when it goes alone.
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    pub fn decide(
        &self,
        call: Call,
        deadline: Duration,
    ) -> impl Future<Output = Result<Batched, LimiterError>> + Send + '_ {
        async move {
            if self.coalescing.max_batch == 1 {
                return self.decide_alone(&call, deadline).await;
            }
            let lane = self.lanes.lane(&call);
            let (answer, start_draining) = 'queued: {
                {
                    let mut queue = lane.lock();
                    if queue.draining || !queue.waiting.is_empty() {
                        let (reply, answer) = oneshot::channel();
                        queue.waiting.push(Job {
                            call,
                            deadline: Instant::now() + deadline,
                            reply,
                        });
                        break 'queued (answer, !std::mem::replace(&mut queue.draining, true));
                    }
                    queue.draining = true;
                }
                // The lane is this request's until `_sending` is dropped (answered, cancelled or
                // unwound), which hands it to a draining task if requests queued meanwhile.
                let _sending = Sending {
                    lane,
                    executor: &self.executor,
                    coalescing: &self.coalescing,
                };
                return self.decide_alone(&call, deadline).await;
            };
            if start_draining {
                tokio::spawn(drain(
                    Arc::clone(lane),
                    Arc::clone(&self.executor),
                    self.coalescing.clone(),
                ));
            }
            match tokio::time::timeout(deadline, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(LimiterError::Connection(
                    "the batch carrying this decision was lost".to_string(),
                )),
                Err(_) => Err(LimiterError::Timeout(deadline.as_millis() as u64)),
            }
        }
    }
}

impl<E: Execute> Coalescer<E> {
    /// One call deciding `call` alone, sent at once from the caller's task: `max_batch: 1` (calls
    /// in flight together are pipelined on the connection, none waits for another's reply), or
    /// an idle lane. The executor keeps the deadline (`mod.rs`: `within`).
    async fn decide_alone(&self, call: &Call, deadline: Duration) -> Result<Batched, LimiterError> {
        self.coalescing.sizes.observe(1.0);
        let flat = self.executor.execute(&[call], deadline).await?;
        script::parse_statuses(&flat, call.limits()).map(|statuses| (statuses, 1))
    }
}

/// A lane whose call a request sends itself: when dropped, the lane goes to a new draining task
/// if requests queued meanwhile, and is idle again otherwise.
struct Sending<'a, E: Execute> {
    lane: &'a Arc<Lane>,
    executor: &'a Arc<E>,
    coalescing: &'a Coalescing,
}

impl<E: Execute> Drop for Sending<'_, E> {
    fn drop(&mut self) {
        let mut queue = self.lane.lock();
        if queue.waiting.is_empty() {
            queue.draining = false;
            return;
        }
        drop(queue);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain(
                    Arc::clone(self.lane),
                    Arc::clone(self.executor),
                    self.coalescing.clone(),
                ));
            }
            // No runtime to drain on (only while one shuts down): free the lane and fail them.
            Err(_) => drop(Draining {
                lane: self.lane,
                finished: false,
            }),
        }
    }
}

/// A lane being drained: if the draining task unwinds (a panic), dropping this frees the lane
/// and fails the requests still queued in it (the batch in flight fails as its jobs drop).
struct Draining<'a> {
    lane: &'a Lane,
    finished: bool,
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let waiting = {
            let mut queue = self.lane.lock();
            queue.draining = false;
            std::mem::take(&mut queue.waiting)
        };
        for job in waiting {
            let _ = job.reply.send(Err(LimiterError::Connection(
                "the task sending this lane's batches failed".to_string(),
            )));
        }
    }
}

/// Sends the lane's waiting calls, a batch at a time, until none is left.
async fn drain<E: Execute>(lane: Arc<Lane>, executor: Arc<E>, coalescing: Coalescing) {
    let mut guard = Draining {
        lane: &lane,
        finished: false,
    };
    let mut batch: Vec<Job> = Vec::new();
    loop {
        {
            let mut queue = guard.lane.lock();
            // A request that stopped waiting is not sent: it already had its failure mode.
            queue.waiting.retain(|job| !job.reply.is_closed());
            if queue.waiting.is_empty() {
                queue.draining = false;
                guard.finished = true;
                return;
            }
            let take = queue.waiting.len().min(coalescing.max_batch);
            batch.extend(queue.waiting.drain(..take));
        }
        coalescing.sizes.observe(batch.len() as f64);
        let latest = batch
            .iter()
            .map(|job| job.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        let calls: SmallVec<[&Call; 64]> = batch.iter().map(|job| &job.call).collect();
        let reply = executor
            .execute(&calls, latest.saturating_duration_since(Instant::now()))
            .await;
        drop(calls);
        answer(batch.drain(..), reply);
    }
}

/// Gives each job its part of the batch's reply (or the batch's error).
fn answer(jobs: std::vec::Drain<'_, Job>, reply: Result<Vec<i64>, LimiterError>) {
    let expected: usize = jobs
        .as_slice()
        .iter()
        .map(|job| job.call.limits())
        .sum::<usize>()
        * script::REPLY_STRIDE;
    let reply = reply.and_then(|flat| {
        if flat.len() == expected {
            Ok(flat)
        } else {
            Err(LimiterError::Reply(format!(
                "expected {expected} integers for the batch, got {}",
                flat.len()
            )))
        }
    });
    match reply {
        Ok(flat) => {
            let mut rest = flat.as_slice();
            let carried = jobs.len();
            for job in jobs {
                let limits = job.call.limits();
                let (mine, others) = rest.split_at(limits * script::REPLY_STRIDE);
                rest = others;
                let decided = script::parse_statuses(mine, limits).map(|s| (s, carried));
                let _ = job.reply.send(decided);
            }
        }
        Err(error) => {
            for job in jobs {
                let _ = job.reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::request::{asks, entries, LimitRequest};
    use crate::limiter::testing::{gcra, limit};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Its first call waits for `release`, its second panics (an injected bug); then it allows
    /// every limit.
    struct PanicsOnce {
        calls: AtomicUsize,
        release: tokio::sync::Notify,
    }

    impl Execute for PanicsOnce {
        async fn execute(
            &self,
            calls: &[&Call],
            _deadline: Duration,
        ) -> Result<Vec<i64>, LimiterError> {
            match self.calls.fetch_add(1, Ordering::SeqCst) {
                0 => self.release.notified().await,
                1 => panic!("injected: a batch task panics"),
                _ => {}
            }
            let limits: usize = calls.iter().map(|call| call.limits()).sum();
            Ok([1, 0, 0, 0, 0, 0].repeat(limits))
        }
    }

    fn call() -> Call {
        let limits = [limit("l", gcra(10, 0))];
        let asks = asks(&[b"k"], &[1]);
        let entries = entries(&limits, &asks);
        Call::of(&LimitRequest::new(&entries))
    }

    /// A lone request goes from its own task; two that arrive while it is in flight wait and go
    /// together in a draining task, which panics: both fail, the lane is freed, and later
    /// requests are served.
    #[tokio::test]
    async fn a_panicking_batch_fails_its_requests_and_frees_the_lane() {
        let coalescing = Coalescing {
            max_batch: 8,
            sizes: Histogram::new(prometheus::DEFAULT_BUCKETS),
        };
        let executor = PanicsOnce {
            calls: AtomicUsize::new(0),
            release: tokio::sync::Notify::new(),
        };
        let coalescer = Arc::new(Coalescer::new(executor, false, coalescing));
        let deadline = Duration::from_secs(30);
        let decide = |coalescer: &Arc<Coalescer<PanicsOnce>>| {
            let coalescer = Arc::clone(coalescer);
            tokio::spawn(async move { coalescer.decide(call(), deadline).await })
        };
        let first = decide(&coalescer);
        while coalescer.executor.calls.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let queued = [decide(&coalescer), decide(&coalescer)];
        while coalescer.lanes.lane(&call()).lock().waiting.len() < 2 {
            tokio::task::yield_now().await;
        }
        coalescer.executor.release.notify_one();
        let (statuses, carried) = first.await.expect("no panic").expect("served");
        assert!(statuses[0].allowed);
        assert_eq!(carried, 1);
        for failed in queued {
            let failed = failed.await.expect("the panic stays in the batch task");
            assert!(
                matches!(failed, Err(LimiterError::Connection(_))),
                "{failed:?}"
            );
        }
        for _ in 0..3 {
            let (statuses, _) = coalescer.decide(call(), deadline).await.expect("served");
            assert!(statuses[0].allowed);
        }
        assert_eq!(coalescer.executor.calls.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn slots_are_those_redis_computes() {
        for key in [
            &b"sluice:{api.3f9c}:per_client.0a1b2c3d:00ff"[..],
            b"plain-key",
            b"{}empty-tag",
            b"a{b}c{d}",
            b"{user1000}.following",
        ] {
            let ours = cluster_slot(key);
            assert_eq!(
                redis::cluster_routing::Slot::new(ours),
                Some(redis::cluster_routing::Slot::for_key(key)),
                "{}",
                String::from_utf8_lossy(key)
            );
        }
    }
}
