//! Keeps this gateway's quota overrides in step with the table where the limits live: every
//! second (and at once after this gateway's own admin write) it reads the overrides in force
//! and the admin epoch, hands the list to the configuration in force, which compiles it into
//! the tiers its callers meet and the plans its consumers are on, and forgets the denials its
//! deny cache holds when either changed (a reset, credit or override may have made them wrong).
//! So a change made through any gateway applies on every gateway within [`EVERY`] and one read.
//!
//! The epoch only grows (`lua/admin/epoch.lua`), and lives longer than any override: one read lower
//! than the last seen means Redis lost the admin tables (a restart without persistence, a
//! flush, a failover to a lagging replica). The gateway then writes back the overrides it holds
//! that the table lacks, each with what it had left (one write lands of the several gateways
//! that try), audits each it wrote as `restored`, says in the log that the counts were lost
//! too, and reads what Redis persists again (`runtime::durability`).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::config::Config;
use crate::exchange::overrides::Read;
use crate::limiter::admin::QuotaStore;
use crate::limiter::{AdminTables, LimiterError, Listed, Policy, Restored};
use crate::observe::audit::AuditLog;
use crate::route::overrides::Override;
use crate::runtime::durability;
use crate::runtime::snapshot::{InForce, Snapshot};

/// How often every gateway reads the admin epoch.
pub const EVERY: Duration = Duration::from_secs(1);

/// How long the admin epoch lives after the last change (`ANNOUNCED_MS` in
/// `lua/admin/epoch.lua`): longer than any override.
const EPOCH_LIFETIME_US: u64 = 30 * 24 * 3600 * 1_000_000;

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
/// time (the list's own lock, `OverrideList::reading`): a slower read that began before a
/// write never lands after the read that saw it.
pub async fn refresh(policy: &Policy, live: &InForce) -> Result<(), LimiterError> {
    let snapshot = live.load_full();
    let _one_at_a_time = snapshot.overrides.list().reading().await;
    let tables = admin_tables(&snapshot.config);
    let mut read_at = Instant::now();
    let mut listed = policy.quota_store().overrides(&tables).await?;
    let seen = snapshot.overrides.list().seen_epoch();
    if lost(listed.epoch, seen, unix_now_us()) {
        restore(policy, &snapshot, &listed, seen).await?;
        read_at = Instant::now();
        listed = policy.quota_store().overrides(&tables).await?;
    }
    let overrides = listed.overrides.iter().filter_map(|stored| {
        let parsed = serde_json::from_str::<Override>(&stored.value);
        if let Err(e) = &parsed {
            log::warn!("quota override {} is not one: {e}; ignored", stored.field);
        }
        let until = read_at + Duration::from_millis(stored.left_ms);
        parsed.ok().map(|one| Read { one, until })
    });
    let changed = snapshot.overrides.list().replace(overrides.collect());
    snapshot.overrides.refresh(&snapshot.config);
    let announced = snapshot.overrides.list().see_epoch(listed.epoch);
    if changed || announced {
        policy.forget_denials();
    }
    Ok(())
}

/// Whether an epoch `read` below the one `seen` means the admin tables were lost: not when the
/// one seen lapsed by itself ([`EPOCH_LIFETIME_US`] after it was written, when no override
/// written before it is left).
fn lost(read: u64, seen: u64, now_us: u64) -> bool {
    read < seen && now_us < seen.saturating_add(EPOCH_LIFETIME_US)
}

/// Microseconds since the Unix epoch on this gateway's clock (an epoch is at least Redis's
/// time when it was written).
fn unix_now_us() -> u64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH);
    since.map_or(0, |d| d.as_micros() as u64)
}

/// Redis lost the admin tables (its epoch read `listed.epoch`, below `seen`): writes back the
/// overrides this gateway holds that `listed` lacks, audits each written, says so in the log,
/// and reads what Redis persists again. `Err`: a write failed (the next read tries again).
async fn restore(
    policy: &Policy,
    snapshot: &Snapshot,
    listed: &Listed,
    seen: u64,
) -> Result<(), LimiterError> {
    let now = Instant::now();
    let missing: Vec<Read> = snapshot
        .overrides
        .list()
        .held(now)
        .into_iter()
        .filter(|held| {
            let field = held.one.field();
            !listed.overrides.iter().any(|stored| stored.field == field)
        })
        .collect();
    log::warn!(
        "quota admin: Redis lost its admin tables (the admin epoch read {}, below the {seen} last seen: a restart without persistence, a flush or a failover to a lagging replica); every count kept there, calendar quotas included, was lost with them; writing back the {} overrides this gateway holds",
        listed.epoch,
        missing.len()
    );
    let tables = admin_tables(&snapshot.config);
    for held in &missing {
        let left = held.until.saturating_duration_since(now);
        let value = serde_json::to_string(&held.one).unwrap_or_default();
        match policy
            .quota_store()
            .restore_override(&tables, &held.one.field(), &value, left)
            .await?
        {
            Restored::Written => audit_restored(&snapshot.audit_log, &held.one, left).await,
            Restored::Present => {}
            Restored::Full => log::warn!(
                "quota admin: override {} is not written back: the table is full",
                held.one.field()
            ),
        }
    }
    let when = "after Redis lost its admin tables";
    durability::check_now(policy, &snapshot.config, when).await;
    Ok(())
}

