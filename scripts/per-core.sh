#!/usr/bin/env bash
# CPU per request, one core against one core (docs/performance.md#cheap-per-core): each proxy
# pinned to core 0 (1 thread or 1 worker), wrk, the demo upstream and Redis pinned to the other
# cores, all in one run, targets alternating round by round, medians and per-round ratios:
#   bare    bare Pingora proxy (examples/bare_proxy.rs)
#   plain   a plain Pingora gateway (examples/plain_gateway.rs): the six forwarding headers, a
#           request id both ways, a counter and a histogram; sluice's default visible work
#   nginx   nginx, 1 worker, the same forwarding headers and request id
#   none    sluice, no limits, 1 thread
#   exact   sluice, one GCRA limit [client_ip, path] decided in Redis per request (mode: exact)
#   peer    nginx + ngx_lua token bucket in Redis, 1 worker (benches/peers/openresty)
# and unpinned, wrk and everything else free to move: sluice without limits at 1 thread (none1u)
# and at 2 threads (none2u), the same without work stealing (none2n), and bare Pingora at 1 and 2
# threads (bare1u, bare2u: how much of the growth is Pingora's), and one exact limit at 2 threads
# with and without work stealing (exact2u, exact2n). CPU per request: the serving processes' user + system time
# (/proc/PID/stat) over the requests wrk completed; "+ Redis" is Redis's own, for the targets
# that call it. The proxy's core is the bottleneck only where the proxy is slower than
# everything on the other core together; CPU per request does not depend on it.
# Usage: scripts/per-core.sh [SECONDS_PER_RUN] [ROUNDS]   (defaults 5 5: about 5 minutes)
#        ONLY="plain none" scripts/per-core.sh 5 3          runs only those targets
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server wrk:wrk nginx:nginx \
  /usr/lib/nginx/modules/ngx_http_lua_module.so:libnginx-mod-http-lua taskset:util-linux pgrep:procps
seconds=${1:-5}
rounds=${2:-5}
cargo build --release --bins --example bare_proxy --example plain_gateway

source scripts/loopback.sh

cores=$(nproc)
proxy_core=0
others=1-$((cores - 1))
[ "$cores" -ge 2 ] || { echo "per-core.sh needs at least 2 cores" >&2; exit 1; }
hz=$(getconf CLK_TCK)
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }

redis_port=$(port); upstream_port=$(port)
taskset -c "$others" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
redis_pid=$!
taskset -c "$others" ./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
wait_port "$redis_port"; wait_port "$upstream_port"

declare -A url cpu_pids uses_redis pinned
label_of() {
  case $1 in
    bare) echo "bare Pingora proxy" ;; plain) echo "plain Pingora gateway" ;;
    nginx) echo "nginx, forwarding headers + request id" ;; none) echo "sluice, no limits" ;;
    exact) echo "sluice, 1 exact GCRA limit" ;; peer) echo "ngx_lua peer (token bucket in Redis)" ;;
    none1u) echo "sluice, no limits, 1 thread, unpinned" ;; none2u) echo "sluice, no limits, 2 threads, unpinned" ;;
    none2n) echo "sluice, no limits, 2 threads, unpinned, work_stealing: false" ;;
    exact2u) echo "sluice, 1 exact limit, 2 threads, unpinned" ;;
    exact2n) echo "sluice, 1 exact limit, 2 threads, unpinned, work_stealing: false" ;;
    bare1u) echo "bare Pingora proxy, 1 thread, unpinned" ;; bare2u) echo "bare Pingora proxy, 2 threads, unpinned" ;;
  esac
}

# example NAME BINARY [THREADS [unpinned]]: one of the hand-written Pingora proxies (1 thread,
# pinned, by default).
example() {
  local name=$1 threads=${3:-1} listen command
  listen=$(port)
  command=("./target/release/examples/$2" "127.0.0.1:$listen" "127.0.0.1:$upstream_port" "$threads")
  [ "${4:-}" = unpinned ] || command=(taskset -c "$proxy_core" "${command[@]}")
  "${command[@]}" >/dev/null 2>&1 & pids+=($!)
  url[$name]="http://127.0.0.1:$listen/x"; cpu_pids[$name]=$!
  [ "${4:-}" = unpinned ] || pinned[$name]=1
  wait_port "$listen"
}

