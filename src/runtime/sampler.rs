//! Samples each limit's decision counters and each upstream server's error counters once a
//! second into the dashboard's histories (`observe::live::LiveViews`, handed to every site): the
//! configuration in force names the series, its metric handles give their values, so the
//! dashboard and `/metrics` count the same decisions and errors. Each second it also ends the
//! upstream servers' ejections whose time has passed (passive health).

use std::sync::Arc;
use std::time::Duration;

use crate::observe::live::Counts;
use crate::route::table::COMMON;
use crate::runtime::snapshot::InForce;

/// How often the counters are sampled.
pub const EVERY: Duration = Duration::from_secs(1);

/// Samples the counters of the configuration in force every [`EVERY`], for ever (started once,
/// by `runtime::background`), and ends the passive-health ejections whose time has passed, so
/// `sluice_upstream_ejected` and the return's log line are at most a second late on a route
/// no request reads.
pub async fn keep(live: &InForce) {
    let mut ticks = tokio::time::interval(EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        sample(live);
        end_ejections(live);
    }
}

/// Reads whether each upstream server of the configuration in force is ejected: an ejection
/// whose time has passed ends on that reading.
fn end_ejections(live: &InForce) {
    let snapshot = live.load();
    for server in snapshot.health().servers() {
        server.ejected();
    }
}

/// One sample: every `(route, limit)` series of the configuration in force, with its totals;
/// a common limit's once, under [`COMMON`]: one bucket, its routes' counts added up.
pub fn sample(live: &InForce) {
    let snapshot = live.load_full();
    let common: Arc<str> = COMMON.into();
    let mut now: Vec<(Arc<str>, Arc<str>, Counts)> = Vec::new();
    for runtime in snapshot.routes.iter() {
        let route = &runtime.route;
        for (position, limit) in route.tiers.default().limits.iter().enumerate() {
            let Some(meters) = runtime.metrics.limit_at(position) else {
                continue;
            };
            let name = Arc::clone(&limit.limit.exact.name);
            if !limit.key.common() {
                now.push((Arc::clone(&route.name), name, meters.totals()));
                continue;
            }
            match now.iter_mut().find(|(r, l, _)| *r == common && *l == name) {
                Some((_, _, totals)) => *totals = totals.plus(meters.totals()),
                None => now.push((Arc::clone(&common), name, meters.totals())),
            }
        }
    }
    snapshot.views.decisions.record(now);
    let servers = snapshot.site.metrics.server_errors().iter();
    let errors = servers.flat_map(|errors| {
        let server: Arc<str> = errors.server.to_string().into();
        let totals = errors.totals().collect::<Vec<_>>();
        totals
            .into_iter()
            .map(move |(kind, total)| (Arc::clone(&server), kind, total))
    });
    snapshot.views.server_errors.record(errors);
}
