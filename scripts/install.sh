#!/usr/bin/env bash
# Puts a built sandboxd in place for systemd, as root: binaries, the static
# agent, the units, the tmpfiles entry and (if absent) the example config.
# Run scripts/build.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
prefix=${PREFIX:-/usr/local}
install -D -m 0755 "$target/release/sandboxd" "$prefix/bin/sandboxd"
install -D -m 0755 "$target/release/sandboxctl" "$prefix/bin/sandboxctl"
install -D -m 0755 "$target/x86_64-unknown-linux-gnu/release/sandbox-agent" "$prefix/lib/sandboxd/sandbox-agent"
install -D -m 0644 systemd/sandboxd.service /etc/systemd/system/sandboxd.service
install -D -m 0644 systemd/sandboxd.socket /etc/systemd/system/sandboxd.socket
install -D -m 0644 systemd/sandboxd.tmpfiles /usr/lib/tmpfiles.d/sandboxd.conf
install -D -m 0644 README.md "$prefix/share/doc/sandboxd/README.md"
[[ -e /etc/sandboxd/config.toml ]] || install -D -m 0644 systemd/config.toml /etc/sandboxd/config.toml
"$prefix/bin/sandboxd" --config /etc/sandboxd/config.toml --check-config
if [[ -d /run/systemd/system ]]; then
  systemd-tmpfiles --create /usr/lib/tmpfiles.d/sandboxd.conf
  systemctl daemon-reload
  echo "installed; start with: systemctl enable --now sandboxd.socket sandboxd.service"
else
  echo "installed (systemd is not running here; start sandboxd by hand)"
fi
