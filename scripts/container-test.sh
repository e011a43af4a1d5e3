#!/usr/bin/env bash
# Runs sluice's image IMAGE (built by scripts/container.sh test) beside a real redis-server and
# the demo upstream, and checks what docs/deploy.md#container promises:
#   200, then 429 through the container, with its limit's keys in that Redis;
#   the process runs as user 65532 with no capabilities on a read-only root filesystem (only
#   /run/sluice, a volume as an emptyDir would be, is writable), and the image has no shell;
#   its logs reach the container's standard streams (the access log's lines);
#   SIGTERM drains: during the grace period /readyz answers 503 and new requests are still
#   served; a request in flight longer than the grace period is answered; the process exits by
#   itself (status 0) before podman's stop timeout.
# Where podman cannot start a container, it says why and checks the same on ROOTFS (the image's
# root filesystem) without a container runtime: chroot as 65532 on a read-only bind mount in new
# mount and PID namespaces. SLUICE_CONTAINER_RUNTIME=chroot forces that path.
# usage: scripts/container-test.sh IMAGE ROOTFS
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
# Every command this script runs beyond coreutils and util-linux (pgrep: procps).
install_missing redis-server:redis-server redis-cli:redis-tools curl:curl pgrep:procps unshare:util-linux
image=$1 rootfs=$(realpath "$2")
target=${CARGO_TARGET_DIR:-target}
binary_dir=$(dirname "${SLUICE_BINARY:-$target/release/sluice}")
deadline=$((SECONDS + ${SLUICE_CONTAINER_TIMEOUT:-120}))

