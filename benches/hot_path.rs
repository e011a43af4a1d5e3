//! Micro-benchmarks of the per-request work sluice does itself (docs/performance.md): route
//! lookup, client identity, key building, decision parsing, the in-process limiter (and a new
//! key it refuses when full) and request ids; and the shared state every request writes (its
//! route's meters, its place in the upstream's retry budget, the limiter's meters, the site it
//! holds), one thread against two writing at once.
//! `cargo bench --bench hot_path`; criterion reports ns per operation.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, HeaderValue, Method};
use sluice::config::Config;
use sluice::limiter::clock::ManualClock;
use sluice::limiter::local::LocalLimiter;
use sluice::limiter::{
    asks, entries, script, Ask, Asks, Key, Limit, LimitRequest, RequestId, Scale,
};
use sluice::route::keys::{RequestFacts, Rotation};

/// 40 routes (hosts, prefixes, methods) ahead of the one the benchmark asks for, so the lookup
/// does real work; that route has three limits.
fn config() -> Config {
    let mut yaml = String::from("listen: [127.0.0.1:1]\ntrusted_proxies: [10.0.0.0/8]\nroutes:\n");
    for i in 0..40 {
        yaml.push_str(&format!(
            "  - name: r{i}\n    match: {{ host: h{i}.example.com, path_prefix: /svc{i}, methods: [GET] }}\n    upstream: {{ servers: [127.0.0.1:1] }}\n"
        ));
    }
    yaml.push_str(
        r#"  - name: api
    match: { path_prefix: /api }
    upstream: { servers: [127.0.0.1:1] }
    limits:
      - { name: per_client, key: [client_ip], rate: 100/s, burst: 50 }
      - { name: per_path, key: [client_ip, path], algorithm: fixed_window, rate: 1000000/m }
      - { name: per_tenant, key: [header:x-tenant, route], algorithm: sliding_window, rate: 1000000/m }
"#,
    );
    Config::from_yaml(Path::new("bench.yaml"), &yaml).expect("bench config")
}

fn hot_path(c: &mut Criterion) {
    let config = config();
    let method = Method::GET;
    let path = "/api/v1/items/42";
    let peer: IpAddr = "10.1.2.3".parse().unwrap();
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-forwarded-for",
        HeaderValue::from_static("203.0.113.7, 10.9.9.9"),
    );
    headers.insert("x-tenant", HeaderValue::from_static("acme"));
    let route = Arc::clone(
        config
            .routes
            .find("example.com", path, &method)
            .expect("route"),
    );

    c.bench_function("router: find (41 routes)", |b| {
        b.iter(|| {
            config
                .routes
                .find(black_box("example.com"), black_box(path), &method)
        })
    });
    c.bench_function("identity: client behind two trusted hops", |b| {
        b.iter(|| {
            config
                .trusted_proxies
                .client(Some(black_box(peer)), &headers)
        })
    });
    c.bench_function("identity + keys: three limits", |b| {
        b.iter(|| {
            let client_ip = config
                .trusted_proxies
                .client(Some(black_box(peer)), &headers);
            let facts = RequestFacts {
                client_ip,
                method: method.as_str(),
                host: "example.com",
                path: black_box(path),
                query: None,
                headers: &headers,
                route: &route.name,
                consumer: None,
                claim_names: &[],
            };
            route
                .tiers
                .default()
                .records(&facts, &Rotation::default())
                .expect("keys")
        })
    });
    let tier = route.tiers.default();
    let mut route_records = tier
        .records(
            &RequestFacts {
                client_ip: peer,
                method: method.as_str(),
                host: "example.com",
                path,
                query: None,
                headers: &headers,
                route: &route.name,
                consumer: None,
                claim_names: &[],
            },
            &Rotation::default(),
        )
        .expect("keys");
    let route_asked = tier.asked(&mut route_records).expect("the tier's records");
    let route_entries = route_asked.entries(Scale::Exact);
    let request = LimitRequest::new(&route_entries);
    let reply: Vec<i64> = vec![
        1, 49, 0, 20, 0, 1, 1, 999, 0, 60_000, 0, 1, 1, 9_999, 0, 60_000, 0, 0,
    ];
    c.bench_function("decision parsing: three limits", |b| {
        b.iter(|| {
            let statuses = script::parse_statuses(black_box(&reply), 3).expect("reply");
            request.decision(statuses)
        })
    });

    let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1_000_000);
    let mut now = 0i64;
    for (label, n) in [("one limit", 1), ("three limits", 3)] {
        let asks: Asks = (0..n)
            .map(|i| Ask {
                key: Key::from_slice(format!("bench:{label}:{i}").as_bytes()),
                cost: 1,
            })
            .collect();
        let limits: Vec<Limit> = route.tiers.written().take(n).cloned().collect();
        let entries = entries(&limits, &asks);
        let request = LimitRequest {
            id: RequestId(1),
            ..LimitRequest::new(&entries)
        };
        c.bench_function(&format!("in-process limiter: {label}, known keys"), |b| {
            b.iter(|| {
                // 20 ms apart: every call is allowed and writes.
                now += 20_000;
                limiter.check_at(&request, now).expect("decision")
            })
        });
    }
}

