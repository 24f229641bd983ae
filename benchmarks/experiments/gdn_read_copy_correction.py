"""Experiment: what GDN's exact fold with a read copy buys (CPU, PyTorch reference).

Why: with a read copy (SPEC §4) GDN's corrected updates ``d = beta (v - alpha S k)`` read ``S k`` from the
16-bit copy, and those d are the ring entries the next fold adds to the fp32 checkpoint. Folded as they
are, the copy's rounding reaches GDN's recurrence, which SPEC §4 says it must not. The library therefore
keeps beta per ring entry (``ring_beta``) and corrects each d at the fold,

    D_0 = checkpoint - copy;   e_j = -beta_j alpha_j D_{j-1} k_j;   D_j = alpha_j D_{j-1} + e_j k_j^T

(D_j is the gap between the true state and the state the steps read; ``d_j + e_j`` is the true update).
This script measured the payoff before it was built (2026-12-03, the JSON beside it) and now measures the
library's fold. It drives three reference states through the same decode steps
(``replayssm.ops.reference.gdn_step``, float32), each against a float64 recurrence:

* ``fp32-reads``: no copy;
* ``bf16-copy-uncorrected``: a bf16 copy with every ring beta zeroed before each step, so the fold takes
  the ring's d as they are (what the library did before the exact fold);
* ``bf16-copy``: a bf16 copy, as the library does it (exact fold).

It reports the checkpoint's relative distance from float64 after each fold, as the worst of the first
and of the last eighth of the steps. It does this for a fast-forgetting and a long-memory decay regime.

    PYTHONPATH=src python3 benchmarks/experiments/gdn_read_copy_correction.py --steps 4096
"""

from __future__ import annotations

import argparse
import json

import torch

from replayssm import GDNGeometry, GDNReplayState, ReplayConfig
from replayssm.ops import reference

GEOMETRY = GDNGeometry(key_heads=2, value_heads=4, key_dim=64, value_dim=64)
BATCH, WINDOW = 4, 16
REGIMES = {"fast decay (g in [-0.5, 0])": (0.5, 1e-3), "long memory (g in [-0.02, 0])": (0.02, 1e-4)}


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def run(decay_span: float, decay_floor: float, steps: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    variants = {"fp32-reads": None, "bf16-copy-uncorrected": torch.bfloat16, "bf16-copy": torch.bfloat16}
    states = {n: GDNReplayState(GEOMETRY, BATCH, ReplayConfig(window=WINDOW, read_dtype=r), device="cpu") for n, r in variants.items()}
    stagger = torch.arange(BATCH, dtype=torch.int32) % WINDOW
    for st in states.values():
        st.cursor.copy_(stagger)
    exact = torch.zeros(BATCH, GEOMETRY.value_heads, GEOMETRY.value_dim, GEOMETRY.key_dim, dtype=torch.float64)
    rows = torch.arange(BATCH)
    errors = {n: [] for n in variants}
    share = GEOMETRY.value_heads // GEOMETRY.key_heads
    for _ in range(steps):
        g = GEOMETRY
        q = torch.randn(BATCH, 1, g.key_heads, g.key_dim, generator=gen).to(torch.bfloat16)
        k = torch.randn(BATCH, 1, g.key_heads, g.key_dim, generator=gen).to(torch.bfloat16)
        v = torch.randn(BATCH, 1, g.value_heads, g.value_dim, generator=gen).to(torch.bfloat16)
        logd = -decay_span * torch.rand(BATCH, 1, g.value_heads, generator=gen) - decay_floor
        beta = torch.rand(BATCH, 1, g.value_heads, generator=gen) * 0.98 + 0.01
        before = exact.clone()
        flushing = states["fp32-reads"].cursor + 1 > WINDOW  # the same schedule in every variant
        states["bf16-copy-uncorrected"].ring_beta.zero_()  # beta 0: the fold takes every d as exact
        for st in states.values():
            reference.gdn_step(
                q, k, v, logd, beta, st.checkpoint, st.ring_k, st.ring_d, st.ring_g, st.cursor, st.pending, rows,
                True, True, None, st.read_checkpoint, st.ring_beta,
            )  # fmt: skip
        # The float64 recurrence (the reference's formula: l2-normalised k, alpha = exp(g)).
        kh = _l2norm(k[:, 0].double()).repeat_interleave(share, dim=1)
        prev = torch.exp(logd[:, 0].double())[..., None, None] * exact
        d = beta[:, 0].double()[..., None] * (v[:, 0].double() - torch.einsum("bhvk,bhk->bhv", prev, kh))
        exact = prev + d[..., None] * kh[:, :, None, :]
        if bool(flushing.any()):
            f = flushing.nonzero()[:, 0]
            for n, st in states.items():
                errors[n].append(float((st.checkpoint[f].double() - before[f]).norm() / before[f].norm()))
    eighth = max(1, len(errors["fp32-reads"]) // 8)
    return {n: {"first": max(e[:eighth]), "last": max(e[-eighth:])} for n, e in errors.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    results = {}
    for regime, (span, floor) in REGIMES.items():
        results[regime] = run(span, floor, args.steps, args.seed)
        for name, r in results[regime].items():
            print(f"{regime:32s} {name:22s} checkpoint vs float64, worst of first / last eighth: {r['first']:.2e} / {r['last']:.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"steps": args.steps, "seed": args.seed, "window": WINDOW, "batch": BATCH, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
