"""The HF parts benchmark's plumbing on the CPU (``benchmarks/hf_parts.py``): every case's dry run and ``--list``.

``hf_parts.py <cases> --dry-run`` checks every form of each case against float64 on tiny sizes, eagerly and
through dynamo's full-graph trace, so a broken form is caught in CI, not in the GPU run. Timing needs the GPU
and is not tested.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")  # the integration package imports it

pytestmark = pytest.mark.hf

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "hf_parts.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _run(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_case_dry_run(tmp_path):
    out = _run("--dry-run", "attention", "projections", "--json", str(tmp_path / "parts.json"))
    for case in ("attention", "projections"):
        assert f"dry run {case}: ok" in out, out[-2000:]
    result = json.loads((tmp_path / "parts.json").read_text())
    forms = {r["variant"] for r in result["attention"]["rows"]}
    assert {"packed sdpa (auto)", "replayssm grouped products", "stock repeat_kv + sdpa"} <= forms
    assert {r["form"] for r in result["projections"]["rows"]} == {"separate", "fused"}
    for rows in (result["attention"]["rows"], result["projections"]["rows"]):
        assert {r["mode"] for r in rows} == {"eager", "inductor"} and all(r["rel_err"] < 1e-2 for r in rows)


def test_list_names_every_case():
    assert [line.split()[0] for line in _run("--list").splitlines()] == ["attention", "projections"]
