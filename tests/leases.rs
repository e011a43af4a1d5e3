//! Leases charge exactly what admitted requests cost, against a real Redis (issue 50): random
//! mixes of 2–4 limits per route (every algorithm, every mode: `exact`, `auto`, `leased`),
//! 1–3 gateways — each the production stack `Leased(Guarded(RedisLimiter))` with connections of
//! its own — on one Redis, under bursts and silences with random costs. After every request
//! and sweep, what Redis stores is what admitted requests cost plus what gateways hold; once
//! every key is idle, exactly what admitted requests cost (`sluice::limiter::leased::simulation`
//! holds the checks; `src/limiter/leased/tests/props.rs` runs many more cases on the in-process
//! twin).
//!
//! The scripts run at the test's clock (sent with each call): real time plus what the test
//! skips ahead, so silences cost no waiting and Redis never expires a key before that clock
//! says its time is up.

mod support;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use redis::AsyncCommands;
use sluice::limiter::algorithm::State;
use sluice::limiter::clock::{Clock, SystemClock};
use sluice::limiter::guard::{BehindBreaker, GuardMeters, Guarded};
use sluice::limiter::leased::simulation::{
    live, Case, Kind, Mode, Phase, Spec, Stored, Timeline, World,
};
use sluice::limiter::leased::{LeaseMeters, Leased};
use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::{Coalescing, Topology};
use support::RedisServer;

#[path = "../src/limiter/leased/tests/strategy.rs"]
mod strategy;

/// Real time plus what the test skipped ahead: never slower than the clock Redis expires keys
/// on.
struct RunningClock {
    start: Instant,
    start_us: i64,
    skipped_us: AtomicI64,
}

impl RunningClock {
    fn new() -> RunningClock {
        RunningClock {
            start: Instant::now(),
            start_us: SystemClock.now_us(),
            skipped_us: AtomicI64::new(0),
        }
    }

    fn elapsed_us(&self) -> i64 {
        self.start.elapsed().as_micros() as i64 + self.skipped_us.load(Ordering::SeqCst)
    }
}

impl Clock for RunningClock {
    fn now_us(&self) -> i64 {
        self.start_us + self.elapsed_us()
    }

    fn instant(&self) -> Instant {
        self.start + Duration::from_micros(self.elapsed_us().max(0) as u64)
    }
}

impl Timeline for RunningClock {
    fn reach(&self, now_us: i64) {
        let behind = now_us - self.now_us();
        if behind > 0 {
            self.skipped_us.fetch_add(behind, Ordering::SeqCst);
        }
    }
}

/// Reads a key's state as the scripts store it (`lua/*.lua`'s State lines), live at `now`.
struct RedisStore {
    connection: tokio::sync::Mutex<redis::aio::MultiplexedConnection>,
}

impl Stored for RedisStore {
    async fn stored(&self, key: &[u8], now_us: i64) -> Option<State> {
        let mut redis = self.connection.lock().await;
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut *redis)
            .await
            .expect("TYPE");
        let field = |fields: &std::collections::HashMap<String, i64>, name: &str| {
            fields.get(name).copied().unwrap_or(0)
        };
        let state = match kind.as_str() {
            // Expired between the two reads: no state.
            "string" => State::Gcra {
                tat_us: redis.get::<_, Option<i64>>(key).await.expect("GET")?,
            },
            "zset" => {
                let stamps: Vec<(String, i64)> =
                    redis.zrange_withscores(key, 0, -1).await.expect("ZRANGE");
                State::Log {
                    stamps: stamps.into_iter().map(|(_, at)| at).collect(),
                }
            }
            "hash" => {
                let fields: std::collections::HashMap<String, i64> =
                    redis.hgetall(key).await.expect("HGETALL");
                let f = |name| field(&fields, name);
                if fields.contains_key("c") {
                    State::Sliding {
                        start_us: f("s"),
                        previous: f("p") as u64,
                        current: f("c") as u64,
                    }
                } else if fields.contains_key("s") {
                    State::Period {
                        start_us: f("s"),
                        end_us: f("e"),
                        count: f("n") as u64,
                    }
                } else {
                    State::Window {
                        end_us: f("e"),
                        count: f("n") as u64,
                    }
                }
            }
            _ => return None,
        };
        live(&state, now_us).then_some(state)
    }
}

/// One gateway: leases over the deny cache and breaker over its own Redis client, on `clock`.
type Gateway = Leased<Guarded<Arc<RedisLimiter>>, BehindBreaker<RedisLimiter>>;

fn gateway(url: &str, clock: &Arc<RunningClock>) -> Gateway {
    let clock: Arc<dyn Clock> = clock.clone();
    let sizes = sluice::limiter::meters::Histogram::new(prometheus::DEFAULT_BUCKETS);
    let backend = Arc::new(
        RedisLimiter::on_clock(
            &Topology::Standalone {
                url: url.to_string(),
            },
            &Default::default(),
            Duration::from_secs(5),
            Coalescing {
                max_batch: 8,
                sizes,
            },
            Some(Arc::clone(&clock)),
        )
        .expect("a Redis client"),
    );
    let guarded = Guarded::new(
        Arc::clone(&backend),
        Some("redis at test"),
        Arc::clone(&clock),
        GuardMeters::unregistered(),
    );
    let breaker = guarded.breaker().expect("a breaker");
    let refunds = Arc::new(BehindBreaker::new(backend, breaker));
    Leased::new(guarded, refunds, clock, LeaseMeters::unregistered()).swept_by_hand()
}

/// Each case on keys of its own.
static CASES: AtomicI64 = AtomicI64::new(0);

async fn play(url: String, case: Case) {
    let clock = Arc::new(RunningClock::new());
    let client = redis::Client::open(url.as_str()).expect("a Redis URL");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection to Redis");
    let store = Arc::new(RedisStore {
        connection: tokio::sync::Mutex::new(connection),
    });
    let gateways = (0..case.gateways).map(|_| gateway(&url, &clock)).collect();
    let prefix = format!("case{}:", CASES.fetch_add(1, Ordering::SeqCst));
    World::new(&case, clock, store, gateways, &prefix)
        .play(&case)
        .await;
}

#[test]
fn leases_on_redis_charge_exactly_what_admitted_requests_cost() {
    let redis = RedisServer::start();
    let url = redis.url();
    let config = ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(case in strategy::case(8, 50))| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(play(url.clone(), case));
    });
}
