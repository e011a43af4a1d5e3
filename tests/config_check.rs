//! `sluice -t`: one fixture per kind of mistake, with the exact messages; the example passes.

mod support;

use std::process::Command;

/// Runs `sluice -t -c <fixture>` from the repository root; returns (exit code, stdout, stderr).
fn check(path: &str) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(support::repo_path(""))
        .args(["-t", "-c", path])
        .output()
        .expect("run sluice -t");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn assert_problems(fixture: &str, expected: &[&str]) {
    let path = format!("tests/fixtures/config/{fixture}");
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, 1, "{fixture} must fail; stdout: {stdout}");
    let mut lines: Vec<&str> = stderr.lines().collect();
    let summary = lines.pop().unwrap_or_default();
    assert_eq!(
        summary,
        format!("sluice: {} problem(s) in {path}", expected.len())
    );
    let expected: Vec<String> = expected.iter().map(|e| format!("{path}: {e}")).collect();
    assert_eq!(lines, expected);
}

#[test]
fn the_example_configuration_passes() {
    let (code, stdout, stderr) = check("conf/sluice.yaml");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "conf/sluice.yaml: ok: 2 routes, 3 limits, redis at redis://127.0.0.1:6379/0\n"
    );
}

#[test]
fn unknown_keys_are_all_named_with_their_path() {
    assert_problems(
        "unknown_key.yaml",
        &[
            "routes[0].limits[0].brust: unknown key: did you mean `burst`?",
            "routes[0].timeout: unknown key",
        ],
    );
}

#[test]
fn an_unknown_key_is_told_with_the_known_key_it_misspells_and_a_period_without_unit_as_such() {
    assert_problems(
        "misspelled.yaml",
        &[
            "acess_log: unknown key: did you mean `access_log`?",
            "routes[0].limits[0].algoritm: unknown key: did you mean `algorithm`?",
            "routes[0].adaptive_concurrency.probe_interval: invalid duration \"30\": no unit after 30: write 30s (or ms, m, h, d)",
        ],
    );
}

#[test]
fn every_mistake_of_an_api_key_file_is_told_in_one_run() {
    // A value of the wrong type, a consumer id that is not one, a hash listed twice and a
    // plan not declared: none hides another.
    let keys = support::repo_path("tests/fixtures/config/key_file_mistakes-keys.yaml");
    let at = format!("identity.api_keys.file: {}", keys.display());
    let expected = [
        format!("{at}: keys[0].disabled: expected true or false, got \"maybe\""),
        format!("{at}: keys[1].consumer: invalid consumer id \"bolt inc\": use visible ASCII characters, without spaces"),
        format!("{at}: keys[2].hash: the same hash as keys[0]: list each key once"),
        format!("{at}: keys[3].plan: unknown plan \"gold\": the plans are free, pro"),
    ];
    let expected: Vec<&str> = expected.iter().map(String::as_str).collect();
    assert_problems("key_file_mistakes.yaml", &expected);
}

#[test]
fn bad_rates_are_explained() {
    assert_problems(
        "bad_rate.yaml",
        &[
            "routes[0].limits[0].rate: invalid rate \"10/fortnight\": unknown period unit \"fortnight\": use ms, s, m, h or d",
            "routes[0].limits[1].rate: invalid rate \"0/s\": the request count must be at least 1",
        ],
    );
}

#[test]
fn bad_addresses_are_explained() {
    assert_problems(
        "bad_address.yaml",
        &[
            "listen[0]: invalid address \"localhost:8080\": expected IP:PORT, e.g. 127.0.0.1:8080",
            "admin.listen: invalid address \"127.0.0.1\": expected IP:PORT, e.g. 127.0.0.1:8080",
            "routes[0].upstream.servers[0]: invalid upstream server \"127.0.0.1:notaport\": expected HOST:PORT with a port from 1 to 65535, e.g. backend.internal:8080 or 10.0.0.5:8080",
        ],
    );
}

