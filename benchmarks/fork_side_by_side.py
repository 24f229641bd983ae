"""BENCHMARKS.md's side-by-side with the ReplaySSM authors' vLLM fork: the shared harness, run on this tree.

The harness (``../shared/anchors``: replayssm, the fork's kernels and upstream vLLM's in one process on the
same inputs, with float64 accuracy and bandwidth floors) is not part of the project. Copy it into the
git-ignored ``.anchors`` and carry it to the GPU machine; then, from the repository root::

    python3 benchmarks/fork_side_by_side.py --only qwen4b,qwen122b --json $OUT/side_by_side.json

(every option is the harness's: ``--help``). The harness calls replayssm as of commit 6c58a51. This script runs
it unchanged except for those calls, pointed at the current API: ``load(state, rows)``, the conventional kernels'
modules, Mamba-2's replay step (its ``read_scale`` argument), and GDN's replay step through the fused gates (raw a and b with ``A_log`` and ``dt_bias``, as the
integrations call it; beta is rounded to b's dtype, so b is passed in bf16 for decoding and in fp32 for
verification, matching the harness's float64 references).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANCHORS = Path(os.environ.get("ANCHORS", ROOT / ".anchors"))


def _adapt(sbs) -> None:
    from replayssm import ops

    def proj_new(case, read_dtype=None):
        cls = sbs.replayssm.GDNReplayState if isinstance(case, sbs.GDN) else sbs.replayssm.Mamba2ReplayState
        config = sbs.replayssm.ReplayConfig(window=case.L, read_dtype=read_dtype)
        kw = {} if isinstance(case, sbs.GDN) else {"activation_dtype": sbs.ACT}
        state = cls(case.pgeom, case.B, config, case.dev, **kw)
        state.load(case.state0)
        return state

    def gdn_proj_step(case, st, inp, commit=True):
        batch, num_tokens = inp["q"].shape[:2]
        b = inp["b"] if num_tokens == 1 else inp["b"].float()  # decode refs round beta to bf16, verify refs do not
        return ops.gdn_step(
            inp["q"], inp["k"], inp["v"], inp["a"].view(batch, num_tokens, -1), b.view(batch, num_tokens, -1),
            st.checkpoint, st.ring_k, st.ring_d, st.ring_g, st.cursor, st.pending,
            case.rows, commit, True, None, st.read_checkpoint, st.ring_beta, case.A_log, case.dt_bias,
        )  # fmt: skip

    def mamba2_proj_step(case, st, inp, commit=True):
        return ops.mamba2_step(
            inp["x4"], inp["dt3"], case.A_h, inp["B4"], inp["C4"], case.D_h, case.dt_bias_h, None,
            st.checkpoint, st.ring_x, st.ring_B, st.ring_dt, st.ring_logdecay, st.cursor, st.pending,
            case.rows, commit, True, st.read_checkpoint, st.read_scale,
        )  # fmt: skip

    def mamba2_snap_step(case, m, inp):
        from replayssm.ops.mamba2.conventional import mamba2_conventional_step_out

        mamba2_conventional_step_out(
            inp["x4"], inp["dt3"], case.A_h, inp["B4"], inp["C4"], case.D_h, case.dt_bias_h, None, m["st"], case.rows, True,
            y=m["y"], snapshots=m["snaps"],
        )  # fmt: skip
        return m["y"]

    def gdn_snap_step(case, m, inp):
        from replayssm.ops.gdn.conventional import gdn_conventional_step_out

        gdn_conventional_step_out(
            inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], m["st"], case.rows, True, None, o=m["y"], snapshots=m["snaps"]
        )
        return m["y"]

    sbs.M2.proj_new = sbs.GDN.proj_new = proj_new
    sbs.GDN.proj_step = gdn_proj_step
    sbs.M2.proj_step = mamba2_proj_step
    sbs.M2.snap_step = mamba2_snap_step
    sbs.GDN.snap_step = gdn_snap_step


def main() -> None:
    if not (ANCHORS / "side_by_side.py").exists():
        sys.exit(f"fork_side_by_side: no harness at {ANCHORS}: copy ../shared/anchors there (git-ignored) and carry it")
    os.environ.setdefault("REPLAYSSM_SRC", str(ROOT / "src"))
    sys.path.insert(0, str(ANCHORS))
    os.chdir(ANCHORS)  # the harness finds its vendor/ folder from its own directory
    import side_by_side as sbs

    _adapt(sbs)
    sys.argv[0] = str(ANCHORS / "side_by_side.py")
    sbs.main()


if __name__ == "__main__":
    main()