# gateway NAME THREADS CPUS LIMITS [SERVER_EXTRA]: sluice on CPUS ("" unpinned).
gateway() {
  local name=$1 threads=$2 cpus=$3 limits=$4 extra=${5:-} listen
  listen=$(port)
  {
    echo "server: { threads: $threads, pid_file: $work/$name.pid, upgrade_sock: $work/$name.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0$extra }"
    echo "listen: [127.0.0.1:$listen]"
    echo "redis: { url: \"redis://127.0.0.1:$redis_port/0\", timeout_ms: 50 }"
    echo "routes:"
    echo "  - name: bench"
    echo "    match: { path_prefix: / }"
    echo "    upstream: { servers: [127.0.0.1:$upstream_port] }"
    if [ -n "$limits" ]; then printf '    limits:\n%s\n' "$limits"; fi
  } > "$work/$name.yaml"
  local command=(./target/release/sluice -c "$work/$name.yaml")
  [ -z "$cpus" ] || command=(taskset -c "$cpus" "${command[@]}")
  RUST_LOG=error "${command[@]}" >/dev/null 2>&1 & pids+=($!)
  url[$name]="http://127.0.0.1:$listen/x"; cpu_pids[$name]=$!; pinned[$name]=${cpus:+1}
  wait_port "$listen"
}

# nginx_target NAME LUA: nginx, 1 worker, pinned (LUA: 1 for the ngx_lua peer).
nginx_target() {
  local name=$1 lua=$2 listen dir
  listen=$(port); dir="$work/$name"
  mkdir -p "$dir/logs" "$dir/tmp"
  {
    if [ "$lua" = 1 ]; then
      echo "load_module /usr/lib/nginx/modules/ndk_http_module.so;"
      echo "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;"
    fi
    echo "worker_processes 1; worker_cpu_affinity 1; daemon off; pid logs/nginx.pid; error_log logs/error.log warn;"
    echo "events { worker_connections 4096; }"
    echo "http { access_log off; keepalive_requests 1000000; client_body_temp_path tmp/body; proxy_temp_path tmp/proxy;"
    echo "  upstream backend { server 127.0.0.1:$upstream_port; keepalive 64; keepalive_requests 1000000; }"
    if [ "$lua" = 1 ]; then
      echo "  lua_package_path \"$PWD/benches/peers/openresty/?.lua;;\";"
      echo "  init_by_lua_block { require(\"ratelimit\").init(\"$PWD/benches/peers/openresty/token_bucket.lua\", \"127.0.0.1\", $redis_port) }"
    fi
    echo "  server { listen 127.0.0.1:$listen; location / {"
    if [ "$lua" = 1 ]; then
      echo "    access_by_lua_block { require(\"ratelimit\").access(1000000, 1000000) }"
    else
      echo "    proxy_set_header X-Forwarded-For \$remote_addr; proxy_set_header X-Real-IP \$remote_addr;"
      echo "    proxy_set_header X-Forwarded-Proto \$scheme; proxy_set_header X-Forwarded-Host \$host;"
      echo "    proxy_set_header X-Forwarded-Port \$server_port;"
      echo "    proxy_set_header Forwarded \"for=\$remote_addr;proto=\$scheme;host=\$host\";"
      echo "    proxy_set_header X-Request-Id \$request_id; add_header X-Request-Id \$request_id;"
    fi
    echo "    proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\"; } } }"
  } > "$dir/nginx.conf"
  # The master on the other cores; its one worker pinned to core 0 (worker_cpu_affinity 1).
  taskset -c "$others" nginx -p "$dir" -c "$dir/nginx.conf" >/dev/null 2>&1 & pids+=($!)
  local master=$!
  wait_port "$listen"
  url[$name]="http://127.0.0.1:$listen/x"; cpu_pids[$name]=$(pgrep -P "$master" | tr '\n' ' '); pinned[$name]=1
  uses_redis[$name]=$lua
}

one="      - { name: per_client, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: exact }"
# shellcheck disable=SC2206 # one target per word
targets=(${ONLY:-bare plain nginx none exact peer none1u none2u})
for t in "${targets[@]}"; do
  case $t in
    bare) example bare bare_proxy ;;
    plain) example plain plain_gateway ;;
    nginx) nginx_target nginx 0 ;;
    none) gateway none 1 "$proxy_core" "" ;;
    exact) gateway exact 1 "$proxy_core" "$one"; uses_redis[exact]=1 ;;
    peer) nginx_target peer 1 ;;
    none1u) gateway none1u 1 "" "" ;;
    none2u) gateway none2u 2 "" "" ;;
    none2n) gateway none2n 2 "" "" ", work_stealing: false" ;;
    exact2u) gateway exact2u 2 "" "$one"; uses_redis[exact2u]=1 ;;
    exact2n) gateway exact2n 2 "" "$one" ", work_stealing: false"; uses_redis[exact2n]=1 ;;
    bare1u) example bare1u bare_proxy 1 unpinned ;;
    bare2u) example bare2u bare_proxy 2 unpinned ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
  esac
