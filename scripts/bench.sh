#!/usr/bin/env bash
# The performance bench (docs/performance.md): on loopback, starts redis-server, the demo upstream,
# nginx (plain proxy with 1 and 2 workers; + ngx_lua calling a token bucket in Redis: the
# OpenResty pattern under Kong and APISIX) and one sluice per scenario, then drives every target
# with `wrk -t2 -c64` for a bounded time, ROUNDS times, alternating targets, and prints medians:
# requests/s, p50/p99/p99.9 latency, non-2xx, CPU per request of the serving processes and of
# Redis (/proc/<pid>/stat utime+stime), decision calls (FCALL or EVALSHA) and Redis commands per request (INFO),
# and beside throughput and CPU their spread over the rounds, (max - min) / median.
# Targets, all in one run so the ratios are meaningful on a noisy machine:
#   0 bare Pingora proxy (examples/bare_proxy.rs: Pingora's own cost, the floor under target 5)
#   1 upstream direct              2 nginx proxy, 1 worker          3 nginx proxy, 2 workers
#   4 nginx + ngx_lua token bucket in Redis (benches/peers/)        5 sluice, no limits
#   6 sluice, no limits, 1 thread  7 sluice, 1 GCRA limit [client_ip, path] (all pass)
#   8 sluice, 3 limits (all pass)  9 sluice, one client over its limit (denials)
#   10 sluice, in-process backend
#   11 hot global GCRA limit (key: [route]), no mode (auto: leased while hot), 2 gateways
#   12 the same, mode: exact, 2 gateways                   17 sluice, no limits, 2 gateways
#   18 cold per-client limit (key: [client_ip]), no mode: every request its own client
#   (X-Forwarded-For from wrk), so auto leases nothing and each request is one exact call
#   (7 and 8 set mode: exact: they are the limiter's per-request cost)
# A target of 2 gateways runs two sluice processes on the same Redis, each driven by its own
# wrk -t1 -c32 at the same time: req/s is their sum, CPU both processes'.
# Then open-loop load (examples/fixed_rate.rs) at half of target 5's peak against 5 and 7: the
# p99 latency the limiter adds. Then TLS, sluice beside nginx with the same certificate (ECDSA
# P-256) and the same upstream, no limits, 2 threads / 2 workers each:
#   13 sluice, access log on, every request (JSON lines to a file)   14 the same, 1 in 100
#   15 sluice, tracing on, every request sampled (OTLP/HTTP to a local sink)   16 the same, 1 %
#   T1 a new TLS handshake per request (wrk, Connection: close)   T2 keep-alive requests over TLS
#   (wrk)   T3 HTTP/2 over TLS, 8 connections x 16 concurrent streams (h2load)
# Results also go to target/bench/results.tsv, and scripts/chart.py draws docs/performance.svg
# from them.
# The targets table judges each target on its rounds' own figures (the ratio or difference per
# round, the targets alternating, so both sides of it saw the same machine): met or missed only
# when the median of those figures is farther from the limit than its own uncertainty (see
# settle), "unsettled" otherwise. SETTLE=N runs up to N more rounds of every target while one
# is unsettled.
# Usage: scripts/bench.sh [SECONDS_PER_RUN] [ROUNDS]   (defaults 5 3: about 7 minutes)
#        ONLY="5 13 14" scripts/bench.sh ...   runs only those targets (medians, nothing after)
#        SETTLE=4 scripts/bench.sh 5 3         up to 4 more rounds while a target is unsettled
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server wrk:wrk nginx:nginx \
  /usr/lib/nginx/modules/ngx_http_lua_module.so:libnginx-mod-http-lua openssl:openssl h2load:nghttp2-client \
  pgrep:procps
seconds=${1:-5}
rounds=${2:-3}
cargo build --release --bins --example fixed_rate --example bare_proxy
results=target/bench/results.tsv
mkdir -p target/bench
: > "$results"

source scripts/loopback.sh

