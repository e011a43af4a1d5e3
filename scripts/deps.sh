#!/usr/bin/env bash
# Installs the Debian packages named as arguments when their command (or, for an absolute path,
# their file) is missing.
# Usage: install_missing COMMAND:PACKAGE ...   (e.g. cmake:cmake /usr/lib/x.so:libx)
# Sourced by quickstart.sh and test.sh; uses sudo when not root.
set -euo pipefail

install_missing() {
  local missing=() pair
  for pair in "$@"; do
    local need=${pair%%:*}
    if [[ $need == /* ]]; then
      [ -e "$need" ] || missing+=("${pair#*:}")
    else
      command -v "$need" >/dev/null 2>&1 || missing+=("${pair#*:}")
    fi
  done
  ((${#missing[@]})) || return 0
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

require_cargo() {
  command -v cargo >/dev/null 2>&1 && return 0
  echo "cargo not found: install Rust first (https://rustup.rs), then run this again" >&2
  exit 1
}
