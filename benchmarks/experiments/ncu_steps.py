"""Experiment: run a few replay steps eagerly, for Nsight Compute to profile their kernels.

No timing here: run it under ``ncu`` (the clocks left alone), e.g.

    ncu --clock-control none -k regex:_gdn_main_kernel --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats --section Occupancy \
        python3 benchmarks/experiments/ncu_steps.py --geometry gdn-16x32x128x128 --tokens 4

``--tokens 1`` runs decode steps (T = 1), more runs verify steps with 2 of T accepted (the speculative
benchmark's cases, batch 256, window 16, staggered rows). ``--all-fold`` (decode steps): every cursor is
set to the window before each step, so every row folds (what ``generate()`` does every L steps);
``--gdn-fold grid``: a GDN decode step's fold launch in its grid form instead of the table's.
``--read-dtype bf16`` (decode steps): the steps read a bf16 copy of the checkpoint (SPEC §4).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode_kernels import GDN_GRID_FOLD, GEOMETRIES, HEADLINE_BATCH, HEADLINE_WINDOW, READ_DTYPES, Case, StepVariant  # noqa: E402
from spec_kernels import SpecCase  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometry", choices=list(GEOMETRIES), required=True)
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--all-fold", action="store_true", help="decode steps on which every row folds")
    ap.add_argument("--gdn-fold", choices=["table", "grid"], default="table", help="a GDN decode step's fold launch")
    ap.add_argument("--read-dtype", choices=list(READ_DTYPES), help="decode steps read a 16-bit copy of the checkpoint")
    args = ap.parse_args()
    if args.tokens != 1 and (args.all_fold or args.gdn_fold != "table" or args.read_dtype):
        ap.error("--all-fold, --gdn-fold and --read-dtype are for decode steps (--tokens 1)")
    if args.read_dtype and args.gdn_fold != "table":
        ap.error("--gdn-fold grid is the fp32 fold's grid form; with --read-dtype the table's fold runs")
    geometry = GEOMETRIES[args.geometry]
    if args.tokens == 1:
        read_dtype = READ_DTYPES[args.read_dtype] if args.read_dtype else None
        case = Case(geometry, HEADLINE_BATCH, HEADLINE_WINDOW, "cuda", read_dtype=read_dtype)
        case.set_phase("staggered")
        config = None
        if args.gdn_fold == "grid":
            from replayssm.ops.triton.configs import _GDN_DECODE_MAIN

            config = StepVariant(_GDN_DECODE_MAIN[(geometry.value_dim, geometry.key_dim)], 3, flush=GDN_GRID_FOLD)
        if args.all_fold:
            steps = case.pinned_replay_steps(HEADLINE_WINDOW, HEADLINE_WINDOW, config)
        else:
            steps = case.replay_steps(config, via_op=config is None)
    else:
        case = SpecCase(geometry, HEADLINE_BATCH, args.tokens, "half")
        case.base.set_phase("staggered")
        steps = case.replay_steps()
    for step in (steps * (1 + args.steps // len(steps)))[: args.steps]:
        step()
    torch.cuda.synchronize()
    print(f"ran {args.steps} steps of {args.geometry}, T = {args.tokens}")


if __name__ == "__main__":
    main()
