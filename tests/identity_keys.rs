//! Who the client is and what the key is, through a real gateway: spoofing, trusted chains,
//! IPv6 grouping, path spellings, hostile paths, forwarding headers, oversized requests.

mod support;

use redis::Commands;
use support::config::{route, Config};
use support::limits::{gcra, Limit};
use support::{http_get, Gateway, RedisServer, Upstream};

/// A gateway trusting `trusted` proxies (none when empty), whose one route has `limits`.
fn gateway(trusted: &str, limits: Vec<Limit>) -> (RedisServer, Upstream, Gateway) {
    let redis = RedisServer::start();
    let upstream = Upstream::start();
    let mut config = Config::new().redis("REDIS_URL");
    if !trusted.is_empty() {
        config = config.set("trusted_proxies", trusted);
    }
    let route = limits.into_iter().fold(route("api"), |r, l| r.limit(l));
    let gateway = Gateway::start(&config.route(route).yaml(), &upstream, Some(&redis));
    (redis, upstream, gateway)
}

/// One request per client (or per client and path) per hour.
fn hourly(name: &str, key: &[&str]) -> Vec<Limit> {
    vec![gcra(name, "1/h").key(key)]
}

/// 100 per second per client.
fn generous() -> Vec<Limit> {
    vec![gcra("per_client", "100/s").burst(99)]
}

fn keys(redis: &RedisServer) -> Vec<String> {
    redis.connection().keys("t:*").unwrap()
}

fn get(gateway: &Gateway, path: &str, headers: &[(&str, &str)]) -> support::Response {
    http_get(gateway.proxy, path, None, headers)
}

#[test]
fn spoofed_forwarding_headers_from_an_untrusted_peer_share_one_bucket() {
    let (redis, _upstream, gateway) = gateway(
        "",
        vec![gcra("per_client", "10/h").key(&["client_ip"]).burst(9)],
    );
    let admitted = (0..1000)
        .filter(|i| {
            let spoof = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
            let forwarded = format!("for={spoof}");
            get(
                &gateway,
                "/x",
                &[
                    ("x-forwarded-for", &spoof),
                    ("x-real-ip", &spoof),
                    ("forwarded", &forwarded),
                ],
            )
            .status
                == 200
        })
        .count();
    assert_eq!(admitted, 10);
    assert_eq!(keys(&redis).len(), 1);
}

#[test]
fn a_trusted_chain_keys_on_the_first_untrusted_hop_from_the_right() {
    let (redis, _upstream, gateway) = gateway(
        "[127.0.0.1, 10.0.0.0/8]",
        hourly("per_client", &["client_ip"]),
    );
    let first = get(
        &gateway,
        "/x",
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.1")],
    );
    assert_eq!(first.status, 200);
    assert!(
        first
            .body
            .contains("x-forwarded-for: 6.6.6.6, 203.0.113.7, 10.0.0.1, 127.0.0.1"),
        "{}",
        first.body
    );
    assert_eq!(
        get(&gateway, "/x", &[("x-forwarded-for", "203.0.113.7")]).status,
        429,
        "same client, same bucket"
    );
    assert_eq!(
        get(
            &gateway,
            "/x",
            &[("x-forwarded-for", "6.6.6.6, 198.51.100.9, 10.0.0.1")]
        )
        .status,
        200
    );
    assert_eq!(
        get(
            &gateway,
            "/x",
            &[("forwarded", "for=198.51.100.9;proto=https")]
        )
        .status,
        429,
        "RFC 7239 too"
    );
    assert_eq!(keys(&redis).len(), 2);
}

#[test]
fn addresses_of_one_ipv6_64_share_a_bucket() {
    let (redis, _upstream, gateway) = gateway("[127.0.0.1]", hourly("per_client", &["client_ip"]));
    let admitted = (1..=500)
        .filter(|i| {
            get(
                &gateway,
                "/x",
                &[("x-forwarded-for", &format!("2001:db8:1:2::{i:x}"))],
            )
            .status
                == 200
        })
        .count();
    assert_eq!(admitted, 1);
    assert_eq!(
        get(&gateway, "/x", &[("x-forwarded-for", "2001:db8:1:3::1")]).status,
        200,
        "another /64"
    );
    assert_eq!(keys(&redis).len(), 2);
}

