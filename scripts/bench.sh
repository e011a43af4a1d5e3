#!/usr/bin/env bash
# The performance bench (docs/performance.md): on loopback, starts redis-server, the demo upstream
# and one sluice per scenario, drives each with wrk for a bounded time, and prints one table:
# requests/s, p50/p99/p99.9 latency, non-2xx, gateway CPU per request (/proc utime+stime of the
# serving processes), EVALSHA calls per request, Redis commands per request including those the
# scripts run (INFO stats) and EVALSHA usec_per_call (INFO commandstats). Scenarios, all in one
# run so the ratios are meaningful on a noisy machine:
#   1 upstream direct   2 sluice, no limits   3 one GCRA limit on [client_ip, path] (all pass)
#   4 three limits (all pass)   5 one client over its limit (denials)   6 in-process backend
#   7 OpenResty-style peer: nginx + ngx_lua, EVALSHA of a token bucket per request (benches/peers/)
#   8 hot global limit (key: [route]), exact   9 the same limit, mode: leased
# Then open-loop load (examples/fixed_rate.rs) at half of scenario 2's peak against scenarios 2
# and 3: the p99 latency the limiter adds. Then TLS, sluice beside nginx with the same certificate
# (ECDSA P-256) and the same upstream, no limits, 2 threads / 2 workers each:
#   T1 a new TLS handshake per request (wrk, Connection: close)   T2 keep-alive requests over TLS
#   (wrk)   T3 HTTP/2 over TLS, 8 connections x 16 concurrent streams (h2load)
# Results also go to target/bench/results.tsv, and scripts/chart.py draws docs/performance.svg
# from them.
# Usage: scripts/bench.sh [SECONDS_PER_SCENARIO]   (default 5; the whole run stays under 3 min)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server wrk:wrk nginx:nginx \
  /usr/lib/nginx/modules/ngx_http_lua_module.so:libnginx-mod-http-lua openssl:openssl h2load:nghttp2-client
seconds=${1:-5}
cargo build --release --bins --example fixed_rate
results=target/bench/results.tsv
mkdir -p target/bench
: > "$results"

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 never opened" >&2; exit 1; }

redis_port=$(port); upstream_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
upstream_pid=$!
wait_port "$redis_port"; wait_port "$upstream_port"
redis_stat() { redis-cli -p "$redis_port" info all | tr -d '\r'; }
# cpu_ticks PID...: user + system clock ticks the processes have used.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
ticks_per_s=$(getconf CLK_TCK)

# sluice NAME BACKEND LIMITS: starts a gateway; sets $proxy to its port.
proxy=; serving=
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
  serving=$!
  wait_port "$proxy"
}

huge='{ name: per_client, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000 }'
one="      - $huge"
three="      - $huge
      - { name: per_client_all, key: [client_ip], algorithm: gcra, rate: 1000000/s, burst: 1000000 }
      - { name: per_route, key: [route], algorithm: fixed_window, rate: 1000000/s }"
tiny="      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1/h }"

hot_exact="      - { name: global, key: [route], algorithm: gcra, rate: 1000000/s, burst: 1000000 }"
hot_leased="      - { name: global, key: [route], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: leased }"

cat > "$work/report.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("REPORT %d %d %d %d %d %d\n", summary.requests, summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), summary.duration))
end
LUA

