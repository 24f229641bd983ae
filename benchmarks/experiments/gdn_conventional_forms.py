"""Experiment: why fla's fused recurrent GDN decode step is ~3% faster than our conventional kernel.

Times, side by side in one run on the GPU (batch 256, GDN 16/32 heads x 128 x 128, fp32 state, bf16 inputs,
one token per step, 16 steps per CUDA graph), copies of the conventional decode step that differ in one
thing each from the production kernel (``_gdn_conventional_kernel``):

* ``slot``: the state row read from ``rows`` (as production) or the batch index itself (``direct``);
* ``dims``: runtime sizes and strides (as production) or sizes as constexpr with int32 offsets from a
  64-bit head pointer (``const``: what fla does);
* ``write``: in place (as production) or into a second state buffer (``out``: what fla does when asked
  for the final state).

plus the production kernel and fla's ``fused_recurrent_gated_delta_rule`` (when importable), at the
production table's 32-row 8-warp shape and fla's 8-row 1-warp one. Each variant's outputs and state are
checked against the production kernel first. Prints a table; ``--out`` writes JSON.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_conventional_forms.py --out /tmp/forms.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import streaming_bandwidth, time_graph_per_step  # noqa: E402

from replayssm.ops.triton import gdn as gdn_kernels  # noqa: E402
from replayssm.ops.triton.configs import LaunchConfig  # noqa: E402


@triton.jit
def _variant_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_o, p_state, p_out, p_rows,
    s_st_s, s_st_h, s_st_v,
    scale,
    H: tl.constexpr, HK: tl.constexpr, V: tl.constexpr, K: tl.constexpr,
    BLOCK_V: tl.constexpr, DIRECT: tl.constexpr, CONST: tl.constexpr, OUT: tl.constexpr,
):  # fmt: skip
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // (H // HK)
    if DIRECT:
        slot = i_b.to(tl.int64)
    else:
        slot = tl.load(p_rows + i_b).to(tl.int64)
    o_k = tl.arange(0, K)
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    if CONST:
        head = (slot * H + i_h) * (V * K)
        offs = o_v[:, None] * K + o_k[None, :]
    else:
        head = slot * s_st_s + i_h.to(tl.int64) * s_st_h
        offs = o_v[:, None].to(tl.int64) * s_st_v + o_k[None, :]
    b_S = tl.load(p_state + head + offs)
    i_b64 = i_b.to(tl.int64)
    b_q = tl.load(p_q + (i_b64 * HK + i_kh) * K + o_k).to(tl.float32)
    b_k = tl.load(p_k + (i_b64 * HK + i_kh) * K + o_k).to(tl.float32)
    b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + 1e-6) * scale
    b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + 1e-6)
    b_g = tl.load(p_g + i_b64 * H + i_h).to(tl.float32)
    b_beta = tl.load(p_beta + i_b64 * H + i_h).to(tl.float32)
    b_v = tl.load(p_v + (i_b64 * H + i_h) * V + o_v).to(tl.float32)
    b_S = b_S * tl.exp(b_g)
    b_d = b_beta * (b_v - tl.sum(b_S * b_k[None, :], axis=1))
    b_S = b_S + b_d[:, None] * b_k[None, :]
    b_o = tl.sum(b_S * b_q[None, :], axis=1)
    tl.store(p_o + (i_b64 * H + i_h) * V + o_v, b_o.to(p_o.dtype.element_ty))
    tl.store((p_out if OUT else p_state) + head + offs, b_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    B, HK, H, K, V, steps = args.batch, 16, 32, 128, 128, 16
    act = torch.bfloat16
    state = torch.randn(B, H, V, K, device=dev) * 0.1
    other = torch.empty_like(state)
    rows = torch.arange(B, device=dev)
    inputs = [
        (
            torch.randn(B, 1, HK, K, device=dev).to(act), torch.randn(B, 1, HK, K, device=dev).to(act),
            torch.randn(B, 1, H, V, device=dev).to(act), (-torch.rand(B, 1, H, device=dev) * 0.3).to(act),
            (torch.rand(B, 1, H, device=dev) * 0.9 + 0.05).to(act),
        )  # fmt: skip
        for _ in range(steps)
    ]
    outs = [torch.empty(B, 1, H, V, device=dev, dtype=act) for _ in range(steps)]
    scale = K**-0.5

    def production(cfg):
        return [
            lambda i=i: gdn_kernels.gdn_conventional_step_out(*inputs[i], state, rows, True, None, o=outs[i], config=cfg)
            for i in range(steps)
        ]

    def variant(block, warps, direct, const, out):
        def step(i):
            _variant_kernel[(V // block, H, B)](
                *inputs[i], outs[i], state, other, rows, *state.stride()[:3], scale,
                H=H, HK=HK, V=V, K=K, BLOCK_V=block, DIRECT=direct, CONST=const, OUT=out, num_warps=warps,
            )  # fmt: skip
        return [lambda i=i: step(i) for i in range(steps)]

    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla
    except Exception as err:  # noqa: BLE001
        fla = None
        print(f"fla not importable: {err}")

    def fla_steps():
        return [
            lambda i=i: fla(
                q=inputs[i][0], k=inputs[i][1], v=inputs[i][2], g=inputs[i][3], beta=inputs[i][4],
                initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True, state_v_first=True,
            )  # fmt: skip
            for i in range(steps)
        ]

    # correctness of each variant against the production kernel, one step from the same state
    def check(run_steps, writes_other):
        base = state.clone()
        ref_o = torch.empty_like(outs[0])
        gdn_kernels.gdn_conventional_step_out(*inputs[0], state, rows, True, None, o=ref_o)
        ref_state = state.clone()
        state.copy_(base)
        outs[0].fill_(float("nan"))
        result = run_steps()[0]()
        got_state = result[1] if isinstance(result, tuple) else other if writes_other else state
        got_o = result[0] if isinstance(result, tuple) else outs[0]
        err_o = ((got_o.float() - ref_o.float()).abs().max() / ref_o.float().abs().max()).item()
        err_s = ((got_state - ref_state).abs().max() / ref_state.abs().max()).item()
        state.copy_(base)
        assert err_o < 1e-2 and err_s < 1e-5, (err_o, err_s)
        return err_o, err_s

    bw, _ = streaming_bandwidth()
    state_bytes = state.numel() * 4
    floor_us = (2 * state_bytes + sum(t.numel() * t.element_size() for t in inputs[0]) + outs[0].numel() * 2) / bw * 1e6
    rows_out = []
    candidates = []
    for block, split, warps in ((16, 8, 1), (16, 8, 2), (32, 4, 4), (8, 8, 1)):
        candidates.append((f"production {block}/{warps}w split {split}", lambda cfg=LaunchConfig(block, split, warps): production(cfg), False))
    for block, warps, split in ((32, 8, 4), (8, 1, 16)):
        candidates.append((f"production {block}/{warps}w", lambda cfg=LaunchConfig(block, split, warps): production(cfg), False))
        for direct in (False, True):
            for const in (False, True):
                for out in (False, True):
                    name = f"variant {block}/{warps}w slot={'direct' if direct else 'rows'} dims={'const' if const else 'runtime'} write={'out' if out else 'inplace'}"
                    candidates.append((name, lambda a=(block, warps, direct, const, out): variant(*a), out))
    if fla is not None:
        candidates.append(("fla fused_recurrent (8/1w, writes a new state)", fla_steps, False))
    for name, make, writes_other in candidates:
        err_o, err_s = check(make, writes_other)
        us = min(time_graph_per_step(make(), args.repeats) for _ in range(3))
        rows_out.append({"variant": name, "us": us, "pct_floor": 100 * floor_us / us, "err_out": err_o, "err_state": err_s})
        print(f"{us:8.1f} us  {100 * floor_us / us:5.1f}% floor  {name}", flush=True)
    # The snapshot baseline of speculative decoding (the same kernel, T = 4 tokens, each state to its own slot)
    tokens = 4
    snaps = torch.empty(B, tokens, H, V, K, device=dev)
    spec_inputs = [
        tuple(torch.cat([t] * tokens, dim=1) for t in inputs[i]) for i in range(4)
    ]
    spec_outs = [torch.empty(B, tokens, H, V, device=dev, dtype=act) for _ in range(4)]
    snap_floor_us = (
        (1 + tokens) * state_bytes + sum(t.numel() * t.element_size() for t in spec_inputs[0]) + spec_outs[0].numel() * 2
    ) / bw * 1e6
    for block, split, warps in ((32, 4, 8), (8, 16, 1), (16, 8, 2), (32, 4, 4), (16, 8, 4)):
        cfg = LaunchConfig(block, split, warps)
        snap_steps = [
            lambda i=i, cfg=cfg: gdn_kernels.gdn_conventional_step_out(
                *spec_inputs[i], state, rows, True, None, o=spec_outs[i], config=cfg, snapshots=snaps
            )
            for i in range(4)
        ]
        us = min(time_graph_per_step(snap_steps, args.repeats) for _ in range(3))
        name = f"snapshot T={tokens} production {block}/{warps}w split {split}"
        rows_out.append({"variant": name, "us": us, "pct_floor": 100 * snap_floor_us / us})
        print(f"{us:8.1f} us  {100 * snap_floor_us / us:5.1f}% floor  {name}", flush=True)
    print(f"bandwidth {bw / 1e12:.3f} TB/s, floor {floor_us:.1f} us (snapshot T={tokens}: {snap_floor_us:.1f}), {torch.cuda.get_device_name()}")
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name()}
        args.out.write_text(json.dumps({"meta": meta, "bandwidth_Bps": bw, "floor_us": floor_us, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
