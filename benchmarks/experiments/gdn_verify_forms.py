"""Experiment: the GDN verification main launch's two forms at every draft length.

Times verify + commit steps (batch 256, window 16, fp32 state, 2 of every 4 drafts accepted, staggered rows,
the speculative benchmark's cases), side by side in one run on the GPU, with the main launch (``_GDN_VERIFY``)
in its per-token form (one 8-row tile per 1-warp program: ``_GDN_VERIFY_SHORT``'s) and in its ``"mma"``
form (tensor-core dots in tf32x3 over 32-column key chunks, 32-row tiles on one warp, 4 stages:
``_GDN_VERIFY``'s since 2026-12-02; the 03:28 run of that day had 16-row tiles on 3 stages), for
T = 2..8 and both GDN geometries (both tables set to the form timed). Each point's first step is checked against the PyTorch reference first (outputs,
ring, checkpoint). Prints a table; ``--out`` writes JSON.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_verify_forms.py --out /tmp/gdn_verify_forms.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import time_graph_per_step  # noqa: E402
from decode_kernels import GEOMETRIES, check_failure  # noqa: E402
from spec_kernels import HEADLINE_BATCH, SpecCase  # noqa: E402

from replayssm.ops.triton import configs  # noqa: E402
from replayssm.ops.triton.configs import LaunchConfig  # noqa: E402

FORMS = {
    "per-token 8x1w": LaunchConfig(8, 16, 1),
    "mma 32x1w 4 stages": LaunchConfig(32, 4, 1, num_stages=4, form="mma"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tokens", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    key = (128, 128)
    tables = (configs._GDN_VERIFY_SHORT, configs._GDN_VERIFY)
    previous = [table.get(key) for table in tables]
    rows = []
    try:
        for name in ("gdn-16x32x128x128", "gdn-16x64x128x128"):
            for T in args.tokens:
                case = SpecCase(GEOMETRIES[name], HEADLINE_BATCH, T, "half")
                case.base.set_phase("staggered")
                point = {"geometry": name, "T": T}
                for form, cfg in FORMS.items():
                    for table in tables:
                        table[key] = cfg
                    errors = case.check()
                    if failure := check_failure(errors):
                        raise RuntimeError(f"{name} T={T} {form}: {failure}")
                    point[form] = time_graph_per_step(case.replay_steps(), args.repeats)
                    point[f"{form} errors"] = errors
                point["mma / per-token"] = point["mma 32x1w 4 stages"] / point["per-token 8x1w"]
                rows.append(point)
                print(f"{name} T={T}: " + ", ".join(f"{f} {point[f]:.1f} us" for f in FORMS) + f" (ratio {point['mma / per-token']:.3f})", flush=True)
                del case
                torch.cuda.empty_cache()
    finally:
        for table, cfg in zip(tables, previous):
            table[key] = cfg
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name()}
        args.out.write_text(json.dumps({"meta": meta, "forms": {f: c.as_dict() for f, c in FORMS.items()}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
