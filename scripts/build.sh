#!/usr/bin/env bash
# Builds sandboxd and sandboxctl (PROFILE=release|dev, default release) and
# the static agent. Honours CARGO_TARGET_DIR, so CI can keep build products
# in a folder that outlives its fresh clones.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
if [[ $profile == release ]]; then
  cargo build --quiet --release --bins
else
  cargo build --quiet --bins
fi
scripts/build-agent.sh >/dev/null
