#!/usr/bin/env bash
# The main job on a fresh machine, as root: install what is needed, build,
# build the images, start sandboxd on its embedded defaults, and run Python
# in a fresh sandbox.
set -euo pipefail
cd "$(dirname "$0")/.."
# No step fails silently: say which one, so its own messages above make sense.
trap 'echo "setup.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO); its messages are above" >&2' ERR
scripts/install-deps.sh
scripts/build.sh
target=${CARGO_TARGET_DIR:-target}
bin="$target/release"
install -D -m 0755 "$target/x86_64-unknown-linux-gnu/release/sandbox-agent" /usr/local/lib/sandboxd/sandbox-agent
install -m 0755 "$bin/sandboxd" "$bin/sandboxctl" /usr/local/bin/

echo "building images (the first python build takes a few minutes; later runs reuse the cache)"
sandboxd image build busybox python >/dev/null

export SANDBOXD_SOCKET=/run/sandboxd/sandboxd.sock
if ! sandboxctl health >/dev/null 2>&1; then
  mkdir -p /var/log/sandboxd
  nohup sandboxd >>/var/log/sandboxd/sandboxd.log 2>&1 &
  for _ in $(seq 1 100); do
    sandboxctl health >/dev/null 2>&1 && break
    sleep 0.1
  done
fi
sandboxctl health
id=$(sandboxctl create --image python --memory 256Mi --ttl 120)
echo "sandbox $id:"
printf 'import platform, sys\nprint("hello from", platform.node(), "python", sys.version.split()[0])\nprint(sum(range(10**6)))\n' |
  sandboxctl run-code "$id" -
sandboxctl rm "$id" >/dev/null
echo "sandboxd is running (socket $SANDBOXD_SOCKET, log /var/log/sandboxd/sandboxd.log)"
