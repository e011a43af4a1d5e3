//! The gateway's background work, owned by one value built once at start (`edge::server`) and
//! started once, from the runtime that serves requests (where the limiter's connections are
//! made): the limiter's connection keeper (`Policy::keep_connections`), the check of what
//! Redis persists once it answers (`runtime::durability`), the keeper of the quota overrides
//! in force (`runtime::overrides`), the sampler of the dashboard's live decisions
//! (`runtime::sampler`) and region sync (`runtime::regions`, with `regions:` only). Each runs for as long as that runtime does; nothing is de-duplicated
//! by a static: one proxy service is given the work to start, the others none.

use std::sync::Arc;

use crate::limiter::Policy;
use crate::runtime::snapshot::InForce;
use crate::runtime::{durability, overrides, regions, sampler};

/// The background work of one process, on the limiter `policy` and the configuration in
/// force `live`.
pub struct Background {
    policy: Arc<Policy>,
    live: InForce,
}

impl Background {
    pub fn new(policy: Arc<Policy>, live: InForce) -> Background {
        Background { policy, live }
    }

    /// Spawns every task in the current runtime; call once (the first proxy service's start).
    pub fn start(&self) {
        let keeper = Arc::clone(&self.policy);
        tokio::spawn(async move { keeper.keep_connections().await });
        let durable = (Arc::clone(&self.policy), Arc::clone(&self.live));
        tokio::spawn(durability::check_at_start(durable.0, durable.1));
        let (policy, live) = (Arc::clone(&self.policy), Arc::clone(&self.live));
        tokio::spawn(async move { overrides::keep(&policy, &live).await });
        let sampled = Arc::clone(&self.live);
        tokio::spawn(async move { sampler::keep(&sampled).await });
        let synced = (Arc::clone(&self.policy), Arc::clone(&self.live));
        tokio::spawn(regions::keep(synced.0, synced.1));
    }
}
