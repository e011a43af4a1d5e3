#!/usr/bin/env bash
# How sluice's cost grows with its work: routes, limits per route, distinct clients, API keys,
# quota overrides against CPU per request, p99, reload time, gateway RSS and Redis memory, with
# the exponent of each curve (scripts/growth.py says how; docs/performance.md has the table).
# Usage: scripts/growth.sh [DIMENSION...]   (routes limits clients api_keys overrides; all by
#        default, about 15 minutes)   GROWTH_SCALE=small: the largest size of each divided by 10
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server redis-cli:redis-tools wrk:wrk \
  python3:python3
cargo build --release --bins
exec python3 scripts/growth.py "$@"
