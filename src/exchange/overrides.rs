//! The quota overrides in force as this gateway last read them (`runtime::overrides` reads
//! them every second where the limits live), shared by every configuration in turn: each site
//! compiles them for its routes (`route::overrides`). Each keeps its own expiry, so one read
//! while the store cannot be reached does not keep it in force past its time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::caller::consumers::Plans;
use crate::config::Config;
use crate::route::overrides::{CompiledOverrides, Override};
use crate::route::table::RouteTable;

/// One override read, and when it expires on this gateway's clock.
#[derive(Debug, Clone)]
pub struct Read {
    pub one: Override,
    pub until: Instant,
}

/// The overrides in force as this gateway last read them, with a version that changes with
/// them. Shared by every configuration in turn (a reload hands it over).
#[derive(Debug, Default)]
pub struct OverrideList {
    list: ArcSwap<Vec<Read>>,
    version: AtomicU64,
    /// The admin epoch last seen (resets and credits counted where the limits live).
    epoch: AtomicU64,
    /// One change of the list at a time: an expiry never stores over a newer read.
    changing: Mutex<()>,
    /// One read from the store at a time (`runtime::overrides::refresh`): a slower read that
    /// began before a write never lands after the read that saw it.
    reading: tokio::sync::Mutex<()>,
}

impl OverrideList {
    /// Waits for the reads from the store before this one to finish; held while reading.
    pub async fn reading(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.reading.lock().await
    }

    /// Takes `read` as the list in force (their expiries refreshed): whether the overrides
    /// changed.
    pub fn replace(&self, mut read: Vec<Read>) -> bool {
        read.sort_by_key(|r| r.one.field());
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let same = {
            let held = self.list.load();
            held.iter().map(|h| &h.one).eq(read.iter().map(|r| &r.one))
        };
        self.list.store(Arc::new(read));
        if !same {
            self.version.fetch_add(1, Ordering::AcqRel);
        }
        !same
    }

    /// Drops the overrides expired at `now` (while the store cannot be read, expiry still
    /// applies): whether any was.
    pub fn expire(&self, now: Instant) -> bool {
        let _one_at_a_time = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let held = self.list.load_full();
        if held.iter().all(|r| r.until > now) {
            return false;
        }
        let live = held.iter().filter(|r| r.until > now).cloned().collect();
        self.list.store(Arc::new(live));
        self.version.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Notes the admin epoch read: whether it changed (a change was made since).
    pub fn see_epoch(&self, epoch: u64) -> bool {
        self.epoch.swap(epoch, Ordering::AcqRel) != epoch
    }

    /// The overrides held in force at `now` (what a gateway writes back when the store lost
    /// them).
    pub fn held(&self, now: Instant) -> Vec<Read> {
        let held = self.list.load();
        held.iter().filter(|r| r.until > now).cloned().collect()
    }

    /// The admin epoch last read.
    pub fn seen_epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The list in force, compiled for `routes` and `plans`.
    pub fn compile(&self, config: (&RouteTable, &Plans), instances: u64) -> CompiledOverrides {
        let version = self.version();
        let overrides: Vec<Override> = self.list.load().iter().map(|r| r.one.clone()).collect();
        CompiledOverrides::compile(&overrides, config, instances, version)
    }
}

/// The overrides in force as one site applies them: the process's list, compiled for the
/// site's routes and plans. Whoever changes the list (the override poll, the quota admin API)
/// compiles it again, off the request path, with [`SiteOverrides::refresh`]; a request only
/// reads the compiled form.
pub struct SiteOverrides {
    list: Arc<OverrideList>,
    compiled: ArcSwap<CompiledOverrides>,
}

impl SiteOverrides {
    /// `list` compiled for `config`'s routes and plans.
    pub fn new(list: Arc<OverrideList>, config: &Config) -> SiteOverrides {
        let compiled = ArcSwap::from_pointee(compile(&list, config));
        SiteOverrides { list, compiled }
    }

    /// The list in force (the process's).
    pub fn list(&self) -> &Arc<OverrideList> {
        &self.list
    }

    /// The list as last compiled for the site.
    pub fn compiled(&self) -> arc_swap::Guard<Arc<CompiledOverrides>> {
        self.compiled.load()
    }

    /// Compiles the list again for `config` (the site's) if it changed since it was compiled.
    pub fn refresh(&self, config: &Config) {
        if self.compiled.load().version == self.list.version() {
            return;
        }
        let compiled = Arc::new(compile(&self.list, config));
        // Two compiling at once: the newer list wins, whichever stores last.
        self.compiled
            .rcu(|current| match current.version > compiled.version {
                true => Arc::clone(current),
                false => Arc::clone(&compiled),
            });
    }
}

fn compile(list: &OverrideList, config: &Config) -> CompiledOverrides {
    list.compile((&config.routes, config.consumers.plans()), config.instances)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limiter::clock::{Clock, ManualClock};
    use crate::route::overrides::QuotaOverride;

    fn read(limit: &str, until: Instant) -> Read {
        let one = Override::Limit(QuotaOverride {
            route: "r".into(),
            limit: limit.into(),
            consumer: None,
            quota: None,
            actor: None,
        });
        Read { one, until }
    }

    #[test]
    fn a_list_changes_its_version_with_its_overrides_and_expires_unread() {
        let list = OverrideList::default();
        let now = ManualClock::default().instant();
        let later = now + Duration::from_secs(1);
        assert!(list.replace(vec![read("a", later), read("b", later)]));
        let version = list.version();
        let again = later + Duration::from_secs(1);
        assert!(
            !list.replace(vec![read("b", again), read("a", later)]),
            "the same, reordered"
        );
        assert_eq!(list.version(), version);
        assert!(!list.expire(now));
        assert!(list.expire(later), "a expires although nothing was read");
        assert!(list.version() > version);
        let compiled = list.compile((&RouteTable::new(Vec::new()), &Plans::default()), 1);
        assert!(compiled.is_empty());
        assert!(list.see_epoch(3) && !list.see_epoch(3));
    }
}
