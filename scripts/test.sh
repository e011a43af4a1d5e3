#!/usr/bin/env bash
# Runs every test of sluice. On a fresh Debian machine it first installs what the tests need:
# a C toolchain and cmake (Pingora builds zlib-ng), redis-server (the tests start their own
# servers on free loopback ports; redis-cli builds the test cluster), systemd-analyze (the unit file is
# verified), curl and openssl (the edge tests drive real TLS and HTTP/2 clients), and promtool
# (the observability tests lint /metrics with it), iproute2 and iptables (the fault suite cuts one
# gateway off from Redis in a network namespace of its own), and Debian's chromium (the dashboard's
# test loads every page in it, headless). promtool is taken out of Debian's prometheus
# package into target/tools rather than installed: installing the package would also start a
# Prometheus server.
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server redis-cli:redis-tools systemd-analyze:systemd curl:curl openssl:openssl \
  ip:iproute2 iptables:iptables chromium:chromium
if ! command -v promtool >/dev/null 2>&1 && [ ! -x target/tools/promtool ]; then
  echo "fetching promtool from Debian's prometheus package into target/tools" >&2
  mkdir -p target/tools
  (cd target/tools && apt-get download -qq prometheus >/dev/null &&
    dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool &&
    mv usr/bin/promtool . && rm -rf usr prometheus_*.deb)
fi
PATH="$PWD/target/tools:$PATH" cargo test "$@"
