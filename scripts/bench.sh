#!/usr/bin/env bash
# First cut of the performance bench (issue 7): on loopback, starts redis-server, the demo
# upstream and one sluice per scenario, drives each with wrk for a bounded time, and prints
# requests/s, p50/p99 latency, non-2xx, and Redis EVALSHA calls per request. Scenarios:
#   1 upstream direct   2 sluice, no limits   3 one GCRA limit on [client_ip, path] (all pass)
#   4 three limits (all pass)   5 one client over its limit (denials)   6 in-process backend
#   7 OpenResty-style peer: nginx + ngx_lua, EVALSHA of a token bucket per request (benches/peers/)
# Usage: scripts/bench.sh [SECONDS_PER_SCENARIO]   (default 5; the whole run stays under 2 min)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server wrk:wrk nginx:nginx \
  /usr/lib/nginx/modules/ngx_http_lua_module.so:libnginx-mod-http-lua
seconds=${1:-5}
cargo build --release --bins

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

redis_port=$(port); upstream_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
wait_port "$redis_port"; wait_port "$upstream_port"
evalsha() { redis-cli -p "$redis_port" info commandstats | awk -F'[=,]' '/cmdstat_evalsha/ {print $2}' | tr -d '\r' | grep . || echo 0; }

# sluice NAME BACKEND LIMITS: starts a gateway; sets $proxy to its port.
proxy=
sluice() {
  local name=$1 backend=$2 limits=$3
  proxy=$(port)
  {
    echo "server: { threads: 2, pid_file: $work/$name.pid, upgrade_sock: $work/$name.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }"
    echo "listen: [127.0.0.1:$proxy]"
    if [ "$backend" = redis ]; then echo "redis: { url: \"redis://127.0.0.1:$redis_port/0\", timeout_ms: 50 }"; fi
    echo "routes:"
    echo "  - name: bench"
    echo "    match: { path_prefix: / }"
    echo "    upstream: { servers: [127.0.0.1:$upstream_port] }"
    if [ -n "$limits" ]; then printf '    limits:\n%s\n' "$limits"; fi
  } > "$work/$name.yaml"
  RUST_LOG=error ./target/release/sluice -c "$work/$name.yaml" >/dev/null 2>&1 & pids+=($!)
  wait_port "$proxy"
}

huge='{ name: per_client, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000 }'
one="      - $huge"
three="      - $huge
      - { name: per_client_all, key: [client_ip], algorithm: gcra, rate: 1000000/s, burst: 1000000 }
      - { name: per_route, key: [route], algorithm: fixed_window, rate: 1000000/s }"
tiny="      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1/h }"

printf '| # | scenario | req/s | p50 ms | p99 ms | non-2xx | EVALSHA/req |\n| --- | --- | --- | --- | --- | --- | --- |\n'
row() {
  local n=$1 label=$2 url=$3 before after out requests
  before=$(evalsha)
  out=$(wrk -t2 -c32 -d"${seconds}s" --latency "$url" 2>&1)
  after=$(evalsha)
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$label" \
    "$(awk '/Requests\/sec/ {printf "%.0f", $2}' <<<"$out")" \
    "$(awk '$1=="50%" {print $2}' <<<"$out")" "$(awk '$1=="99%" {print $2}' <<<"$out")" \
    "$(awk '/Non-2xx/ {print $5} END {}' <<<"$out" | grep . || echo 0)" \
    "$(awk -v a="$after" -v b="$before" -v r="$requests" 'BEGIN {printf "%.3f", (r > 0 ? (a - b) / r : 0)}')"
}
row 1 "upstream direct" "http://127.0.0.1:$upstream_port/x"
sluice none redis "";       row 2 "sluice, no limits" "http://127.0.0.1:$proxy/x"
sluice one redis "$one";     row 3 "sluice, 1 GCRA limit" "http://127.0.0.1:$proxy/x"
sluice three redis "$three"; row 4 "sluice, 3 limits" "http://127.0.0.1:$proxy/x"
sluice tiny redis "$tiny";   row 5 "sluice, client over its limit" "http://127.0.0.1:$proxy/x"
sluice local local "$one";   row 6 "sluice, in-process backend" "http://127.0.0.1:$proxy/x"

# 7: nginx + ngx_lua with the peer's token bucket in the same Redis, 2 workers, keepalive upstream.
peer=$(port)
mkdir -p "$work/nginx/logs" "$work/nginx/tmp"
cat > "$work/nginx/nginx.conf" <<NGINX
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes 2;
daemon off;
pid logs/nginx.pid;
error_log logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path tmp/body;
    proxy_temp_path tmp/proxy;
    upstream backend { server 127.0.0.1:$upstream_port; keepalive 64; keepalive_requests 1000000; }
    lua_package_path "$PWD/benches/peers/openresty/?.lua;;";
    init_by_lua_block { require("ratelimit").init("$PWD/benches/peers/openresty/token_bucket.lua", "127.0.0.1", $redis_port) }
    server {
        listen 127.0.0.1:$peer;
        location / {
            access_by_lua_block { require("ratelimit").access(1000000, 1000000) }
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" >/dev/null 2>&1 & pids+=($!)
wait_port "$peer"
row 7 "nginx + ngx_lua token bucket in Redis" "http://127.0.0.1:$peer/x"
echo
echo "machine: $(nproc) cores; wrk -t2 -c32 -d${seconds}s; $(redis-server --version | awk '{print $3}'); release build"