done

# measure NAME: one wrk run; appends "NAME req/s cpu_us redis_us p99_ms non2xx" to runs.tsv.
measure() {
  local name=$1 cpu0 cpu1 r0 r1 out wrk_cmd=(wrk -t2 -c32 -d"${seconds}s" --latency)
  [ -z "${pinned[$name]:-}" ] || wrk_cmd=(taskset -c "$others" "${wrk_cmd[@]}")
  # shellcheck disable=SC2086 # one PID per word
  cpu0=$(cpu_ticks ${cpu_pids[$name]}); r0=$(cpu_ticks "$redis_pid")
  out=$("${wrk_cmd[@]}" "${url[$name]}" 2>&1)
  # shellcheck disable=SC2086
  cpu1=$(cpu_ticks ${cpu_pids[$name]}); r1=$(cpu_ticks "$redis_pid")
  awk -v n="$name" -v cpu="$((cpu1 - cpu0))" -v rcpu="$((r1 - r0))" -v hz="$hz" -v redis="${uses_redis[$name]:-0}" '
    / requests in / { r = $1 }
    /^Requests\/sec:/ { rps = $2 }
    /^ +99%/ { p = $2; if (p ~ /us$/) p99 = p / 1000; else if (p ~ /ms$/) p99 = p + 0; else p99 = p * 1000 }
    /Non-2xx/ { bad = $NF }
    END { printf "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%d\n", n, rps, cpu * 1e6 / hz / r, (redis == 1 ? rcpu * 1e6 / hz / r : 0), p99, bad }
  ' <<<"$out" >> "$work/runs.tsv"
}

: > "$work/runs.tsv"
for round in $(seq "$rounds"); do
  echo "round $round of $rounds..." >&2
  for t in "${targets[@]}"; do measure "$t"; done
done

median() { sort -g | awk '{v[NR] = $1} END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
column() { awk -F'\t' -v n="$1" -v c="$2" '$1 == n {print $c}' "$work/runs.tsv"; }
# ratio A B: the median over rounds of A's CPU (+ Redis) per request over B's, with its range.
ratio() {
  paste <(column "$1" 3) <(column "$1" 4) <(column "$2" 3) <(column "$2" 4) |
    awk '{ print ($1 + $2) / ($3 + $4) }' | sort -g |
    awk '{v[NR] = $1} END { m = (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); printf "%.2f × (rounds %.2f to %.2f)", m, v[1], v[NR] }'
}
has() { [[ " ${targets[*]} " == *" $1 "* ]]; }

echo "command: scripts/per-core.sh $seconds $rounds   ($cores cores; proxies on core $proxy_core, wrk -t2 -c32, upstream and Redis on $others)"
echo
echo "| target | req/s | CPU µs/req | + Redis µs/req | p99 ms | non-2xx |"
echo "| --- | --- | --- | --- | --- | --- |"
for t in "${targets[@]}"; do
  printf '| %s | %s | %s | %s | %s | %s |\n' "$(label_of "$t")" "$(column "$t" 2 | median)" \
    "$(column "$t" 3 | median)" "$(column "$t" 4 | median)" "$(column "$t" 5 | median)" "$(column "$t" 6 | median)"
done
echo
if has none && has plain; then echo "- sluice without limits / the plain gateway, CPU per request (target ≤ 1.05 ×): $(ratio none plain)"; fi
if has none && has bare; then echo "- sluice without limits / bare Pingora: $(ratio none bare)"; fi
if has exact && has peer; then echo "- one exact limit / the ngx_lua peer, gateway + Redis CPU per request (target ≤ 1.0 ×): $(ratio exact peer)"; fi
if has none2u && has none1u; then echo "- sluice without limits, 2 threads / 1 thread, unpinned (target ≤ 1.10 ×): $(ratio none2u none1u)"; fi
if has none2n && has none1u; then echo "- the same, work_stealing: false at 2 threads: $(ratio none2n none1u)"; fi
if has exact2n && has exact2u; then echo "- one exact limit at 2 threads, unpinned, without work stealing / with it: $(ratio exact2n exact2u)"; fi
if has bare2u && has bare1u; then echo "- bare Pingora, 2 threads / 1 thread, unpinned: $(ratio bare2u bare1u)"; fi