/// The limits of the route `/api` of [`config`], as written.
fn api_limits() -> Vec<Limit> {
    let config = config();
    let route = config.routes.find("example.com", "/api", &Method::GET);
    route.expect("route").tiers.written().cloned().collect()
}

/// A new key refused by an in-process limiter whose every shard is full of live state (a flood
/// of distinct clients at `max_keys`): what each refusal costs.
fn local_limiter_full(c: &mut Criterion) {
    // The fixed window (a minute): nothing expires while the clock stands still.
    let limits = &api_limits()[1..2];
    let limiter = LocalLimiter::new(Arc::new(ManualClock::new(0)), 1_000_000);
    let check = |key: u64| {
        let asks = asks(&[&key.to_le_bytes()], &[1]);
        let entries = entries(limits, &asks);
        limiter.check_at(&LimitRequest::new(&entries), 0).is_ok()
    };
    // Enough distinct keys that every shard fills (they are hashed to shards unevenly).
    let mut next = 0u64;
    while next < 1_500_000 {
        check(next);
        next += 1;
    }
    c.bench_function(
        "in-process limiter: a new key refused, every shard full",
        |b| {
            b.iter(|| {
                next += 1;
                assert!(!check(black_box(next)));
            })
        },
    );
}

/// The deny cache asked about a request's three keys when none is denied now: before, the map
/// was asked (a shard's lock per key); now, first the end of the key's group. "a denial live"
/// keeps each key denied under another limit (a denial that does not answer this request), so
/// the map is asked as it always was.
fn deny_cache_lookup(c: &mut Criterion) {
    use sluice::limiter::guard::DenyCache;
    use sluice::limiter::{Decision, LimitStatus};
    let limits = &api_limits()[..3];
    let keys: [&[u8]; 3] = [b"client-a", b"client-b", b"client-c"];
    let three = asks(&keys, &[1, 1, 1]);
    let looked_up = entries(limits, &three);
    let now = std::time::Instant::now();
    let (none, held) = (DenyCache::new(1000), DenyCache::new(1000));
    let denied = Decision::from_statuses(vec![LimitStatus {
        allowed: false,
        remaining: 0,
        retry_after_ms: Some(3_600_000),
        reset_after_ms: 3_600_000,
        delay_ms: 0,
        mark_us: 0,
    }]);
    for key in keys {
        let alone = asks(&[key], &[1]);
        let alone = entries(&limits[..1], &alone);
        held.remember(&LimitRequest::new(&alone), &denied, now);
    }
    assert_eq!(
        held.len(),
        3,
        "each key denied, under its first limit alone"
    );
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("a denial live (the map asked)", &|| {
            assert!(held.lookup(black_box(&looked_up), now).is_none())
        }),
        ("no live denial in their groups", &|| {
            assert!(none.lookup(black_box(&looked_up), now).is_none())
        }),
    ];
    one_thread_against_two(c, "deny cache: three keys looked up", "", &cases);
}

