#!/usr/bin/env bash
# What the file of API keys costs in memory: one release sluice (1 thread, no Redis) whose one
# route asks for a key, with a key file of 1 key and then of KEYS keys (each its own consumer),
# its RSS one second after its port opens and its peak (VmHWM) by then, then its RSS after each
# of RELOADS reloads of the same file (SIGHUP; each waited for until its success is logged).
# docs/performance.md ("How the cost grows with the work") has the figures.
# Usage: scripts/key-memory.sh [KEYS] [RELOADS]   (1000000 and 3 by default; about a minute)
#        SLUICE=path: measure that binary instead of building the release one.
#        MIMALLOC_PURGE_DELAY=0 (passed on to sluice): freed memory goes back to the system at
#        once, so the RSS is what is live rather than what the allocator keeps.
set -euo pipefail
[ -z "${SLUICE:-}" ] || SLUICE=$(realpath "$SLUICE")
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_missing python3:python3
keys=${1:-1000000}
reloads=${2:-3}
if [ -z "${SLUICE:-}" ]; then
  require_cargo
  cargo build --release --bin sluice
  SLUICE=${CARGO_TARGET_DIR:-target}/release/sluice
fi
source scripts/loopback.sh

status_mib() { awk -v field="$2:" '$1 == field {printf "%.1f", $2 / 1024}' "/proc/$1/status"; }

# measure COUNT: one line, the RSS (MiB) at start, the peak by then, and after each reload.
measure() {
  local count=$1 proxy pid started line r
  python3 - "$count" "$work/keys-$count.yaml" <<'EOF'
import hashlib, sys
count, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    f.write("keys:\n")
    for i in range(count):
        digest = hashlib.sha256(f"key-memory-{i}".encode()).hexdigest()
        f.write(f'  - {{ hash: "sha256:{digest}", consumer: c{i} }}\n')
EOF
  proxy=$(port)
  cat >"$work/keys-$count.conf.yaml" <<EOF
server: { threads: 1, pid_file: $work/$count.pid, upgrade_sock: $work/$count.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }
listen: [127.0.0.1:$proxy]
identity:
  api_keys: { file: $work/keys-$count.yaml }
routes:
  - name: api
    match: { path_prefix: / }
    upstream: { servers: [127.0.0.1:9] }
    auth: required
EOF
  started=$(date +%s%N)
  RUST_LOG=info "$SLUICE" -c "$work/keys-$count.conf.yaml" >/dev/null 2>"$work/$count.log" &
  pid=$!
  pids+=("$pid")
  wait_port "$proxy" 120
  line="keys=$count start_s=$(( ($(date +%s%N) - started) / 1000000 ))e-3"
  sleep 1
  line="$line start=$(status_mib "$pid" VmRSS) peak=$(status_mib "$pid" VmHWM)"
  for ((r = 1; r <= reloads; r++)); do
    kill -HUP "$pid"
    for _ in $(seq 1200); do
      (($(grep -c "reload: .*: ok: " "$work/$count.log" || true) >= r)) && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if (($(grep -c "reload: .*: ok: " "$work/$count.log" || true) < r)); then
      echo "keys=$count: reload $r logged no success" >&2
      cat "$work/$count.log" >&2
      exit 1
    fi
    sleep 1 # the reload logs its success, then hands back what it let go
    line="$line reload$r=$(status_mib "$pid" VmRSS)"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  echo "$line (MiB)"
}

measure 1
measure "$keys"
