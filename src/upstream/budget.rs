//! The retry budget of one upstream, in flight: its requests and its retries, and a retry
//! granted only while retries stay within the rule's share of the requests (Envoy's
//! `retry_budget`). Every request proxied to the upstream is counted, so its count is kept per
//! thread ([`PerThread`]) and summed only when a retry asks; retries are rare, and share one
//! count. A request's place is a plain token: whoever holds it holds the budget too (the
//! exchange, through its route) and gives it back with [`RetryBudget::leave`], so a request
//! writes no count shared across cores and clones no `Arc`. Nothing here names Pingora.

use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};

use crate::limiter::per_thread::PerThread;
use crate::route::upstream::RetryBudgetRule;

/// The requests and retries in flight to one upstream, and the rule that bounds the retries.
pub struct RetryBudget {
    rule: RetryBudgetRule,
    /// Per thread: the requests that entered on the slot and have not left.
    requests: PerThread<AtomicI64>,
    retries: AtomicU32,
}

/// A request counted in flight to one upstream, with its latest retry's place when it holds
/// one: given back to the budget that counted it by [`RetryBudget::leave`]. Its count is taken
/// off the slot it was put on, so that no slot reads below zero and a sum read while requests
/// come and go never misses a request in flight throughout.
#[derive(Debug)]
#[must_use = "a place is given back with RetryBudget::leave"]
pub struct RequestPlace {
    slot: usize,
    retry: bool,
}

impl RetryBudget {
    pub fn new(rule: RetryBudgetRule) -> RetryBudget {
        RetryBudget {
            rule,
            requests: PerThread::new(),
            retries: AtomicU32::new(0),
        }
    }

    /// Counts a request in flight until its place is given back.
    pub fn request(&self) -> RequestPlace {
        let slot = self.requests.mine();
        self.requests
            .slot(slot, AtomicI64::default)
            .fetch_add(1, Ordering::Relaxed);
        RequestPlace { slot, retry: false }
    }

    /// A place for one more retry of `place`'s request, if the budget has one now: retries in
    /// flight stay within the rule's share of the requests in flight (never below its floor).
    /// The request's earlier retry, if any, has ended, and its place goes back first.
    pub fn retry(&self, place: &mut RequestPlace) -> bool {
        self.end_retry(place);
        let allowed = self.rule.allowed(self.requests_in_flight());
        let taken = self
            .retries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |retries| {
                (retries < allowed).then_some(retries + 1)
            });
        place.retry = taken.is_ok();
        place.retry
    }

    /// The request has ended: its retry's place goes back first. Were the request's to go
    /// first, retries would for a moment outnumber the share of the requests left, and another
    /// request's retry would be refused a place the budget has.
    pub fn leave(&self, mut place: RequestPlace) {
        self.end_retry(&mut place);
        self.requests
            .slot(place.slot, AtomicI64::default)
            .fetch_sub(1, Ordering::Release);
    }

    fn end_retry(&self, place: &mut RequestPlace) {
        if std::mem::take(&mut place.retry) {
            self.retries.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The requests in flight, summed over the threads' slots.
    fn requests_in_flight(&self) -> u32 {
        let slots = self.requests.made();
        let sum: i64 = slots.map(|count| count.load(Ordering::Acquire)).sum();
        u32::try_from(sum.max(0)).unwrap_or(u32::MAX)
    }

    /// Requests and retries in flight now.
    pub fn in_flight(&self) -> (u32, u32) {
        (
            self.requests_in_flight(),
            self.retries.load(Ordering::Relaxed),
        )
    }
}

/// A budget of the default rule (Envoy's: 20 %, at least 3).
impl Default for RetryBudget {
    fn default() -> RetryBudget {
        RetryBudget::new(RetryBudgetRule::DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(percent: u8) -> RetryBudget {
        RetryBudget::new(RetryBudgetRule {
            percent,
            min_concurrency: 1,
        })
    }

    #[test]
    fn retries_stay_within_the_share_of_requests_and_places_come_back() {
        let budget = budget(20);
        let mut requests: Vec<_> = (0..10).map(|_| budget.request()).collect();
        assert!(budget.retry(&mut requests[0]), "20 % of 10 is 2");
        assert!(budget.retry(&mut requests[1]), "the second of 2");
        assert!(
            !budget.retry(&mut requests[2]),
            "a third is over the budget"
        );
        assert!(
            budget.retry(&mut requests[1]),
            "a request's next retry: its last one's place first"
        );
        budget.leave(requests.remove(0));
        assert_eq!(
            budget.in_flight(),
            (9, 1),
            "a request leaves with its retry"
        );
        assert!(
            !budget.retry(&mut requests[2]),
            "20 % of 9 is 1, the other's"
        );
        budget.leave(requests.remove(0));
        assert_eq!(budget.in_flight(), (8, 0));
        assert!(budget.retry(&mut requests[2]), "a place came back");
        assert_eq!(budget.in_flight(), (8, 1));
        requests.into_iter().for_each(|place| budget.leave(place));
        assert_eq!(budget.in_flight(), (0, 0));
        let mut alone = budget.request();
        assert!(
            budget.retry(&mut alone),
            "the floor: one beside one request"
        );
        let mut second = budget.request();
        assert!(!budget.retry(&mut second), "20 % of 2 is below the floor");
        budget.leave(alone);
        budget.leave(second);
        assert_eq!(budget.in_flight(), (0, 0));
    }

    #[test]
    fn requests_counted_on_many_threads_and_left_on_others_sum_exactly() {
        // A slot per thread (64): a place taken off the leaving thread's slot would show.
        let budget = RetryBudget {
            requests: PerThread::with_slots(64),
            ..budget(100)
        };
        let places: Vec<RequestPlace> = std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..25).map(|_| budget.request()).collect::<Vec<_>>()))
                .collect();
            let joined = threads.into_iter().map(|t| t.join().expect("a thread"));
            joined.flatten().collect()
        });
        assert_eq!(budget.in_flight(), (100, 0));
        let (mut these, those): (Vec<_>, Vec<_>) = places
            .into_iter()
            .enumerate()
            .partition(|(i, _)| i % 4 != 0);
        let retried = these.iter_mut().all(|(_, place)| budget.retry(place));
        assert!(retried, "100 % of 100: every one of 75");
        // Three in four leave on another thread than the one that counted them.
        std::thread::scope(|scope| {
            scope.spawn(|| these.into_iter().for_each(|(_, place)| budget.leave(place)));
        });
        assert_eq!(budget.in_flight(), (25, 0), "each left with its retry");
        let slots = budget.requests.made();
        let counts: Vec<i64> = slots.map(|count| count.load(Ordering::Relaxed)).collect();
        assert!(counts.iter().all(|count| *count >= 0), "{counts:?}");
        those.into_iter().for_each(|(_, place)| budget.leave(place));
        assert_eq!(budget.in_flight(), (0, 0));
    }
}