say() { echo "container-test: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 30000))
    (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}
# Polls COMMAND until it succeeds; fails naming WHAT past the script's deadline.
eventually() {
  local what=$1; shift
  until "$@"; do
    [ $SECONDS -lt $deadline ] || fail "$what: not before the deadline"
    sleep 0.2
  done
}
status_of() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" || true; }

work=$(mktemp -d)
started=() container=""
cleanup() {
  [ -z "$container" ] || podman rm -f -t 0 "$container" >/dev/null 2>&1 || true
  for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Beside it: a Redis and the demo upstream, on free loopback ports of this host.
redis_port=$(free_port) upstream_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no >/dev/null &
started+=($!)
[ -x "$binary_dir/demo-upstream" ] || fail "no demo upstream at $binary_dir/demo-upstream (cargo build --bin demo-upstream)"
"$binary_dir/demo-upstream" "127.0.0.1:$upstream_port" >/dev/null &
started+=($!)
eventually "redis-server on $redis_port" bash -c "redis-cli -p $redis_port ping >/dev/null 2>&1"
eventually "demo upstream on $upstream_port" bash -c "echo >/dev/tcp/127.0.0.1/$upstream_port"

# The configuration a deployment would mount at /etc/sluice/sluice.yaml.
write_config() { # HOST_SEEN_FROM_SLUICE PROXY_LISTEN ADMIN_LISTEN
  cat >"$work/sluice.yaml" <<EOF
server: { grace_period_seconds: 3, graceful_shutdown_timeout_seconds: 5 }
listen: [$2]
admin: { listen: "$3" }
redis: { url: "redis://$1:$redis_port/0", timeout_ms: 500 }
failure_mode: deny          # a Redis the container cannot reach is a 503, never a silent 200
access_log: { enabled: true }
watch: true
routes:
  - name: slow
    match: { path_prefix: /slow/ }
    upstream: { servers: ["$1:$upstream_port"] }
  - name: api
    match: { path_prefix: / }
    upstream: { servers: ["$1:$upstream_port"] }
    limits: [{ name: two, key: [route], algorithm: fixed_window, rate: 2/m }]
EOF
  chmod 0644 "$work/sluice.yaml"
}

proxy_port=$(free_port) admin_port=$(free_port)
mode=${SLUICE_CONTAINER_RUNTIME:-podman}
runtime=()
if [ "$mode" = podman ]; then
  # Podman's defaults first; then runc with this machine's own limits; else no container.
  if ! out=$(podman run --rm "$image" --version 2>&1); then
    say "podman's default runtime cannot start a container here: $out"
    # Podman asks RLIMIT_NOFILE 1048576 and the largest RLIMIT_NPROC as root; give what the
    # machine allows (its hard open-file limit; 4096 threads, ample for sluice).
    hard_files=$(ulimit -Hn)
    runtime=(--runtime runc --ulimit "nofile=$hard_files:$hard_files" --ulimit "nproc=4096:4096")
    if out=$(podman run --rm "${runtime[@]}" "$image" --version 2>&1); then
      say "using: ${runtime[*]}"
    else
      say "nor with ${runtime[*]}: $out"
      say "so the image's root filesystem is tested without a container runtime (chroot), below"
      mode=chroot
    fi
  fi
fi

if [ "$mode" = podman ]; then
  # The host's loopback is 10.0.2.2 inside: Redis and the upstream stay on loopback.
  write_config 10.0.2.2 0.0.0.0:8080 0.0.0.0:9091
  container=sluice-test-$$
  # The one writable place, as an emptyDir would be (podman 4.3 with runc mounts a --tmpfs
  # 0755 root-owned whatever mode it is given).
  install -d -o 65532 -g 65532 -m 0700 "$work/run"
  podman run -d --name "$container" "${runtime[@]}" \
    --network slirp4netns:allow_host_loopback=true \
    -p "127.0.0.1:$proxy_port:8080" -p "127.0.0.1:$admin_port:9091" \
    --read-only --read-only-tmpfs=false -v "$work/run:/run/sluice:rw" \
    --cap-drop ALL --security-opt no-new-privileges \
    -v "$work/sluice.yaml:/etc/sluice/sluice.yaml:ro" \
    "$image" >/dev/null
  pid() { podman inspect --format '{{.State.Pid}}' "$container"; }
  logs() { podman logs "$container" 2>&1; }
  running() { [ "$(podman inspect --format '{{.State.Running}}' "$container")" = true ]; }
else
  command -v unshare >/dev/null && command -v chroot >/dev/null || fail "no unshare/chroot (util-linux, coreutils)"
  write_config 127.0.0.1 "127.0.0.1:$proxy_port" "127.0.0.1:$admin_port"
  # New mount and PID namespaces; the root filesystem bound read-only; /run a tmpfs with
  # /run/sluice in it; the configuration bound over the image's; then chroot, as 65532 (which
  # drops every capability: no ambient set is kept across the change of user).
  unshare --mount --pid --fork --kill-child -- bash -c '
    set -e; r=$1
    mount --make-rprivate /
    mount --bind "$r" "$r" && mount -o remount,bind,ro "$r"
    mount -t tmpfs -o mode=0755,size=1m tmpfs "$r/run" && install -d -o 65532 -g 65532 -m 0700 "$r/run/sluice"
    mount --bind "$2" "$r/etc/sluice/sluice.yaml" && mount -o remount,bind,ro "$r/etc/sluice/sluice.yaml"
    mount -t proc proc "$r/proc"
    for d in null zero urandom; do mount --bind "/dev/$d" "$r/dev/$d"; done
    RUNTIME_DIRECTORY=/run/sluice exec chroot --userspec=65532:65532 "$r" /usr/bin/sluice -c /etc/sluice/sluice.yaml
  ' - "$rootfs" "$work/sluice.yaml" >"$work/stdout.log" 2>"$work/stderr.log" &
  started+=($!)
  chrooted=$!
  pid() { pgrep -P "$(pgrep -P "$chrooted" | head -1)" | head -1 || pgrep -P "$chrooted" | head -1; }
  logs() { cat "$work/stdout.log" "$work/stderr.log"; }
  running() { kill -0 "$chrooted" 2>/dev/null; }
fi

proxy=http://127.0.0.1:$proxy_port admin=http://127.0.0.1:$admin_port
ready() {
  running || fail "sluice exited at start ($mode); its log: $(logs | tail -20)"
  [ "$(status_of "$admin/readyz")" = 200 ]
}
eventually "sluice ready ($mode)" ready
got=$(for _ in 1 2 3; do status_of "$proxy/api/x"; echo -n " "; done)
[ "$got" = "200 200 429 " ] || fail "expected 200 200 429 through the $mode image, got: $got; log: $(logs | tail -20)"
keys=$(redis-cli -p "$redis_port" --scan | wc -l)
[ "$keys" -gt 0 ] || fail "the limit wrote no key to Redis"
say "$mode: 200 200 429 through the image; $keys limiter key(s) in the Redis beside it"

# Who it runs as, with what, on what.
p=$(pid)
[ -n "$p" ] && [ -r "/proc/$p/status" ] || fail "cannot find sluice's process"
uid=$(awk '/^Uid:/{print $2}' "/proc/$p/status")
caps=$(awk '/^CapEff:/{print $2}' "/proc/$p/status")
root_options=$(awk '$5 == "/" {print $6}' "/proc/$p/mountinfo" | tail -1)
[ "$uid" = 65532 ] || fail "runs as uid $uid, not 65532"
[ "$caps" = 0000000000000000 ] || fail "effective capabilities $caps, not none"
[[ $root_options == ro* ]] || fail "root filesystem mounted $root_options, not read-only"
for shell in sh bash dash ash busybox; do
  [ ! -e "$rootfs/bin/$shell" ] && [ ! -e "$rootfs/usr/bin/$shell" ] || fail "the image has /bin/$shell"
done
if [ "$mode" = podman ]; then
  ! podman exec "$container" /bin/sh -c true >/dev/null 2>&1 || fail "a shell ran in the container"
fi
access_logged() { logs | grep -q '"status":429'; }
eventually "the access log line of the 429 on the container's output" access_logged
say "$mode: uid 65532, no capabilities (CapEff $caps), root filesystem ${root_options%%,*}, no shell; access log on standard output"

# SIGTERM: for the grace period it keeps serving and accepting while /readyz answers 503 (the
# load balancer takes it out); then it stops accepting and lets the request in flight — longer
# than the grace period — finish, within the shutdown timeout; then it exits by itself.
curl -s -o "$work/slow.out" -w '%{http_code}' --max-time 20 "$proxy/slow/5000" >"$work/slow.status" &
in_flight=$!
sleep 0.5
started_stop=$SECONDS
if [ "$mode" = podman ]; then
  podman kill --signal TERM "$container" >/dev/null
else
  kill -TERM "$p"
fi
not_ready() { [ "$(status_of "$admin/readyz")" = 503 ]; }
eventually "/readyz answering 503 once SIGTERM is received" not_ready
during=$(status_of "$proxy/slow/0")
[ "$during" = 200 ] || fail "a request sent during the grace period got '$during', not 200"
wait "$in_flight" || true
[ "$(cat "$work/slow.status")" = 200 ] || fail "the request in flight at SIGTERM (5 s, longer than the 3 s grace) got '$(cat "$work/slow.status")', not 200"
if [ "$mode" = podman ]; then
  code=$(timeout 30 podman wait "$container") || fail "still running 30 s after SIGTERM"
else
  timeout 30 tail --pid="$p" -f /dev/null || fail "still running 30 s after SIGTERM"
  code=0
fi
[ "$code" = 0 ] || fail "exited with status $code after SIGTERM"
say "$mode: SIGTERM drained: /readyz 503 and still serving during the grace period, the 5 s request in flight answered 200, exited 0 after $((SECONDS - started_stop)) s (grace_period_seconds 3, then at most graceful_shutdown_timeout_seconds 5)"
if [ "$mode" = podman ]; then
  say "image $image: $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec), root filesystem $(du -sh "$rootfs" | cut -f1)"
fi
say "passed ($mode)"