/// The audit line (and count) of an override this gateway wrote back: `restore`, `restored`.
async fn audit_restored(audit_log: &AuditLog, one: &Override, left: Duration) {
    let mut line = match serde_json::to_value(one) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    if let Override::Limit(limit) = one {
        line.insert(
            "quota".into(),
            limit.quota.map_or(json!("off"), |q| json!(q)),
        );
    }
    line.insert("kind".into(), json!(one.kind()));
    line.insert("expires_in_seconds".into(), json!(left.as_secs()));
    line.insert("peer".into(), json!(null));
    line.insert(
        "reason".into(),
        json!("Redis lost the overrides table; this gateway held it in force"),
    );
    audit_log.write("restore", "restored", line).await;
}

/// Reads the admin epoch (one `GET`), and everything again only when it changed since the
/// last read (or nothing was read yet): a change made through any gateway counts in it.
async fn check(policy: &Policy, live: &InForce, read_before: bool) -> Result<(), LimiterError> {
    // `read_before` false: nothing read yet, or a check that reads anyway.
    let snapshot = live.load_full();
    let tables = admin_tables(&snapshot.config);
    let epoch = policy.quota_store().epoch(&tables).await?;
    if read_before && epoch == snapshot.overrides.list().seen_epoch() {
        return Ok(());
    }
    refresh(policy, live).await
}

