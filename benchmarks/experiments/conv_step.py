"""Experiment: the decode step of the causal conv, ``replayssm::causal_conv_step`` against transformers' path.

At the HF benchmark models' conv shape (8192 channels, 4 taps, a window of 4 columns as transformers keeps
it, bf16), per step, in CUDA graphs of 16 steps, side by side in one run on the GPU. Each step has a
window and a column of its own (256 MiB of windows at batch 256): a decode step finds its layer's window
out of L2, evicted by the state reads of the layers between (one window of 16 MiB moved on 16 times
stays in the H200's 50 MB L2 and runs about 1.7x faster).

* the op's Triton kernel, at its launch configuration and a few others;
* transformers' path as a captured decode step ran it before the op: ``update_conv_state`` (concatenate
  window and column, copy the tail back) and the fp64 sum and SiLU over the concatenation, through
  ``torch.compile`` (inductor fuses what it can);

next to the floor: bytes moved (window read and written, column read, output written) over the streaming
bandwidth measured in the same run. Each form is checked against the PyTorch reference first. Prints a
table; ``--out`` writes JSON.

    PYTHONPATH=src python3 benchmarks/experiments/conv_step.py --out /tmp/conv_step.json
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

from replayssm.ops import reference  # noqa: E402
from replayssm.ops.triton import conv  # noqa: E402

CHANNELS, TAPS, WIDTH, STEPS = 8192, 4, 4, 16
#: (form, block_channels, num_warps); the first is the op's
CONFIGS = [("w4", conv._BLOCK_CHANNELS, conv._NUM_WARPS), ("w4", 64, 2), ("w4", 256, 4), ("w4", 512, 4), ("w4", 1024, 8),
           ("tile", 128, 4), ("tile", 256, 4)]  # fmt: skip


def transformers_step(window, x, weight, bias):
    """What a captured decode step did before the op: transformers' window update, then the fp64 conv column."""
    full = torch.cat([window, x[..., None]], dim=-1)
    window.copy_(full[..., -window.shape[-1] :])
    return reference.causal_conv_columns(full[..., -TAPS:], weight, bias, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    args = ap.parse_args()
    bandwidth, _ = streaming_bandwidth()
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(CHANNELS, TAPS, device="cuda", generator=gen).bfloat16()
    bias = torch.randn(CHANNELS, device="cuda", generator=gen).bfloat16()
    compiled = torch.compile(transformers_step, fullgraph=True, dynamic=False)
    rows = []
    for batch in args.batches:
        windows = [torch.randn(batch, CHANNELS, WIDTH, device="cuda", generator=gen).bfloat16() for _ in range(STEPS)]
        columns = [torch.randn(batch, CHANNELS, device="cuda", generator=gen).bfloat16() for _ in range(STEPS)]
        out = torch.empty(batch, CHANNELS, device="cuda", dtype=torch.bfloat16)
        bytes_moved = 2 * windows[0].numel() * 2 + 2 * batch * CHANNELS * 2
        floor_us = bytes_moved / bandwidth * 1e6
        forms = {
            f"op {f} {b}x{w}w": (lambda win, c, f=f, b=b, w=w: conv.causal_conv_step_out(c, weight, bias, win, True, out, b, w, form=f))
            for f, b, w in CONFIGS
        }
        forms["transformers path, inductor"] = lambda win, c: out.copy_(compiled(win, c, weight, bias))
        for name, step in forms.items():
            saved, expected_window = windows[0].clone(), windows[0].clone()
            expected = reference.causal_conv_step(columns[0], weight, bias, expected_window, True)
            out.fill_(float("nan"))
            step(windows[0], columns[0])
            torch.cuda.synchronize()
            ok = torch.equal(windows[0], expected_window) and bool(torch.allclose(out, expected, rtol=2**-8, atol=0))
            windows[0].copy_(saved)
            us = time_graph_per_step([lambda w=w, c=c, step=step: step(w, c) for w, c in zip(windows, columns)])
            rows.append({"batch": batch, "form": name, "us": us, "floor_us": floor_us, "pct_floor": 100 * floor_us / us, "ok": ok})
            print(rows[-1], flush=True)
        del windows, columns
    table = format_table(
        rows,
        [("batch", "batch", ""), ("form", "form", ""), ("us", "us/step", ".2f"), ("floor_us", "floor us", ".2f"),
         ("pct_floor", "% floor", ".1f"), ("ok", "matches reference", "")],
    )  # fmt: skip
    print(table)
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(),
                "torch": torch.__version__, "bandwidth_bytes_per_s": bandwidth, "channels": CHANNELS, "taps": TAPS, "width": WIDTH}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
