#!/usr/bin/env bash
# sluice's container image (Containerfile; docs/deploy.md#container), built and run with Debian's
# podman.
#
#   scripts/container.sh build   the release binary, then the image localhost/sluice:VERSION
#   scripts/container.sh test    the image, then runs it beside a Redis: 200, then 429, with its
#                                limits in that Redis, as user 65532 on a read-only root
#                                filesystem with every capability dropped; reports its size and
#                                how long SIGTERM takes to drain it
#
# Where base images cannot be pulled (no registry), the root filesystem is assembled on this
# (Debian bookworm) host by scripts/rootfs.sh from the same Debian packages the Containerfile's
# build stage uses, and the image is built from it (ROOTFS_FROM=prebuilt). Where podman cannot
# start containers at all, `test` says exactly what failed and runs the image's own root
# filesystem instead: its binary, chrooted, as user 65532, on a read-only bind mount, in new mount
# and PID namespaces. It never skips.
#
# Environment:
#   SLUICE_BINARY=PATH        put this binary in the image instead of building the release one
#                             (CI: target/debug/sluice, already built by the tests)
#   SLUICE_IMAGE_FROM=registry  build the Containerfile's own build stage (pulls rust:*-bookworm)
#   CARGO_BUILD_LOCK=FILE     hold this lock (flock) while cargo builds
#   SLUICE_CONTAINER_TIMEOUT  seconds the run may take once built (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
image=localhost/sluice:$version
target=${CARGO_TARGET_DIR:-target}
rootfs=target/container/rootfs

say() { echo "container.sh: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }

locked() {
  if [ -n "${CARGO_BUILD_LOCK:-}" ]; then flock "$CARGO_BUILD_LOCK" "$@"; else "$@"; fi
}

# The root filesystem from Debian packages, with the binary (built now unless SLUICE_BINARY).
assemble_rootfs() {
  install_missing apt-get:apt dpkg-deb:dpkg
  if [ -n "${SLUICE_BINARY:-}" ]; then
    scripts/rootfs.sh "$rootfs" "$SLUICE_BINARY"
  else
    require_cargo
    install_missing cc:build-essential cmake:cmake
    # In the lock: another build must not replace the binary before it is copied.
    locked bash -c "cargo build --release --locked --bin sluice --bin demo-upstream && scripts/rootfs.sh '$rootfs' '$target/release/sluice'"
  fi
}

build() {
  # podman runs rootful containers with runc, and their network needs slirp4netns (a fresh
  # Debian machine has none of them: install_missing, not a hope).
  install_missing podman:podman runc:runc slirp4netns:slirp4netns
  if [ "${SLUICE_IMAGE_FROM:-}" = registry ]; then
    podman build -t "$image" -f Containerfile .
  else
    assemble_rootfs
    podman build -q --build-arg ROOTFS_FROM=prebuilt -t "$image" -f Containerfile . >/dev/null
  fi
  say "built $image: $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) ($(podman image inspect --format '{{.Config.User}}' "$image") user, entrypoint $(podman image inspect --format '{{.Config.Entrypoint}}' "$image"))"
}

case "${1:-}" in
  build) build ;;
  test) build && exec bash scripts/container-test.sh "$image" "$rootfs" ;;
  *) echo "usage: scripts/container.sh build|test" >&2; exit 2 ;;
esac
