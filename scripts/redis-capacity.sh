#!/usr/bin/env bash
# Decisions per second one Redis core makes, per algorithm (docs/scaling.md): starts a throwaway
# redis-server on a free loopback port and drives sluice's Redis backend with
# examples/redis_capacity.rs (the real script and key builder), every call allowed: once with one
# decision per call, once with decisions coalesced into batches of up to 32 (as the gateway does).
# Usage: scripts/redis-capacity.sh [SECONDS_PER_SCENARIO] [CONCURRENCY]   (defaults 5 64)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
seconds=${1:-5}
concurrency=${2:-64}
cargo build --release --example redis_capacity

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
redis_pid=$!
trap 'kill $redis_pid 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 100); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), redis $(redis-server --version | awk '{print $3}' | cut -d= -f2)"
echo "command: scripts/redis-capacity.sh $seconds $concurrency"
for max_batch in 1 32; do
  ./target/release/examples/redis_capacity "redis://127.0.0.1:$port/0" "$seconds" "$concurrency" "$max_batch"
done
