#!/usr/bin/env bash
# Cardinality flood on loopback: 100,000 distinct random paths from 1,000 source addresses
# (127.1.x.y) through sluice with a limit keyed on [client_ip, path]; prints the Redis key count
# and used_memory before, at the peak, and while they drain back to the baseline, and the gateway's
# RSS every 5 s during the flood (`scripts/cardinality.sh 1000 1000`: one million distinct keys).
# Usage: scripts/cardinality.sh [ADDRESSES] [REQUESTS_PER_ADDRESS]   (defaults 1000 100)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
addresses=${1:-1000}
per_address=${2:-100}
cargo build --release --bins --example cardinality

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(port); upstream_port=$(port); proxy_port=$(port); admin_port=$(port)
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM

redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null & pids+=($!)
./target/release/demo-upstream "127.0.0.1:$upstream_port" 2>/dev/null & pids+=($!)
cat > "$work/sluice.yaml" <<YAML
server: { threads: 2, pid_file: $work/sluice.pid, upgrade_sock: $work/upgrade.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }
listen: [127.0.0.1:$proxy_port]
admin: { listen: 127.0.0.1:$admin_port }
redis: { url: "redis://127.0.0.1:$redis_port/0", timeout_ms: 100 }
routes:
  - name: flood
    match: { path_prefix: / }
    upstream: { servers: [127.0.0.1:$upstream_port] }
    limits:
      - { name: per_path, key: [client_ip, path], algorithm: sliding_window, rate: 10/2s }
      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1000/s, burst: 1000 }
YAML
RUST_LOG=warn ./target/release/sluice -c "$work/sluice.yaml" & pids+=($!)
gateway=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$proxy_port") 2>/dev/null && break
  sleep 0.1
done
echo "machine: $(nproc) cores, $(redis-server --version | awk '{print $3}')"
./target/release/examples/cardinality "127.0.0.1:$proxy_port" "redis://127.0.0.1:$redis_port/0" "$addresses" "$per_address" "$gateway"
