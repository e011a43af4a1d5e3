//! Warm decisions: the decision scripts a configuration may call are loaded into Redis before
//! the gateway says it is ready and before a reload takes effect, so that no decision pays a
//! script's load (`FUNCTION LOAD` compiles the Lua text, which takes longer than a tight
//! deadline allows: a cold first decision missed a 1 ms deadline).
//!
//! A batch's script holds exactly the algorithms of its requests (`script.rs`), and a batch may
//! join requests of several routes, or carry part of a route's limits (a lease's refill). So
//! the scripts a configuration may call are those of every set of the algorithms it uses: one
//! when it uses one algorithm, three for two, at most 63.
//!
//! [`Warmth`] is what the Redis backend knows of them: the scripts wanted (by the configuration
//! in force) and those the server is known to hold. The connection keeper (`mod.rs`) loads
//! what is wanted and not held, woken at once when a reload wants more. It forgets what the
//! server holds when the connection breaks (a restarted server may have lost them) and when a
//! call finds one missing (`FUNCTION FLUSH`, `SCRIPT FLUSH`), and loads them again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::script::Algorithms;

/// A set of decision scripts, each named by its algorithms (bit [`Algorithms::index`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scripts(u128);

impl Scripts {
    /// The scripts of every set of `algorithms`.
    pub fn of_every_subset(algorithms: Algorithms) -> Scripts {
        Scripts(
            algorithms
                .subsets()
                .fold(0, |bits, set| bits | 1 << set.index()),
        )
    }

    /// The script of `algorithms` alone.
    pub fn one(algorithms: Algorithms) -> Scripts {
        Scripts(1 << algorithms.index())
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// How many scripts it names.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether it names every script of `other`.
    pub fn holds_all(self, other: Scripts) -> bool {
        other.0 & !self.0 == 0
    }

    /// Those of its scripts that `other` does not name.
    pub fn without(self, other: Scripts) -> Scripts {
        Scripts(self.0 & !other.0)
    }

    /// The algorithms of each of its scripts.
    pub fn iter(self) -> impl Iterator<Item = Algorithms> {
        Algorithms::ALL
            .subsets()
            .filter(move |set| self.0 & 1 << set.index() != 0)
    }
}

/// The decision scripts the configuration in force may call, and those the server holds.
#[derive(Debug)]
pub struct Warmth {
    /// Read by the keeper and by readiness, written at start and by reloads: never on a
    /// request's path.
    wanted: Mutex<Scripts>,
    /// Whether the server answered the keeper's last `PING`: a reload waits for the scripts
    /// only then (it does not wait out its bound while Redis is down).
    answering: AtomicBool,
    /// Those the server is known to hold; a reload waits on it.
    held: watch::Sender<Scripts>,
    /// Wakes the keeper: more are wanted, or some were forgotten.
    wake: Notify,
}

impl Default for Warmth {
    fn default() -> Warmth {
        Warmth {
            wanted: Mutex::new(Scripts::default()),
            answering: AtomicBool::new(true),
            held: watch::Sender::new(Scripts::default()),
            wake: Notify::new(),
        }
    }
}

impl Warmth {
    /// The configuration in force may call `scripts`: the keeper loads those the server lacks.
    pub fn want(&self, scripts: Scripts) {
        *self.wanted.lock().unwrap_or_else(|e| e.into_inner()) = scripts;
        if !self.missing().is_empty() {
            self.wake.notify_one();
        }
    }

    pub fn wanted(&self) -> Scripts {
        *self.wanted.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The scripts wanted that the server is not known to hold.
    pub fn missing(&self) -> Scripts {
        self.wanted().without(*self.held.borrow())
    }

    /// The server holds `scripts` now.
    pub fn loaded(&self, scripts: Scripts) {
        self.held
            .send_modify(|held| *held = Scripts(held.0 | scripts.0));
    }

    /// The server may have lost every script (a broken connection, a call that found one
    /// missing): the keeper loads them again.
    pub fn forget(&self) {
        let had = self.held.send_replace(Scripts::default());
        if !had.is_empty() {
            self.wake.notify_one();
        }
    }

    /// Whether the server answered the keeper's last `PING`.
    pub fn answering(&self, answered: bool) {
        self.answering.store(answered, Ordering::Relaxed);
    }

    /// Returns once woken by [`Warmth::want`] or [`Warmth::forget`] (a wake while no one
    /// waited is kept for the next call).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    /// Waits until the server holds every script wanted, for at most `bound`, or not at all
    /// while it does not answer: whether it holds them.
    pub async fn held_within(&self, bound: Duration) -> bool {
        let wanted = self.wanted();
        if !self.answering.load(Ordering::Relaxed) {
            return self.held.borrow().holds_all(wanted);
        }
        let mut held = self.held.subscribe();
        let all = held.wait_for(|held| held.holds_all(wanted));
        let held_all = matches!(tokio::time::timeout(bound, all).await, Ok(Ok(_)));
        held_all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Algorithms {
        Algorithms::named(names.iter().copied()).expect("known algorithms")
    }

    #[test]
    fn every_subset_of_the_algorithms_used_is_wanted() {
        assert_eq!(Scripts::of_every_subset(Algorithms::default()).len(), 0);
        assert_eq!(Scripts::of_every_subset(set(&["gcra"])).len(), 1);
        let two = Scripts::of_every_subset(set(&["gcra", "concurrency"]));
        let mut named: Vec<Algorithms> = two.iter().collect();
        named.sort_by_key(|a| a.index());
        let mut expected = vec![
            set(&["gcra"]),
            set(&["concurrency"]),
            set(&["gcra", "concurrency"]),
        ];
        expected.sort_by_key(|a| a.index());
        assert_eq!(named, expected);
        assert_eq!(Scripts::of_every_subset(Algorithms::ALL).len(), 127);
    }

    #[tokio::test]
    async fn a_reload_waits_for_the_scripts_it_wants_and_forgetting_wakes_the_keeper() {
        let warmth = Warmth::default();
        let gcra = Scripts::of_every_subset(set(&["gcra"]));
        warmth.want(gcra);
        assert_eq!(warmth.missing(), gcra);
        // The keeper was woken by the want, and a reload waiting gives up after its bound.
        tokio::time::timeout(Duration::from_secs(5), warmth.woken())
            .await
            .expect("a want that misses scripts wakes the keeper");
        assert!(!warmth.held_within(Duration::from_millis(20)).await);
        warmth.loaded(gcra);
        assert!(warmth.missing().is_empty());
        assert!(warmth.held_within(Duration::from_millis(20)).await);
        // While the server does not answer, a reload does not wait for what it lacks.
        warmth.answering(false);
        warmth.want(Scripts::of_every_subset(set(&["gcra", "calendar"])));
        tokio::time::timeout(Duration::from_secs(5), warmth.woken())
            .await
            .expect("more wanted wakes the keeper");
        let waited = std::time::Instant::now();
        assert!(!warmth.held_within(Duration::from_secs(5)).await);
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "it waited out its bound"
        );
        warmth.answering(true);
        warmth.want(gcra);
        // Wanting what is held wakes no one; forgetting it does.
        warmth.want(gcra);
        let idle = tokio::time::timeout(Duration::from_millis(20), warmth.woken()).await;
        assert!(
            idle.is_err(),
            "nothing was missing, yet the keeper was woken"
        );
        warmth.forget();
        assert_eq!(warmth.missing(), gcra);
        tokio::time::timeout(Duration::from_secs(5), warmth.woken())
            .await
            .expect("forgetting held scripts wakes the keeper");
    }
}
