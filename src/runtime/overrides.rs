//! Keeps this gateway's quota overrides in step with the table where the limits live: every
//! second (and at once after this gateway's own admin write) it reads the overrides in force
//! and the admin epoch, hands the list to the configuration in force, which compiles it into
//! the tiers its callers meet, and forgets the denials its deny cache holds when either changed
//! (a reset, credit or override may have made them wrong). So a change made through any
//! gateway applies on every gateway within [`EVERY`] and one read.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::exchange::overrides::Read;
use crate::limiter::{AdminTables, LimiterError, Policy, QuotaStore};
use crate::route::overrides::Override;
use crate::runtime::snapshot::Live;

/// How often every gateway reads the admin epoch.
pub const EVERY: Duration = Duration::from_secs(1);

/// Every this many checks the overrides are read whatever the epoch says (a bound on a change
/// missed by a read racing it).
const READ_ANYWAY: u32 = 30;

/// Where the admin API's tables are, under `config`'s key prefix.
pub fn admin_tables(config: &Config) -> AdminTables {
    let prefix = config
        .redis
        .as_ref()
        .map_or("sluice", |r| r.key_prefix.as_str());
    AdminTables::under(prefix)
}

/// Reads the overrides in force and the admin epoch once, and applies them. One read at a
/// time: a slower read that began before a write never lands after the read that saw it.
pub async fn refresh(policy: &Policy, live: &Live) -> Result<(), LimiterError> {
    static READING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = READING.lock().await;
    let snapshot = live.load_full();
    let read_at = Instant::now();
    let listed = policy
        .engine()
        .overrides(&admin_tables(&snapshot.config))
        .await?;
    let overrides = listed.overrides.iter().filter_map(|stored| {
        let parsed = serde_json::from_str::<Override>(&stored.value);
        if let Err(e) = &parsed {
            log::warn!("quota override {} is not one: {e}; ignored", stored.field);
        }
        let until = read_at + Duration::from_millis(stored.left_ms);
        parsed.ok().map(|one| Read { one, until })
    });
    let changed = snapshot.overrides.replace(overrides.collect());
    snapshot.refresh_overrides();
    let announced = snapshot.overrides.see_epoch(listed.epoch);
    if changed || announced {
        policy.engine().forget_denials();
    }
    Ok(())
}

/// Reads the admin epoch (one `GET`), and everything again only when it changed since the
/// last read (or nothing was read yet): a change made through any gateway counts in it.
async fn check(policy: &Policy, live: &Live, read_before: bool) -> Result<(), LimiterError> {
    // `read_before` false: nothing read yet, or a check that reads anyway.
    let snapshot = live.load_full();
    let tables = admin_tables(&snapshot.config);
    let epoch = policy.engine().epoch(&tables).await?;
    if read_before && epoch == snapshot.overrides.seen_epoch() {
        return Ok(());
    }
    refresh(policy, live).await
}

/// Checks every [`EVERY`] for as long as its runtime runs; one task per process (later calls
/// return at once). Each override expires on time whether or not the store answers; a failed
/// read keeps those last read until then, and is logged once until a read succeeds again.
pub async fn keep(policy: &Policy, live: &Live) {
    static KEEPING: AtomicBool = AtomicBool::new(false);
    if KEEPING.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut read_before, mut failing, mut ticks) = (false, false, 0u32);
    loop {
        every.tick().await;
        ticks = ticks.wrapping_add(1);
        read_before &= ticks % READ_ANYWAY != 0;
        let snapshot = live.load_full();
        snapshot.overrides.expire(Instant::now());
        // Compiles them for the configuration in force if they (or it) changed.
        snapshot.refresh_overrides();
        match check(policy, live, read_before).await {
            Ok(()) => (read_before, failing) = (true, false),
            Err(e) if !failing => {
                failing = true;
                log::warn!("quota overrides: cannot read them ({e}); those last read stay in force until each expires");
            }
            Err(_) => {}
        }
    }
}
