#!/usr/bin/env python3
"""The code tool an agent gets: run a snippet in a fresh sandbox, say what
happened, leave nothing behind.

    python3 examples/python/run_agent_code.py 'print(6 * 7)'
    echo 'import sys; print(sys.version)' | python3 examples/python/run_agent_code.py -

Needs the SDK (`pip install ./sdk/python` in a venv) and a daemon: the
socket in SANDBOXD_SOCKET (default /run/sandboxd/sandboxd.sock), or the
remote API in SANDBOXD_URL + SANDBOXD_TOKEN (+ SANDBOXD_TLS_FINGERPRINT).
"""

from __future__ import annotations

import sys

from sandboxd import Sandbox

# What the model gets back is bounded: a runaway print loop must not flood it.
MAX_OUTPUT_CHARS = 20_000


def _clip(text: str) -> str:
    if len(text) <= MAX_OUTPUT_CHARS:
        return text
    return text[:MAX_OUTPUT_CHARS] + f"\n[... {len(text) - MAX_OUTPUT_CHARS} more characters cut]\n"


def run_agent_code(code: str, timeout: float = 30.0) -> str:
    """Runs Python ``code`` in a new sandbox (no network, 1 CPU, 512 MiB) for
    at most ``timeout`` seconds and returns its exit code, stdout and stderr
    as text for the model. The sandbox is deleted whatever happens."""
    sandbox = Sandbox(image="python", cpu=1, memory="512Mi", block_network=True, keep_warm_seconds=300).create()
    try:
        # The daemon kills the whole process tree when the timeout passes.
        result = sandbox.process.run_code(code, timeout=timeout)
    finally:
        sandbox.terminate()
    status = f"exit code: {result.exit_code}"
    if result.timed_out:
        status += f" (timed out after {timeout:g} s: killed)"
    return (
        f"{status}\n"
        f"--- stdout ---\n{_clip(result.stdout.read())}"
        f"--- stderr ---\n{_clip(result.stderr.read())}"
    )


def main(argv: list) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    code = sys.stdin.read() if argv[1] == "-" else argv[1]
    print(run_agent_code(code))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