printf '| # | scenario | req/s | p50 ms | p99 ms | p99.9 ms | non-2xx | gateway CPU us/req | EVALSHA/req | Redis cmds/req | EVALSHA us/call |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
# row N LABEL URL PID...: one closed-loop wrk run; CPU is counted for the given processes.
row() {
  local n=$1 label=$2 url=$3; shift 3
  local before after cpu0 cpu1 out
  before=$(redis_stat); cpu0=$(cpu_ticks "$@")
  out=$(wrk -t2 -c32 -d"${seconds}s" -s "$work/report.lua" "$url" 2>&1)
  cpu1=$(cpu_ticks "$@"); after=$(redis_stat)
  read -r requests non2xx p50 p99 p999 duration < <(awk '/^REPORT/ {print $2, $3, $4, $5, $6, $7}' <<<"$out")
  awk -v n="$n" -v label="$label" -v r="$requests" -v bad="$non2xx" -v p50="$p50" -v p99="$p99" \
      -v p999="$p999" -v us="$duration" -v cpu="$(( cpu1 - cpu0 ))" -v hz="$ticks_per_s" \
      -v results="$results" -v b="$before" -v a="$after" '
    function stat(text, name,    lines, i, kv) {
      split(text, lines, "\n")
      for (i in lines) if (index(lines[i], name) == 1) { return substr(lines[i], length(name) + 1) }
      return ""
    }
    function evalsha(text, field,    line, parts, i, kv) {
      line = stat(text, "cmdstat_evalsha:"); split(line, parts, ",")
      for (i in parts) { split(parts[i], kv, "="); if (kv[1] == field) return kv[2] }
      return 0
    }
    BEGIN {
      rps = r / (us / 1e6)
      commands = stat(a, "total_commands_processed:") - stat(b, "total_commands_processed:") - 1
      calls = evalsha(a, "calls") - evalsha(b, "calls")
      usec = evalsha(a, "usec") - evalsha(b, "usec")
      cpu_us = cpu * 1e6 / hz / r
      printf "| %s | %s | %.0f | %.2f | %.2f | %.2f | %d | %.1f | %.3f | %.3f | %s |\n", n, label, rps, p50 / 1000,
        p99 / 1000, p999 / 1000, bad, cpu_us, calls / r, commands / r,
        (calls > 0 ? sprintf("%.2f", usec / calls) : "-")
      printf "%s\t%s\t%.0f\t%.3f\t%.3f\n", n, label, rps, p99 / 1000, p999 / 1000 >> results
    }'
}
row 1 "upstream direct" "http://127.0.0.1:$upstream_port/x" "$upstream_pid"
sluice none redis "";       row 2 "sluice, no limits" "http://127.0.0.1:$proxy/x" "$serving"
none_port=$proxy
sluice one redis "$one";     row 3 "sluice, 1 GCRA limit" "http://127.0.0.1:$proxy/x" "$serving"
one_port=$proxy
sluice three redis "$three"; row 4 "sluice, 3 limits" "http://127.0.0.1:$proxy/x" "$serving"
sluice tiny redis "$tiny";   row 5 "sluice, client over its limit" "http://127.0.0.1:$proxy/x" "$serving"
sluice local local "$one";   row 6 "sluice, in-process backend" "http://127.0.0.1:$proxy/x" "$serving"

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
nginx_master=$!
wait_port "$peer"
# shellcheck disable=SC2046 # one PID per word
row 7 "nginx + ngx_lua token bucket in Redis" "http://127.0.0.1:$peer/x" $(pgrep -P "$nginx_master")
sluice hot redis "$hot_exact";   row 8 "hot global limit, exact" "http://127.0.0.1:$proxy/x" "$serving"
sluice leased redis "$hot_leased"; row 9 "hot global limit, mode: leased" "http://127.0.0.1:$proxy/x" "$serving"

# Open loop at half of scenario 2's peak: latency the limiter adds at a rate the gateway can hold.
half=$(awk -F'\t' '$1 == 2 {printf "%d", $3 / 2}' "$results")
echo
echo "Fixed rate ${half} req/s (half of scenario 2's peak), ${seconds}s, 32 connections, latency from the scheduled send time:"
echo
printf '| # | scenario | achieved req/s | non-2xx | p50 ms | p99 ms | p99.9 ms |\n| --- | --- | --- | --- | --- | --- | --- |\n'
declare -A fixed_p99
for case in "2 $none_port sluice, no limits" "3 $one_port sluice, 1 GCRA limit"; do
  read -r n at label <<<"$case"
  out=$(./target/release/examples/fixed_rate "127.0.0.1:$at" /x "$half" "$seconds" 32)
  read -r rate bad p50 p99 p999 < <(awk '{print $6, $4, $8, $10, $12}' <<<"$out")
  fixed_p99[$n]=$p99
  awk -v n="$n" -v l="$label" -v r="$rate" -v b="$bad" -v p50="$p50" -v p99="$p99" -v p999="$p999" \
    'BEGIN {printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f |\n", n, l, r, b, p50 / 1000, p99 / 1000, p999 / 1000}'
done
awk -v a="${fixed_p99[3]}" -v b="${fixed_p99[2]}" 'BEGIN {printf "\np99 added by the limiter at that rate: %.2f ms\n", (a - b) / 1000}'
# TLS: sluice and nginx with the same certificate and upstream, no limits, alternating per row.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench.test \
  -addext subjectAltName=DNS:bench.test -keyout "$work/tls.key" -out "$work/tls.pem" 2>/dev/null
tls_sluice=$(port)
cat > "$work/tls.yaml" <<YAML
server: { threads: 2, pid_file: $work/tls.pid, upgrade_sock: $work/tls.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0 }
listen:
  - { addr: 127.0.0.1:$tls_sluice, tls: { certificates: [{ cert: $work/tls.pem, key: $work/tls.key }] } }
routes:
  - { name: bench, match: { path_prefix: / }, upstream: { servers: [127.0.0.1:$upstream_port] } }
