#!/usr/bin/env bash
# The fault suite's long form (docs/reliability.md): every fault of tests/faults.rs — Sentinel
# and Cluster failovers, a slot migration, Redis restarts with and without persistence, one
# gateway cut off (network namespace + iptables) or slowed past its deadline, gateways killed
# holding slots and leases, reload bursts — with loads three times as long as CI's, on a release
# build, one fault at a time. Prints the table docs/reliability.md shows, and fails if any fault
# admitted more than its bound. About 4 minutes on 2 cores once built. Needs root (network
# namespaces); installs what it runs.
#
# Usage: scripts/faults.sh [FILTER]   (FILTER: a test name part, e.g. sentinel)
#        SLUICE_FAULTS=short scripts/faults.sh   (CI's load lengths)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server redis-cli:redis-tools \
  ip:iproute2 iptables:iptables
table=$(mktemp)
trap 'rm -f "$table"' EXIT
SLUICE_FAULTS=${SLUICE_FAULTS:-long} SLUICE_FAULT_TABLE=$table \
  cargo test --release --test faults -- --test-threads 1 "$@"
echo
echo "$(date -u +%F), $(nproc) cores, Redis $(redis-server --version | awk '{print $3}' | sed 's/^v=//'), SLUICE_FAULTS=${SLUICE_FAULTS:-long}:"
echo
echo "| fault | failure mode | bound (design) | bound | exact | admitted | over | under | 503 | worst latency | heal |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
cat "$table"
