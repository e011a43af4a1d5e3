#!/usr/bin/env bash
# How coalesced decisions behave (docs/performance.md#coalesced-decisions): on loopback, one
# redis-server, the demo upstream and two gateways with the same GCRA limit (all requests pass),
# one sending a script call per request (`redis.max_batch: 1`), one batching (the default, 32).
# Each is offered fixed rates (examples/fixed_rate.rs: open loop, 64 keep-alive connections,
# latency from the scheduled send time), the rates alternating between the two; for each run it
# prints latency percentiles, the mean batch size (the gateway's sluice_limiter_batch_size
# histogram) and Redis CPU per decision.
# Usage: scripts/coalescing.sh [SECONDS_PER_RUN] [RATES...]   (defaults: 5 s; 1000 4000 8000 12000)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
seconds=${1:-5}
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1000 4000 8000 12000)
cargo build --release --bins --example fixed_rate

source scripts/loopback.sh
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ticks_per_s=$(getconf CLK_TCK)

redis_port=$(port); upstream_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
redis_pid=$!
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
wait_port "$redis_port"; wait_port "$upstream_port"

declare -A proxy admin
for batch in 1 32; do
  proxy[$batch]=$(port); admin[$batch]=$(port)
  cat > "$work/b$batch.yaml" <<YAML
server: { pid_file: $work/b$batch.pid, upgrade_sock: $work/b$batch.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }
listen: [127.0.0.1:${proxy[$batch]}]
admin: { listen: 127.0.0.1:${admin[$batch]} }
redis: { url: "redis://127.0.0.1:$redis_port/0", timeout_ms: 50, max_batch: $batch }
routes:
  - name: bench
    match: { path_prefix: / }
    upstream: { servers: [127.0.0.1:$upstream_port] }
    limits: [{ name: per_client, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000 }]
YAML
  RUST_LOG=error ./target/release/sluice -c "$work/b$batch.yaml" >/dev/null 2>&1 & pids+=($!)
  wait_port "${proxy[$batch]}"
done

batch_stats() { curl -s "http://127.0.0.1:${admin[$1]}/metrics" | awk '/^sluice_limiter_batch_size_sum/ {s=$2} /^sluice_limiter_batch_size_count/ {c=$2} END {print s + 0, c + 0}'; }

printf '| offered req/s | max_batch | achieved req/s | non-2xx | p50 ms | p99 ms | p99.9 ms | mean batch | Redis CPU µs/decision |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
for rate in "${rates[@]}"; do
  for batch in 1 32; do
    read -r sum0 count0 < <(batch_stats "$batch")
    r0=$(cpu_ticks "$redis_pid")
    out=$(./target/release/examples/fixed_rate "127.0.0.1:${proxy[$batch]}" /x "$rate" "$seconds" 64)
    r1=$(cpu_ticks "$redis_pid")
    read -r sum1 count1 < <(batch_stats "$batch")
    read -r sent bad achieved p50 p99 p999 < <(awk '{print $2, $4, $6, $8, $10, $12}' <<<"$out")
    awk -v rate="$rate" -v batch="$batch" -v a="$achieved" -v bad="$bad" -v p50="$p50" -v p99="$p99" \
        -v p999="$p999" -v ds="$(awk -v a="$sum1" -v b="$sum0" 'BEGIN {print a - b}')" \
        -v dc="$(awk -v a="$count1" -v b="$count0" 'BEGIN {print a - b}')" -v cpu="$(( r1 - r0 ))" \
        -v hz="$ticks_per_s" -v sent="$sent" 'BEGIN {
      printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.1f |\n", rate, batch, a, bad,
        p50 / 1000, p99 / 1000, p999 / 1000, (dc > 0 ? ds / dc : 0), (sent > 0 ? cpu * 1e6 / hz / sent : 0)
    }'
  done
done
echo
echo "machine: $(nproc) cores; redis $(redis-server --version | awk '{print $3}' | cut -d= -f2); ${seconds} s per run, 64 connections"
