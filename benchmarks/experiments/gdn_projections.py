"""Experiment: would one GEMM for a Qwen3.5 Gated DeltaNet layer's four input projections pay (issue 7)?

``Qwen3_5GatedDeltaNet`` projects the hidden state four times per token: ``in_proj_qkv`` (2 x 2048 + 4096
outputs at the Qwen3.5-like size of ``benchmarks/generate.py``), ``in_proj_z`` (4096), ``in_proj_b`` and
``in_proj_a`` (32 each). In the captured decode step at batch 256 (H200, 2026-12-04 20:49 profile) the two
32-wide products took about 5 us each per layer (31.6 us per step for three layers), as long as a 2048-wide
one would, when the GDN adapter (``integrations/hf/gdn.py``) called the four layers as the model built them.

This script times, at that shape (bf16, batch 1 to 256), the four products as they are and one product with
the four weights concatenated (then split), eagerly and through inductor (``torch.compile``, no CUDA graphs of
its own), every call inside one captured CUDA graph of ``--calls`` calls, after checking that both give the
same outputs. Prints a table; ``--out`` writes JSON. Since 2026-12-06 a patched model computes them the
fused way (``integrations/hf/projections.py``); BENCHMARKS.md has the figures.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_projections.py --out /tmp/projections.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import time_graph_per_step  # noqa: E402

HIDDEN = 2048
OUTPUTS = {"qkv": 2 * 16 * 128 + 32 * 128, "z": 32 * 128, "b": 32, "a": 32}  # generate.py's qwen3_5-like layer


def separate(h, weights):
    return tuple(F.linear(h, w) for w in weights)


def fused(h, weight):
    return torch.split(F.linear(h, weight), list(OUTPUTS.values()), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 16, 64, 256])
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    print(json.dumps(meta), flush=True)
    weights = [torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16) * HIDDEN**-0.5 for n in OUTPUTS.values()]
    weight = torch.cat(weights)
    rows = []
    for batch in args.batches:
        h = torch.randn(batch, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
        expected = separate(h, weights)
        for name, fn, w in (("separate", separate, weights), ("fused", fused, weight)):
            for mode in ("eager", "inductor"):
                call = fn if mode == "eager" else torch.compile(fn, fullgraph=True, dynamic=False)
                got = call(h, w)
                # one GEMM over the concatenated weights sums each output over the same K: equal up to the
                # GEMM's choice of kernel (bf16 outputs, fp32 accumulation)
                err = max(((g.float() - e.float()).norm() / e.float().norm()).item() for g, e in zip(got, expected))
                if not err < 1e-2:
                    raise AssertionError(f"{name} {mode} batch {batch}: relative error {err:.3g}")
                us = time_graph_per_step([lambda c=call, w=w: c(h, w)] * args.calls, repeats=args.repeats)
                rows.append({"batch": batch, "form": name, "mode": mode, "us": us, "rel_err": err})
                print(json.dumps(rows[-1]), flush=True)
                torch._dynamo.reset()
    print(f"\n{meta['gpu']}; us per layer's input projections (one token per row)\n")
    for r in rows:
        print(f"batch {r['batch']:4d} | {r['form']:9s} {r['mode']:8s} | {r['us']:8.1f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
