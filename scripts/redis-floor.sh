#!/usr/bin/env bash
# What Redis itself spends per limiter call (docs/performance.md): usec_per_call of the decision
# script a gateway sends for GCRA limits, as an EVALSHA of the script (`sluice
# --print-script=gcra`: the one holding exactly the algorithms of the call; what a server before
# Redis 7 runs) and as an FCALL of its function library (`--print-library=gcra`: what Redis 7
# runs), for one and three GCRA limits, alone and in batches of 8 requests
# (coalesced decisions), of the OpenResty-style peer's token bucket, and of bare scripts that only
# do the unavoidable work (read the clock, read each key, write each key with a TTL, reply six
# integers per limit) — the floor any script with one key per limit pays; and the settlement a
# limit priced by the response adds when its response ends (lua/settle.lua charging a GCRA key).
# redis-benchmark drives each for a fixed count, 16 clients, one request in flight each, keys
# spread over 100,000 clients; every call is allowed. Redis runs on core 1 and redis-benchmark on
# core 0 (this machine's noise is otherwise ±20 %); ROUNDS rounds alternate the scripts and the
# median of each is printed; a script's "× floor" is the median of its rounds' ratios to the
# floor run just before it in the same round.
# METER=instructions counts instead of timing: Redis runs under valgrind's callgrind, and each
# script's user-space instructions per call are read from its profile, in the command (`call()`,
# inclusive: what usec_per_call times) and in the whole server (with reading the request and
# writing the reply, which usec_per_call leaves out). Counts do not drift with the machine, so
# one round is enough; they weigh a cache miss like any instruction, which is why the floor,
# mostly dictionary lookups over 100,000 keys, costs more time per instruction than Lua does.
# Usage: scripts/redis-floor.sh [CALLS] [ROUNDS]   (default 100000 and 5; about 5 min)
#        METER=instructions scripts/redis-floor.sh [CALLS]   (default 3000; about 2 min)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
install_missing redis-server:redis-server redis-benchmark:redis-tools
meter=${METER:-time}
case $meter in
  time) calls=${1:-100000}; rounds=${2:-5} ;;
  instructions) install_missing valgrind:valgrind callgrind_annotate:valgrind \
                  callgrind_control:valgrind
                calls=${1:-3000}; rounds=1 ;;
  *) echo "METER is time or instructions, not $meter" >&2; exit 2 ;;
esac
sluice_bin=${SLUICE_BIN:-target/release/sluice}
if [ -z "${SLUICE_BIN:-}" ]; then cargo build --release --quiet --bin sluice; fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
pin() { if [ "$(nproc)" -ge 2 ]; then taskset -c "$1" "${@:2}"; else "${@:2}"; fi; }
results=$(mktemp -d)
redis=(redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no)
if [ "$meter" = instructions ]; then
  valgrind --tool=callgrind --callgrind-out-file="$results/callgrind.out" "${redis[@]}" >/dev/null 2>&1 &
else
  pin 1 "${redis[@]}" >/dev/null 2>&1 &
