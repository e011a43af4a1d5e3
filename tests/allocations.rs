//! The per-request work sluice does itself — route lookup, path normalization, client identity,
//! key building, decision parsing, and an in-process decision on known keys — makes no heap
//! allocation, and neither does the policy's asynchronous decision through the limiter's layers.
//! Nor does the rate limit service's decision of a call, descriptors included. A counting global
//! allocator counts this thread's allocations around each step.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{HeaderMap, HeaderValue, Method};
use sluice::config::Config;
use sluice::limiter::clock::ManualClock;
use sluice::limiter::guard::{GuardMeters, Guarded};
use sluice::limiter::leased::{LeaseMeters, Leased};
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::{
    entries, script, Engine, LimitRequest, Limiter, Policy, PolicyMeters, RequestId, Scale,
};
use sluice::route::keys::{RequestFacts, Rotation};
use sluice::route::path::normalize;
use sluice::route::table::Route;
use support::config::route;
use support::limits::{fixed_window, gcra, sliding_window};

mod support;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-local may be gone while a thread is torn down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations this thread made while running `work` `times` times.
fn allocations(times: usize, mut work: impl FnMut()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..times {
        work();
    }
    ALLOCATIONS.with(Cell::get) - before
}

/// Three limits of three algorithms on one route, behind a trusted proxy.
fn config() -> String {
    let body = support::config::Config::new()
        .set("trusted_proxies", "[127.0.0.1/32]")
        .route(
            route("api")
                .matching("{ path_prefix: /api, methods: [GET, POST] }")
                .servers(&["127.0.0.1:1"])
                .limit(gcra("per_client", "100/s").key(&["client_ip"]).burst(50))
                .limit(fixed_window("per_path", "5000/m").key(&["client_ip", "path"]))
                .limit(sliding_window("per_tenant", "10000/m").key(&["header:x-tenant", "route"])),
        )
        .route(
            route("one").prefix("/one").servers(&["127.0.0.1:1"]).limit(
                gcra("per_client_one", "100/s")
                    .key(&["client_ip"])
                    .burst(50),
            ),
        )
        .route(route("other").prefix("/other").servers(&["127.0.0.1:1"]));
    format!("listen: [127.0.0.1:1]\n{body}")
}

/// The request headers every test sends: a forwarded client address and a tenant.
fn headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
    headers.insert("x-tenant", HeaderValue::from_static("acme"));
    headers
}

#[test]
fn per_request_work_allocates_nothing() {
    let config = Config::from_yaml(Path::new("inline.yaml"), &config()).expect("config");
    let headers = headers();
    let peer: IpAddr = "127.0.0.1".parse().unwrap();
    let method = Method::GET;
    let path = "/api/v1/items/42";

    let route = Arc::clone(
        config
            .routes
            .find("example.com", path, &method)
            .expect("route"),
    );
    let client_ip = config.trusted_proxies.client(Some(peer), &headers);
    let facts = RequestFacts {
        client_ip,
        method: method.as_str(),
        host: "example.com",
        path,
        query: None,
        headers: &headers,
        route: &route.name,
        consumer: None,
        claim_names: &[],
    };
    let steps = [
        (
            "route lookup",
            allocations(1000, || {
                assert!(config.routes.find("example.com", path, &method).is_some());
            }),
        ),
        (
            "path normalization",
            allocations(1000, || {
                assert!(normalize(path, config.paths).is_ok());
            }),
        ),
        (
            "client identity",
            allocations(1000, || {
                assert_eq!(
                    config.trusted_proxies.client(Some(peer), &headers),
                    client_ip
                );
            }),
        ),
        (
            "keys and costs",
            allocations(1000, || {
                assert_eq!(
                    route
                        .tiers
                        .default()
                        .records(&facts, &Rotation::default())
                        .expect("keys")
                        .len(),
                    3
                );
            }),
        ),
    ];
    assert_none(steps.into_iter().chain(deciding(&route, &facts)));
}

/// Allocations of parsing a decision's reply and of deciding in-process on known keys.
fn deciding(route: &Route, facts: &RequestFacts<'_>) -> [(&'static str, u64); 2] {
    let reply: Vec<i64> = vec![
        1, 49, 0, 20, 0, 1, 1, 4999, 0, 60_000, 0, 1, 1, 9_999, 0, 60_000, 0, 0,
    ];
    let limiter = LocalLimiter::new(Arc::new(ManualClock::new(1_000_000)), 1000);
    let tier = route.tiers.default();
    let mut records = tier.records(facts, &Rotation::default()).expect("keys");
    let asked = tier.asked(&mut records).expect("the tier's records");
    let entries = asked.entries(Scale::Exact);
    let request = LimitRequest {
        id: RequestId(7),
        ..LimitRequest::new(&entries)
    };
    assert!(
        limiter.check_at(&request, 1_000_000).unwrap().allowed(),
        "warm the keys"
    );
    let now = Cell::new(1_000_000i64);
    [
        (
            "decision parsing",
            allocations(1000, || {
                let statuses = script::parse_statuses(&reply, 3).expect("reply");
                assert!(request.decision(statuses).allowed());
            }),
        ),
        (
            "in-process decision",
            allocations(1000, || {
                // 20 ms apart: within every limit.
                now.set(now.get() + 20_000);
                assert!(limiter.check_at(&request, now.get()).unwrap().allowed());
            }),
        ),
    ]
}

