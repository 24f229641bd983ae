"""Experiment: shapes of the GDN decode step's fold launch, timed with rows staggered and in phase.

Why: the fold launch's table entry (a work list of a few programs per multiprocessor) was chosen on
staggered rows, where about B / L rows fold per step. In ``generate()`` every row of a batch folds on
the same step, and there the work list's few programs hold few bytes in flight. For each fold-launch
shape (the main and weights launches as in the tables), at batch 256, window 16, fp32 state, bf16
inputs, this checks one step with every row folding against the reference and times (16 steps in one
CUDA graph, median of repeats, us per step):

* ``staggered``: rows at cursors r mod 16 (what ``decode_kernels.py`` reports as the headline);
* ``in_phase``: every row at cursor 0, so all fold on the 16th step (amortised over the 16);
* ``all_fold``: one step with every row folding (each step preceded by a 256-int cursor reset);
* ``no_fold``: one step with no row folding (cursors reset to 15), the fold launch's cost when idle.

With ``--read-dtype bf16`` the steps read a bf16 copy of the checkpoint (SPEC §4; the main launch from
``_GDN_DECODE_MAIN_READ``), so the fold launch does the exact fold with the copy, in the form(s) named by
``--read-folds`` (``configs.GDN_READ_COPY_FOLDS``), and stores both copies.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_fold_forms.py --out $OUT/fold_forms.json
    PYTHONPATH=src python3 benchmarks/experiments/gdn_fold_forms.py --read-dtype bf16 --read-folds blocked entries
    PYTHONPATH=src python3 benchmarks/experiments/gdn_fold_forms.py --read-dtype bf16 --folds 36 --mains 32x4x1 16x8x1

``--mains`` times each fold launch with each of these main launch shapes (``LaunchConfig(block, split,
warps)``) instead of the table's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import format_table, streaming_bandwidth, time_graph_per_step  # noqa: E402
from decode_kernels import GEOMETRIES, HEADLINE_BATCH, HEADLINE_WINDOW, READ_DTYPES, Case, StepVariant, check_failure  # noqa: E402

from replayssm.ops.triton.configs import _GDN_DECODE_MAIN, _GDN_DECODE_MAIN_READ, GDN_READ_COPY_FOLDS, LaunchConfig  # noqa: E402


def _worklist(block, split, warps, per_sm, stages=1):
    return LaunchConfig(block, split, warps, num_stages=stages, form="worklist", programs_per_sm=per_sm)


# (block, split, warps, programs per SM[, stages]); the table's entry first.
FOLDS = [
    _worklist(16, 2, 4, 3),
    _worklist(16, 2, 4, 4),
    _worklist(16, 2, 4, 6),
    _worklist(16, 2, 4, 3, stages=2),
    _worklist(16, 8, 4, 4),
    _worklist(16, 8, 2, 8),
    _worklist(32, 2, 4, 3),
    _worklist(32, 4, 4, 4),
    _worklist(64, 2, 4, 2),
    _worklist(64, 2, 4, 3),
    _worklist(64, 2, 8, 2),
    _worklist(64, 2, 8, 3),
    _worklist(128, 1, 8, 2),
    _worklist(16, 2, 8, 2),
    _worklist(32, 2, 8, 2),
    LaunchConfig(16, 1, 4),
    LaunchConfig(64, 2, 4),
    # whole-head work lists and a half-head grid (docs/kernels.md runs 31-32; the read copy's table entry is the first)
    _worklist(16, 1, 4, 2),
    _worklist(16, 1, 4, 3),
    LaunchConfig(16, 2, 4),
    # the fold launch beside the main launch, finishing its rows ("alongside", docs/kernels.md runs 19 and 33)
    LaunchConfig(16, 1, 4, form="alongside", programs_per_sm=1),
    LaunchConfig(16, 1, 4, form="alongside", programs_per_sm=2),
    LaunchConfig(16, 2, 4, form="alongside", programs_per_sm=2),
    LaunchConfig(16, 2, 4, form="alongside", programs_per_sm=1),
    # whole heads with the tile loop software-pipelined, and other tile shapes (docs/kernels.md run 33)
    _worklist(16, 1, 4, 2, stages=2),
    _worklist(16, 1, 4, 2, stages=3),
    _worklist(32, 1, 8, 1),
    _worklist(32, 1, 4, 2),
    _worklist(16, 1, 8, 1),
    _worklist(16, 1, 4, 2, stages=4),
    _worklist(16, 1, 4, 2, stages=5),
    _worklist(16, 1, 4, 3, stages=3),
    _worklist(16, 2, 4, 3, stages=3),
    _worklist(16, 2, 4, 3, stages=4),
    _worklist(16, 1, 4, 3, stages=4),
    # two-warp programs, so more of them fit beside each other (docs/kernels.md run 34)
    _worklist(16, 1, 2, 4, stages=3),
    _worklist(16, 1, 2, 4),
    _worklist(16, 1, 2, 3, stages=3),
    _worklist(16, 2, 2, 4, stages=3),
    _worklist(16, 1, 2, 6, stages=3),
    _worklist(16, 1, 2, 4, stages=2),
    _worklist(16, 2, 2, 4),
    _worklist(16, 1, 1, 8),
    _worklist(16, 1, 2, 3),
    # beside the main launch with the merged fold's two-warp programs (docs/kernels.md run 35)
    LaunchConfig(16, 1, 2, form="alongside", programs_per_sm=1),
    LaunchConfig(16, 1, 2, form="alongside", programs_per_sm=2),
    LaunchConfig(16, 1, 2, form="alongside", programs_per_sm=4),
    # four-warp programs, 4-5 per SM, timed for a "chunked" read-copy fold (docs/kernels.md run 37; it lost and
    # was removed): merged there 174-181 / 326-354 us against 161.6 / 301.1 on two warps (fold 36)
    _worklist(16, 1, 4, 5),
    _worklist(16, 1, 4, 4),
    _worklist(16, 2, 4, 5),
]


def measure(name, fold, repeats, log, read_dtype=None, read_fold=None, main=None) -> dict:
    geometry = GEOMETRIES[name]
    case = Case(geometry, HEADLINE_BATCH, HEADLINE_WINDOW, "cuda", conventional=False, read_dtype=read_dtype)
    main = main or (_GDN_DECODE_MAIN_READ if read_dtype is not None else _GDN_DECODE_MAIN)[(geometry.value_dim, geometry.key_dim)]
    variant = StepVariant(main, 3, flush=fold, overlap=True, read_fold=read_fold)
    row = {"geometry": name, "fold": str(fold), "main": str(main)}
    if read_dtype is not None:
        row["read_dtype"], row["read_fold"] = str(read_dtype).replace("torch.", ""), read_fold
    try:
        # the check: every row folds (cursors at L), against the reference
        case.state.cursor.fill_(HEADLINE_WINDOW)
        row["check_all_fold"] = case.check_replay(variant)
        case.set_phase("staggered")
        row["check_staggered"] = case.check_replay(variant)
        for check in ("check_all_fold", "check_staggered"):
            if failure := check_failure(row[check]):
                raise RuntimeError(f"{check}: {failure}")
        row["staggered_us"] = time_graph_per_step(case.replay_steps(variant, via_op=False), repeats)
        case.set_phase("in-phase")
        row["in_phase_us"] = time_graph_per_step(case.replay_steps(variant, via_op=False), repeats)
        row["all_fold_us"] = time_graph_per_step(case.pinned_replay_steps(HEADLINE_WINDOW, HEADLINE_WINDOW, variant), repeats)
        row["no_fold_us"] = time_graph_per_step(case.pinned_replay_steps(HEADLINE_WINDOW - 1, HEADLINE_WINDOW, variant), repeats)
    except Exception as exc:  # noqa: BLE001 - a shape that does not compile, or is wrong, is a result too
        row["error"] = f"{type(exc).__name__}: {exc}"[:300]
    log(json.dumps(row))
    del case
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--geometries", nargs="+", default=["gdn-16x32x128x128", "gdn-16x64x128x128"])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--alternations", type=int, default=2, help="times through the list (the order alternates runs)")
    ap.add_argument("--folds", type=int, nargs="+", help="indices into FOLDS (default: all)")
    ap.add_argument("--read-dtype", choices=list(READ_DTYPES), help="steps read a 16-bit copy of the checkpoint")
    ap.add_argument("--read-folds", nargs="+", choices=GDN_READ_COPY_FOLDS, default=["blocked"], help="with --read-dtype")
    ap.add_argument("--mains", nargs="+", metavar="BLOCKxSPLITxWARPS", help="main launch shapes (default: the table's)")
    args = ap.parse_args()
    mains = [LaunchConfig(*map(int, m.split("x"))) for m in args.mains] if args.mains else [None]
    folds = [FOLDS[i] for i in args.folds] if args.folds else FOLDS
    read_dtype = READ_DTYPES[args.read_dtype] if args.read_dtype else None
    read_folds = args.read_folds if read_dtype is not None else [None]
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    bw, _ = streaming_bandwidth()
    log(f"streaming bandwidth {bw / 1e12:.3f} TB/s")
    rows = []
    for rep in range(args.alternations):
        for name in args.geometries:
            for fold in folds if rep % 2 == 0 else folds[::-1]:
                for read_fold in read_folds:
                    for main_cfg in mains:
                        rows.append({"pass": rep, **measure(name, fold, args.repeats, log, read_dtype, read_fold, main_cfg)})
    columns = [
        ("geometry", "geometry", ""), ("fold", "fold launch", ""), ("read_fold", "read-copy fold", ""), ("main", "main launch", ""),
        ("pass", "pass", ""), ("staggered_us", "staggered", ".1f"),
        ("in_phase_us", "in-phase", ".1f"), ("all_fold_us", "all fold", ".1f"), ("no_fold_us", "no fold", ".1f"),
    ]  # fmt: skip
    print(format_table([r for r in rows if "error" not in r], columns))
    for r in rows:
        if "error" in r:
            print(f"{r['geometry']} {r['fold']}: {r['error']}")
    if args.out:
        meta = {
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "bandwidth_Bps": bw,
            "read_dtype": args.read_dtype,
            "command": " ".join(sys.argv),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
