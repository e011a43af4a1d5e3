//! The property that keeps leases honest (issue 50), on the in-process backend (the scripts'
//! twin, held to the same answers by `tests/lua_scripts.rs`): any mix of 2–4 limits per route —
//! every algorithm, every mode — across 1–3 gateways on one manual clock, under bursts and
//! silences with random costs, stores exactly what admitted requests cost once idle, and what
//! they cost plus what gateways hold at every instant ([`simulation`]). `tests/leases.rs` runs it
//! against Redis.

use std::sync::Arc;

use proptest::prelude::*;

use crate::limiter::clock::{Clock, ManualClock};
use crate::limiter::leased::simulation::{Case, Kind, Mode, Phase, Spec, World};
use crate::limiter::leased::{LeaseMeters, Leased};
use crate::limiter::local::LocalLimiter;

#[path = "strategy.rs"]
mod strategy;

async fn play(case: Case) {
    // Just before a day ends, so the day-long periods turn over too.
    let clock = Arc::new(ManualClock::new(20_000 * 86_400_000_000 - 3_000_000));
    let backend = Arc::new(LocalLimiter::new(clock.clone(), 10_000));
    let gateways = (0..case.gateways)
        .map(|_| {
            let clock: Arc<dyn Clock> = clock.clone();
            Leased::new(
                Arc::clone(&backend),
                Arc::clone(&backend),
                clock,
                LeaseMeters::unregistered(),
            )
            .swept_by_hand()
        })
        .collect();
    World::new(&case, clock, backend, gateways, "")
        .play(&case)
        .await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn leases_charge_exactly_what_admitted_requests_cost(case in strategy::case(10, 80)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(play(case));
    }
}