#[test]
fn every_spelling_of_a_path_shares_one_key_and_the_upstream_sees_the_normalized_path() {
    let (redis, _upstream, gateway) = gateway("", hourly("per_path", &["client_ip", "path"]));
    let first = get(&gateway, "/api/x/../users?page=2", &[]);
    assert_eq!(first.status, 200);
    assert!(
        first.body.contains("GET /api/users?page=2 "),
        "{}",
        first.body
    );
    for spelling in [
        "/api/users",
        "//api/users",
        "/api/./users",
        "/api/x/../users",
        "/api/%75sers",
    ] {
        assert_eq!(get(&gateway, spelling, &[]).status, 429, "{spelling}");
    }
    assert_eq!(keys(&redis).len(), 1);
    assert_eq!(
        get(&gateway, "/api/a%2Fb", &[]).status,
        400,
        "encoded slash"
    );
    assert_eq!(
        get(&gateway, "/api/a%zz", &[]).status,
        400,
        "malformed escape"
    );
}

#[test]
fn a_hostile_8kb_path_makes_one_fixed_length_key() {
    let (redis, _upstream, gateway) = gateway("", hourly("per_path", &["client_ip", "path"]));
    let hostile = format!("/{}%0D%0A%7B%7D{{}}", "a".repeat(8000));
    assert_eq!(get(&gateway, &hostile, &[]).status, 200);
    let keys = keys(&redis);
    assert_eq!(keys.len(), 1);
    let key = &keys[0];
    assert_eq!(
        key.len(),
        "t:{api.}:per_path.:".len() + 16 + 8 + 32,
        "{key}"
    );
    assert!(key.bytes().all(|b| b.is_ascii_graphic()), "{key}");
}

#[test]
fn oversized_requests_are_refused_before_redis() {
    let (redis, upstream, gateway) = gateway("", generous());
    let long = format!("/{}", "a".repeat(9000));
    assert_eq!(get(&gateway, &long, &[]).status, 414);
    let big = "b".repeat(4000);
    let headers: Vec<(String, &str)> = (0..10)
        .map(|i| (format!("x-big-{i}"), big.as_str()))
        .collect();
    let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    assert_eq!(get(&gateway, "/x", &headers).status, 431);
    assert_eq!(redis.decision_calls(), 0);
    assert_eq!(upstream.served(), 0);
}

#[test]
fn untrusted_forwarding_claims_never_reach_the_upstream() {
    let (_redis, upstream, gateway) = gateway("", generous());
    let response = get(&gateway, "/x", &[("x-forwarded-for", "6.6.6.6")]);
    assert_eq!(response.status, 200);
    assert!(
        response.body.contains("x-forwarded-for: 127.0.0.1)"),
        "{}",
        response.body
    );
    // A Connection header nominating a forwarding header (to make a hop strip it) is refused.
    let response = get(&gateway, "/x", &[("connection", "x-forwarded-for")]);
    assert_eq!(response.status, 400);
    assert_eq!(upstream.served(), 1);
}

#[test]
fn a_limit_whose_part_is_missing_can_be_skipped_or_deny() {
    let limits = vec![
        gcra("per_key", "1/h")
            .key(&["header:x-api-key"])
            .set("on_missing", "skip"),
        gcra("per_tenant", "100/h")
            .key(&["query:tenant"])
            .set("on_missing", "deny")
            .burst(99),
    ];
    let (_redis, _upstream, gateway) = gateway("", limits);
    // Without the key header, per_key is skipped: it neither counts nor denies.
    for _ in 0..3 {
        assert_eq!(get(&gateway, "/x?tenant=a", &[]).status, 200);
    }
    assert_eq!(
        get(&gateway, "/x?tenant=a", &[("x-api-key", "k1")]).status,
        200
    );
    assert_eq!(
        get(&gateway, "/x?tenant=a", &[("x-api-key", "k1")]).status,
        429
    );
    assert_eq!(
        get(&gateway, "/x", &[]).status,
        400,
        "the tenant is required"
    );
}