redis_port=$(port); upstream_port=$(port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & pids+=($!)
redis_pid=$!
./target/release/demo-upstream "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
upstream_pid=$!
wait_port "$redis_port"; wait_port "$upstream_port"
redis_stat() { redis-cli -p "$redis_port" info all | tr -d '\r'; }
# cpu_ticks PID...: user + system clock ticks the processes have used.
cpu_ticks() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
ticks_per_s=$(getconf CLK_TCK)

# Targets: number, label, URL, CPU PIDs (space-separated), in arrays indexed by number.
declare -A label url cpu_pids script

# sluice N LABEL BACKEND SERVER_EXTRA LIMITS [TOP_LEVEL]: starts a gateway for target N.
sluice() {
  local n=$1 name=$2 backend=$3 extra=$4 limits=$5 top=${6:-} proxy
  proxy=$(port)
  sluice_config "$n" "$proxy" "$backend" "$extra" "$limits" "$top"
  RUST_LOG=error ./target/release/sluice -c "$work/s$n.yaml" >/dev/null 2>&1 & pids+=($!)
  label[$n]=$name; url[$n]="http://127.0.0.1:$proxy/x"; cpu_pids[$n]=$!
  wait_port "$proxy"
}

# sluice_pair N LABEL LIMITS: two gateways for target N, on the same Redis.
sluice_pair() {
  local n=$1 name=$2 limits=$3 side proxy
  label[$n]="$name"; url[$n]=""; cpu_pids[$n]=""
  for side in a b; do
    proxy=$(port)
    sluice_config "$n$side" "$proxy" redis "" "$limits" "trusted_proxies: [127.0.0.1]"
    RUST_LOG=error ./target/release/sluice -c "$work/s$n$side.yaml" >/dev/null 2>&1 & pids+=($!)
    url[$n]+="http://127.0.0.1:$proxy/x "; cpu_pids[$n]+="$! "
    wait_port "$proxy"
  done
}

# sluice_config NAME PORT BACKEND SERVER_EXTRA LIMITS [TOP_LEVEL]: writes $work/sNAME.yaml.
sluice_config() {
  local n=$1 proxy=$2 backend=$3 extra=$4 limits=$5 top=${6:-}
  {
    echo "server: { pid_file: $work/s$n.pid, upgrade_sock: $work/s$n.sock, grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 0$extra }"
    echo "listen: [127.0.0.1:$proxy]"
    if [ -n "$top" ]; then echo "$top"; fi
    if [ "$backend" = redis ]; then echo "redis: { url: \"redis://127.0.0.1:$redis_port/0\", timeout_ms: 50 }"; fi
    echo "routes:"
    echo "  - name: bench"
    echo "    match: { path_prefix: / }"
    echo "    upstream: { servers: [127.0.0.1:$upstream_port] }"
    if [ -n "$limits" ]; then printf '    limits:\n%s\n' "$limits"; fi
  } > "$work/s$n.yaml"
}

# nginx_preamble WORKERS: the start of every nginx.conf here, up to the open http block: no
# access log, keep-alive to the client and to the demo upstream.
nginx_preamble() {
  cat <<NGINX
worker_processes $1;
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
NGINX
}

# nginx N LABEL WORKERS LUA: starts nginx for target N (LUA: 1 for the ngx_lua peer).
nginx_target() {
  local n=$1 name=$2 workers=$3 lua=$4 listen dir
  listen=$(port); dir="$work/nginx$n"
  mkdir -p "$dir/logs" "$dir/tmp"
  {
    if [ "$lua" = 1 ]; then
      echo "load_module /usr/lib/nginx/modules/ndk_http_module.so;"
      echo "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;"
    fi
    nginx_preamble "$workers"
    if [ "$lua" = 1 ]; then
      echo "    lua_package_path \"$PWD/benches/peers/openresty/?.lua;;\";"
      echo "    init_by_lua_block { require(\"ratelimit\").init(\"$PWD/benches/peers/openresty/token_bucket.lua\", \"127.0.0.1\", $redis_port) }"
    fi
    echo "    server {"
    echo "        listen 127.0.0.1:$listen;"
    echo "        location / {"
    if [ "$lua" = 1 ]; then echo "            access_by_lua_block { require(\"ratelimit\").access(1000000, 1000000) }"; fi
    echo "            proxy_pass http://backend;"
    echo "            proxy_http_version 1.1;"
    echo "            proxy_set_header Connection \"\";"
    echo "        }"
    echo "    }"
    echo "}"
  } > "$dir/nginx.conf"
  nginx -p "$dir" -c "$dir/nginx.conf" >/dev/null 2>&1 & pids+=($!)
  local master=$!
  wait_port "$listen"
  label[$n]=$name; url[$n]="http://127.0.0.1:$listen/x"
  cpu_pids[$n]=$(pgrep -P "$master" | tr '\n' ' ')
}

huge='{ name: per_client, key: [client_ip, path], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: exact }'
one="      - $huge"
three="      - $huge
      - { name: per_client_all, key: [client_ip], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: exact }
      - { name: per_route, key: [route], algorithm: fixed_window, rate: 1000000/s, mode: exact }"
tiny="      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1/h }"
hot="      - { name: global, key: [route], algorithm: gcra, rate: 1000000/s, burst: 1000000 }"
hot_exact="      - { name: global, key: [route], algorithm: gcra, rate: 1000000/s, burst: 1000000, mode: exact }"
cold="      - { name: per_client, key: [client_ip], algorithm: gcra, rate: 1000/s, burst: 999 }"

label[1]="upstream direct"; url[1]="http://127.0.0.1:$upstream_port/x"; cpu_pids[1]=$upstream_pid
bare_port=$(port)
./target/release/examples/bare_proxy "127.0.0.1:$bare_port" "127.0.0.1:$upstream_port" >/dev/null 2>&1 & pids+=($!)
label[0]="bare Pingora proxy"; url[0]="http://127.0.0.1:$bare_port/x"; cpu_pids[0]=$!
wait_port "$bare_port"
nginx_target 2 "nginx proxy, 1 worker" 1 0
nginx_target 3 "nginx proxy, 2 workers" 2 0
nginx_target 4 "nginx + ngx_lua token bucket in Redis" 2 1
sluice 5 "sluice, no limits" redis "" ""
sluice 6 "sluice, no limits, 1 thread" redis ", threads: 1" ""
sluice 7 "sluice, 1 GCRA limit" redis "" "$one"
sluice 8 "sluice, 3 limits" redis "" "$three"
sluice 9 "sluice, client over its limit" redis "" "$tiny"
sluice 10 "sluice, in-process backend" local "" "$one"
sluice_pair 11 "hot global limit, no mode (auto), 2 gateways" "$hot"
sluice_pair 12 "hot global limit, mode: exact, 2 gateways" "$hot_exact"
sluice_pair 17 "sluice, no limits, 2 gateways" ""
sluice 18 "cold per-client limit, no mode (a new client per request)" redis "" "$cold" "trusted_proxies: [127.0.0.1]"
script[18]="$work/cold.lua"
sluice 13 "sluice, access log, every request" redis "" "" "access_log: { enabled: true, path: $work/access13.log }"
sluice 14 "sluice, access log, 1 in 100" redis "" "" "access_log: { enabled: true, path: $work/access14.log, sample: 100 }"
# A local OTLP/HTTP sink for the tracing targets: answers every export with 200.
otlp_port=$(port)
python3 - "$otlp_port" >/dev/null 2>&1 <<'PY' & pids+=($!)
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
wait_port "$otlp_port"
sluice 15 "sluice, tracing, every request" redis "" "" "tracing: { enabled: true, endpoint: \"http://127.0.0.1:$otlp_port/v1/traces\", sample: 1 }"
sluice 16 "sluice, tracing, 1 in 100" redis "" "" "tracing: { enabled: true, endpoint: \"http://127.0.0.1:$otlp_port/v1/traces\", sample: 0.01 }"
# ONLY="5 13 14" runs those targets alone (medians only: no target table, open loop or TLS).
# shellcheck disable=SC2206 # one target per word
targets=(${ONLY:-0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18})

cat > "$work/report.lua" <<'LUA'
done = function(summary, latency, requests)
  io.write(string.format("REPORT %d %d %d %d %d %d\n", summary.requests, summary.errors.status,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), summary.duration))
