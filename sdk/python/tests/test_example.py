"""The example agent tool (examples/python/run_agent_code.py), run as written."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.daemon

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python" / "run_agent_code.py"


def test_the_example_runs_as_a_script(daemon):
    env = dict(os.environ, SANDBOXD_SOCKET=daemon.socket)
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "import sys\nprint(6 * 7)\nprint('careful', file=sys.stderr)"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "exit code: 0\n--- stdout ---\n42\n--- stderr ---\ncareful\n\n"
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "-"], input="raise SystemExit(4)", env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0 and out.stdout.startswith("exit code: 4\n"), out
    out = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "run_agent_code" in out.stderr


def test_the_example_function_times_out_and_clips(daemon):
    spec = importlib.util.spec_from_file_location("run_agent_code", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.run_agent_code("import time\nprint('begun', flush=True)\ntime.sleep(600)", timeout=1)
    assert text.startswith("exit code: 137 (timed out after 1 s: killed)\n"), text
    assert "begun\n" in text
    text = module.run_agent_code("print('x' * 50000)")
    assert "more characters cut" in text and len(text) < 21000
    text = module.run_agent_code("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=5)")
    assert text.startswith("exit code: 1\n") and "URLError" in text