fi
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$results"' EXIT INT TERM
for _ in $(seq 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done

cli() { redis-cli -p "$port" "$@"; }
# metered COMMAND ARGS...: $calls calls of the command through redis-benchmark, and what they
# cost per call: usec_per_call (time), or instructions in the command and in the whole server.
dumps=0
metered() {
  local command=$1 per_call
  if [ "$meter" = time ]; then
    cli config resetstat >/dev/null
    pin 0 redis-benchmark -p "$port" -n "$calls" -c 16 -r 100000 -q "$@" >/dev/null 2>&1
    cli info commandstats | tr -d '\r' |
      awk -F'usec_per_call=' -v c="cmdstat_$command:" 'index($0, c) == 1 {split($2, v, ","); print v[1]}'
    return
  fi
  redis-benchmark -p "$port" -n 200 -c 4 -r 100000 -q "$@" >/dev/null 2>&1 # warm-up
  cli flushall >/dev/null
  callgrind_control -z "$server" >/dev/null
  redis-benchmark -p "$port" -n "$calls" -c 16 -r 100000 -q "$@" >/dev/null 2>&1
  callgrind_control -d "$command" "$server" >/dev/null
  dumps=$((dumps + 1))
  local profile="$results/callgrind.out.$dumps"
  local in_command whole
  # call() is Redis's command execution; the first line is its outermost (inclusive) level.
  in_command=$(callgrind_annotate --inclusive=yes "$profile" 2>/dev/null |
    awk '/\?\?\?:call \[/ && !n++ {gsub(",", "", $1); print $1}')
  whole=$(callgrind_annotate "$profile" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  awk -v a="$in_command" -v b="$whole" -v n="$calls" 'BEGIN {printf "%.0f %.0f\n", a / n, b / n}'
}
# measure LABEL DECISIONS SCRIPT NUMKEYS ARGS...: what EVALSHA of SCRIPT costs per call, appended
# to results/<n> (one line per round).
labels=()
case_no=0
measure() {
  local label=$1 decisions=$2 script=$3 sha
  shift 3
  case_no=$((case_no + 1))
  [ "$round" = 1 ] && labels+=("$label|$decisions")
  sha=$(cli script load "$script")
  cli flushall >/dev/null
  metered evalsha "$sha" "$@" >>"$results/$case_no"
}
sluice=$("$sluice_bin" --print-script=gcra)
library=$("$sluice_bin" --print-library=gcra)
function_name=$(head -1 <<<"$library" | sed 's/^#!lua name=//')
# measure_fcall LABEL DECISIONS NUMKEYS ARGS...: the same for an FCALL of the GCRA library.
measure_fcall() {
  local label=$1 decisions=$2
  shift 2
  case_no=$((case_no + 1))
  [ "$round" = 1 ] && labels+=("$label|$decisions")
  cli flushall >/dev/null
  cli function load replace "$library" >/dev/null
  metered fcall "$function_name" "$@" >>"$results/$case_no"
}
id=00000000000000000000000000000001
gcra="gcra 1 1000000 0 1 0"
reply="return {1, 0, 0, 1, 0, 1763500000123456}"
floor1="local t = redis.call('TIME') local v = redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '1763500000123456', 'PX', 1000) $reply"
floor3="local t = redis.call('TIME') for i = 1, 3 do redis.call('GET', KEYS[i]) end for i = 1, 3 do redis.call('SET', KEYS[i], '1763500000123456', 'PX', 1000) end $reply"
floor_n="local t = redis.call('TIME') for i = 1, #KEYS do redis.call('GET', KEYS[i]) redis.call('SET', KEYS[i], '1763500000123456', 'PX', 1000) end $reply"
batch_keys=""; batch_args=""; batch3_keys=""; batch3_args=""
for i in 1 2 3 4 5 6 7 8; do
  batch_keys="$batch_keys {k$i}:a:__rand_int__"
  batch_args="$batch_args 0000000000000000000000000000000$i 1 $gcra"
  batch3_keys="$batch3_keys {k$i}:a:__rand_int__ {k$i}:b:__rand_int__ {k$i}:c:__rand_int__"
  batch3_args="$batch3_args 0000000000000000000000000000000$i 3 $gcra $gcra $gcra"
done
settle=$(for f in prelude gcra fixed_window settle; do cat "lua/$f.lua"; echo; done)

for round in $(seq "$rounds"); do
  case_no=0
  measure "floor: TIME + GET + SET PX" 1 "$floor1" 1 a:__rand_int__
  # shellcheck disable=SC2086 # one argument per word
  measure "sluice, 1 GCRA limit" 1 "$sluice" 1 a:__rand_int__ "" 1 $id 1 $gcra
  # shellcheck disable=SC2086
  measure_fcall "sluice, 1 GCRA limit, FCALL" 1 1 a:__rand_int__ "" 1 $id 1 $gcra
  measure "peer token bucket (TIME + HMGET + HSET + PEXPIRE)" 1 "$(cat benches/peers/openresty/token_bucket.lua)" 1 p:__rand_int__ 1000000 1000000 1
  # shellcheck disable=SC2086
  measure "floor: TIME + 3 × (GET + SET PX)" 1 "$floor3" 3 a:__rand_int__ b:__rand_int__ c:__rand_int__
  # shellcheck disable=SC2086
  measure "sluice, 3 GCRA limits" 1 "$sluice" 3 a:__rand_int__ b:__rand_int__ c:__rand_int__ "" 1 $id 3 $gcra $gcra $gcra
  # shellcheck disable=SC2086
  measure_fcall "sluice, 3 GCRA limits, FCALL" 1 3 a:__rand_int__ b:__rand_int__ c:__rand_int__ "" 1 $id 3 $gcra $gcra $gcra
  # shellcheck disable=SC2086
  measure "floor: TIME + 8 × (GET + SET PX), one call" 8 "$floor_n" 8 $batch_keys
  # shellcheck disable=SC2086
  measure "sluice, a batch of 8 requests of 1 GCRA limit" 8 "$sluice" 8 $batch_keys "" 8 $batch_args
  # shellcheck disable=SC2086
  measure_fcall "sluice, a batch of 8 requests of 1 GCRA limit, FCALL" 8 8 $batch_keys "" 8 $batch_args
  # shellcheck disable=SC2086
  measure "floor: TIME + 24 × (GET + SET PX), one call" 8 "$floor_n" 24 $batch3_keys
  # shellcheck disable=SC2086
  measure "sluice, a batch of 8 requests of 3 GCRA limits" 8 "$sluice" 24 $batch3_keys "" 8 $batch3_args
  # shellcheck disable=SC2086
  measure_fcall "sluice, a batch of 8 requests of 3 GCRA limits, FCALL" 8 24 $batch3_keys "" 8 $batch3_args
  measure "sluice settle: a response's charge on 1 GCRA key" 1 "$settle" 1 a:__rand_int__ "" gcra 1000 5 0
done

if [ "$meter" = instructions ]; then
  echo "| script | instructions per call, in the command | per decision | × floor | in the whole server, per decision | × floor |"
  echo "| --- | --- | --- | --- | --- | --- |"
  for i in "${!labels[@]}"; do
    label=${labels[$i]%|*}; decisions=${labels[$i]#*|}
    read -r in_command whole <"$results/$((i + 1))"
    case $label in floor*) floor_command=$in_command; floor_whole=$whole ;; esac
    awk -v l="$label" -v c="$in_command" -v w="$whole" -v d="$decisions" -v fc="$floor_command" \
      -v fw="$floor_whole" 'BEGIN {
        ratio = (l ~ /^sluice,/); printf "| %s | %d | %d | %s | %d | %s |\n", l, c, c / d,
          ratio ? sprintf("%.2f", c / fc) : "", w / d, ratio ? sprintf("%.2f", w / fw) : "" }'
  done
  echo
  echo "redis $(redis-server --version | awk '{print $3}' | cut -d= -f2) under callgrind; $calls calls per script"
  exit 0
fi
median() { sort -g "$1" | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "| script | usec_per_call (median of $rounds) | per decision | × floor (median of the rounds' ratios) |"
echo "| --- | --- | --- | --- |"
floor_file=""
for i in "${!labels[@]}"; do
  label=${labels[$i]%|*}; decisions=${labels[$i]#*|}
  per_call=$(median "$results/$((i + 1))")
  per_decision=$(awk -v c="$per_call" -v d="$decisions" 'BEGIN {printf "%.2f", c / d}')
  ratio=""
  case $label in
    floor*) floor_file="$results/$((i + 1))" ;;
    # Each round runs the floor and the script back to back, so the ratio is taken per round
    # (the machine's drift between rounds cancels) and its median printed.
    sluice,*) ratio=$(paste "$results/$((i + 1))" "$floor_file" | awk '{printf "%.4f\n", $1 / $2}' > "$results/ratio"; median "$results/ratio")
              ratio=$(awk -v r="$ratio" 'BEGIN {printf "%.2f", r}') ;;
  esac
  echo "| $label | $per_call | $per_decision | $ratio |"
done
echo
echo "machine: $(nproc) cores; redis $(redis-server --version | awk '{print $3}' | cut -d= -f2); $calls calls per script and round"
