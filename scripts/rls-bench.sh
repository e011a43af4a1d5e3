#!/usr/bin/env bash
# Envoy's rate limit service under load (docs/performance.md#envoy-rate-limit-service): starts
# redis-server and a release sluice with an envoyproxy/ratelimit configuration (generous limits:
# every call is allowed) on free loopback ports, and drives ShouldRateLimit with
# examples/rls_load.rs — 64 calls in flight over 4 HTTP/2 connections — with 1 and then 3
# descriptors per call. Prints calls/s, latency, and Redis's CPU and decision calls (FCALL or EVALSHA) per call.
# Usage: scripts/rls-bench.sh [SECONDS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
seconds=${1:-5}
cargo build --release --bins --example rls_load
source scripts/loopback.sh

redis_port=$(port); upstream_port=$(port); proxy=$(port); rls_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
redis_pid=$!
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
mkdir -p "$work/rls"
cat > "$work/rls/bench.yaml" <<YAML
domain: bench
descriptors:
  - key: client
    rate_limit: { unit: second, requests_per_unit: 1000000 }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 1000000 }
  - key: route
    rate_limit: { unit: second, requests_per_unit: 1000000 }
YAML
cat > "$work/sluice.yaml" <<YAML
server: { pid_file: $work/s.pid, upgrade_sock: $work/s.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }
listen: [127.0.0.1:$proxy]
redis: { url: "redis://127.0.0.1:$redis_port/0", timeout_ms: 100 }
rls: { listen: 127.0.0.1:$rls_port, config_dir: $work/rls }
routes:
  - { name: all, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:$upstream_port] } }
YAML
RUST_LOG=error ./target/release/sluice -c "$work/sluice.yaml" >/dev/null 2>&1 & pids+=($!)
sluice_pid=$!
wait_port "$redis_port"; wait_port "$rls_port"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# The decision calls so far: FCALL (functions) and EVALSHA (scripts).
evalsha_calls() { redis-cli -p "$redis_port" info commandstats | tr -d '\r' | awk -F'[=,]' '/^cmdstat_(fcall|evalsha):/ {n += $2} END {print n + 0}'; }
hz=$(getconf CLK_TCK)
echo "command: scripts/rls-bench.sh $seconds"
echo "| descriptors per call | calls/s | p50 ms | p99 ms | errors | sluice CPU µs/call | Redis CPU µs/call | decision calls per call |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for descriptors in 1 3; do
  s0=$(cpu_ticks "$sluice_pid"); r0=$(cpu_ticks "$redis_pid"); e0=$(evalsha_calls)
  out=$(./target/release/examples/rls_load "127.0.0.1:$rls_port" bench "$seconds" 64 "$descriptors")
  s1=$(cpu_ticks "$sluice_pid"); r1=$(cpu_ticks "$redis_pid"); e1=$(evalsha_calls)
  read -r calls rate errors p50 p99 < <(awk '{print $2, $4, $10, $12, $14}' <<<"$out")
  awk -v d="$descriptors" -v c="$calls" -v r="$rate" -v e="$errors" -v p50="$p50" -v p99="$p99" \
      -v s="$(( s1 - s0 ))" -v rc="$(( r1 - r0 ))" -v ev="$(( e1 - e0 ))" -v hz="$hz" 'BEGIN {
    printf "| %d | %d | %.2f | %.2f | %d | %.1f | %.1f | %.3f |\n", d, r, p50 / 1000, p99 / 1000, e,
      s * 1e6 / hz / c, rc * 1e6 / hz / c, ev / c
  }'
done
