//! The scripts of one limit across regions (`lua/global.lua`, `lua/regions/give.lua` and
//! `apply.lua`) on a real redis-server, against their Rust twin (`limiter::regions::ledger`,
//! which the simulation runs): any sequence of decisions, gives and applied totals leaves the
//! key as the twin says, each decision and give answers as the twin does, and a strict key
//! never counts past its part moved by transfers.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice::limiter::algorithm::Algorithm;
use sluice::limiter::clock::{Clock, ManualClock};
use sluice::limiter::redis::RedisLimiter;
use sluice::limiter::regions::ledger::Ledger;
use sluice::limiter::regions::notes::Note;
use sluice::limiter::regions::plan::Give;
use sluice::limiter::regions::sync::{Apply, Here};
use sluice::limiter::regions::{Consistency, Kind, Region, Regions};
use sluice::limiter::{asks, entries, Coalescing, Limit, LimitRequest, Limiter, Rate, Topology};
use support::RedisServer;

const WHOLE: u64 = 90;
const HOUR_US: u64 = 3_600_000_000;
/// The middle of an hour: every call of a case falls in one period.
const NOW_US: i64 = 20_000 * 86_400_000_000 + 1_800_000_000;

fn regions() -> Regions {
    let region = |name: &str| Region {
        name: name.into(),
        weight: 1,
    };
    Regions {
        this: 0,
        list: vec![region("us-east"), region("eu-west"), region("ap-south")],
        every: Duration::from_millis(250),
        max_delay: Duration::from_millis(250),
        home: 0,
        seed_percent: 1,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Decide(u64),
    Give(usize, u64),
    /// A total given to this region by a peer (`i:`).
    GivenIn(usize, u64),
    /// A peer's count (`r:`, approx).
    Counted(usize, u64),
}

fn ops(approx: bool) -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        4 => (1u64..=7).prop_map(Op::Decide),
        2 => (1usize..3, 1u64..=40).prop_map(|(t, u)| Op::Give(t, u)),
        2 => (1usize..3, 0u64..=60).prop_map(|(g, t)| Op::GivenIn(g, t)),
        1 => (1usize..3, 0u64..=60).prop_map(move |(r, t)| if approx { Op::Counted(r, t) } else { Op::Decide(1) }),
    ];
    prop::collection::vec(op, 1..40)
}

struct Bench {
    _redis: RedisServer,
    limiter: RedisLimiter,
    runtime: tokio::runtime::Runtime,
}

fn bench() -> Bench {
    let redis = RedisServer::start();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(NOW_US));
    let sizes = sluice::limiter::meters::Histogram::new(prometheus::DEFAULT_BUCKETS);
    let limiter = RedisLimiter::on_clock(
        &Topology::Standalone { url: redis.url() },
        &Default::default(),
        Duration::from_secs(5),
        Coalescing {
            max_batch: 1,
            sizes,
        },
        Some(clock),
    )
    .expect("a Redis client");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    Bench {
        _redis: redis,
        limiter,
        runtime,
    }
}

