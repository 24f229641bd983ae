"""Float64 naive recurrences, written independently of the library.

These are the ground truth of the tests: one token at a time, the full state
kept in float64, exactly the recurrences of SPEC §1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class NaiveMamba2:
    """Per-row float64 Mamba-2 state with explicit token-by-token updates."""

    def __init__(self, slots: int, heads: int, head_dim: int, state_size: int, groups: int):
        self.groups = groups
        self.state = torch.zeros(slots, heads, head_dim, state_size, dtype=torch.float64)

    def token(self, row: int, x, dt, A, B, C, D=None, dt_bias=None, z=None, softplus=True, state=None):
        """Advance ``row`` by one token (or a given ``state``); returns (y, new_state)."""
        s = self.state[row] if state is None else state
        heads = x.shape[0]
        dt = dt.double() + (dt_bias.double() if dt_bias is not None else 0)
        dt = F.softplus(dt) if softplus else dt
        rep = heads // self.groups
        y = torch.empty(x.shape, dtype=torch.float64)
        new = torch.empty_like(s)
        for h in range(heads):
            grp = h // rep
            a = torch.exp(dt[h] * A[h].double())
            new[h] = a * s[h] + dt[h] * torch.outer(x[h].double(), B[grp].double())
            y[h] = new[h] @ C[grp].double()
            if D is not None:
                y[h] += D[h].double() * x[h].double()
            if z is not None:
                y[h] *= F.silu(z[h].double())
        return y, new


class NaiveGDN:
    """Per-row float64 Gated DeltaNet state ``(value_heads, value_dim, key_dim)``."""

    def __init__(self, slots: int, key_heads: int, value_heads: int, key_dim: int, value_dim: int):
        self.key_heads = key_heads
        self.state = torch.zeros(slots, value_heads, value_dim, key_dim, dtype=torch.float64)

    def token(self, row: int, q, k, v, g, beta, l2norm=False, scale=None, state=None):
        s = self.state[row] if state is None else state
        value_heads = v.shape[0]
        rep = value_heads // self.key_heads
        q, k = q.double(), k.double()
        if l2norm:
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
        o = torch.empty(v.shape, dtype=torch.float64)
        new = torch.empty_like(s)
        for h in range(value_heads):
            kh, qh = k[h // rep], q[h // rep]
            alpha = torch.exp(g[h].double())
            prev = alpha * s[h]
            new[h] = prev + beta[h].double() * torch.outer(v[h].double() - prev @ kh, kh)
            o[h] = new[h] @ qh
        return o, new


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error ||a - b|| / ||b||; NaN anywhere fails."""
    a, b = a.double(), b.double()
    assert not torch.isnan(a).any(), "NaN in result"
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