/// A new request id in its 32 hex digits: 128 random bits from the thread's generator, against
/// what ids were before (a per-process prefix and a shared counter: guessable).
fn request_ids(c: &mut Criterion) {
    c.bench_function("request id: 128 random bits, as hex", |b| {
        b.iter(|| RequestId::random().hex())
    });
    let prefix = u128::from(0x5c1f_0e9a_7b3d_42e1_u64) << 64;
    let counter = AtomicU64::new(0);
    c.bench_function("request id: prefix + counter (before), as hex", |b| {
        b.iter(|| {
            let n = counter.fetch_add(1, Ordering::Relaxed);
            RequestId(black_box(prefix) | u128::from(n)).hex()
        })
    });
}

/// One client's standing under 10,000 `deny` prefixes (IPv4 /24s and IPv6 /48s) and an
/// `allow` list: what an address lookup costs a request.
fn address_lists(c: &mut Criterion) {
    use sluice::caller::address_lists::{AddressLists, Ranges};
    let deny: Ranges = (0..10_000u32)
        .map(|i| {
            let net = if i % 2 == 0 {
                format!(
                    "{}.{}.{}.0/24",
                    10 + (i >> 16) % 200,
                    (i >> 8) & 0xff,
                    i & 0xff
                )
            } else {
                format!("2001:db8:{:x}::/48", i)
            };
            net.parse::<ipnet::IpNet>().expect("a prefix")
        })
        .collect();
    let gateway = AddressLists {
        allow: ["192.0.2.0/24".parse::<ipnet::IpNet>().unwrap()]
            .into_iter()
            .collect(),
        deny,
    };
    let route = AddressLists::default();
    let client: std::net::IpAddr = "203.0.113.7".parse().unwrap();
    c.bench_function("address lists: standing among 10,000 prefixes", |b| {
        b.iter(|| AddressLists::standing(&gateway, &route, std::hint::black_box(client)))
    });
}

/// Reading and verifying a presented API key among 10,000 stored hashes: the header read, one
/// SHA-256 and one lookup (docs/consumers.md#api-keys).
fn api_keys(c: &mut Criterion) {
    use sluice::caller::api_keys::{presented_key, KeyHash, KeysBuilder, NewKey};
    let mut keys = KeysBuilder::default();
    for i in 0..10_000 {
        let consumer = format!("consumer-{}", i % 1000);
        let key = NewKey {
            consumer: &consumer,
            plan: None,
            disabled: false,
        };
        let secret = format!("sk_bench_key_{i:032}");
        keys.add(KeyHash::of(secret.as_bytes()), key, i);
    }
    let keys = keys.build();
    let name = http::header::HeaderName::from_static("x-api-key");
    let mut headers = HeaderMap::new();
    headers.insert(
        name.clone(),
        HeaderValue::from_static("sk_bench_key_00000000000000000000000000004242"),
    );
    c.bench_function("api keys: verify a presented key among 10,000", |b| {
        b.iter(|| {
            let presented = presented_key(black_box(&headers), &name).ok().flatten();
            presented.and_then(|key| keys.verify(key)).is_some()
        })
    });
}