/// Plays `ops` on key `key` of a global limit, checking each answer and the key against the twin.
fn play(
    bench: &Bench,
    key: &[u8],
    consistency: Consistency,
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let regions = Arc::new(regions());
    let window = Algorithm::FixedWindow {
        limit: WHOLE,
        window_us: HOUR_US,
    };
    let (algorithm, global) = regions.compile(window, consistency, WHOLE);
    prop_assert!(global.synced);
    let rate = Rate::new(WHOLE, Duration::from_secs(3600)).expect("a rate");
    let base = algorithm.capacity();
    let store = bench.limiter.region_store("t", Arc::clone(&regions));
    let kind = match consistency {
        Consistency::Strict => Kind::Strict,
        Consistency::Approx => Kind::Approx,
    };
    let start = NOW_US - NOW_US.rem_euclid(HOUR_US as i64);
    let note = Note {
        key: key.to_vec(),
        limit: "g".into(),
        kind,
        whole: WHOLE,
        start_us: start,
        end_us: start + HOUR_US as i64,
    };
    let mut twin = Ledger {
        start_us: note.start_us,
        end_us: note.end_us,
        ..Ledger::default()
    };
    bench.runtime.block_on(async {
        for op in ops {
            match *op {
                Op::Decide(cost) => {
                    let limits = [Limit {
                        global: Some(global),
                        ..Limit::new("g", algorithm, cost, rate)
                    }];
                    let asked = asks(&[key], &[cost]);
                    let entries = entries(&limits, &asked);
                    let decision = bench
                        .limiter
                        .check(&LimitRequest::new(&entries))
                        .await
                        .expect("a decision");
                    let allowed = twin.used + cost <= twin.room(base);
                    if allowed {
                        twin.used += cost;
                    }
                    let status = &decision.statuses[0];
                    prop_assert_eq!(status.allowed, allowed, "{:?} on {:?}", op, twin);
                    prop_assert_eq!(status.remaining, twin.room(base).saturating_sub(twin.used));
                }
                Op::Give(taker, units) => {
                    let give = Give {
                        note: note.clone(),
                        base,
                        taker,
                        units,
                    };
                    let given = store.give(&[give]).await.expect("a give")[0];
                    let expected = units.min(twin.unspent(base));
                    twin.given_out[taker] += expected;
                    let total = if expected > 0 {
                        twin.given_out[taker]
                    } else {
                        0
                    };
                    prop_assert_eq!(given, (expected, total), "{:?} on {:?}", op, twin);
                }
                Op::GivenIn(giver, total) | Op::Counted(giver, total) => {
                    let letter = if matches!(op, Op::GivenIn(..)) {
                        'i'
                    } else {
                        'r'
                    };
                    let apply = Apply {
                        key: key.to_vec(),
                        start_us: note.start_us,
                        end_us: note.end_us,
                        field: format!("{letter}:{}", regions.list[giver].name),
                        total,
                    };
                    store.apply(&[apply]).await.expect("an apply");
                    let slot = match letter {
                        'i' => &mut twin.given_in[giver],
                        _ => &mut twin.counted[giver],
                    };
                    *slot = (*slot).max(total);
                }
            }
            if consistency == Consistency::Strict {
                let spent: u64 = twin.used + twin.given_out.iter().sum::<u64>();
                prop_assert!(
                    spent <= base + twin.given_in.iter().sum::<u64>(),
                    "{:?}",
                    twin
                );
            }
        }
        let stored = store.ledgers(&[key]).await.expect("the ledger")[0].clone();
        prop_assert_eq!(stored.used, twin.used);
        prop_assert_eq!(stored.given_in, twin.given_in);
        prop_assert_eq!(stored.given_out, twin.given_out);
        prop_assert_eq!(stored.counted, twin.counted);
        Ok(())
    })
}

#[test]
fn the_scripts_of_a_global_limit_do_what_their_twin_does() {
    let bench = bench();
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = (prop::bool::ANY, ops(false), ops(true));
    runner
        .run(&strategy, |(approx, strict_ops, approx_ops)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let key = format!("t:{{g}}:{n}");
            match approx {
                false => play(&bench, key.as_bytes(), Consistency::Strict, &strict_ops),
                true => play(&bench, key.as_bytes(), Consistency::Approx, &approx_ops),
            }
        })
        .expect("every case");
}

#[test]
fn a_total_of_an_earlier_period_is_dropped_and_one_of_a_later_period_opens_it() {
    let bench = bench();
    let regions = Arc::new(regions());
    let store = bench.limiter.region_store("t", Arc::clone(&regions));
    let start = NOW_US - NOW_US.rem_euclid(HOUR_US as i64);
    let hour = HOUR_US as i64;
    let apply = |from: i64, total: u64| Apply {
        key: b"t:{p}".to_vec(),
        start_us: from,
        end_us: from + hour,
        field: "i:eu-west".into(),
        total,
    };
    bench.runtime.block_on(async {
        assert_eq!(store.apply(&[apply(start, 10)]).await.expect("applied"), 1);
        assert_eq!(
            store.apply(&[apply(start, 5)]).await.expect("applied"),
            0,
            "smaller"
        );
        assert_eq!(
            store
                .apply(&[apply(start - hour, 50)])
                .await
                .expect("applied"),
            0,
            "ended"
        );
        assert_eq!(
            store
                .apply(&[apply(start + hour, 7)])
                .await
                .expect("applied"),
            1,
            "later"
        );
        let ledger = store.ledgers(&[b"t:{p}"]).await.expect("read")[0].clone();
        assert_eq!((ledger.start_us, ledger.given_in[1]), (start + hour, 7));
        assert_eq!(
            store.apply(&[apply(start, 90)]).await.expect("applied"),
            0,
            "earlier"
        );
    });
}