/// Prints each step's count, then asserts that none allocated.
fn assert_none(steps: impl Iterator<Item = (&'static str, u64)>) {
    let steps: Vec<_> = steps.collect();
    for (step, count) in &steps {
        println!("{step}: {count} allocations in 1000 requests");
    }
    for (step, count) in steps {
        assert_eq!(count, 0, "{step} allocated {count} times in 1000 requests");
    }
}

/// Polls `future` once: the in-process limiter never waits, so it must be ready.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("an in-process decision waited"),
    }
}

/// A policy deciding in this process, on a manual clock.
fn in_process_policy() -> (Arc<ManualClock>, Policy) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let limiter = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    let policy = Policy::new(
        Engine::local(limiter),
        None,
        clock.clone(),
        PolicyMeters::unregistered(),
    );
    (clock, policy)
}

#[test]
fn the_policys_decision_allocates_nothing_once_its_keys_are_known() {
    let config = Config::from_yaml(Path::new("inline.yaml"), &config()).expect("config");
    let headers = headers();
    let (clock, policy) = in_process_policy();
    for (path, limits) in [("/one/x", 1), ("/api/v1/items/42", 3)] {
        let route = config
            .routes
            .find("example.com", path, &Method::GET)
            .expect("route");
        assert_eq!(route.tiers.default().limits.len(), limits);
        let facts = RequestFacts {
            client_ip: config
                .trusted_proxies
                .client(Some([127, 0, 0, 1].into()), &headers),
            method: "GET",
            host: "example.com",
            path,
            query: None,
            headers: &headers,
            route: &route.name,
            consumer: None,
            claim_names: &[],
        };
        let tier = route.tiers.default();
        let records = tier.records(&facts, &Rotation::default()).expect("keys");
        let decide = || {
            let mut records = records.clone();
            let mut asked = tier.asked(&mut records).expect("the tier's records");
            ready(policy.decide(&mut asked))
        };
        // A key's first sighting stores its state: warm up before counting.
        assert!(decide().admitted());
        let count = allocations(1000, || {
            // 20 ms apart: within every limit.
            clock.advance(20_000);
            let verdict = decide();
            assert!(verdict.admitted());
        });
        println!("policy decision, {limits} limits: {count} allocations in 1000 requests");
        assert_eq!(
            count, 0,
            "{limits} limits: {count} allocations in 1000 decisions"
        );
    }
}

#[test]
fn the_redis_engines_decorators_allocate_nothing_around_their_backend() {
    // The Redis engine's layers, `Leased(Guarded(backend))`, around the in-process backend.
    let clock = Arc::new(ManualClock::new(1_000_000));
    let backend = Arc::new(LocalLimiter::new(clock.clone(), 1000));
    let guarded = Guarded::new(
        Arc::clone(&backend),
        Some("redis at test"),
        clock.clone(),
        GuardMeters::unregistered(),
    );
    let layered = Leased::new(guarded, backend, clock.clone(), LeaseMeters::unregistered());
    let limits = [
        gcra("a", "100/s").burst(50).compile(),
        fixed_window("b", "5000/m").compile(),
        sliding_window("c", "10000/m").compile(),
    ];
    let asks = sluice::limiter::asks(&[b"ka", b"kb", b"kc"], &[1, 1, 1]);
    let entries = entries(&limits, &asks);
    let request = LimitRequest::new(&entries);
    // Warm: the keys' state, the leases, and this thread's slot of each meter a decision
    // writes (made at the thread's first write, once).
    for _ in 0..10 {
        clock.advance(20_000);
        assert!(ready(layered.check(&request)).unwrap().allowed(), "warm");
    }
    let count = allocations(1000, || {
        clock.advance(20_000);
        assert!(ready(layered.check(&request)).unwrap().allowed());
    });
    println!("decorated decision, 3 limits: {count} allocations in 1000 requests");
    assert_eq!(count, 0, "{count} allocations in 1000 decorated decisions");
}

