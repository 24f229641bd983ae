"""Experiment: how fast can the checkpoint part of GDN verification stream on its own?

GDN verification's main launch (``_gdn_main_kernel``, "mma" form) reads each checkpoint tile once and forms,
from it, the products ``[K; Q] S^T`` (the T keys' and T queries' products with every value row), then the
ring's part, the T x T solve for the corrected updates and the outputs. At T = 4 it takes about 250 us per
verify step at GDN 16/32 heads (batch 256), where its checkpoint read alone is about 130 us at the streaming
bandwidth: the launch is latency-bound (one-warp programs of some 220 registers).

This script times only the first part as a kernel of its own: per (row, value head, tile of value rows),
``P = [K; Q] S^T`` summed over key chunks with tensor-core dots in tf32x3 (the main launch's own product),
written to a ``(batch, value heads, 16, V)`` fp32 scratch. If it streams near the bandwidth floor, a
verification main launch split in two (products, then a light epilogue reading P and the ring) could
beat the fused one; if not, the split is not worth building. (It streamed at 99-103% of its floor on
2026-12-05; the split form built on it lost by 6-8%: docs/kernels.md run 38.) Launch shapes are swept; each result is
checked against a float64 product first. Prints a table; ``--out`` writes JSON.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_verify_products.py --out /tmp/products.json
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import streaming_bandwidth, time_graph_per_step  # noqa: E402

BLOCK_M = 16  # token rows: keys at 0..T-1, queries at T..2T-1, zeros beyond (the main launch's padding)


@triton.jit
def _products_kernel(
    p_ckpt, p_kq, p_out,
    s_ck_b, s_ck_h, s_ck_v,
    s_kq_b, s_kq_h,
    s_p_b, s_p_h,
    V, K, value_per_key, rows_used,
    BLOCK_V: tl.constexpr, BLOCK_KC: tl.constexpr, BLOCK_M: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    o_m = tl.arange(0, BLOCK_M)
    o_c = tl.arange(0, BLOCK_KC)
    m_m = o_m < rows_used
    p_S = p_ckpt + i_b.to(tl.int64) * s_ck_b + i_h.to(tl.int64) * s_ck_h + o_v[:, None] * s_ck_v
    p_KQ = p_kq + i_b.to(tl.int64) * s_kq_b + i_kh.to(tl.int64) * s_kq_h + o_m[:, None] * K
    b_acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for kc in tl.range(0, K, BLOCK_KC, num_stages=NUM_STAGES):
        b_S = tl.load(p_S + (kc + o_c)[None, :])
        b_KQ = tl.load(p_KQ + (kc + o_c)[None, :], mask=m_m[:, None], other=0.0)
        b_acc = tl.dot(b_KQ, tl.trans(b_S), b_acc, input_precision="tf32x3")
    p_P = p_out + i_b.to(tl.int64) * s_p_b + i_h.to(tl.int64) * s_p_h + o_m[:, None] * V + o_v[None, :]
    tl.store(p_P, b_acc, mask=m_m[:, None])


def launch(ckpt, kq, out, rows_used, block_v, block_kc, num_warps, num_stages):
    batch, heads, V, K = ckpt.shape
    grid = (V // block_v, heads, batch)
    _products_kernel[grid](
        ckpt, kq, out, ckpt.stride(0), ckpt.stride(1), ckpt.stride(2), kq.stride(0), kq.stride(1), out.stride(0), out.stride(1),
        V, K, heads // kq.shape[1], rows_used,
        BLOCK_V=block_v, BLOCK_KC=block_kc, BLOCK_M=BLOCK_M, NUM_STAGES=num_stages, num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--tokens", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bw, _ = streaming_bandwidth()
    print(f"streaming bandwidth {bw / 1e12:.3f} TB/s", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for key_heads, heads in ((16, 32), (16, 64)):
        V = K = 128
        ckpt = torch.randn(args.batch, heads, V, K, device="cuda", generator=gen)
        out = torch.empty(args.batch, heads, BLOCK_M, V, device="cuda")
        for T in args.tokens:
            kq = torch.randn(args.batch, key_heads, BLOCK_M, K, device="cuda", generator=gen)
            used = 2 * T
            expected = torch.einsum("bgmk,bgjvk->bgjmv", kq[:, :, :used].double(), ckpt.view(args.batch, key_heads, heads // key_heads, V, K).double())
            expected = expected.reshape(args.batch, heads, used, V)
            floor_us = (ckpt.numel() * 4 + args.batch * heads * used * V * 4) / bw * 1e6
            for block_v, block_kc, num_warps, num_stages in itertools.product((16, 32, 64, 128), (32, 64), (1, 2, 4), (2, 3, 4)):
                if block_v * block_kc * 4 * num_stages > 160 * 1024 or (block_v == 16 and num_warps > 1):
                    continue
                out.fill_(float("nan"))
                try:
                    launch(ckpt, kq, out, used, block_v, block_kc, num_warps, num_stages)
                except Exception as exc:  # a shape that does not compile (shared memory, registers)
                    print(f"  skipped {block_v} {block_kc} {num_warps} {num_stages}: {type(exc).__name__}", flush=True)
                    continue
                err = ((out[:, :, :used].double() - expected).norm() / expected.norm()).item()
                if not err < 1e-5:
                    raise RuntimeError(f"products wrong: rel err {err} at {block_v} {block_kc} {num_warps} {num_stages}")
                steps = [lambda: launch(ckpt, kq, out, used, block_v, block_kc, num_warps, num_stages)] * 16
                us = time_graph_per_step(steps, args.repeats)
                row = {
                    "heads": f"{key_heads}/{heads}", "T": T, "block_v": block_v, "block_kc": block_kc, "num_warps": num_warps,
                    "num_stages": num_stages, "us": us, "floor_us": floor_us, "pct_floor": 100 * floor_us / us, "rel_err": err,
                }  # fmt: skip
                rows.append(row)
                print(f"{key_heads}/{heads} T={T} v{block_v} kc{block_kc} w{num_warps} s{num_stages}: {us:.1f} us ({row['pct_floor']:.1f}% of floor {floor_us:.1f}), err {err:.1e}", flush=True)
        del ckpt, out
        torch.cuda.empty_cache()
    best = {}
    for r in rows:
        k = (r["heads"], r["T"])
        if k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    print("\nbest per (heads, T):")
    for (h, T), r in best.items():
        print(f"  {h} T={T}: v{r['block_v']} kc{r['block_kc']} w{r['num_warps']} s{r['num_stages']} {r['us']:.1f} us, {r['pct_floor']:.1f}% of floor")
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(), "bandwidth": bw}
        args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