YAML
RUST_LOG=error ./target/release/sluice -c "$work/tls.yaml" >/dev/null 2>&1 & pids+=($!)
tls_sluice_pid=$!
tls_nginx=$(port)
mkdir -p "$work/nginx-tls/logs" "$work/nginx-tls/tmp"
cat > "$work/nginx-tls/nginx.conf" <<NGINX
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
    server {
        listen 127.0.0.1:$tls_nginx ssl http2;
        ssl_certificate $work/tls.pem;
        ssl_certificate_key $work/tls.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
NGINX
nginx -p "$work/nginx-tls" -c "$work/nginx-tls/nginx.conf" >/dev/null 2>&1 & pids+=($!)
tls_nginx_master=$!
wait_port "$tls_sluice"; wait_port "$tls_nginx"
tls_nginx_workers=$(pgrep -P "$tls_nginx_master" | tr '\n' ' ')

# tls_measure KIND URL PID...: "req/s p99-or-mean-ms non-2xx cpu-us/req" for one load run.
tls_measure() {
  local kind=$1 url=$2; shift 2
  local cpu0 cpu1 out requests bad latency rps
  cpu0=$(cpu_ticks "$@")
  case $kind in
    handshake) out=$(wrk -t2 -c32 -d"${seconds}s" -H "Connection: close" -s "$work/report.lua" "$url" 2>&1) ;;
    keepalive) out=$(wrk -t2 -c32 -d"${seconds}s" -s "$work/report.lua" "$url" 2>&1) ;;
    h2) out=$(h2load -t2 -c8 -m16 -D "$seconds" "$url" 2>&1) ;;
  esac
  cpu1=$(cpu_ticks "$@")
  if [ "$kind" = h2 ]; then
    requests=$(awk '/^requests:/ {print $8}' <<<"$out")
    bad=$(awk '/^requests:/ {f = $10} /^status codes:/ {print f + $5 + $7 + $9}' <<<"$out")
    rps=$(awk '/^finished in/ {print $4}' <<<"$out")
    latency=$(awk '/^time for request:/ {v=$6; if (v ~ /us$/) {sub(/us$/, "", v); v /= 1000} else if (v ~ /ms$/) {sub(/ms$/, "", v)} else {sub(/s$/, "", v); v *= 1000}; print v}' <<<"$out")
  else
    read -r requests bad _ p99 _ duration < <(awk '/^REPORT/ {print $2, $3, $4, $5, $6, $7}' <<<"$out")
    rps=$(awk -v r="$requests" -v us="$duration" 'BEGIN {print r / (us / 1e6)}')
    latency=$(awk -v p="$p99" 'BEGIN {print p / 1000}')
  fi
  awk -v rps="$rps" -v l="$latency" -v b="$bad" -v cpu="$(( cpu1 - cpu0 ))" -v hz="$ticks_per_s" -v r="$requests" \
    'BEGIN {printf "%.0f %.2f %d %.1f\n", rps, l, b, (r > 0 ? cpu * 1e6 / hz / r : 0)}'
}
echo
echo "TLS, sluice beside nginx $(nginx -v 2>&1 | cut -d/ -f2) (same ECDSA P-256 certificate, same upstream, no limits; latency: p99 for wrk rows, mean for h2load):"
echo
printf '| # | scenario | sluice req/s | nginx req/s | sluice / nginx | sluice ms | nginx ms | non-2xx | sluice CPU µs/req | nginx CPU µs/req |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
for case in "T1 handshake https new TLS connection per request" "T2 keepalive https keep-alive requests over TLS" "T3 h2 https HTTP/2, 8 conns x 16 streams"; do
  read -r n kind scheme label <<<"$case"
  # shellcheck disable=SC2086 # one PID per word
  read -r s_rps s_lat s_bad s_cpu < <(tls_measure "$kind" "$scheme://127.0.0.1:$tls_sluice/x" "$tls_sluice_pid")
  # shellcheck disable=SC2086
  read -r n_rps n_lat n_bad n_cpu < <(tls_measure "$kind" "$scheme://127.0.0.1:$tls_nginx/x" $tls_nginx_workers)
  awk -v n="$n" -v l="$label" -v sr="$s_rps" -v nr="$n_rps" -v sl="$s_lat" -v nl="$n_lat" -v bad="$(( s_bad + n_bad ))" \
      -v sc="$s_cpu" -v nc="$n_cpu" \
    'BEGIN {printf "| %s | %s | %d | %d | %.2f | %.2f | %.2f | %d | %.1f | %.1f |\n", n, l, sr, nr, (nr > 0 ? sr / nr : 0), sl, nl, bad, sc, nc}'
done

echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); wrk -t2 -c32 -d${seconds}s; redis $(redis-server --version | awk '{print $3}' | cut -d= -f2); release build"
python3 scripts/chart.py "$results" docs/performance.svg
