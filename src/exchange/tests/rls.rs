//! The rate limit service's decision (`exchange::rls::decide`) on the in-process limiter with a
//! manual clock: descriptors to rules, all or nothing across them, blocked and unlimited rules,
//! `replaces`, what is shown per descriptor and what is counted per limit.

use std::sync::Arc;

use crate::config::choice::{AlgorithmName, Spelled};
use crate::config::problem::Problems;
use crate::config::rls_files::{self, Sharing};
use crate::config::sources::Sources;
use crate::exchange::meters::rls_metrics;
use crate::exchange::rls::{decide, Descriptor, PerDescriptor, RlsReply, ServiceWide, Shown};
use crate::limiter::clock::ManualClock;
use crate::limiter::local::LocalLimiter;
use crate::limiter::{Engine, FailureMode, Policy, PolicyMeters};
use crate::observe::metrics::{RLS_LIMIT_DECISIONS, RLS_REQUESTS};
use crate::route::descriptors::{Domain, Domains, Unit};

/// The domain `name` of one configuration file: `descriptors` is its YAML list.
fn domain(name: &str, descriptors: &str) -> Domains {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let text = format!("domain: {name}\ndescriptors:\n{descriptors}");
    std::fs::write(dir.path().join("d.yaml"), text).expect("write the domain");
    let mut p = Problems::default();
    let fixed_window = Spelled::Known(AlgorithmName::FixedWindow);
    let sharing = Sharing { instances: 1 };
    let read = &mut Sources::default();
    let domains = rls_files::load(dir.path(), &fixed_window, sharing, &mut p, read);
    assert!(p.lines().is_empty(), "{:?}", p.lines());
    domains
}

const DESCRIPTORS: &str = "  - key: a
    rate_limit: { name: a, unit: minute, requests_per_unit: 1 }
  - key: b
    rate_limit: { name: b, unit: minute, requests_per_unit: 5 }
  - key: blocked
    rate_limit: { name: blocked, unit: hour, requests_per_unit: 0 }
  - key: free
    rate_limit: { unlimited: true }
  - key: wide
    rate_limit: { name: wide, unit: minute, requests_per_unit: 2 }
  - key: narrow
    rate_limit:
      name: narrow
      unit: minute
      requests_per_unit: 100
      replaces: [{ name: wide }]
";

fn policy() -> Policy {
    let clock = Arc::new(ManualClock::new(1_000_000_000));
    let local = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    Policy::new(
        Engine::local(local),
        None,
        clock,
        PolicyMeters::unregistered(),
    )
}

/// A call of one descriptor per key, each `(key, value)`.
fn call<'a>(keys: &[&'a str]) -> PerDescriptor<Descriptor<'a>> {
    keys.iter()
        .map(|key| Descriptor {
            entries: [(*key, "v")].into_iter().collect(),
            hits: None,
        })
        .collect()
}

struct Service {
    domains: Domains,
    policy: Policy,
}

impl Service {
    fn new(name: &str) -> Service {
        Service {
            domains: domain(name, DESCRIPTORS),
            policy: policy(),
        }
    }

    fn domain(&self) -> &Domain {
        self.domains.iter().next().expect("one domain")
    }

    async fn ask(&self, keys: &[&str]) -> RlsReply<'_> {
        let service = ServiceWide {
            key_prefix: "t",
            secret: (1, 2),
            failure_mode: FailureMode::Deny,
        };
        let metrics = rls_metrics(&self.domains);
        let meters = metrics.get(&self.domain().name);
        let descriptors = call(keys);
        let deciders = (&self.policy, meters);
        decide(self.domain(), service, deciders, &descriptors, 1).await
    }

    /// Remaining units of each descriptor of a call.
    async fn remaining(&self, keys: &[&str]) -> Vec<u64> {
        let reply = self.ask(keys).await;
        reply.statuses.iter().map(|s| s.remaining).collect()
    }
}

#[tokio::test]
async fn a_descriptor_is_held_to_its_limit_and_shown_it() {
    let service = Service::new("held");
    let first = service.ask(&["b"]).await;
    assert!(!first.over);
    let status = first.statuses[0];
    assert_eq!(
        status.limit,
        Some(Shown {
            name: "b",
            requests_per_unit: 5,
            unit: Unit::Minute
        })
    );
    assert_eq!((status.remaining, status.enforced), (4, true));
    for left in [3, 2, 1, 0] {
        assert_eq!(service.remaining(&["b"]).await, [left]);
    }
    let over = service.ask(&["b"]).await;
    assert!(over.over && over.statuses[0].over);
    let requests = |decision: &str| RLS_REQUESTS.with_label_values(&["held", decision]).get();
    assert_eq!((requests("allowed"), requests("limited")), (5, 1));
}

#[tokio::test]
async fn a_call_is_all_or_nothing_across_its_descriptors() {
    let service = Service::new("all_or_nothing");
    assert!(!service.ask(&["a", "b"]).await.over);
    let refused = service.ask(&["a", "b"]).await;
    assert!(refused.over);
    assert!(refused.statuses[0].over, "a is spent");
    assert!(!refused.statuses[1].over, "b would have allowed");
    assert_eq!(
        service.remaining(&["b"]).await,
        [3],
        "the refused call took nothing from b"
    );
}

#[tokio::test]
async fn a_blocked_descriptor_refuses_the_call_and_the_others_are_only_read() {
    let service = Service::new("blocked");
    let reply = service.ask(&["blocked", "b"]).await;
    assert!(reply.over);
    assert!(reply.statuses[0].over);
    assert_eq!(
        reply.statuses[0].limit.map(|l| l.requests_per_unit),
        Some(0)
    );
    assert_eq!(reply.statuses[1].remaining, 5, "b is read, not counted");
    assert_eq!(service.remaining(&["b"]).await, [4]);
    let blocked = RLS_LIMIT_DECISIONS.with_label_values(&["blocked", "blocked", "limited"]);
    assert_eq!(
        blocked.get(),
        1,
        "the blocked rule counts as its limit's denial"
    );
}

#[tokio::test]
async fn an_unlimited_descriptor_is_never_counted_nor_over() {
    let service = Service::new("unlimited");
    for _ in 0..3 {
        let reply = service.ask(&["free"]).await;
        assert!(!reply.over);
        assert_eq!(reply.statuses[0].remaining, u64::from(u32::MAX));
        assert_eq!(reply.statuses[0].limit, None);
    }
}

#[tokio::test]
async fn a_limit_another_matched_limit_replaces_does_not_apply() {
    let service = Service::new("replaces");
    for _ in 0..3 {
        let reply = service.ask(&["wide", "narrow"]).await;
        assert!(!reply.over, "wide (2 a minute) is replaced by narrow");
        assert_eq!(reply.statuses[0].limit, None, "wide was not decided");
    }
    assert_eq!(service.remaining(&["wide"]).await, [1], "nor counted");
    let counted = |limit: &str, outcome: &str| {
        RLS_LIMIT_DECISIONS
            .with_label_values(&["replaces", limit, outcome])
            .get()
    };
    assert_eq!(
        (counted("narrow", "allowed"), counted("wide", "allowed")),
        (3, 1)
    );
}