#[test]
fn duplicate_route_names_are_refused() {
    assert_problems(
        "duplicate_route.yaml",
        &["routes[1].name: duplicate route name \"api\""],
    );
}

#[test]
fn an_empty_upstream_is_refused() {
    assert_problems(
        "empty_upstream.yaml",
        &["routes[0].upstream.servers: at least one upstream server is required"],
    );
}

#[test]
fn a_type_error_names_its_path_in_plain_words_and_hides_nothing_else() {
    assert_problems(
        "wrong_type.yaml",
        &[
            "redis.timeout_ms: expected a whole number ≥ 0, got \"fast\"",
            "routes: at least one route is required (a gateway that only serves Envoy's rate limit service sets rls: instead)",
        ],
    );
}

#[test]
fn type_errors_of_every_section_and_route_are_told_in_plain_words() {
    assert_problems(
        "plain_words.yaml",
        &[
            "listen: expected a list, got 8080",
            "ipv6_prefix: expected a whole number from 0 to 255, got 300",
            "routes[0].upstream: expected the name of an upstream (upstreams: at the top), or { servers: [...] }, got a list",
            "routes[1].upstream.retries: expected a whole number ≥ 0, got -1",
        ],
    );
}

#[test]
fn a_type_error_a_missing_certificate_and_an_unknown_user_are_reported_in_one_run() {
    assert_problems(
        "every_kind_at_once.yaml",
        &[
            "instances: expected a whole number ≥ 0, got a list",
            "routes[0].limits[0].rate: expected a string, got a list",
            "routes[1].limits[0].rate: invalid rate \"0/s\": the request count must be at least 1",
            "server.user: no such user \"no-such-user-of-sluice\"",
            "listen[0].tls.certificates[0]: cannot read the certificate file /nonexistent/sluice/cert.pem: no such file",
        ],
    );
}

#[test]
fn an_unresolvable_name_and_a_count_too_large_say_what_would_be_right() {
    let path = "tests/fixtures/config/unresolvable.yaml";
    let (code, _, stderr) = check(path);
    assert_eq!(code, 1);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    let dns = format!(
        "{path}: routes[0].upstream.servers[0]: the name \"no-such-host.invalid\" could not be resolved ("
    );
    assert!(lines[0].starts_with(&dns), "{stderr}");
    // The resolver's own words vary by system; what follows them does not.
    assert!(
        lines[0].ends_with(
            "): sluice resolves upstream names once, when it loads the configuration (at start and at each reload); check the name and the resolver, or write IP:PORT"
        ),
        "{stderr}"
    );
    assert!(!lines[0].contains("failed to lookup"), "{stderr}");
    assert_eq!(
        lines[1],
        format!("{path}: routes[0].limits[0].rate: invalid rate \"99999999999999999999/s\": 99999999999999999999 is too large: at most one request per microsecond can be limited, so the largest count is 31622400000000 (per 366d, the longest period)")
    );
}

#[test]
fn every_mistake_of_a_file_is_reported_at_once() {
    assert_problems(
        "many_mistakes.yaml",
        &[
            "redis.url: invalid redis URL: expected redis://[user[:password]@]host[:port][/db], rediss://..., or redis+unix:///path[?db=N]",
            "failure_mode: unknown failure mode \"maybe\": use allow, deny or local",
            "routes[0].name: invalid name \"bad name{}\": use 1 to 64 of A-Z a-z 0-9 _ . -",
            "routes[0].match.path_prefix: must be a normalized absolute path starting with '/', got \"api\"",
            "routes[0].match.methods[1]: invalid HTTP method \"NOT A METHOD\"",
            "routes[0].limits[2].name: duplicate limit name \"b\" in this route",
            "routes[0].limits[0].key[1]: unknown key part \"cookie\": use client_ip, path, route, method, host, header:NAME, query:NAME, const:TEXT, consumer or claim:NAME",
            "routes[0].limits[0].algorithm: unknown algorithm \"leaky\": use gcra, token_bucket, leaky_bucket, fixed_window, calendar, sliding_window, sliding_log or concurrency",
            "routes[0].limits[1].burst: does not apply to algorithm fixed_window",
            "routes[0].limits[2].cost: cost 3 exceeds what this limit can ever admit (1): no request could ever pass",
        ],
    );
}

