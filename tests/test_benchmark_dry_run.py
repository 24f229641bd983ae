"""The kernel benchmarks' plumbing on the CPU: every step kind and every --sweep candidate runs once;
the speculative sweep's candidate lists.

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


def test_spec_sweep_times_each_table_entry(monkeypatch):
    """``spec_kernels.py --sweep`` keeps the fastest candidate per launch table: the table's own entry is
    among the candidates for every geometry (first, if the sweep's list lacks it), so a sweep can only
    replace it by something it timed."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import spec_kernels
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from replayssm.ops.triton import configs
    from replayssm.ops.triton.configs import LaunchConfig

    unlisted = LaunchConfig(32, 4, 1, num_stages=7, form="mma")  # in no candidate list
    monkeypatch.setitem(configs._GDN_VERIFY, (128, 128), unlisted)
    seen = 0
    for geometry in spec_kernels.GEOMETRIES.values():
        for name, table, key, candidates in spec_kernels.sweep_tables(geometry):
            assert len(set(candidates)) == len(candidates), name
            if key in table:
                assert table[key] in candidates, (name, key)
                seen += 1
            if name == "_GDN_VERIFY":
                assert candidates[0] == unlisted
    assert seen >= 6  # the verify, flush and weights tables of both families


@pytest.mark.parametrize("args, message", [(["--tokens", "1", "6"], "--tokens: draft lengths must be 2 to the window"), (["--batches", "0"], "--batches")])
def test_spec_sweep_points_are_checked(args, message):
    """``spec_kernels.py --tokens / --batches`` (the sweeps' points) refuse a bad value before any GPU work."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "spec_kernels.py"), *args], env=env, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_spec_read_copy_steps_carry_the_copy(family):
    """``spec_kernels.py --read-dtype``'s verify + commit steps pass the state's read copy to the op: over
    a sequence that flushes every row, the step matches the reference (outputs and every state tensor,
    the copy included) and the copy ends as the bf16 rounding of the checkpoint. (On the CPU the op runs
    its reference; the GPU run checks the kernels the same way before timing them.)"""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import spec_kernels
        from decode_kernels import DRY_GEOMETRIES, check_failure
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import torch

    geometry = next(g for n, g in DRY_GEOMETRIES.items() if n.startswith(family))
    case = spec_kernels.SpecCase(geometry, 3, 4, "half", read_dtype=torch.bfloat16, device="cpu")
    assert case.snapshots is None and case.base.state.read_checkpoint is not None
    case.base.set_phase("staggered")
    assert check_failure(case.check()) is None
    before = case.base.state.read_checkpoint.clone()
    for step in case.replay_steps():  # 16 steps of 2 accepted tokens: every row flushes at least once
        step()
    st = case.base.state
    assert not torch.equal(st.read_checkpoint, before)
    torch.testing.assert_close(st.read_checkpoint, st.checkpoint.to(torch.bfloat16), rtol=0, atol=0)
