#!/usr/bin/env bash
# Helpers for the scripts that start servers on loopback (bench.sh, coalescing.sh,
# instructions.sh): free ports, a work directory and the processes started, both cleaned up at
# exit, and waiting for a port to open.
# Sourced; sets $work (a temporary directory) and the array pids (kill them at exit).

# port: a free loopback port.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM

# wait_port PORT [SECONDS]: returns once 127.0.0.1:PORT accepts a connection (default 10 s).
wait_port() {
  local tries=$(( ${2:-10} * 20 ))
  for _ in $(seq "$tries"); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done
  echo "port $1 never opened" >&2
  exit 1
}
