#!/usr/bin/env bash
# What a route costs in memory: one release sluice (1 thread, no Redis) with 1 route, then with
# ROUTES routes (each its own upstream, then all naming one), its RSS one second after its port
# opens and after each of RELOADS reloads of the same file (SIGHUP, 2.5 s apart).
# docs/performance.md ("How the cost grows with the work") has the table.
# Usage: scripts/route-memory.sh [ROUTES] [RELOADS]   (1000 and 8 by default)
#        SLUICE=path: measure that binary instead of building the release one.
#        THREADS=n: the gateway's threads (1 by default).
#        SERVE=n: after the start's RSS, n clients at once each send one request to every route
#        (its upstream refuses: a 502, which writes the request meters and the retry budget),
#        then the RSS again ("served"): what the slots per thread of the routes served cost.
set -euo pipefail
[ -z "${SLUICE:-}" ] || SLUICE=$(realpath "$SLUICE")
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_missing python3:python3 curl:curl
routes=${1:-1000}
reloads=${2:-8}
threads=${THREADS:-1}
serve=${SERVE:-0}
if [ -z "${SLUICE:-}" ]; then
  require_cargo
  cargo build --release --bin sluice
  SLUICE=${CARGO_TARGET_DIR:-target}/release/sluice
fi
work=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

rss_kib() {
  awk '/^VmRSS/ {print $2}' "/proc/$1/status"
}

# config NAME ROUTES SHARED PORT: writes $work/NAME.yaml.
config() {
  local name=$1 count=$2 shared=$3 port=$4 upstream="{ servers: [127.0.0.1:9] }" i
  {
    echo "server: { threads: $threads, pid_file: $work/$name.pid, upgrade_sock: $work/$name.sock," \
      "grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }"
    echo "listen: [127.0.0.1:$port]"
    if [ "$shared" = yes ]; then
      echo "upstreams: { shared: $upstream }"
      upstream=shared
    fi
    echo "routes:"
    for ((i = 1; i <= count; i++)); do
      echo "  - { name: r$i, match: { path_prefix: /p$i/ }, upstream: $upstream }"
    done
  } >"$work/$name.yaml"
}

# serve_every_route PORT ROUTES: $serve clients at once, each one request to every route over
# one keep-alive connection; every answer must be the gateway's 502 (the upstream refuses).
serve_every_route() {
  local port=$1 count=$2 c i
  for ((i = 1; i <= count; i++)); do
    echo "url = \"http://127.0.0.1:$port/p$i/\""
    echo "output = /dev/null"
    echo "write-out = \"%{http_code}\\n\""
  done >"$work/urls"
  local clients=()
  for ((c = 1; c <= serve; c++)); do
    curl -s -K "$work/urls" >"$work/codes$c" &
    clients+=($!)
  done
  wait "${clients[@]}"
  for ((c = 1; c <= serve; c++)); do
    if [ "$(grep -c '^502$' "$work/codes$c")" != "$count" ]; then
      echo "client $c: not every route answered 502: $(sort "$work/codes$c" | uniq -c)" >&2
      exit 1
    fi
  done
}

# measure NAME ROUTES SHARED: one line, RSS in KiB at start and after each reload (each one
# checked: its success is logged).
measure() {
  local name=$1 port line tries r
  port=$(free_port)
  config "$name" "$2" "$3" "$port"
  RUST_LOG=info "$SLUICE" -c "$work/$name.yaml" >/dev/null 2>"$work/$name.log" &
  pid=$!
  for ((tries = 0; ; tries++)); do
    (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    if ! kill -0 "$pid" 2>/dev/null || ((tries == 600)); then
      echo "$name: sluice did not open its port" >&2
      cat "$work/$name.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  sleep 1
  line="routes=$2 shared_upstream=$3 threads=$threads start=$(rss_kib "$pid")"
  if ((serve > 0)); then
    serve_every_route "$port" "$2"
    sleep 1
    line="$line served=$(rss_kib "$pid")"
  fi
  for ((r = 1; r <= reloads; r++)); do
    kill -HUP "$pid"
    sleep 2.5
    line="$line reload$r=$(rss_kib "$pid")"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=""
  local reloaded
  reloaded=$(grep -c "reload: .*: ok: " "$work/$name.log" || true)
  if ((reloaded != reloads)) || grep -q "reload rejected" "$work/$name.log"; then
    echo "$name: $reloaded of $reloads reloads logged a success" >&2
    cat "$work/$name.log" >&2
    exit 1
  fi
  echo "$line (KiB)"
}

measure one 1 no
measure own "$routes" no
measure shared "$routes" yes