end
LUA
# Every request from its own client: a random X-Forwarded-For (trusted from 127.0.0.1).
{
  cat "$work/report.lua"
  cat <<'LUA'
request = function()
  local client = string.format("10.%d.%d.%d", math.random(0, 255), math.random(0, 255), math.random(1, 254))
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = client })
end
LUA
} > "$work/cold.lua"

info_field() { awk -v name="$2" 'index($0, name) == 1 { print substr($0, length(name) + 1); exit }' <<<"$1"; }
# decision_calls INFO FIELD: FIELD of the decision calls, FCALL (functions) and EVALSHA (scripts) summed.
decision_calls() {
  local name total=0
  for name in cmdstat_fcall: cmdstat_evalsha:; do
    total=$(( total + $(info_field "$1" "$name" | tr ',' '\n' | awk -F= -v f="$2" '$1 == f { v = $2 } END { print v + 0 }') ))
  done
  echo "$total"
}

# drive N: wrk against target N for the run's length; its REPORT line(s). Two gateways: a wrk
# -t1 -c32 each, at the same time.
drive() {
  local n=$1 target
  local -a urls
  read -r -a urls <<<"${url[$n]}"
  if (( ${#urls[@]} == 1 )); then
    wrk -t2 -c64 -d"${seconds}s" -s "${script[$n]:-$work/report.lua}" "${urls[0]}" 2>&1
    return
  fi
  for target in "${urls[@]}"; do
    wrk -t1 -c32 -d"${seconds}s" -s "${script[$n]:-$work/report.lua}" "$target" 2>&1 &
  done
  wait
}

# One closed-loop wrk run of target N: appends "N req/s p50 p99 p99.9 non2xx cpu_us redis_us
# decision calls/req commands/req" to runs.tsv. Two gateways: their requests and durations
# summed (req/s is the sum of both rates), the larger of their latencies.
measure() {
  local n=$1 before after cpu0 cpu1 r0 r1 out requests non2xx p50 p99 p999 duration
  # shellcheck disable=SC2086 # one PID per word
  before=$(redis_stat); cpu0=$(cpu_ticks ${cpu_pids[$n]}); r0=$(cpu_ticks "$redis_pid")
  out=$(drive "$n")
  # shellcheck disable=SC2086
  cpu1=$(cpu_ticks ${cpu_pids[$n]}); r1=$(cpu_ticks "$redis_pid"); after=$(redis_stat)
  # Several REPORT lines: requests and errors summed, latencies the largest, the duration
  # scaled so requests / duration is the sum of the rates.
  read -r requests non2xx p50 p99 p999 duration < <(awk '/^REPORT/ {
      r += $2; e += $3; rate += $2 / $7; if ($4 > a) a = $4; if ($5 > b) b = $5; if ($6 > c) c = $6 }
    END { printf "%d %d %d %d %d %d\n", r, e, a, b, c, (rate > 0 ? r / rate : 0) }' <<<"$out")
  local calls=$(( $(decision_calls "$after" calls) - $(decision_calls "$before" calls) ))
  local commands=$(( $(info_field "$after" total_commands_processed:) - $(info_field "$before" total_commands_processed:) - 1 ))
  awk -v n="$n" -v r="$requests" -v bad="$non2xx" -v p50="$p50" -v p99="$p99" -v p999="$p999" \
      -v us="$duration" -v cpu="$(( cpu1 - cpu0 ))" -v rcpu="$(( r1 - r0 ))" -v hz="$ticks_per_s" \
      -v calls="$calls" -v commands="$commands" 'BEGIN {
    printf "%s\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%.1f\t%.2f\t%.3f\t%.3f\n", n, r / (us / 1e6), p50 / 1000,
      p99 / 1000, p999 / 1000, bad, cpu * 1e6 / hz / r, rcpu * 1e6 / hz / r, calls / r, commands / r
  }' >> "$work/runs.tsv"
}
for round in $(seq "$rounds"); do
  echo "round $round of $rounds..." >&2
  for n in "${targets[@]}"; do measure "$n"; done
done

# per_round N COLUMN: COLUMN of target N, one line per round, in round order.
per_round() { awk -F'\t' -v n="$1" -v c="$2" '$1 == n {print $c}' "$work/runs.tsv"; }
# settle OP LIMIT UNIT: judges the per-round figures on standard input (one per line) against
# "OP LIMIT" (<= or >=): their median, their range, and how far the median itself can be
# trusted, u: the half-width of its 95 % interval estimated from the rounds' median absolute
# deviation, 1.96 x 1.253 x 1.4826 x MAD / sqrt(rounds) (printed as a share of the median).
# Unlike the range, u narrows as rounds are added. The verdict is met or missed when the limit
# lies outside the median's interval, unsettled otherwise.
settle() {
  sort -g | awk -v op="$1" -v limit="$2" -v unit="$3" '{v[NR] = $1} END {
    n = NR; m = (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2); a = (m < 0 ? -m : m)
    for (i = 1; i <= n; i++) {
      x = (v[i] > m ? v[i] - m : m - v[i])
      for (j = i - 1; j >= 1 && d[j] > x; j--) d[j + 1] = d[j]
      d[j + 1] = x
    }
    mad = (n % 2 ? d[(n + 1) / 2] : (d[n / 2] + d[n / 2 + 1]) / 2)
    half = 3.64 * mad / sqrt(n); u = (a > 0 ? half / a * 100 : 0)
    met = (op == "<=" ? m <= limit : m >= limit)
    if ((m > limit ? m - limit : limit - m) > half) verdict = (met ? "**met**" : "**missed**")
    else verdict = sprintf("unsettled (the limit is within the median'"'"'s ±%.0f %%): more rounds", u)
    printf "%.2f%s (rounds %.2f to %.2f; median ±%.0f %%): %s", m, unit, v[1], v[n], u, verdict }'
}
# per_round_ratio A B COLUMN / per_round_difference A B COLUMN: each round's A over (minus) B.
per_round_ratio() { paste <(per_round "$1" "$3") <(per_round "$2" "$3") | awk '{print ($2 > 0 ? $1 / $2 : 0)}'; }
per_round_difference() { paste <(per_round "$1" "$3") <(per_round "$2" "$3") | awk '{print $1 - $2}'; }
# limiter_against_peer: each round's sluice limiter cost (gateway CPU 7 - 5, plus Redis CPU per
# request of 7) over the ngx_lua peer's (nginx CPU 4 - 3, plus Redis CPU per request of 4).
limiter_against_peer() {
  paste <(per_round 7 7) <(per_round 5 7) <(per_round 7 8) <(per_round 4 7) <(per_round 3 7) <(per_round 4 8) |
    awk '{peer = $4 - $5 + $6; print (peer > 0 ? ($1 - $2 + $3) / peer : 0)}'
}
# judgments: the targets table's judged rows (needs every target).
judgments() {
  echo "| 1 GCRA limit ≥ 1.0 × the ngx_lua peer's throughput (7 / 4) | $(per_round_ratio 7 4 2 | settle ">=" 1.0 " ×") |"
  echo "| 1 limit ≥ 0.90 × no limits (7 / 5) | $(per_round_ratio 7 5 2 | settle ">=" 0.90 " ×") |"
  echo "| 3 limits ≥ 0.85 × no limits (8 / 5) | $(per_round_ratio 8 5 2 | settle ">=" 0.85 " ×") |"
  echo "| the limiter's gateway CPU ≤ 8 µs per request (7 − 5) | $(per_round_difference 7 5 7 | settle "<=" 8 " µs") |"
  echo "| sluice CPU per proxied request ≤ 1.5 × nginx's, one thread / one worker (6 / 2) | $(per_round_ratio 6 2 7 | settle "<=" 1.5 " ×") |"
  echo "| sluice without limits ≤ 1.10 × the bare Pingora proxy's CPU per request (5 / 0, issue 37) | $(per_round_ratio 5 0 7 | settle "<=" 1.10 " ×") |"
  echo "| sluice's limiter ≤ 0.4 × the peer's Redis call, both processes counted ((7 − 5 + Redis of 7) / (4 − 3 + Redis of 4), issue 37) | $(limiter_against_peer | settle "<=" 0.4 " ×") |"
  leases_judged
}
# leases_judged: issue 37's rows on leases by default (targets 11, 17, 18).
leases_judged() {
  echo "| a hot shared GCRA limit with no mode ≥ 0.95 × no limits, 2 gateways each (11 / 17, issue 37) | $(per_round_ratio 11 17 2 | settle ">=" 0.95 " ×") |"
  echo "| a cold per-client limit with no mode is decided in Redis for every request: ≥ 1.9 Redis commands per request, a GCRA decision's GET and SET (0 when paid from a lease; its decision calls are fewer, coalesced) (18, issue 37) | $(per_round 18 10 | settle ">=" 1.9 "") |"
}
if [ -z "${ONLY:-}" ]; then
  extra=0
  # (Not `judgments | grep -q`: grep leaving early fails the pipeline under pipefail.)
  while (( extra < ${SETTLE:-0} )) && [[ $(judgments) == *unsettled* ]]; do
    extra=$((extra + 1)); rounds=$((rounds + 1))
    echo "round $rounds (a target is unsettled; $extra of at most ${SETTLE} more)..." >&2
    for n in "${targets[@]}"; do measure "$n"; done
  done
fi

# Medians per target, per column.
# median_in FILE N COLUMN: the median of COLUMN over the rows of target N in a results file.
median_in() { awk -F'\t' -v n="$2" -v c="$3" '$1 == n {print $c}' "$1" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
median() { median_in "$work/runs.tsv" "$@"; }
# spread N COLUMN: (max - min) / median of COLUMN over target N's rounds, in percent: how far one
# round's figure can be trusted; a ratio between two targets means little below the spreads.
spread() {
  awk -F'\t' -v n="$1" -v c="$2" '$1 == n {print $c}' "$work/runs.tsv" | sort -g |
    awk '{v[NR]=$1} END {m=v[int((NR+1)/2)]; printf "%.0f %%", (m > 0 ? (v[NR] - v[1]) / m * 100 : 0)}'
}
printf 'Medians of %d rounds, wrk -t2 -c64 -d%ss each, targets alternating:\n\n' "$rounds" "$seconds"
printf '| # | target | req/s | spread | p50 ms | p99 ms | p99.9 ms | non-2xx | serving CPU µs/req | spread | Redis CPU µs/req | decision calls/req | Redis cmds/req |\n'
printf '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n'
declare -A rps cpu redis_cpu p99
for n in "${targets[@]}"; do
  rps[$n]=$(median "$n" 2); p99[$n]=$(median "$n" 4); cpu[$n]=$(median "$n" 7); redis_cpu[$n]=$(median "$n" 8)
  printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$n" "${label[$n]}" "${rps[$n]}" \
    "$(spread "$n" 2)" "$(median "$n" 3)" "${p99[$n]}" "$(median "$n" 5)" "$(median "$n" 6)" "${cpu[$n]}" \
    "$(spread "$n" 7)" "${redis_cpu[$n]}" "$(median "$n" 9)" "$(median "$n" 10)"
  printf '%s\t%s\t%s\t%s\t%s\n' "$n" "${label[$n]}" "${rps[$n]}" "${p99[$n]}" "$(median "$n" 5)" >> "$results"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}'; }
if [ -n "${ONLY:-}" ]; then
  if [[ " ${targets[*]} " == *" 0 "* && " ${targets[*]} " == *" 5 "* ]]; then
    echo
    echo "sluice without limits ≤ 1.10 × the bare Pingora proxy's CPU per request (5 / 0, issue 37): $(per_round_ratio 5 0 7 | settle "<=" 1.10 " ×")"
  fi
  if [[ " ${targets[*]} " == *" 11 "* && " ${targets[*]} " == *" 17 "* && " ${targets[*]} " == *" 18 "* ]]; then
    echo
    leases_judged
  fi
  exit 0
fi
echo
echo "The access log's cost: every request logged $(ratio "${rps[13]}" "${rps[5]}") × the throughput of none (${cpu[13]} against ${cpu[5]} µs/req), 1 in 100 $(ratio "${rps[14]}" "${rps[5]}") ×."
echo "Tracing's cost: every request sampled $(ratio "${rps[15]}" "${rps[5]}") × (${cpu[15]} µs/req), 1 in 100 $(ratio "${rps[16]}" "${rps[5]}") × (${cpu[16]} µs/req)."
echo
echo "Targets (issues 17 and 26), from the medians above:"
echo
declare -A calls_per_req
for n in "${targets[@]}"; do calls_per_req[$n]=$(median "$n" 9); done
echo "| target | measured: the median of the rounds' own figures, their range, the median's uncertainty, the verdict |"
echo "| --- | --- |"
judgments
echo "| a 429 flood costs the gateway ≤ an allowed request (9 against 7) | ${cpu[9]} against ${cpu[7]} µs |"
echo "| cached denials call Redis 0 times (9) | ${calls_per_req[9]} decision calls per request |"
echo "| Redis CPU per decision, 1 limit (7), 3 limits (8) | ${redis_cpu[7]} µs, ${redis_cpu[8]} µs |"

# Open loop at half of target 5's peak: latency the limiter adds at a rate the gateway can hold,
# beside what the ngx_lua peer's Redis call adds to the plain nginx proxy (2 workers) at the
# same rate. As many rounds as the closed loop, the four targets back to back in alternating
# order; an added p99 is the median of the rounds' differences, so the machine's drift between
# rounds cancels (one round's p99 on two shared cores moves by a millisecond either way).
half=$(awk -v r="${rps[5]}" 'BEGIN {printf "%d", r / 2}')
echo
echo "Fixed rate ${half} req/s (half of target 5's peak), ${seconds}s, 64 connections, latency from the scheduled send time; medians of $rounds rounds, the targets alternating:"
echo
: > "$work/fixed.tsv"
for round in $(seq 1 "$rounds"); do
  order="3 4 5 7"; if (( round % 2 == 0 )); then order="7 5 4 3"; fi
  for n in $order; do
    addr=${url[$n]#http://}
    out=$(./target/release/examples/fixed_rate "${addr%/x}" /x "$half" "$seconds" 64)
    awk -v n="$n" -v round="$round" '{printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n, round, $6, $4, $8, $10, $12}' <<<"$out" >> "$work/fixed.tsv"
  done
done
fixed_median() { median_in "$work/fixed.tsv" "$@"; }
printf '| # | target | achieved req/s | non-2xx | p50 ms | p99 ms | p99.9 ms |\n| --- | --- | --- | --- | --- | --- | --- |\n'
for n in 3 4 5 7; do
  awk -v n="$n" -v l="${label[$n]}" -v r="$(fixed_median "$n" 3)" -v b="$(fixed_median "$n" 4)" \
    -v p50="$(fixed_median "$n" 5)" -v p99="$(fixed_median "$n" 6)" -v p999="$(fixed_median "$n" 7)" \
    'BEGIN {printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f |\n", n, l, r, b, p50 / 1000, p99 / 1000, p999 / 1000}'
done
# added_p99 WITH WITHOUT: each round's p99 difference (ms), sorted; then the median and all of them.
added_p99() {
  awk -F'\t' -v with="$1" -v without="$2" '{p99[$2, $1] = $6; rounds[$2] = 1}
    END {for (r in rounds) print (p99[r, with] - p99[r, without]) / 1000}' "$work/fixed.tsv" \
    | sort -g | awk '{v[NR] = $1; all = all sprintf("%s%.2f", NR > 1 ? ", " : "", $1)}
        END {printf "%.2f ms, the median of the rounds (%s)", v[int((NR + 1) / 2)], all}'
}
echo
echo "p99 added by sluice's limiter at that rate (7 − 5): $(added_p99 7 5); target ≤ 0.5 ms"
echo "p99 added by the peer's Redis call at that rate (4 − 3, both nginx with 2 workers): $(added_p99 4 3)"

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
{ nginx_preamble 2; cat <<NGINX
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
} > "$work/nginx-tls/nginx.conf"
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
  read -r n kind scheme tls_label <<<"$case"
  read -r s_rps s_lat s_bad s_cpu < <(tls_measure "$kind" "$scheme://127.0.0.1:$tls_sluice/x" "$tls_sluice_pid")
  # shellcheck disable=SC2086 # one PID per word
  read -r n_rps n_lat n_bad n_cpu < <(tls_measure "$kind" "$scheme://127.0.0.1:$tls_nginx/x" $tls_nginx_workers)
  awk -v n="$n" -v l="$tls_label" -v sr="$s_rps" -v nr="$n_rps" -v sl="$s_lat" -v nl="$n_lat" -v bad="$(( s_bad + n_bad ))" \
      -v sc="$s_cpu" -v nc="$n_cpu" \
    'BEGIN {printf "| %s | %s | %d | %d | %.2f | %.2f | %.2f | %d | %.1f | %.1f |\n", n, l, sr, nr, (nr > 0 ? sr / nr : 0), sl, nl, bad, sc, nc}'
done

echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo); redis $(redis-server --version | awk '{print $3}' | cut -d= -f2); nginx $(nginx -v 2>&1 | cut -d/ -f2); release build"
python3 scripts/chart.py "$results" docs/performance.svg
