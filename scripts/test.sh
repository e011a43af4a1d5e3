#!/usr/bin/env bash
# Runs every test of sluice. On a fresh Debian machine it first installs what the tests need:
# a C toolchain and cmake (Pingora builds zlib-ng), redis-server (the tests start their own
# servers on free loopback ports; redis-cli builds the test cluster), systemd-analyze (the unit file is
# verified), and curl and openssl (the edge tests drive real TLS and HTTP/2 clients).
# Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server redis-cli:redis-tools systemd-analyze:systemd curl:curl openssl:openssl
cargo test "$@"