#[test]
fn a_missing_file_is_one_clear_error() {
    assert_problems(
        "does_not_exist.yaml",
        &["cannot read the file: No such file or directory (os error 2)"],
    );
}

#[test]
fn each_algorithm_takes_only_its_own_parameters() {
    assert_problems(
        "algorithm_parameters.yaml",
        &[
            "routes[0].limits[0].capacity: required for token_bucket",
            "routes[0].limits[1].rate: does not apply to algorithm concurrency",
            "routes[0].limits[1].max: required for concurrency (requests in flight per key)",
            "routes[0].limits[2].rate: sliding_log keeps one entry per request: at most 10000 per window (use sliding_window or gcra)",
            "routes[0].limits[3].max_delay: does not apply to algorithm fixed_window",
            "routes[0].limits[4].cost_max: required with cost_header: the largest cost a request may claim",
            "routes[0].limits[5].max_delay: invalid duration \"soon\": unknown period unit \"soon\": use ms, s, m, h or d",
            "routes[0].limits[6].cost_max: cost_max 50 exceeds what this limit can ever admit (10): no request could ever pass",
        ],
    );
}

#[test]
fn identity_and_path_settings_are_checked() {
    assert_problems(
        "identity.yaml",
        &[
            "trusted_proxies[1]: invalid address or CIDR \"10.0.0.0/33\"",
            "ipv6_prefix: must be between 1 and 128, got 0",
            "path.encoded_slash: unknown value \"decode\": use reject or keep",
            "routes[0].limits[0].on_missing: unknown value \"ignore\": use use_empty, skip or deny",
        ],
    );
}

#[test]
fn redis_topology_and_split_settings_are_checked() {
    assert_problems(
        "redis_topology.yaml",
        &[
            "redis.url: not used in sentinel mode",
            "redis.nodes: not used in sentinel mode",
            "redis.sentinels[1]: invalid redis URL: expected redis://[user[:password]@]host[:port][/db], rediss://..., or redis+unix:///path[?db=N]",
            "redis.master_name: required in sentinel mode: the name the sentinels monitor",
            "routes[0].limits[2].split: 4 shards need a limit (or burst) of at least 4 units, this one has 3",
            "routes[0].limits[3].split: does not apply to algorithm concurrency (leases are released by key)",
            "routes[0].limits[4].split: must be between 1 and 256, got 1000",
            "routes[0].limits: split limits of one route must have the same number of shards, got [4, 8]",
        ],
    );
    assert_problems(
        "leased.yaml",
        &[
            "routes[0].limits[2].mode: unknown mode \"lazy\": use auto, exact or leased",
            "routes[0].limits[3].mode: leased applies to gcra, token_bucket, leaky_bucket (without max_delay), fixed_window and calendar",
            "routes[0].limits[4].mode: leased applies to gcra, token_bucket, leaky_bucket (without max_delay), fixed_window and calendar",
            "routes[0].limits[5].lease_units: must be between 1 and the limit's capacity (10), got 11",
            "routes[0].limits[6].lease_units: applies only with mode: leased or auto",
        ],
    );
    assert_problems(
        "redis_mode.yaml",
        &["redis.mode: unknown mode \"clustered\": use standalone, cluster or sentinel"],
    );
}

#[test]
fn what_start_needs_is_checked_by_sluice_t() {
    assert_problems(
        "start_needs.yaml",
        &[
            "server.user: no such user \"no-such-user-of-sluice\"",
            "server.group: no such group \"no-such-group-of-sluice\"",
            "server.pid_file: the directory /nonexistent/sluice does not exist",
            "server.error_log: the directory /nonexistent/sluice does not exist",
        ],
    );
}