/// Verifying a bearer token of each family against a key set of one key (the signature, the
/// claims, the consumer and plan read): what `auth` with `identity.jwt` costs a request the
/// first time its token is seen; and a token seen before (`jwt/cache.rs`).
fn jwt(c: &mut Criterion) {
    use sluice::caller::jwt::testing::{self, Family, TestKey};
    use sluice::caller::jwt::{jwks, Algorithm, JwtSettings, JwtVerifier, KeySource};
    let now = testing::now();
    let families = [
        (
            "RS256 (RSA 2048)",
            TestKey::generate(Family::Rsa, Algorithm::RS256, Some("k")),
        ),
        (
            "ES256 (P-256)",
            TestKey::generate(Family::P256, Algorithm::ES256, Some("k")),
        ),
        (
            "EdDSA (Ed25519)",
            TestKey::generate(Family::Ed25519, Algorithm::EdDSA, Some("k")),
        ),
        (
            "HS256",
            TestKey::hmac(&[7u8; 32], Algorithm::HS256, Some("k")),
        ),
    ];
    for (label, key) in &families {
        let set = jwks::parse(testing::jwks(&[key]).as_bytes())
            .expect("a JWKS")
            .set;
        let settings = JwtSettings {
            algorithms: [
                Algorithm::RS256,
                Algorithm::ES256,
                Algorithm::EdDSA,
                Algorithm::HS256,
            ]
            .into(),
            source: Some(KeySource::File {
                path: "/bench/jwks.json".into(),
                keys: std::sync::Arc::new(set),
            }),
            hmac: None,
            issuers: ["https://idp.example".into()].into(),
            audiences: ["api".into()].into(),
            leeway_seconds: 60,
            consumer_claim: "sub".into(),
            plan_claim: Some("plan".into()),
        };
        let verifier = JwtVerifier::new(settings, &[], None);
        let mut claims = testing::claims("user-42", "https://idp.example", "api", now);
        claims["plan"] = "pro".into();
        let token = key.sign(&claims);
        let document = testing::jwks(&[key]);
        // In full: the keys installed again before each verification empty the cache.
        c.bench_function(&format!("jwt: verify a new bearer token, {label}"), |b| {
            b.iter_batched(
                || verifier.install(jwks::parse(document.as_bytes()).expect("a JWKS").set),
                |()| verifier.verify(black_box(&token), now).is_ok(),
                criterion::BatchSize::PerIteration,
            )
        });
        assert!(
            verifier.verify(&token, now).is_ok(),
            "{label}: the token verifies"
        );
        if *label == "RS256 (RSA 2048)" {
            c.bench_function("jwt: a token verified before (held), RS256", |b| {
                b.iter(|| verifier.verify(black_box(&token), now).is_ok())
            });
        }
    }
}

/// One request's writes to its route's meters: its decision, its status class, its duration and
/// upstream time, in flight and out.
trait RequestMeters: Sync {
    fn request(&self);
}

/// Through prometheus's own handles, as sluice did before the meters were sharded.
struct Shared {
    decision: prometheus::IntCounter,
    class: prometheus::IntCounter,
    duration: prometheus::Histogram,
    upstream: prometheus::Histogram,
    in_flight: prometheus::IntGauge,
}

impl RequestMeters for Shared {
    fn request(&self) {
        self.in_flight.inc();
        self.decision.inc();
        self.upstream.observe(black_box(0.0007));
        self.class.inc();
        self.duration.observe(black_box(0.0009));
        self.in_flight.dec();
    }
}

impl RequestMeters for sluice::observe::sharded::RouteRequests {
    fn request(&self) {
        self.enter();
        self.count(0);
        self.observe_upstream(black_box(Duration::from_micros(700)));
        self.count_class(1);
        self.observe_duration(1, black_box(Duration::from_micros(900)));
        self.leave();
    }
}

/// ns per request with `threads` threads each making `request` at once (writing one route's
/// meters, or one upstream's budget): each thread does the whole `iters`, so the figure is the
/// time one request's writes take while the other threads write too.
fn contended(threads: usize, iters: u64, request: &(dyn Fn() + Sync)) -> Duration {
    let start = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| (0..iters).for_each(|_| request()));
        }
    });
    start.elapsed()
}

fn request_meters(c: &mut Criterion) {
    let buckets = prometheus::DEFAULT_BUCKETS.to_vec();
    let histogram = |name: &str| {
        let opts = prometheus::HistogramOpts::new(name, "bench").buckets(buckets.clone());
        prometheus::Histogram::with_opts(opts).expect("a histogram")
    };
    let shared = Shared {
        decision: prometheus::IntCounter::new("d", "bench").expect("a counter"),
        class: prometheus::IntCounter::new("c", "bench").expect("a counter"),
        duration: histogram("h"),
        upstream: histogram("u"),
        in_flight: prometheus::IntGauge::new("g", "bench").expect("a gauge"),
    };
    let families = sluice::observe::sharded::RequestFamilies::new();
    let sharded = families.route("bench", &["allowed"]);
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("prometheus handles", &|| shared.request()),
        ("sharded per thread", &|| sharded.request()),
    ];
    one_thread_against_two(c, "request meters", " on one route", &cases);
}

