#!/usr/bin/env bash
# The Python SDK's tests (as root: they start their own sandboxd).
#
# Makes or reuses a venv (SANDBOXD_SDK_VENV, default
# /var/cache/sandboxd-sdk/python-venv: outside the clone, so it survives a
# fresh one), installs the pinned test requirements from PyPI, then this
# package (`pip install ./sdk/python`, as a user would), and runs pytest.
# The daemon and agent are SANDBOXD_BIN and SANDBOXD_AGENT (default: the
# release build in target/). Extra arguments go to pytest, e.g.
#   sdk/python/run-tests.sh -m "not remote"   # leave out the remote-API tests
#   sdk/python/run-tests.sh -k stream
# Ends with pytest's summary line; exits non-zero when anything failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
trap 'echo "run-tests.sh: \"$BASH_COMMAND\" failed (exit $?, line $LINENO); its messages are above" >&2' ERR

venv=${SANDBOXD_SDK_VENV:-/var/cache/sandboxd-sdk/python-venv}
python=${PYTHON:-python3}

usable() {
	[[ -x $venv/bin/python ]] &&
		"$venv/bin/python" -c 'import sys, venv; sys.exit(sys.version_info < (3, 9))' 2>/dev/null
}
if ! usable; then
	if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
		echo "run-tests.sh: $python is older than Python 3.9; set PYTHON to a newer one" >&2
		exit 1
	fi
	rm -rf "$venv"
	mkdir -p "$(dirname "$venv")"
	if ! "$python" -m venv "$venv"; then
		echo "run-tests.sh: cannot make a venv with $python; on Debian: apt-get install python3-venv" >&2
		exit 1
	fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet -r "$here/requirements-test.txt"
# The pinned flit_core from above builds it: no unpinned build environment.
"${pip[@]}" install --quiet --no-deps --no-build-isolation --force-reinstall "$here"

out=${SANDBOXD_SDK_TEST_LOGS:-$(mktemp -d /var/tmp/sandboxd-sdk-python.XXXXXX)}
mkdir -p "$out"
cd "$here"
status=0
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -v -p no:cacheprovider \
	--junitxml="$out/junit.xml" "$@" tests || status=$?
echo "python sdk: junit report $out/junit.xml"
exit "$status"