#[test]
fn jwt_settings_are_checked_with_their_paths() {
    assert_problems(
        "jwt.yaml",
        &[
            "identity.jwt.audiences: unknown key: did you mean `audience`?",
            "identity.api_keys.header: authorization carries the bearer tokens of identity.jwt: present API keys in another header",
            "identity.jwt.algorithms[1]: unsigned tokens (alg none) are never accepted",
            "identity.jwt.algorithms[2]: unknown algorithm \"HS257\": use RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA, HS256, HS384, HS512",
            "identity.jwt.hmac_secret: an HMAC secret needs HS256, HS384 or HS512 in algorithms (HMAC is off unless named)",
            "identity.jwt.jwks_url: use https (http only on a loopback address)",
            "identity.jwt.refresh_seconds: must be greater than zero",
            "identity.jwt.leeway_seconds: at most 3600",
        ],
    );
}

/// Every configuration shown in docs/consumers.md (a `yaml` block with `routes:`) passes
/// `sluice -t`, its key file replaced by one that exists.
#[test]
fn the_configurations_of_the_consumers_guide_pass() {
    let guide = std::fs::read_to_string(support::repo_path("docs/consumers.md"))
        .expect("docs/consumers.md");
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("api-keys.yaml");
    let hash = sluice::caller::api_keys::KeyHash::of(b"sk_documented_example_key_01");
    std::fs::write(
        &key_file,
        format!("keys:\n  - {{ hash: \"{hash}\", consumer: acme }}\n"),
    )
    .expect("write the key file");
    let examples: Vec<&str> = guide
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .filter(|block| block.contains("\nroutes:"))
        .collect();
    assert!(examples.len() >= 4, "the worked examples are found");
    for (i, example) in examples.iter().enumerate() {
        let text = example.replace("/etc/sluice/api-keys.yaml", &key_file.display().to_string());
        let path = dir.path().join(format!("example-{i}.yaml"));
        std::fs::write(&path, format!("listen: [127.0.0.1:8080]\n{text}")).expect("write");
        let (code, _, stderr) = check(&path.display().to_string());
        assert_eq!(
            code, 0,
            "example {i} of docs/consumers.md:\n{example}\n{stderr}"
        );
    }
}

#[test]
fn every_mistake_of_one_route_is_told_in_one_run_in_an_operators_words() {
    // Values of the wrong type (five in one route, two in the next), a limit that does not
    // compile, an address that is not one and a caller key on a route that verifies no caller:
    // none hides another, and no Rust or serde name shows.
    assert_problems(
        "route_mistakes.yaml",
        &[
            "routes[0].upstream.retries: expected a whole number ≥ 0, got -1",
            "routes[0].upstream.connect_timeout_ms: expected a whole number ≥ 0, got 1.5 (a decimal)",
            "routes[0].limiter_timeout_ms: expected a whole number ≥ 0, got \"fast\"",
            "routes[0].shadow: expected true or false, got a list",
            "routes[0].limits[2].rate: expected a string, got a list",
            "routes[0].limits[2].burst: expected a whole number ≥ 0, got -3",
            "routes[1].upstream.retries: expected a whole number ≥ 0, got 2.5 (a decimal)",
            "routes[1].upstream.connect_timeout_ms: expected a whole number ≥ 0, got a list",
            "routes[0].limits[1].algorithm: unknown algorithm \"leaky\": use gcra, token_bucket, leaky_bucket, fixed_window, calendar, sliding_window, sliding_log or concurrency",
            "routes[0].limits[0].key: consumer needs the route to verify callers: auth: required or optional",
            "routes[0].addresses.deny[0]: \"not-an-address\" is not an address or a CIDR such as 10.0.0.0/8 or 2001:db8::/32",
        ],
    );
}