/// Benches each of `cases` (its label, one request's writes) made by one thread, then by two
/// at once: `{what}: {label}, {threads} thread(s){on}`.
fn one_thread_against_two(
    c: &mut Criterion,
    what: &str,
    on: &str,
    cases: &[(&str, &(dyn Fn() + Sync))],
) {
    for (label, request) in cases {
        for threads in [1, 2] {
            c.bench_function(&format!("{what}: {label}, {threads} thread(s){on}"), |b| {
                b.iter_custom(|iters| contended(threads, iters, *request))
            });
        }
    }
}

/// A request's place in its upstream's retry budget, taken and given back.
trait BudgetPlace: Sync {
    fn request(&self);
}

/// As sluice did before the count was kept per thread: one shared count, and an `Arc` of the
/// budget in each place.
struct SharedBudget {
    requests: std::sync::atomic::AtomicU32,
}

impl BudgetPlace for Arc<SharedBudget> {
    fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let place = black_box(Arc::clone(self));
        place.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

impl BudgetPlace for sluice::upstream::budget::RetryBudget {
    fn request(&self) {
        let place = black_box(self.request());
        self.leave(place);
    }
}

fn retry_budget(c: &mut Criterion) {
    let shared = Arc::new(SharedBudget {
        requests: Default::default(),
    });
    let per_thread = sluice::upstream::budget::RetryBudget::default();
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("one shared count and an Arc", &|| shared.request()),
        ("counted per thread", &|| BudgetPlace::request(&per_thread)),
    ];
    one_thread_against_two(c, "retry budget", " on one upstream", &cases);
}

/// What every Redis decision writes whatever its route: its duration and its call's batch
/// size, through prometheus's histograms (before) and kept per thread (now).
fn decision_meters(c: &mut Criterion) {
    use sluice::limiter::meters::Histogram;
    let prometheus = |name: &str| {
        let opts = prometheus::HistogramOpts::new(name, "bench");
        prometheus::Histogram::with_opts(opts).expect("a histogram")
    };
    let (duration, sizes) = (prometheus("d"), prometheus("s"));
    let shared = || {
        duration.observe(black_box(0.0004));
        sizes.observe(black_box(1.0));
    };
    let (duration, sizes) = (
        Histogram::new(prometheus::DEFAULT_BUCKETS),
        Histogram::new(prometheus::DEFAULT_BUCKETS),
    );
    let per_thread = || {
        duration.observe(black_box(0.0004));
        sizes.observe(black_box(1.0));
    };
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("prometheus histograms", &shared),
        ("kept per thread", &per_thread),
    ];
    one_thread_against_two(c, "decision meters", "", &cases);
}

/// A request taking the site in force and letting it go: an `Arc` of the site (before), its
/// thread's handle (now).
fn site_taken(c: &mut Criterion) {
    use sluice::limiter::per_thread::ThreadHandles;
    let site = Arc::new([0u64; 8]);
    let handles = ThreadHandles::new(Arc::clone(&site));
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("an Arc of the site", &|| drop(black_box(Arc::clone(&site)))),
        ("its thread's handle", &|| drop(black_box(handles.handle()))),
    ];
    one_thread_against_two(c, "site taken", "", &cases);
}

/// A response taking a header value built from the configuration (the tier's
/// `RateLimit-Policy`) and letting it go: a clone of the one value (before), of its thread's copy
/// (now).
fn config_header_value(c: &mut Criterion) {
    use sluice::limiter::per_thread::ThreadCopies;
    let value = HeaderValue::from_bytes(b"\"per_client\";q=100;w=60").expect("a header value");
    // As a route holds it: cloned once already, so its bytes are shared.
    let shared = (value.clone(), value);
    let copies = ThreadCopies::new(shared.0.clone());
    let cases: [(&str, &(dyn Fn() + Sync)); 2] = [
        ("the value cloned", &|| drop(black_box(shared.0.clone()))),
        ("its thread's copy cloned", &|| {
            drop(black_box(copies.get()))
        }),
    ];
    one_thread_against_two(c, "config header value", "", &cases);
}

criterion_group!(
    benches,
    hot_path,
    local_limiter_full,
    request_ids,
    address_lists,
    api_keys,
    jwt,
    request_meters,
    retry_budget,
    decision_meters,
    site_taken,
    deny_cache_lookup,
    config_header_value
);
criterion_main!(benches);
