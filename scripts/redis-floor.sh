#!/usr/bin/env bash
# What Redis itself spends per limiter call (docs/performance.md): EVALSHA usec_per_call of
# sluice's composed script for one and three GCRA limits, and for a batch of 8 requests of one
# limit each (coalesced decisions), of the OpenResty-style peer's token bucket, and of bare
# scripts that only do the unavoidable work (read the clock, read each key, write each key with a
# TTL) — the floor any script with one key per limit pays; and the settlement a limit priced by
# the response adds when its response ends (lua/settle.lua charging one GCRA key).
# redis-benchmark drives each for a fixed count, 16 clients, one request in flight each, keys
# spread over 100,000 clients; every call is allowed.
# Usage: scripts/redis-floor.sh [CALLS]   (default 300000; about 30 s)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_missing redis-server:redis-server redis-benchmark:redis-tools
calls=${1:-300000}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

cli() { redis-cli -p "$port" "$@"; }
# measure LABEL DECISIONS SCRIPT NUMKEYS ARGS...: usec_per_call of EVALSHA over $calls calls,
# and per decision (a call deciding DECISIONS requests).
measure() {
  local label=$1 decisions=$2 script=$3 sha per_call
  shift 3
  sha=$(cli script load "$script")
  cli flushall >/dev/null
  cli config resetstat >/dev/null
  redis-benchmark -p "$port" -n "$calls" -c 16 -r 100000 -q evalsha "$sha" "$@" >/dev/null 2>&1
  per_call=$(cli info commandstats | tr -d '\r' | awk -F'usec_per_call=' '/cmdstat_evalsha/ {split($2, v, ","); print v[1]}')
  printf '| %s | %s | %s |\n' "$label" "$per_call" "$(awk -v c="$per_call" -v d="$decisions" 'BEGIN {printf "%.2f", c / d}')"
}
sluice=$(for f in prelude gcra fixed_window sliding_window sliding_log concurrency check; do cat "lua/$f.lua"; echo; done)
id=00000000000000000000000000000001
gcra="gcra 1 1000000 0 1 0"
floor1="local t = redis.call('TIME') local v = redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1763500000123456', 'PX', 1000) return {1, 0, 0, 1, 0}"
floor3="local t = redis.call('TIME') for i = 1, 3 do redis.call('GET', KEYS[i]) end for i = 1, 3 do redis.call('SET', KEYS[i], '1763500000123456', 'PX', 1000) end return {1, 0, 0, 1, 0}"

floor8="local t = redis.call('TIME') for i = 1, 8 do redis.call('GET', KEYS[i]) redis.call('SET', KEYS[i], '1763500000123456', 'PX', 1000) end return {1, 0, 0, 1, 0}"
batch_keys=""; batch_args=""
for i in 1 2 3 4 5 6 7 8; do
  batch_keys="$batch_keys k$i:__rand_int__"
  batch_args="$batch_args 0000000000000000000000000000000$i 1 $gcra"
done

echo "| script | EVALSHA usec_per_call | per decision |"
echo "| --- | --- | --- |"
measure "floor: TIME + GET + SET PX" 1 "$floor1" 1 a:__rand_int__
# shellcheck disable=SC2086 # one argument per word
measure "sluice, 1 GCRA limit" 1 "$sluice" 1 a:__rand_int__ "" 1 $id 1 $gcra
measure "peer token bucket (TIME + HMGET + HSET + PEXPIRE)" 1 "$(cat benches/peers/openresty/token_bucket.lua)" 1 p:__rand_int__ 1000000 1000000 1
# shellcheck disable=SC2086
measure "floor: TIME + 3 GET + 3 SET PX" 1 "$floor3" 3 a:__rand_int__ b:__rand_int__ c:__rand_int__
# shellcheck disable=SC2086
measure "sluice, 3 GCRA limits" 1 "$sluice" 3 a:__rand_int__ b:__rand_int__ c:__rand_int__ "" 1 $id 3 $gcra $gcra $gcra
# shellcheck disable=SC2086
measure "floor: TIME + 8 x (GET + SET PX)" 8 "$floor8" 8 $batch_keys
# shellcheck disable=SC2086
measure "sluice, a batch of 8 requests, 1 GCRA limit each" 8 "$sluice" 8 $batch_keys "" 8 $batch_args
settle=$(for f in prelude gcra fixed_window settle; do cat "lua/$f.lua"; echo; done)
measure "sluice settle: a response's charge on 1 GCRA key" 1 "$settle" 1 a:__rand_int__ "" gcra 1000 5 0
echo
echo "machine: $(nproc) cores; redis $(redis-server --version | awk '{print $3}' | cut -d= -f2); $calls calls per script"