#[test]
fn common_limits_are_refused_where_one_key_cannot_serve_every_route() {
    assert_problems(
        "common_limits.yaml",
        &[
            "limits[1].key: a common limit counts one bucket for every route that uses it: its key cannot name the route",
            "limits[2].split: a common limit is one bucket whichever route a request takes: it cannot be split",
            "limits[3].name: duplicate common limit name \"monthly\"",
            "limits[5].use: use: names a common limit from a route's limits; here, define it",
            "routes[0].limits[0].use: no common limit named \"montly\": did you mean `monthly`? (limits: monthly, per_route, hot, by_ip)",
            "routes[0].limits[1].rate: a use: entry names a common limit and nothing else: set it where the limit is defined",
            "routes[2].limits: limit per_consumer lacks [client_ip] of the common limits' key [client_ip]: every limit of a route that uses a common limit is counted in that caller's Redis Cluster slot (add the parts, or scope: local)",
            "routes[3].limits[2].name: duplicate limit name \"monthly\" in this route",
            "routes[3].limits: the common limits a route uses must be keyed on the same parts: by_ip is keyed on [client_ip], another on [consumer]",
            "routes[4].limits[0].use: consumer needs the route to verify callers: auth: required or optional",
        ],
    );
}

#[test]
fn every_mistake_of_regions_and_global_limits_is_told_in_one_run() {
    assert_problems(
        "regions.yaml",
        &[
            "regions.list[0].weight: must be between 1 and 1000, got 0",
            "regions.list[2].name: duplicate region \"eu-west\"",
            "regions.this: \"eu-wst\" is not in regions.list (us-east, eu-west, eu-west, ap-south)",
            "regions.every: must be between 100 and 60000, got 10",
            "regions.seed_percent: must be between 1 and 50, got 70",
            "regions.list[1].redis: required for every region but this one: region sync reads its records there",
            "regions.list[2].redis.url: invalid redis URL: expected redis://[user[:password]@]host[:port][/db], rediss://..., or redis+unix:///path[?db=N]",
            "regions.list[3].redis: required for every region but this one: region sync reads its records there",
            "routes[0].limits[0].consistency: applies only with scope: global (one limit across regions)",
            "routes[0].limits[1].scope: global applies to fixed_window, calendar, gcra, token_bucket and leaky_bucket, not sliding_log",
            "routes[0].limits[2].consistency: approx applies to fixed_window and calendar (counts region sync can add up), not gcra: a global gcra is kept strict, each region on its part of the rate",
            "routes[0].limits[3].scope: global needs a regions: section without problems (this gateway's region and every region's Redis)",
            "routes[0].limits[4].split: a global limit is one key in each region's Redis: it cannot be split",
            "routes[0].limits[5].consistency: unknown consistency \"eventual\": use strict or approx",
        ],
    );
    assert_problems(
        "global_without_regions.yaml",
        &["routes[0].limits[0].scope: global needs a regions: section without problems (this gateway's region and every region's Redis)"],
    );
    assert_problems(
        "regions_without_redis.yaml",
        &[
            "regions: needs redis: (this region's Redis, where its gateways decide)",
            "regions.list: lists 2 to 16 regions, every region's configuration the same list",
        ],
    );
    assert_problems(
        "regions_parts.yaml",
        &[
            "routes[0].limits[0].rate: 3 units cannot be split among 3 regions by their weights and seed: each region's part must be at least one unit",
            "routes[0].limits[1].rate: 2 units cannot be split among 3 regions by their weights and seed: each region's part must be at least one unit",
        ],
    );
}

#[test]
fn the_regions_example_passes_and_says_which_limits_stay_per_region() {
    let (code, stdout, stderr) = check("conf/regions.example.yaml");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "conf/regions.example.yaml: ok: 1 routes, 3 limits, redis at redis://127.0.0.1:6379/0\n\
         regions: this is eu-west of 3 (us-east, eu-west, ap-south); region sync every 1000 ms, delays up to 250 ms assumed\n\
         \x20 global api/monthly 100000 strict\n\
         \x20 global api/per_minute 1000 approx\n\
         \x20 global api/per_second 50 strict: decided per region (each region on its part: a window under 5000 ms, or a rate with no count to move)\n"
    );
}
