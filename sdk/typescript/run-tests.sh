#!/usr/bin/env bash
# Builds the TypeScript SDK and runs its tests: unit tests, a local TLS
# server for certificate pinning, and the integration tests, each file
# against its own real sandboxd (root needed; the daemon, agent and image
# cache come from SANDBOXD_BIN, SANDBOXD_AGENT, SANDBOXD_TEST_IMAGES_DIR,
# defaulting to this checkout's target/ and /var/lib/sandboxd/images).
#
#   sdk/typescript/run-tests.sh                         # everything
#   sdk/typescript/run-tests.sh test/unit.test.mjs      # some files
#
# npm's cache lives in /var/cache/sandboxd-sdk/npm (SANDBOXD_NPM_CACHE), so
# a clean clone installs offline once the packages were fetched once.
# Exits non-zero when any step or test fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

fail() {
    echo "sdk/typescript/run-tests.sh: $*" >&2
    exit 1
}

command -v node >/dev/null || fail "node is not installed (Node.js 18 or newer is needed; Debian: apt-get install nodejs npm)"
command -v npm >/dev/null || fail "npm is not installed (Debian: apt-get install npm)"
major="$(node -p 'process.versions.node.split(".")[0]')"
[ "$major" -ge 18 ] || fail "Node.js $(node --version) is too old; the SDK needs 18 or newer"
command -v python3 >/dev/null || fail "python3 is needed by the test harness (it receives the daemon's READY=1 datagram)"
command -v openssl >/dev/null || fail "openssl is needed by the TLS tests (they make self-signed certificates)"

cache="${SANDBOXD_NPM_CACHE:-/var/cache/sandboxd-sdk/npm}"
mkdir -p "$cache" || fail "cannot create the npm cache folder $cache"

echo "== npm ci (cache $cache)"
if ! npm ci --cache "$cache" --prefer-offline --no-audit --no-fund; then
    fail "npm ci failed (its output is above). The first run needs the npm registry (or SANDBOXD_NPM_CACHE pointing at a filled cache); later runs use $cache"
fi

echo "== tsc"
rm -rf dist
./node_modules/.bin/tsc -p tsconfig.json || fail "the TypeScript build failed (errors above)"

if [ "$#" -gt 0 ]; then
    files=("$@")
else
    files=(test/*.test.mjs)
fi

echo "== node --test ${files[*]}"
node --test "${files[@]}"