/// Checks every [`EVERY`] for as long as its runtime runs; started once
/// (`runtime::background`). Each override expires on time whether or not the store answers; a failed
/// read keeps those last read until then, and is logged once until a read succeeds again.
pub async fn keep(policy: &Policy, live: &InForce) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut read_before, mut failing, mut ticks) = (false, false, 0u32);
    loop {
        every.tick().await;
        ticks = ticks.wrapping_add(1);
        read_before &= ticks % READ_ANYWAY != 0;
        let snapshot = live.load_full();
        snapshot.overrides.list().expire(Instant::now());
        // Compiles them for the configuration in force if they (or it) changed.
        snapshot.overrides.refresh(&snapshot.config);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arc_swap::ArcSwap;

    use super::*;
    use crate::route::overrides::QuotaOverride;

    /// One route, `api`, with a limit `per_ip` of 50 a second and `per_path` of 20, on the
    /// in-process backend (which keeps the admin tables too).
    fn gateway() -> (Policy, InForce) {
        let yaml = "listen: [127.0.0.1:1]\n\
             routes: [{ name: api, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:1] }, \
             limits: [{ name: per_ip, rate: 50/s }, { name: per_path, key: [path], rate: 20/s }] }]\n";
        let (policy, snapshot) = crate::runtime::snapshot::testing::in_process(yaml);
        let live = Arc::new(ArcSwap::from_pointee(snapshot));
        (policy, live)
    }

    fn at(limit: &str, quota: u64) -> Override {
        Override::Limit(QuotaOverride {
            route: "api".into(),
            limit: limit.into(),
            consumer: None,
            quota: Some(quota),
            actor: None,
        })
    }

    async fn put(policy: &Policy, live: &InForce, one: &Override) {
        let tables = admin_tables(&live.load().config);
        let value = serde_json::to_string(one).expect("JSON");
        let lifetime = Duration::from_secs(600);
        let field = one.field();
        let put = policy
            .quota_store()
            .put_override(&tables, &field, &value, lifetime);
        put.await.expect("stored");
    }

    /// The quotas every caller of `api` meets, by limit, with the overrides in force.
    fn quotas(live: &InForce) -> Vec<(String, u64)> {
        let snapshot = live.load_full();
        let route = snapshot.config.routes.named("api").expect("api");
        let (id, overridden) = snapshot.tier_for(route, None);
        let tier = overridden.unwrap_or_else(|| Arc::clone(route.tiers.shared(id)));
        let limits = tier.limits.iter();
        let quota = |l: &Arc<crate::route::tiers::TierLimit>| {
            let (q, _) = l.limit.exact.advertised.expect("a rate");
            (l.limit.exact.name.to_string(), q)
        };
        limits.map(quota).collect()
    }

    async fn stored(policy: &Policy, live: &InForce) -> Listed {
        let tables = admin_tables(&live.load().config);
        policy
            .quota_store()
            .overrides(&tables)
            .await
            .expect("a read")
    }

    fn of(quotas: &[(&str, u64)]) -> Vec<(String, u64)> {
        quotas.iter().map(|(n, q)| (n.to_string(), *q)).collect()
    }

    #[tokio::test]
    async fn a_read_puts_the_stored_overrides_in_force_and_notes_the_epoch() {
        let (policy, live) = gateway();
        assert_eq!(quotas(&live), of(&[("per_ip", 50), ("per_path", 20)]));
        put(&policy, &live, &at("per_ip", 5)).await;
        refresh(&policy, &live).await.expect("a read");
        assert_eq!(quotas(&live), of(&[("per_ip", 5), ("per_path", 20)]));
        let epoch = stored(&policy, &live).await.epoch;
        assert_eq!(live.load().overrides.list().seen_epoch(), epoch);

        // Removed from the store: the next read drops it, and writes nothing back.
        let tables = admin_tables(&live.load().config);
        let field = at("per_ip", 5).field();
        policy
            .quota_store()
            .delete_override(&tables, &field)
            .await
            .expect("removed");
        refresh(&policy, &live).await.expect("a read");
        assert_eq!(quotas(&live), of(&[("per_ip", 50), ("per_path", 20)]));
        assert!(stored(&policy, &live).await.overrides.is_empty());
    }

    #[tokio::test]
    async fn an_override_held_past_its_expiry_no_longer_applies() {
        let (policy, live) = gateway();
        put(&policy, &live, &at("per_ip", 5)).await;
        refresh(&policy, &live).await.expect("a read");
        assert_eq!(quotas(&live), of(&[("per_ip", 5), ("per_path", 20)]));
        let snapshot = live.load_full();
        let soon = Instant::now() + Duration::from_secs(599);
        assert!(
            !snapshot.overrides.list().expire(soon),
            "600 s left: still in force"
        );
        snapshot.overrides.refresh(&snapshot.config);
        assert_eq!(quotas(&live), of(&[("per_ip", 5), ("per_path", 20)]));
        let past = Instant::now() + Duration::from_secs(601);
        assert!(snapshot.overrides.list().expire(past));
        snapshot.overrides.refresh(&snapshot.config);
        assert_eq!(quotas(&live), of(&[("per_ip", 50), ("per_path", 20)]));
        assert!(
            snapshot.overrides.list().held(past).is_empty(),
            "nothing to write back"
        );
    }

    #[tokio::test]
    async fn an_epoch_read_below_the_one_seen_writes_back_the_overrides_the_store_lost() {
        let (policy, live) = gateway();
        put(&policy, &live, &at("per_ip", 5)).await;
        put(&policy, &live, &at("per_path", 2)).await;
        refresh(&policy, &live).await.expect("a read");
        // The store loses one override (as a flush would), and this gateway has seen an epoch
        // above the store's: the admin tables were lost.
        let tables = admin_tables(&live.load().config);
        let lost_one = at("per_path", 2).field();
        policy
            .quota_store()
            .delete_override(&tables, &lost_one)
            .await
            .expect("removed");
        let before = stored(&policy, &live).await.epoch;
        live.load().overrides.list().see_epoch(unix_now_us());

        refresh(&policy, &live).await.expect("a read");
        let after = stored(&policy, &live).await;
        let fields: Vec<&str> = after.overrides.iter().map(|o| o.field.as_str()).collect();
        let mut expected = [at("per_ip", 5).field(), lost_one.clone()];
        expected.sort();
        assert_eq!(fields, expected, "the lost one is written back");
        assert_eq!(after.epoch, before + 1, "only the missing one is written");
        let restored = after.overrides.iter().find(|o| o.field == lost_one);
        let left = restored.expect("restored").left_ms;
        assert!(left > 0 && left <= 600_000, "with what it had left: {left}");
        assert_eq!(quotas(&live), of(&[("per_ip", 5), ("per_path", 2)]));
        assert_eq!(live.load().overrides.list().seen_epoch(), after.epoch);
    }

    #[test]
    fn an_epoch_below_the_one_seen_is_a_loss_unless_the_one_seen_lapsed() {
        let seen = 1_700_000_000_000_000;
        assert!(
            lost(0, seen, seen + 1_000_000),
            "gone: a restart without persistence"
        );
        assert!(
            lost(seen - 5, seen, seen + 1_000_000),
            "behind: a lagging replica"
        );
        assert!(!lost(seen, seen, seen + 1_000_000));
        assert!(!lost(seen + 1, seen, seen + 1_000_000), "a change since");
        assert!(!lost(0, seen, seen + EPOCH_LIFETIME_US), "lapsed by itself");
        assert!(!lost(0, 0, seen), "nothing seen yet");
    }
}
