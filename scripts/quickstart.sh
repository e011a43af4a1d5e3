#!/usr/bin/env bash
# Quick start: builds sluice (unoptimized, for a fast first build), starts a demo upstream on
# 127.0.0.1:3000 and a throwaway redis-server on 127.0.0.1:6379 (or uses the one already
# running), then runs sluice with conf/sluice.yaml in the foreground: proxy on :8080, metrics on
# 127.0.0.1:9091.
# Without Redis (not installable, not running) the same limits run in-process.
# Ctrl-C stops everything this script started.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake
install_missing redis-server:redis-server || echo "redis-server could not be installed: limits will run in-process" >&2

# The quickstart profile (Cargo.toml) builds for compile time, not speed: the first request is
# served minutes sooner (docs/deploy.md#quick-start-how-long). `cargo build --release` for the
# optimized binary.
cargo build --profile quickstart --bins
bin=${CARGO_TARGET_DIR:-target}/quickstart
started=()
cleanup() { for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

"$bin/demo-upstream" 127.0.0.1:3000 &
started+=($!)

config=conf/sluice.yaml
if command -v redis-cli >/dev/null 2>&1 && redis-cli -p 6379 ping >/dev/null 2>&1; then
  echo "using the redis-server already running on 127.0.0.1:6379"
elif command -v redis-server >/dev/null 2>&1; then
  redis-server --port 6379 --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
  started+=($!)
  for _ in $(seq 50); do redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
else
  # Same file without its redis: section: every limit runs in-process.
  config=$(mktemp --suffix=.yaml)
  awk '/^redis:/{skip=1; next} skip && /^[^ #]/{skip=0} !skip' conf/sluice.yaml > "$config"
  echo "no Redis available: running the in-process limiter"
fi

echo "sluice on http://127.0.0.1:8080 (try: curl -i localhost:8080/login), metrics on http://127.0.0.1:9091/metrics"
"$bin/sluice" -c "$config"
