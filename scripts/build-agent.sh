#!/usr/bin/env bash
# Builds the in-sandbox agent as a static executable: it is PID 1 in images
# that may have no C library. The explicit --target keeps the static flags off
# build scripts and proc macros, and puts the result where sandboxd looks.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --quiet -p sandbox-agent --release --target x86_64-unknown-linux-gnu
echo "target/x86_64-unknown-linux-gnu/release/sandbox-agent"
