"""The kernel benchmarks' plumbing on the CPU (``benchmarks/kernel_bench.py``): every case's dry run, the sweeps'
candidate lists, the options checked before any GPU work.

``kernel_bench.py <cases> --dry-run`` runs each case's code on tiny sizes under the Triton interpreter, every
timing replaced by one call of the first step, and checks every step kind and every ``--sweep`` candidate
against the reference, so a broken candidate or step is caught in CI, not in the GPU run. Timing needs the
GPU and is not tested.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "kernel_bench.py"


def _kernels_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import kernel_bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return kernel_bench


@pytest.mark.interpreter
def test_every_case_dry_run():
    """Each case's dry run with every option that adds steps (sweeps, breakdown, a read copy, the batch / window
    / draft-length sweeps); two processes side by side (the spec case is the longest)."""
    options = ["--dry-run", "--sweep", "--breakdown", "--read-dtype", "fp16", "--accept", "random"]
    groups = [["spec"], ["decode", "conv", "resources"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1"}
    procs = [
        subprocess.Popen([sys.executable, str(SCRIPT), *cases, *options], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cases in groups
    ]
    for cases, proc in zip(groups, procs):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        for case in cases:
            if case != "resources":  # compiles for a GPU target: nothing to run under the interpreter
                assert f"dry run {case}: ok" in out, out[-2000:]


@pytest.mark.interpreter
def test_fp8_read_copy_dry_run_takes_the_mamba2_geometries():
    """``--read-dtype fp8``: the headline steps reading an fp8 copy run and check for Mamba-2; GDN, which
    refuses an fp8 copy, is left out (and a GDN-only choice is an error naming the option)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, str(SCRIPT), "decode", "spec", "--dry-run", "--headline-only", "--read-dtype", "fp8"],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "dry run decode: ok" in run.stdout and "dry run spec: ok" in run.stdout
    assert "float8_e4m3fn" in run.stdout and "mamba2-tiny" in run.stdout and "gdn-tiny" not in run.stdout
    kernels = _kernels_module()
    with pytest.raises(SystemExit) as exit:
        kernels.main(["decode", "--read-dtype", "fp8", "--geometries", "gdn-16x32x128x128"])
    assert exit.value.code == 2


def test_list_names_every_case(capsys):
    kernels = _kernels_module()
    kernels.main(["--list"])
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == list(kernels.CASES)


def test_sweeps_time_each_table_entry(monkeypatch):
    """``--sweep`` keeps the fastest candidate per launch table: the table's own entry is among the candidates
    for every geometry (first, if the list lacks it), so a sweep can only replace it by something it timed; no
    candidate twice; only forms the kernels still have."""
    kernels = _kernels_module()
    from replayssm.ops.gdn import launch as gdn_launch
    from replayssm.ops.launch import LaunchConfig

    unlisted = LaunchConfig(32, 4, 1, num_stages=7, form="mma")  # in no candidate list
    monkeypatch.setitem(gdn_launch.VERIFY, (128, 128), unlisted)
    seen = set()
    for geometry in kernels.GEOMETRIES.values():
        for kind in ("decode", "spec"):
            for s in kernels.sweep_tables(geometry, kind, read=True):
                assert len(set(s.candidates)) == len(s.candidates), s.name
                assert s.key in s.table and s.candidates[0] == s.table[s.key], (s.name, s.key)
                forms = {getattr(c, "form", "") for c in s.candidates}
                assert forms <= {"", "tokens_prefetched", "mma", "worklist", "dot"}, (s.name, forms)
                assert "mamba2" not in s.name or forms <= {"", "tokens_prefetched"}, (s.name, forms)
                if s.name == "gdn.VERIFY":
                    assert s.candidates[0] == unlisted
                seen.add(s.name)
    expected = {"DECODE", "FOLD_IN_MAIN", "DECODE_READ_COPY", "FLUSH", "VERIFY", "WEIGHTS_VERIFY", "CONVENTIONAL"}
    expected = {f"mamba2.{n}" for n in expected} | {f"gdn.{n}" for n in ("DECODE_LAUNCHES", "DECODE", "DECODE_READ_COPY", "FOLD",
                                                                           "VERIFY", "VERIFY_SHORT", "WEIGHTS", "WEIGHTS_SHORT", "CONVENTIONAL")}  # fmt: skip
    assert seen == expected


@pytest.mark.parametrize(
    "args, message",
    [(["spec", "--tokens", "1", "6"], "--tokens: draft lengths must be 2 to the window"), (["decode", "--batches", "0"], "--batches"),
     (["nonsense"], "unknown case"), ([], "name at least one case")],
)  # fmt: skip
def test_options_are_checked_first(args, message, capsys):
    """Bad points, cases or no case are refused before any GPU work."""
    with pytest.raises(SystemExit) as exit:
        _kernels_module().main(args)
    assert exit.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_spec_read_copy_steps_carry_the_copy(family):
    """``spec --read-dtype``'s verify + commit steps pass the state's read copy to the op: over a sequence that
    folds every row, the step matches the reference (outputs and every state tensor, the copy included) and
    the copy ends as the bf16 rounding of the checkpoint. (On the CPU the op runs its reference; the GPU run
    checks the kernels the same way before timing them.)"""
    import torch

    import replayssm

    kernels = _kernels_module()
    geometry = next(g for n, g in kernels.DRY_GEOMETRIES.items() if n.startswith(family))
    point = kernels.SpecPoint(geometry, 3, 4, "half", "cpu", read_dtype=torch.bfloat16, window=4)
    point.base.fn = {"mamba2": replayssm.ops.mamba2_step, "gdn": replayssm.ops.gdn_step, "commit": replayssm.ops.commit}
    assert point.snapshots is None and point.base.state.read_checkpoint is not None
    assert kernels.check_failure(point.check()) is None
    before = point.base.state.read_checkpoint.clone()
    for step in point.replay_steps():  # 16 steps of 2 accepted tokens: every row folds at least once
        step()
    st = point.base.state
    assert not torch.equal(st.read_checkpoint, before)
    torch.testing.assert_close(st.read_checkpoint, st.checkpoint.to(torch.bfloat16), rtol=0, atol=0)
