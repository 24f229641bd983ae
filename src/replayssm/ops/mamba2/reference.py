"""The PyTorch twin of the Mamba-2 ops: the CPU path and what the kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..replay_math import (
    append_entries, causal_sum, compute_dtype, fold_weights, live_entries, read_copy, ring_valid, segment_sums, store_fold,
)  # fmt: skip


def _mamba2_dt(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool, dtype: torch.dtype) -> Tensor:
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    return F.softplus(dt) if dt_softplus else dt


def _mamba2_fold(state: Tensor, ring_x: Tensor, ring_B: Tensor, ring_dt: Tensor, ring_logdecay: Tensor, valid: Tensor) -> Tensor:
    """State after the valid ring entries (``valid``: bool ``(batch, E)``): ``exp(G) S + sum_i exp(G_i) dt_i x_i B_i^T``."""
    heads, groups = state.shape[1], ring_B.shape[2]
    # Every ring tensor is selected: a dead entry's garbage must not meet a zero weight.
    log_decay, dt = live_entries(ring_logdecay, valid), live_entries(ring_dt, valid)
    x, B = live_entries(ring_x, valid), live_entries(ring_B, valid)
    decay, weights = fold_weights(log_decay)
    B_heads = B.repeat_interleave(heads // groups, dim=2)  # (batch, E, heads, N)
    update = torch.einsum("beh,behp,behn->bhpn", weights.exp() * dt, x, B_heads)
    return decay.exp()[:, :, None, None] * state + update


def mamba2_step(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    z: Tensor | None,
    checkpoint: Tensor,
    ring_x: Tensor,
    ring_B: Tensor,
    ring_dt: Tensor,
    ring_logdecay: Tensor,
    cursor: Tensor,
    pending: Tensor,
    rows: Tensor,
    commit: bool,
    dt_softplus: bool,
    read_checkpoint: Tensor | None = None,
    read_scale: Tensor | None = None,
) -> Tensor:
    """Reference replay step for Mamba-2; see ``replayssm.ops.mamba2_step``."""
    batch, num_tokens, heads, head_dim = x.shape
    groups = B.shape[2]
    window = ring_x.shape[1]
    cd = compute_dtype(x, checkpoint)
    rows = rows.long()
    c = cursor[rows].long()

    dt_t = _mamba2_dt(dt, dt_bias, dt_softplus, cd)  # (batch, T, heads)
    log_decay_t = dt_t * A.to(cd)
    ring_x_r, ring_B_r = ring_x[rows].to(cd), ring_B[rows].to(cd)
    ring_dt_r, ring_ld_r = ring_dt[rows].to(cd), ring_logdecay[rows].to(cd)
    state = checkpoint[rows].to(cd)

    # 1. rows whose ring cannot take T more entries fold their committed part.
    flush = c + num_tokens > window
    if bool(flush.any()):
        folded = _mamba2_fold(state, ring_x_r, ring_B_r, ring_dt_r, ring_ld_r, ring_valid(c, window))
        state = store_fold(folded, flush, rows, checkpoint, read_checkpoint, state, read_scale)
        c = torch.where(flush, torch.zeros_like(c), c)
    elif read_checkpoint is not None:
        state = read_copy(read_checkpoint, read_scale, rows, cd)

    # 2. outputs: the sequence is the committed ring entries followed by the T new tokens.
    #    Dead ring entries (past the cursor) are selected out, so their garbage never reaches the sums.
    valid = ring_valid(c, window)
    log_decay = torch.cat([live_entries(ring_ld_r, valid), log_decay_t], dim=1)  # (batch, L+T, heads)
    seq_dt = torch.cat([live_entries(ring_dt_r, valid), dt_t], dim=1)
    seq_x = torch.cat([live_entries(ring_x_r, valid), x.to(cd)], dim=1)
    seq_B = torch.cat([live_entries(ring_B_r, valid), B.to(cd)], dim=1)
    queries = window + torch.arange(num_tokens)
    prefix, segment = segment_sums(log_decay, queries)  # (batch, T, heads), (batch, T, L+T, heads)

    C_cd = C.to(cd)
    C_heads = C_cd.repeat_interleave(heads // groups, dim=2)  # (batch, T, heads, N)
    from_checkpoint = torch.einsum("bhpn,bthn->bthp", state, C_heads) * prefix.exp()[..., None]
    BC = torch.einsum("bign,btgn->btig", seq_B, C_cd).repeat_interleave(heads // groups, dim=3)  # (batch, T, L+T, heads)
    # A later token's terms are selected out, not weighted by exp(-inf) = 0: its dt or B may be non-finite.
    causal = torch.arange(window + num_tokens, device=x.device)[None, :] <= queries.to(x.device)[:, None]  # (T, L+T)
    weights = torch.where(causal[None, :, :, None], segment.exp() * seq_dt[:, None] * BC, 0.0)
    from_ring = causal_sum("btih,bihp->bthp", weights, seq_x, causal)
    y = from_checkpoint + from_ring
    if D is not None:
        y = y + D.to(cd)[:, None] * x.to(cd)
    if z is not None:
        y = y * F.silu(z.to(cd))

    # 3. append the T entries past the committed cursor.
    append_entries(rows, c, commit, cursor, pending, (ring_x, x), (ring_B, B), (ring_dt, dt_t), (ring_logdecay, log_decay_t))
    return y.to(x.dtype).contiguous()


def mamba2_materialize(
    checkpoint: Tensor,
    ring_x: Tensor,
    ring_B: Tensor,
    ring_dt: Tensor,
    ring_logdecay: Tensor,
    cursor: Tensor,
    rows: Tensor,
) -> Tensor:
    """Exact current state of ``rows`` (committed entries only), ``(n, heads, head_dim, state_size)``."""
    cd = compute_dtype(checkpoint)
    rows = rows.long()
    valid = ring_valid(cursor[rows].long(), ring_x.shape[1])
    return _mamba2_fold(
        checkpoint[rows].to(cd),
        ring_x[rows].to(cd),
        ring_B[rows].to(cd),
        ring_dt[rows].to(cd),
        ring_logdecay[rows].to(cd),
        valid,
    )


def mamba2_conventional_step(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    z: Tensor | None,
    state: Tensor,
    rows: Tensor,
    dt_softplus: bool,
) -> Tensor:
    """Conventional Mamba-2 decoding: read, update and write the state every token."""
    heads, groups = x.shape[2], B.shape[2]
    cd = compute_dtype(x, state)
    rows = rows.long()
    s = state[rows].to(cd)
    dt_t = _mamba2_dt(dt, dt_bias, dt_softplus, cd)
    decay = (dt_t * A.to(cd)).exp()
    B_heads = B.to(cd).repeat_interleave(heads // groups, dim=2)
    C_heads = C.to(cd).repeat_interleave(heads // groups, dim=2)
    outputs = []
    for t in range(x.shape[1]):
        s = decay[:, t, :, None, None] * s + torch.einsum(
            "bh,bhp,bhn->bhpn", dt_t[:, t], x[:, t].to(cd), B_heads[:, t]
        )
        s = s.to(state.dtype).to(cd)  # the state is stored after every token
        outputs.append(torch.einsum("bhpn,bhn->bhp", s, C_heads[:, t]))
    y = torch.stack(outputs, dim=1)
    if D is not None:
        y = y + D.to(cd)[:, None] * x.to(cd)
    if z is not None:
        y = y * F.silu(z.to(cd))
    state[rows] = s.to(state.dtype)
    return y.to(x.dtype).contiguous()
