//! The retry budget of one upstream, in flight: its requests and its retries, each held by a
//! guard that gives its place back when dropped, and a retry granted only while retries stay
//! within the rule's share of the requests (Envoy's `retry_budget`). Plain atomics: the
//! exchange holds the guards, nothing here names Pingora.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::route::upstream::RetryBudgetRule;

/// The requests and retries in flight to one upstream, and the rule that bounds the retries.
#[derive(Debug)]
pub struct RetryBudget {
    rule: RetryBudgetRule,
    requests: AtomicU32,
    retries: AtomicU32,
}

/// A request in flight to the upstream: counted while this lives, with its latest retry's
/// place when it holds one. The retry's place goes back first: were the request's to go first,
/// retries would for a moment outnumber the share of the requests left, and another request's
/// retry would be refused a place the budget has.
#[derive(Debug)]
pub struct RequestPlace {
    budget: Arc<RetryBudget>,
    retry: Option<RetryPlace>,
}

/// A retry in flight: counted while this lives.
#[derive(Debug)]
struct RetryPlace(Arc<RetryBudget>);

impl RetryBudget {
    pub fn new(rule: RetryBudgetRule) -> Arc<RetryBudget> {
        Arc::new(RetryBudget {
            rule,
            requests: AtomicU32::new(0),
            retries: AtomicU32::new(0),
        })
    }

    /// Counts a request in flight until the place drops.
    pub fn request(self: &Arc<Self>) -> RequestPlace {
        self.requests.fetch_add(1, Ordering::Relaxed);
        RequestPlace {
            budget: Arc::clone(self),
            retry: None,
        }
    }

    /// A place for one more retry, if the budget has one now: retries in flight stay within
    /// the rule's share of the requests in flight (never below its floor).
    fn retry(self: &Arc<Self>) -> Option<RetryPlace> {
        let allowed = self.rule.allowed(self.requests.load(Ordering::Relaxed));
        let taken = self
            .retries
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |retries| {
                (retries < allowed).then_some(retries + 1)
            });
        taken.ok().map(|_| RetryPlace(Arc::clone(self)))
    }

    /// Requests and retries in flight now.
    pub fn in_flight(&self) -> (u32, u32) {
        (
            self.requests.load(Ordering::Relaxed),
            self.retries.load(Ordering::Relaxed),
        )
    }
}

impl RequestPlace {
    /// A place for one more retry of this request, if the budget has one now; this request's
    /// earlier retry, if any, has ended, and its place goes back first.
    pub fn retry(&mut self) -> bool {
        self.retry = None;
        self.retry = self.budget.retry();
        self.retry.is_some()
    }
}

impl Drop for RequestPlace {
    fn drop(&mut self) {
        self.retry = None;
        self.budget.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for RetryPlace {
    fn drop(&mut self) {
        self.0.retries.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_stay_within_the_share_of_requests_and_places_come_back() {
        let budget = RetryBudget::new(RetryBudgetRule {
            percent: 20,
            min_concurrency: 1,
        });
        let mut requests: Vec<_> = (0..10).map(|_| budget.request()).collect();
        assert!(requests[0].retry(), "20 % of 10 is 2");
        assert!(requests[1].retry(), "the second of 2");
        assert!(!requests[2].retry(), "a third is over the budget");
        assert!(
            requests[1].retry(),
            "a request's next retry: its last one's place first"
        );
        drop(requests.remove(0));
        assert_eq!(
            budget.in_flight(),
            (9, 1),
            "a request leaves with its retry"
        );
        assert!(!requests[2].retry(), "20 % of 9 is 1, the other's");
        drop(requests.remove(0));
        assert_eq!(budget.in_flight(), (8, 0));
        assert!(requests[2].retry(), "a place came back");
        assert_eq!(budget.in_flight(), (8, 1));
        drop(requests);
        assert_eq!(budget.in_flight(), (0, 0));
        let floor = budget
            .retry()
            .expect("the floor allows one with no request");
        assert!(budget.retry().is_none());
        drop(floor);
    }
}
