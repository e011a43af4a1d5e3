#!/usr/bin/env bash
# Instructions per proxied request (docs/performance.md#the-proxy-path): the one measure of the
# gateway's own work that a noisy machine does not blur. Runs the release sluice (1 thread) under
# valgrind's callgrind, serves N/4 and then N keep-alive requests (h2load --h1, 8 connections)
# after a warm-up, and prints (Ir(N) - Ir(N/4)) / (3N/4): user-space instructions per request,
# start-up and shutdown cancelled out. Once for the bare Pingora proxy (examples/bare_proxy.rs:
# Pingora's own work, the floor under sluice without limits), once for the plain gateway
# (examples/plain_gateway.rs: the visible work sluice does by default, written by hand), once for
# sluice without limits,
# once with one GCRA limit decided in Redis for every request (mode: exact), once with a hot
# GCRA limit (key: [route]) and no mode: leased, paid from units held.
# Optional: CALLGRIND_KEEP=DIR keeps each run's profile there for callgrind_annotate.
# Usage: scripts/instructions.sh [N]   (default 4000; about 2 minutes)
#        SCENARIOS="none" scripts/instructions.sh   counts only those of bare, plain, none, gcra and hot
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server valgrind:valgrind \
  callgrind_annotate:valgrind h2load:nghttp2-client
n=${1:-4000}
cargo build --release --bins --example bare_proxy --example plain_gateway

source scripts/loopback.sh

redis_port=$(port); upstream_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
wait_port "$redis_port"; wait_port "$upstream_port"

# config NAME LIMITS: a one-route, one-thread config in $work/NAME.yaml; prints its port.
config() {
  local name=$1 limits=$2 proxy
  proxy=$(port)
  {
    echo "server: { threads: 1, pid_file: $work/$name.pid, upgrade_sock: $work/$name.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }"
    echo "listen: [127.0.0.1:$proxy]"
    echo "redis: { url: \"redis://127.0.0.1:$redis_port/0\", timeout_ms: 500 }"
    echo "routes:"
    echo "  - name: bench"
    echo "    match: { path_prefix: / }"
    echo "    upstream: { servers: [127.0.0.1:$upstream_port] }"
    if [ -n "$limits" ]; then printf '    limits:\n%s\n' "$limits"; fi
  } > "$work/$name.yaml"
  echo "$proxy"
}

# instructions NAME PORT REQUESTS: total instructions of a run serving REQUESTS after a warm-up.
instructions() {
  local name=$1 proxy=$2 requests=$3 vp
  local out="$work/$name.$requests.callgrind"
  local command=(./target/release/sluice -c "$work/$name.yaml")
  case $name in
    bare) command=(./target/release/examples/bare_proxy "127.0.0.1:$proxy" "127.0.0.1:$upstream_port" 1) ;;
    plain) command=(./target/release/examples/plain_gateway "127.0.0.1:$proxy" "127.0.0.1:$upstream_port" 1) ;;
  esac
  valgrind --tool=callgrind --callgrind-out-file="$out" "${command[@]}" >"$work/$name.log" 2>&1 &
  vp=$!; pids+=($vp)
  wait_port "$proxy" 60
  h2load --h1 -n 200 -c 8 "http://127.0.0.1:$proxy/x" >/dev/null 2>&1
  h2load --h1 -n "$requests" -c 8 "http://127.0.0.1:$proxy/x" >/dev/null 2>&1
  kill -TERM "$vp"; wait "$vp" 2>/dev/null || true
  [ -z "${CALLGRIND_KEEP:-}" ] || { mkdir -p "$CALLGRIND_KEEP"; cp "$out" "$CALLGRIND_KEEP/"; }
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

echo "command: scripts/instructions.sh $n"
echo "| configuration | instructions per request |"
echo "| --- | --- |"
# shellcheck disable=SC2206 # one scenario per word
scenarios=(${SCENARIOS:-bare plain none gcra hot})
for scenario in "${scenarios[@]}"; do
  case $scenario in
    gcra) limits="      - { name: l, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: exact }" ;;
    hot) limits="      - { name: l, key: [route], algorithm: gcra, rate: 1000000/s, burst: 1000000 }" ;;
    *) limits="" ;;
  esac
  if [ "$scenario" = bare ] || [ "$scenario" = plain ]; then proxy=$(port); else proxy=$(config "$scenario" "$limits"); fi
  small=$(instructions "$scenario" "$proxy" $((n / 4)))
  large=$(instructions "$scenario" "$proxy" "$n")
  case $scenario in
    bare) label="bare Pingora proxy (examples/bare_proxy.rs)" ;;
    plain) label="plain Pingora gateway (examples/plain_gateway.rs)" ;;
    none) label="sluice, no limits" ;;
    gcra) label="sluice, one GCRA limit in Redis" ;;
    *) label="sluice, a hot GCRA limit, no mode (leased)" ;;
  esac
  awk -v a="$small" -v b="$large" -v n="$n" -v l="$label" \
    'BEGIN {printf "| %s | %.0f |\n", l, (b - a) / (n - n / 4)}'
done
