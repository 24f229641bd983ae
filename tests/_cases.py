"""Random inputs and drivers shared by the core tests.

Inputs are fresh random draws (never zeros) in realistic ranges: dt around
softplus(N(0,1)), A in [-1.5, -0.5], GDN log-decays in [-0.5, 0) and beta in
(0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from naive import NaiveGDN, NaiveMamba2
from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig


@dataclass
class Mamba2Params:
    A: torch.Tensor
    D: torch.Tensor | None
    dt_bias: torch.Tensor | None


def mamba2_params(geometry: Mamba2Geometry, gen: torch.Generator, with_D=True, with_bias=True) -> Mamba2Params:
    h = geometry.heads
    return Mamba2Params(
        A=-(0.5 + torch.rand(h, generator=gen)),
        D=torch.randn(h, generator=gen) if with_D else None,
        dt_bias=0.1 * torch.randn(h, generator=gen) if with_bias else None,
    )


def mamba2_inputs(geometry: Mamba2Geometry, batch: int, T: int, gen: torch.Generator, dtype=torch.float32, with_z=True):
    g = geometry
    x = torch.randn(batch, T, g.heads, g.head_dim, generator=gen)
    dt = torch.randn(batch, T, g.heads, generator=gen)
    B = torch.randn(batch, T, g.groups, g.state_size, generator=gen)
    C = torch.randn(batch, T, g.groups, g.state_size, generator=gen)
    z = torch.randn(batch, T, g.heads, g.head_dim, generator=gen) if with_z else None
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return cast(x), dt, cast(B), cast(C), cast(z)


def gdn_inputs(geometry: GDNGeometry, batch: int, T: int, gen: torch.Generator, dtype=torch.float32):
    g = geometry
    q = torch.randn(batch, T, g.key_heads, g.key_dim, generator=gen)
    k = torch.randn(batch, T, g.key_heads, g.key_dim, generator=gen)
    v = torch.randn(batch, T, g.value_heads, g.value_dim, generator=gen)
    logd = -0.5 * torch.rand(batch, T, g.value_heads, generator=gen) - 1e-3
    beta = torch.rand(batch, T, g.value_heads, generator=gen) * 0.98 + 0.01
    return q.to(dtype), k.to(dtype), v.to(dtype), logd, beta


class Mamba2Pair:
    """A replay state and the float64 naive recurrence, driven together."""

    def __init__(self, geometry: Mamba2Geometry, slots: int, config: ReplayConfig, gen: torch.Generator, **param_kw):
        self.geometry = geometry
        self.gen = gen
        self.state = Mamba2ReplayState(geometry, slots, config)
        self.naive = NaiveMamba2(slots, geometry.heads, geometry.head_dim, geometry.state_size, geometry.groups)
        self.params = mamba2_params(geometry, gen, **param_kw)

    def step(self, rows: list[int], T: int, commit: bool, with_z=True):
        """Run the replay op; returns (y, expected_y, candidate_states) where candidate_states[b][t] is the naive state after token t."""
        x, dt, B, C, z = mamba2_inputs(self.geometry, len(rows), T, self.gen, with_z=with_z)
        p = self.params
        y = self.state.step(x, dt, p.A, B, C, p.D, p.dt_bias, z, rows=rows, commit=commit)
        expected = torch.empty(y.shape, dtype=torch.float64)
        candidates = []
        for b, r in enumerate(rows):
            s = self.naive.state[r]
            row_states = []
            for t in range(T):
                expected[b, t], s = self.naive.token(
                    r, x[b, t], dt[b, t], p.A, B[b, t], C[b, t], p.D, p.dt_bias, None if z is None else z[b, t], state=s
                )
                row_states.append(s)
            candidates.append(row_states)
        return y, expected, candidates


class GDNPair:
    def __init__(self, geometry: GDNGeometry, slots: int, config: ReplayConfig, gen: torch.Generator, l2norm=True):
        self.geometry = geometry
        self.gen = gen
        self.l2norm = l2norm
        self.state = GDNReplayState(geometry, slots, config)
        self.naive = NaiveGDN(slots, geometry.key_heads, geometry.value_heads, geometry.key_dim, geometry.value_dim)

    def step(self, rows: list[int], T: int, commit: bool):
        q, k, v, g, beta = gdn_inputs(self.geometry, len(rows), T, self.gen)
        if not self.l2norm:
            # Without in-op normalisation a model passes unit keys (or the delta rule diverges).
            q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
        o = self.state.step(q, k, v, g, beta, rows=rows, commit=commit, use_qk_l2norm=self.l2norm)
        expected = torch.empty(o.shape, dtype=torch.float64)
        candidates = []
        for b, r in enumerate(rows):
            s = self.naive.state[r]
            row_states = []
            for t in range(T):
                expected[b, t], s = self.naive.token(r, q[b, t], k[b, t], v[b, t], g[b, t], beta[b, t], l2norm=self.l2norm, state=s)
                row_states.append(s)
            candidates.append(row_states)
        return o, expected, candidates


def accept(pair, rows: list[int], candidates, accepted: list[int]) -> None:
    """Advance the naive states of ``rows`` by their accepted tokens."""
    for r, row_states, n in zip(rows, candidates, accepted):
        if n > 0:
            pair.naive.state[r] = row_states[n - 1]
