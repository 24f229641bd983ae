"""The kernel benchmark's plumbing on the CPU: every step kind and every --sweep candidate runs once.

``benchmarks/decode_kernels.py --dry-run`` builds the benchmark's cases at tiny
sizes and runs each replay / conventional step (launchers and ops) under the
Triton interpreter, so a broken candidate or step is caught in CI, not in the
GPU run. Timing needs the GPU and is not tested.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.interpreter
def test_decode_kernels_dry_run():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decode_kernels.py"), "--dry-run"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("dry run") == 2 and "ok" in done.stdout