/// A whole request's life through the exchange — its head read, route, client, keys, the
/// policy's async decision on the in-process backend, and its end (counted, slots released) —
/// allocates nothing once its keys exist.
#[test]
fn a_request_through_the_exchange_allocates_nothing() {
    use sluice::exchange::{Admission, Exchange, Head};
    use sluice::runtime::snapshot::Snapshot;

    let config = Config::from_yaml(Path::new("inline.yaml"), &config()).expect("config");
    let snapshot = Arc::new(
        Snapshot::build(
            config,
            &sluice::exchange::Lasting::new(Arc::new(sluice::limiter::clock::SystemClock)),
            Default::default(),
            &mut Default::default(),
        )
        .expect("snapshot"),
    );
    let (clock, policy) = in_process_policy();
    let (head, ()) = http::Request::get("/api/v1/items/42")
        .header("host", "example.com")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-tenant", "acme")
        .body(())
        .expect("a request")
        .into_parts();
    let request = Head {
        parts: &head,
        raw_target: b"/api/v1/items/42",
        peer: Some([127, 0, 0, 1].into()),
        client_certificate: None,
        cut: Default::default(),
    };
    let serve = || {
        // 20 ms apart: within every limit.
        clock.advance(20_000);
        let mut exchange = Exchange::new(snapshot.site_for_request(), std::time::Instant::now());
        let admission = ready(exchange.admit(&policy, &request));
        assert!(
            matches!(admission, Admission::Admitted { .. }),
            "{admission:?}"
        );
        assert_eq!(
            exchange
                .limits_said()
                .map(|said| said.iter().filter(|(_, r)| r.status.is_some()).count()),
            Some(3)
        );
        ready(exchange.end(&policy, Some(200)));
    };
    serve(); // the keys' first sighting stores their state
    let count = allocations(1000, serve);
    println!("a request through the exchange: {count} allocations in 1000 requests");
    assert_eq!(count, 0, "{count} allocations in 1000 requests");
}

#[test]
fn verifying_an_api_key_allocates_nothing() {
    use sluice::caller::api_keys::presented_key;
    // The hashes of `abc` and `hello` (sha256sum).
    let keys = sluice::config::api_key_file::from_yaml(
        "keys:\n\
         - { hash: \"sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\", consumer: acme, plan: pro }\n\
         - { hash: \"sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824\", consumer: bolt }\n",
    )
    .expect("the key file reads");
    let name = http::header::HeaderName::from_static("x-api-key");
    let mut known = HeaderMap::new();
    known.insert(name.clone(), HeaderValue::from_static("abc"));
    let mut unknown = HeaderMap::new();
    unknown.insert(
        name.clone(),
        HeaderValue::from_static("sk_not_a_stored_key_at_all"),
    );
    let verify = |headers: &HeaderMap| {
        let presented = presented_key(headers, &name).ok().flatten()?;
        keys.verify(presented).map(|key| key.consumer.len())
    };
    assert_eq!(verify(&known), Some(4));
    assert_eq!(verify(&unknown), None);
    assert_none(
        [
            (
                "verifying a stored key",
                allocations(1000, || assert!(verify(&known).is_some())),
            ),
            (
                "verifying an unknown key",
                allocations(1000, || assert!(verify(&unknown).is_none())),
            ),
        ]
        .into_iter(),
    );
}

/// A domain of the rate limit service: a limit, a nested limit and an unlimited descriptor.
const RLS_DOMAIN: &str = "domain: d
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 1000000 }
  - key: b
    descriptors:
      - key: c
        rate_limit: { name: nested, unit: minute, requests_per_unit: 1000000 }
  - key: u
    rate_limit: { unlimited: true }
";

#[test]
fn the_rate_limit_services_decision_allocates_nothing_per_descriptor() {
    use sluice::exchange::rls::{decide, Descriptor, PerDescriptor, ServiceWide};
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join("d.yaml"), RLS_DOMAIN).expect("write the domain");
    let yaml = format!(
        "listen: [127.0.0.1:1]\nrls: {{ listen: 127.0.0.1:1, config_dir: {} }}\n\
         routes: [{{ name: r, match: {{ path_prefix: / }}, upstream: {{ servers: [127.0.0.1:1] }} }}]\n",
        dir.path().display()
    );
    let config = Config::from_yaml(Path::new("rls.yaml"), &yaml).expect("config");
    let rls = config.rls.as_ref().expect("an rls section");
    let domain = rls.domains.get("d").expect("the domain");
    let scope = ServiceWide {
        key_prefix: &rls.key_prefix,
        secret: rls.secret,
        failure_mode: rls.failure_mode,
    };
    let (clock, policy) = in_process_policy();
    // What the edge hands over per call: three descriptors, built from the protobuf's strings.
    let call = || -> PerDescriptor<Descriptor<'static>> {
        [
            &[("a", "1")][..],
            &[("b", "x"), ("c", "y")][..],
            &[("u", "z")][..],
        ]
        .into_iter()
        .map(|entries| Descriptor {
            entries: entries.iter().copied().collect(),
            hits: None,
        })
        .collect()
    };
    let decided = |policy: &Policy| {
        let descriptors = call();
        let reply = ready(decide(domain, scope, (policy, None), &descriptors, 1));
        assert!(!reply.over);
        let decided = [0, 1, 2].map(|i| reply.statuses[i].limit.is_some());
        assert_eq!(
            decided,
            [true, true, false],
            "two limits decided, one unlimited"
        );
    };
    decided(&policy); // the keys' first sighting stores their state
    let count = allocations(1000, || {
        clock.advance(20_000);
        decided(&policy);
    });
    println!("a rate limit service call of 3 descriptors: {count} allocations in 1000 calls");
    assert_eq!(count, 0, "{count} allocations in 1000 calls");
}
