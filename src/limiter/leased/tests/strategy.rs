//! The cases of the leases' property (`simulation`), drawn by proptest: 2–4 limits of every
//! algorithm and mode, 1–3 gateways, bursts and silences. Included by the in-process property
//! test and by `tests/leases.rs` (each names `Case`, `Kind`, `Mode`, `Phase`, `Spec` beside it).

use proptest::prelude::*;

use super::{Case, Kind, Mode, Phase, Spec};

fn spec() -> impl Strategy<Value = Spec> {
    let kinds = prop_oneof![
        Just(Kind::Gcra),
        Just(Kind::FixedWindow),
        Just(Kind::Calendar),
        Just(Kind::SlidingWindow),
        Just(Kind::SlidingLog),
    ];
    let modes = prop_oneof![Just(Mode::Exact), Just(Mode::Auto), Just(Mode::Leased)];
    let shadow = prop_oneof![4 => Just(false), 1 => Just(true)];
    (kinds, 0..3usize, modes, any::<bool>(), shadow).prop_map(
        |(kind, size, mode, per_client, shadow)| Spec {
            kind,
            size,
            mode,
            per_client,
            shadow,
        },
    )
}

/// Bursts of up to `requests` requests (three in four phases), or silences up to 2.5 s.
fn phase(requests: u64) -> impl Strategy<Value = Phase> {
    prop_oneof![
        3 => (1..requests, 100..30_000u64)
            .prop_map(|(requests, spacing_us)| Phase::Burst { requests, spacing_us }),
        1 => (20..2_500i64).prop_map(|ms| Phase::Silence { ms }),
    ]
}

/// A case of up to `phases` phases of bursts up to `requests` long.
pub fn case(phases: usize, requests: u64) -> impl Strategy<Value = Case> {
    (
        proptest::collection::vec(spec(), 2..=4),
        1..=3usize,
        proptest::collection::vec(phase(requests), 2..phases),
        any::<u64>(),
    )
        .prop_map(|(specs, gateways, phases, seed)| Case {
            specs,
            gateways,
            phases,
            seed,
        })
}
