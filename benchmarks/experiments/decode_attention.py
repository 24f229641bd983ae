"""Experiment: which attention call is fastest for a patched hybrid's decode step (issue 7)?

The captured Qwen3.5-like decode step (``benchmarks/generate.py``, batch 256, H200, 2026-12-04 20:49) spent
47.6 us per step in one cuDNN flash-attention kernel for its single attention layer (16 query / 2 key-value
heads of 256, a static cache of 104 positions), where the layer's KV cache is 54.5 MB: about 13 us at the
streaming bandwidth. ``integrations/hf/attention.py`` already folds each group's query heads into the query
length (no ``repeat_kv`` copy); until 2026-12-06 it called ``scaled_dot_product_attention`` with a
``(batch, 1, q, kv)`` mask, and SDPA picked its backend (cuDNN on sm_90). A decode query of ``groups x q`` rows (8 here) fills a
64-row tile of that kernel an eighth.

This script times, at the model's attention shape, each way of computing the same attention (the stock
``repeat_kv`` path, the packed query with SDPA's own choice and with each backend forced, and the packed
query as two batched matrix products around an fp32 softmax, with bf16 scores and, as
``integrations/hf/attention.py`` ships it since 2026-12-06, with fp32 scores), each eagerly and through inductor
(``torch.compile``, no CUDA graphs of its own), every call inside one captured CUDA graph of
``--calls`` calls, and checks each against a float64 reference first. Prints a table; ``--out`` writes JSON.

    PYTHONPATH=src python3 benchmarks/experiments/decode_attention.py --out /tmp/attention.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import streaming_bandwidth, time_graph_per_step  # noqa: E402

from replayssm.integrations.hf.attention import grouped_products_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 16, 2, 256  # generate.py's qwen3_5-like attention layer


def stock(q, k, v, mask, scale):
    """transformers' SDPA path with a mask: every key/value head repeated for its query heads."""
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _packed(q, k):
    batch, heads, q_len, dim = q.shape
    return q.reshape(batch, k.shape[1], heads // k.shape[1] * q_len, dim)


def _packed_mask(mask, q, k):
    """The ``(batch, 1, q, kv)`` mask over the packed rows (group-major: row g * q + t is token t)."""
    return mask if q.shape[2] == 1 else mask.repeat(1, 1, q.shape[1] // k.shape[1], 1)


def packed_sdpa(backend):
    def fn(q, k, v, mask, scale):
        if backend is None:
            out = F.scaled_dot_product_attention(_packed(q, k), k, v, attn_mask=_packed_mask(mask, q, k), scale=scale)
        else:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(_packed(q, k), k, v, attn_mask=_packed_mask(mask, q, k), scale=scale)
        return out.reshape(q.shape)

    return fn


def packed_matmul(q, k, v, mask, scale):
    """The packed query as two batched products around an fp32 softmax (the mask added as -inf)."""
    scores = torch.matmul(_packed(q, k), k.transpose(-1, -2)).float() * scale
    scores = scores.masked_fill(~_packed_mask(mask, q, k), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    return torch.matmul(probs, v).reshape(q.shape)


VARIANTS = {
    "stock repeat_kv + sdpa": stock,
    "packed sdpa (auto)": packed_sdpa(None),
    "packed sdpa cudnn": packed_sdpa(SDPBackend.CUDNN_ATTENTION),
    "packed sdpa efficient": packed_sdpa(SDPBackend.EFFICIENT_ATTENTION),
    "packed sdpa math": packed_sdpa(SDPBackend.MATH),
    "packed matmul": packed_matmul,
    "replayssm grouped products": grouped_products_attention,  # the same with fp32 scores, as the library ships it
}


def reference(q, k, v, mask, scale):
    groups = q.shape[1] // k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", nargs="*", type=int, default=[1, 64, 256])
    ap.add_argument("--kv", nargs="*", type=int, default=[104, 1024, 4096], help="static cache lengths")
    ap.add_argument("--queries", nargs="*", type=int, default=[1], help="query tokens per row (1: decoding)")
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    bw, _ = streaming_bandwidth()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "bandwidth_Bps": bw,
    }
    print(json.dumps(meta), flush=True)
    rows = []
    for batch in args.batches:
        for kv in args.kv:
            for q_len in args.queries:
                dtype = torch.bfloat16
                q = torch.randn(batch, HEADS, q_len, HEAD_DIM, device="cuda", dtype=dtype)
                k = torch.randn(batch, KV_HEADS, kv, HEAD_DIM, device="cuda", dtype=dtype)
                v = torch.randn(batch, KV_HEADS, kv, HEAD_DIM, device="cuda", dtype=dtype)
                # a static cache: each row filled to a random length (at least q_len), the rest masked
                filled = torch.randint(max(q_len, kv // 2), kv + 1, (batch,), device="cuda")
                pos = torch.arange(kv, device="cuda")
                mask = (pos[None, :] < filled[:, None])[:, None, None, :].expand(batch, 1, q_len, kv)
                mask = mask & (pos[None, None, None, :] <= (filled[:, None, None, None] - q_len + torch.arange(q_len, device="cuda")[None, None, :, None]))
                scale = HEAD_DIM**-0.5
                ref = reference(q, k, v, mask, scale)
                floor_us = (2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()) / bw * 1e6
                for name in args.variants:
                    fn = VARIANTS[name]
                    for mode in ("eager", "inductor"):
                        row = {"batch": batch, "kv": kv, "q": q_len, "variant": name, "mode": mode, "floor_us": floor_us}
                        try:
                            call = fn if mode == "eager" else torch.compile(fn, fullgraph=True, dynamic=False)
                            out = torch.full_like(q, float("nan"))
                            out.copy_(call(q, k, v, mask, scale))
                            err = ((out.double() - ref).norm() / ref.norm()).item()
                            row["rel_err"] = err
                            row["max_abs_err"] = (out.double() - ref).abs().max().item()
                            if not err < 2e-2:
                                raise AssertionError(f"relative error {err:.3g} against float64")
                            row["us"] = time_graph_per_step([lambda c=call: c(q, k, v, mask, scale)] * args.calls, repeats=args.repeats)
                            row["pct_floor"] = 100 * floor_us / row["us"]
                        except Exception as e:  # a backend that refuses the shape: record why, go on
                            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        torch._dynamo.reset()
    print(f"\n{meta['gpu']}, streaming bandwidth {bw / 1e12:.3f} TB/s; us per call (% of the KV-read floor)\n")
    for r in rows:
        cell = f"{r['us']:8.1f} ({r['pct_floor']:5.1f}%)" if "us" in r else r["error"]
        print(f"batch {r['batch']:4d} kv {r['kv']:5d} q {r['q']} | {r['variant']:24s} {r['mode']:8s} | {cell}")
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
