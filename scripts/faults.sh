#!/usr/bin/env bash
# Redis faults under steady load, on loopback, bounded (~30 s): two gateways share one Redis
# (deadline 25 ms); Redis is killed for 3 s and restarted, then paused with CLIENT PAUSE for 2 s;
# for each failure mode it prints requests, statuses, failed connections, p99 and max latency.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
cargo build --release --bins --example faults
echo "machine: $(nproc) cores, $(redis-server --version | awk '{print $3}')"
./target/release/examples/faults target/release
