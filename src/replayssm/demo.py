"""The main job: decode random layers both ways and show what replay saves.

``python -m replayssm demo`` runs it (on the GPU when there is one). It
decodes a random Mamba-2 layer and a random Gated DeltaNet layer token by
token with the conventional op (state read and written every token) and with
the replay op (checkpoint + ring), checks the outputs agree, counts the
checkpoint writes, and prints the bytes each would move at serving scale.
"""

from __future__ import annotations

import time

import torch

from . import ops
from .config import ReplayConfig
from .state import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState
from .traffic import decode_traffic


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _mamba2_layer(geometry: Mamba2Geometry, batch: int, window: int, device, gen):
    """Returns (replay state, conventional state, draw inputs, conventional step, replay step)."""
    g = geometry
    A = -(0.5 + torch.rand(g.heads, generator=gen)).to(device)
    D, dt_bias = torch.randn(g.heads, generator=gen).to(device), (0.1 * torch.randn(g.heads, generator=gen)).to(device)
    replay = Mamba2ReplayState(g, batch, ReplayConfig(window=window), device=device)
    conventional = torch.zeros_like(replay.checkpoint)
    rows = torch.arange(batch, device=device)

    def draw():
        shapes = [(g.heads, g.head_dim), (g.heads,), (g.groups, g.state_size), (g.groups, g.state_size)]
        return [torch.randn(batch, 1, *s, generator=gen).to(device) for s in shapes]

    def conventional_step(x, dt, B, C):
        return ops.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, None, conventional, rows, True)

    def replay_step(x, dt, B, C):
        return replay.step(x, dt, A, B, C, D, dt_bias, rows=rows)

    return replay, conventional, draw, conventional_step, replay_step


def _gdn_layer(geometry: GDNGeometry, batch: int, window: int, device, gen):
    g = geometry
    replay = GDNReplayState(g, batch, ReplayConfig(window=window), device=device)
    conventional = torch.zeros_like(replay.checkpoint)
    rows = torch.arange(batch, device=device)

    def draw():
        q, k = (torch.randn(batch, 1, g.key_heads, g.key_dim, generator=gen).to(device) for _ in range(2))
        v = torch.randn(batch, 1, g.value_heads, g.value_dim, generator=gen).to(device)
        log_decay = (-0.5 * torch.rand(batch, 1, g.value_heads, generator=gen)).to(device)
        beta = torch.rand(batch, 1, g.value_heads, generator=gen).to(device)
        return [q, k, v, log_decay, beta]

    def conventional_step(*inputs):
        return ops.gdn_conventional_step(*inputs, conventional, rows, True, None)

    def replay_step(*inputs):
        return replay.step(*inputs, rows=rows, use_qk_l2norm=True)

    return replay, conventional, draw, conventional_step, replay_step


def _decode_both_ways(layer, tokens: int):
    """Decode ``tokens`` steps both ways; worst output difference, state difference, checkpoint writes, times."""
    replay, conventional, draw, conventional_step, replay_step = layer
    worst, writes, t_conv, t_replay = 0.0, 0, 0.0, 0.0
    for _ in range(tokens):
        inputs = draw()
        t0 = time.perf_counter()
        reference = conventional_step(*inputs)
        t1 = time.perf_counter()
        before = replay.checkpoint.clone()
        t2 = time.perf_counter()
        out = replay_step(*inputs)
        t3 = time.perf_counter()
        writes += int(not torch.equal(before, replay.checkpoint))
        worst = max(worst, _rel(out, reference))
        t_conv, t_replay = t_conv + t1 - t0, t_replay + t3 - t2
    return worst, _rel(replay.materialize(), conventional), writes, t_conv / tokens, t_replay / tokens


def run_layer_demo(device: str | None = None, tokens: int = 48, window: int = 16, batch: int = 4) -> None:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gen = torch.Generator().manual_seed(0)
    print(f"replayssm layer demo on {device}: batch {batch}, {tokens} tokens, window {window}\n")
    layers = [
        ("Mamba-2", Mamba2Geometry(heads=8, head_dim=64, state_size=128, groups=2), _mamba2_layer),
        ("Gated DeltaNet", GDNGeometry(key_heads=4, value_heads=8, key_dim=128, value_dim=128), _gdn_layer),
    ]
    for name, geometry, build in layers:
        layer = build(geometry, batch, window, device, gen)
        worst, state_err, writes, t_conv, t_replay = _decode_both_ways(layer, tokens)
        print(f"{name} {geometry}")
        print(f"  outputs, replay vs conventional: max relative difference {worst:.1e}; state {state_err:.1e}")
        print(f"  checkpoint writes: conventional {tokens}, replay {writes} (one per {window} tokens)")
        print(f"  time per step ({device}, eager): conventional {t_conv * 1e3:.2f} ms, replay {t_replay * 1e3:.2f} ms")
    print("\nBytes per decode step at serving scale (batch 256, fp32 state, bf16 activations, window 16):")
    print(f"  {'layer':<40} {'conventional':>13} {'replay':>10} {'saved':>7}")
    serving = [
        ("Mamba-2, 128 heads x 64 x 128, 8 groups", Mamba2Geometry(128, 64, 128, 8)),
        ("GDN, 16 key / 32 value heads x 128 x 128", GDNGeometry(16, 32, 128, 128)),
    ]
    for label, geometry in serving:
        t = decode_traffic(geometry, batch=256, window=16)
        print(f"  {label:<40} {t.conventional / 2**20:>9.0f} MiB {t.replay / 2**20:>6.0f} MiB {t.ratio:>6.2f}x")
    print("  (state writes per token drop from the whole state to 1/16 of it plus one ring entry)")
