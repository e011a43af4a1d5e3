#!/usr/bin/env bash
# One limit across regions, the long form (docs/multi-region.md): tests/regions.rs with every
# phase three windows long — three redis-servers persisting, a gateway each, relays emulating
# 80/150/250 ms one way with jitter, traffic skewed to one region, a round-robin attacker while
# one region is cut off for 10 s and while another is killed and restarted — on a release build.
# Then the simulation's table. Prints the tables docs/multi-region.md shows and fails if any
# window admitted past its bound. About 3 minutes once built; installs what it runs.
#
# Usage: scripts/regions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
require_cargo
install_missing cc:build-essential cmake:cmake redis-server:redis-server
table=$(mktemp)
trap 'rm -f "$table"' EXIT
SLUICE_REGIONS=long SLUICE_REGION_TABLE=$table \
  cargo test --release --test regions -- --test-threads 1
echo
echo "$(date -u +%F), $(nproc) cores, Redis $(redis-server --version | awk '{print $3}' | sed 's/^v=//'), SLUICE_REGIONS=long:"
echo
echo "| window | traffic | consistency | offered | admitted | across a boundary | bound | bound as written |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
cat "$table"
echo
cargo test --release --lib regions::simulation::tests::every_pattern -- --nocapture 2>/dev/null | grep '^|'
