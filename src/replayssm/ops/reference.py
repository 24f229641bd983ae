"""Pure-PyTorch implementations of every replayssm op.

These are the CPU kernels and the reference every Triton kernel is tested
against: each function here has exactly the signature of the op it
implements (see ``replayssm.ops`` and docs/ops.md). They favour clarity over
speed, but stay vectorised over rows and heads so the CPU path is usable.

Conventions (SPEC §1-3):

* Mamba-2 state per head is ``(head_dim P, state_size N)``; GDN state per
  value head is ``(value_dim V, key_dim K)``. In both the key-like dimension
  (N or K) is the contiguous one.
* Head ``h`` of Mamba-2 uses group ``h // (heads // groups)``; value head
  ``h`` of GDN uses key head ``h // (value_heads // key_heads)``.
* Arithmetic runs in fp32 (fp64 when the inputs are fp64). Decay products are
  formed from direct sums of log-decays over each segment, never from
  differences of cumulative sums, so they do not lose digits to cancellation.

The replay step for T tokens of one row with committed cursor ``c``:

1. if ``c + T > window``, fold the ``c`` committed ring entries into the
   checkpoint (the only checkpoint write), and ``c = 0``;
2. compute the T outputs from the checkpoint (or its read copy, SPEC §4), the
   ``c`` ring entries and the causal terms among the T tokens;
3. write the T entries at ring positions ``c .. c+T-1``; with ``commit`` they
   are committed at once (``cursor = c + T``), otherwise they are pending
   until ``commit``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# ---------------------------------------------------------------------------
# shared helpers
# ---------------------------------------------------------------------------


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _segment_sums(log_decay: Tensor, query_positions: Tensor) -> tuple[Tensor, Tensor]:
    """Sums of log-decays over segments ending at each query position.

    Args:
        log_decay: ``(batch, E, heads)`` log-decays of a sequence of E entries.
        query_positions: ``(Q,)`` entry indices at which states are wanted.

    Returns:
        ``prefix (batch, Q, heads)``: sum of ``log_decay[0..m]`` (decay of the
        checkpoint up to and including entry m), and
        ``segment (batch, Q, E, heads)``: sum of ``log_decay[i+1..m]`` for
        ``i <= m`` (decay applied to entry i's update), ``-inf`` for ``i > m``
        so that ``exp`` gives exactly zero for non-causal terms.
    """
    num_entries = log_decay.shape[1]
    j = torch.arange(num_entries, device=log_decay.device)
    m = query_positions.to(log_decay.device)
    prefix_mask = (j[None, :] <= m[:, None]).to(log_decay.dtype)  # (Q, E)
    prefix = torch.einsum("qj,bjh->bqh", prefix_mask, log_decay)
    # segment_mask[q, i, j] = i < j <= m_q
    segment_mask = ((j[None, :, None] < j[None, None, :]) & (j[None, None, :] <= m[:, None, None])).to(log_decay.dtype)
    segment = torch.einsum("qij,bjh->bqih", segment_mask, log_decay)
    causal = j[None, :] <= m[:, None]  # (Q, E)
    segment = segment.masked_fill(~causal[None, :, :, None], float("-inf"))
    return prefix, segment


def _fold_weights(log_decay: Tensor) -> tuple[Tensor, Tensor]:
    """Decay of the checkpoint and of each entry's update at the end of a sequence."""
    num_entries = log_decay.shape[1]
    prefix, segment = _segment_sums(log_decay, torch.tensor([num_entries - 1]))
    return prefix[:, 0], segment[:, 0]  # (batch, heads), (batch, E, heads)


def _ring_valid(cursor: Tensor, window: int) -> Tensor:
    """``(batch, window)`` mask of ring slots holding committed entries."""
    return torch.arange(window, device=cursor.device)[None, :] < cursor[:, None]


def _scatter_ring(ring: Tensor, rows: Tensor, start: Tensor, values: Tensor) -> None:
    """``ring[rows[b], start[b] + t] = values[b, t]`` for every row b and token t."""
    num_tokens = values.shape[1]
    positions = start[:, None] + torch.arange(num_tokens, device=start.device)[None, :]
    ring[rows[:, None], positions] = values.to(ring.dtype)


def _append(rows: Tensor, start: Tensor, commit: bool, cursor: Tensor, pending: Tensor, *rings: tuple[Tensor, Tensor]) -> None:
    """Write the T new entries of each ring at ``start``; commit them or leave them pending."""
    num_tokens = rings[0][1].shape[1]
    for ring, values in rings:
        _scatter_ring(ring, rows, start, values)
    if commit:
        cursor[rows] = (start + num_tokens).to(cursor.dtype)
        pending.index_fill_(0, rows, 0)
    else:
        cursor[rows] = start.to(cursor.dtype)
        pending.index_fill_(0, rows, num_tokens)


def _store_fold(folded: Tensor, flush: Tensor, rows: Tensor, checkpoint: Tensor, read_checkpoint: Tensor | None, state: Tensor) -> Tensor:
    """Store the fold of the flushing rows and return the state the outputs read, per row.

    The checkpoint (and the read copy, if any: SPEC §4) take the fold rounded to their dtypes; the
    outputs read the read copy where there is one, else the checkpoint, as stored.
    """
    stored = folded.to(checkpoint.dtype)
    checkpoint[rows[flush]] = stored[flush]
    if read_checkpoint is not None:
        stored = folded.to(read_checkpoint.dtype)
        read_checkpoint[rows[flush]] = stored[flush]
        state = read_checkpoint[rows].to(folded.dtype)
    return torch.where(flush[:, None, None, None], stored.to(folded.dtype), state)


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    # Same formula as the Hugging Face and fla GDN paths.
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


# ---------------------------------------------------------------------------
# Mamba-2
# ---------------------------------------------------------------------------


def _mamba2_dt(dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool, dtype: torch.dtype) -> Tensor:
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    return F.softplus(dt) if dt_softplus else dt


def _mamba2_fold(state: Tensor, ring_x: Tensor, ring_B: Tensor, ring_dt: Tensor, ring_logdecay: Tensor, valid: Tensor) -> Tensor:
    """State after the valid ring entries: ``exp(G) S + sum_i exp(G_i) dt_i x_i B_i^T``."""
    heads, groups = state.shape[1], ring_B.shape[2]
    log_decay = ring_logdecay * valid[..., None]
    dt = ring_dt * valid[..., None]
    decay, weights = _fold_weights(log_decay)
    B_heads = ring_B.repeat_interleave(heads // groups, dim=2)  # (batch, E, heads, N)
    update = torch.einsum("beh,behp,behn->bhpn", weights.exp() * dt, ring_x, B_heads)
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
) -> Tensor:
    """Reference replay step for Mamba-2; see ``replayssm.ops.mamba2_step``."""
    batch, num_tokens, heads, head_dim = x.shape
    groups = B.shape[2]
    window = ring_x.shape[1]
    cd = _compute_dtype(x, checkpoint)
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
        folded = _mamba2_fold(state, ring_x_r, ring_B_r, ring_dt_r, ring_ld_r, _ring_valid(c, window))
        state = _store_fold(folded, flush, rows, checkpoint, read_checkpoint, state)
        c = torch.where(flush, torch.zeros_like(c), c)
    elif read_checkpoint is not None:
        state = read_checkpoint[rows].to(cd)

    # 2. outputs: the sequence is the committed ring entries followed by the T new tokens.
    valid = _ring_valid(c, window).to(cd)
    log_decay = torch.cat([ring_ld_r * valid[..., None], log_decay_t], dim=1)  # (batch, L+T, heads)
    seq_dt = torch.cat([ring_dt_r * valid[..., None], dt_t], dim=1)
    seq_x = torch.cat([ring_x_r, x.to(cd)], dim=1)
    seq_B = torch.cat([ring_B_r, B.to(cd)], dim=1)
    queries = window + torch.arange(num_tokens)
    prefix, segment = _segment_sums(log_decay, queries)  # (batch, T, heads), (batch, T, L+T, heads)

    C_cd = C.to(cd)
    C_heads = C_cd.repeat_interleave(heads // groups, dim=2)  # (batch, T, heads, N)
    from_checkpoint = torch.einsum("bhpn,bthn->bthp", state, C_heads) * prefix.exp()[..., None]
    BC = torch.einsum("bign,btgn->btig", seq_B, C_cd).repeat_interleave(heads // groups, dim=3)  # (batch, T, L+T, heads)
    weights = segment.exp() * seq_dt[:, None] * BC
    from_ring = torch.einsum("btih,bihp->bthp", weights, seq_x)
    y = from_checkpoint + from_ring
    if D is not None:
        y = y + D.to(cd)[:, None] * x.to(cd)
    if z is not None:
        y = y * F.silu(z.to(cd))

    # 3. append the T entries past the committed cursor.
    _append(rows, c, commit, cursor, pending, (ring_x, x), (ring_B, B), (ring_dt, dt_t), (ring_logdecay, log_decay_t))
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
    cd = _compute_dtype(checkpoint)
    rows = rows.long()
    valid = _ring_valid(cursor[rows].long(), ring_x.shape[1])
    return _mamba2_fold(
        checkpoint[rows].to(cd),
        ring_x[rows].to(cd),
        ring_B[rows].to(cd),
        ring_dt[rows].to(cd),
        ring_logdecay[rows].to(cd),
        valid.to(cd),
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
    cd = _compute_dtype(x, state)
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


# ---------------------------------------------------------------------------
# Gated DeltaNet
# ---------------------------------------------------------------------------


def _gdn_fold(state: Tensor, ring_k: Tensor, ring_d: Tensor, ring_g: Tensor, valid: Tensor) -> Tensor:
    """State after the valid ring entries: ``exp(G) S + sum_i exp(G_i) d_i k_i^T``."""
    value_heads, key_heads = state.shape[1], ring_k.shape[2]
    decay, weights = _fold_weights(ring_g * valid[..., None])
    k_heads = ring_k.repeat_interleave(value_heads // key_heads, dim=2)  # (batch, E, value_heads, K)
    update = torch.einsum("beh,behv,behk->bhvk", weights.exp() * valid[..., None], ring_d, k_heads)
    return decay.exp()[:, :, None, None] * state + update


def _gdn_read_copy_chain(
    state: Tensor, copy: Tensor, ring_k: Tensor, ring_d: Tensor, ring_g: Tensor, ring_beta: Tensor, valid: Tensor
) -> tuple[Tensor, Tensor]:
    """The exact fold with a read copy: the state after the valid entries, and each entry's correction.

    An entry's d was formed from ``S k`` read off the copy, so it is the update of the state the steps
    read, not of the fp32 one. With ``D_0 = S - copy`` (the gap between the two) the true update of entry
    j is ``d_j + e_j``, ``e_j = -beta_j alpha_j D_{j-1} k_j``, and the gap moves on as
    ``D_j = alpha_j D_{j-1} + e_j k_j^T``. An entry whose d is already exact has beta 0 (no correction).
    Returns the folded state ``(batch, HV, V, K)`` and the corrections ``(batch, E, HV, V)``, zero for
    invalid entries.
    """
    value_heads, key_heads = state.shape[1], ring_k.shape[2]
    k_heads = ring_k.repeat_interleave(value_heads // key_heads, dim=2)  # (batch, E, HV, K)
    gap, folded = state - copy, state
    corrections = torch.zeros_like(ring_d)
    for j in range(ring_k.shape[1]):
        live = valid[:, j, None]  # (batch, 1)
        alpha = torch.where(live, ring_g[:, j].exp(), 1.0)  # (batch, HV)
        k = k_heads[:, j]
        e = torch.where(live[..., None], -(ring_beta[:, j] * alpha)[..., None] * torch.einsum("bhvk,bhk->bhv", gap, k), 0.0)
        d = torch.where(live[..., None], ring_d[:, j], 0.0)
        gap = alpha[..., None, None] * gap + e[..., None] * k[:, :, None, :]
        folded = alpha[..., None, None] * folded + (d + e)[..., None] * k[:, :, None, :]
        corrections[:, j] = e
    return folded, corrections


def gdn_settle_ring(
    checkpoint: Tensor, read_checkpoint: Tensor, ring_k: Tensor, ring_d: Tensor, ring_g: Tensor, ring_beta: Tensor, rows: Tensor, count: Tensor
) -> None:
    """Make the first ``count[i]`` ring entries of ``rows[i]`` exact (in place): ``d += e``, ``beta = 0``.

    A partial fold with a read copy settles every entry it keeps first: after it, the copy is rounded from
    the new checkpoint, and the kept entries' d, formed against the old copy, could no longer be
    corrected from it.
    """
    rows = rows.long()
    cd = _compute_dtype(checkpoint)
    valid = _ring_valid(count.to(rows.device).long(), ring_k.shape[1])
    _, corrections = _gdn_read_copy_chain(
        checkpoint[rows].to(cd), read_checkpoint[rows].to(cd), ring_k[rows].to(cd), ring_d[rows].to(cd), ring_g[rows].to(cd),
        ring_beta[rows].to(cd), valid,
    )  # fmt: skip
    ring_d[rows] = (ring_d[rows].to(cd) + corrections).to(ring_d.dtype)
    ring_beta[rows] = torch.where(valid[..., None], 0.0, ring_beta[rows])


def _gdn_ends_with_copy_entry(ring_beta: Tensor, rows: Tensor, cursor: Tensor) -> Tensor:
    """Whether each row's last committed ring entry (``cursor - 1``) was formed against the read copy,
    ``(batch,)`` bool: its stored beta (value head 0) is not +0. An exact entry stores +0; one formed
    against the copy stores its beta, and -0 for a beta of 0 (numerically the same, but marked)."""
    last = ring_beta[rows, (cursor - 1).clamp(min=0), 0]
    return (cursor > 0) & ((last != 0) | torch.signbit(last))


def _gdn_copy_beta(beta: Tensor) -> Tensor:
    """The betas stored with entries formed against the read copy: beta, -0 for 0 (the mark of
    ``_gdn_ends_with_copy_entry``)."""
    return torch.where(beta == 0, torch.full_like(beta, -0.0), beta)


def _gdn_prepare_qk(q: Tensor, k: Tensor, use_qk_l2norm: bool, scale: float | None, cd: torch.dtype) -> tuple[Tensor, Tensor]:
    q, k = q.to(cd), k.to(cd)
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q * scale, k


def gdn_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    checkpoint: Tensor,
    ring_k: Tensor,
    ring_d: Tensor,
    ring_g: Tensor,
    cursor: Tensor,
    pending: Tensor,
    rows: Tensor,
    commit: bool,
    use_qk_l2norm: bool,
    scale: float | None,
    read_checkpoint: Tensor | None = None,
    ring_beta: Tensor | None = None,
) -> Tensor:
    """Reference replay step for Gated DeltaNet; see ``replayssm.ops.gdn_step``."""
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads = v.shape[2]
    window = ring_k.shape[1]
    share = value_heads // key_heads
    cd = _compute_dtype(v, checkpoint)
    rows = rows.long()
    c = cursor[rows].long()

    q_t, k_t = _gdn_prepare_qk(q, k, use_qk_l2norm, scale, cd)
    g_t, beta_t, v_t = g.to(cd), beta.to(cd), v.to(cd)
    ring_k_r, ring_d_r, ring_g_r = ring_k[rows].to(cd), ring_d[rows].to(cd), ring_g[rows].to(cd)
    state = checkpoint[rows].to(cd)

    # 1. rows whose ring cannot take T more entries fold their committed part. Verification with a read
    #    copy reads the checkpoint (docs/ops.md, "Read copy"): its d are then exact, so a row whose ring
    #    ends in entries formed against the copy (decode steps') folds first, as their correction needs.
    exact_reads = read_checkpoint is not None and num_tokens > 1
    flush = c + num_tokens > window
    if exact_reads:
        flush = flush | _gdn_ends_with_copy_entry(ring_beta, rows, c)
    if bool(flush.any()):
        if read_checkpoint is None:
            folded = _gdn_fold(state, ring_k_r, ring_d_r, ring_g_r, _ring_valid(c, window).to(cd))
        else:  # the ring's d may have been formed against the copy: the exact fold corrects them
            folded, _ = _gdn_read_copy_chain(
                state, read_checkpoint[rows].to(cd), ring_k_r, ring_d_r, ring_g_r, ring_beta[rows].to(cd), _ring_valid(c, window)
            )
        state = _store_fold(folded, flush, rows, checkpoint, read_checkpoint, state)
        c = torch.where(flush, torch.zeros_like(c), c)
    elif read_checkpoint is not None:
        state = read_checkpoint[rows].to(cd)
    if exact_reads:  # the checkpoint as stored
        state = checkpoint[rows].to(cd)

    # 2. outputs. Sequence = committed ring entries, then the T new tokens whose
    #    corrected updates d_t are solved for in order (unit lower-triangular).
    valid = _ring_valid(c, window).to(cd)
    log_decay = torch.cat([ring_g_r * valid[..., None], g_t], dim=1)  # (batch, L+T, HV)
    seq_k = torch.cat([ring_k_r, k_t], dim=1).repeat_interleave(share, dim=2)  # (batch, L+T, HV, K)
    q_heads = q_t.repeat_interleave(share, dim=2)  # (batch, T, HV, K)
    k_heads = k_t.repeat_interleave(share, dim=2)
    prefix, segment = _segment_sums(log_decay, window + torch.arange(num_tokens))
    decay_seq = segment.exp()  # (batch, T, L+T, HV), zero for non-causal entries

    # One read of the checkpoint serves S k and S q.
    S_k = torch.einsum("bhvk,bthk->bthv", state, k_heads) * prefix.exp()[..., None]
    S_q = torch.einsum("bhvk,bthk->bthv", state, q_heads) * prefix.exp()[..., None]
    kk = torch.einsum("bihk,bthk->btih", seq_k, k_heads)  # k_i . k_t
    kq = torch.einsum("bihk,bthk->btih", seq_k, q_heads)  # k_i . q_t

    seq_d = torch.cat([ring_d_r * valid[..., None, None], torch.zeros_like(v_t)], dim=1)  # (batch, L+T, HV, V)
    for t in range(num_tokens):
        before = window + t  # entries strictly before token t
        w = decay_seq[:, t, :before] * kk[:, t, :before]  # (batch, before, HV)
        alpha_r = S_k[:, t] + torch.einsum("bih,bihv->bhv", w, seq_d[:, :before])  # alpha_t * S_{t-1} k_t
        seq_d[:, before] = beta_t[:, t, :, None] * (v_t[:, t] - alpha_r)
    o = S_q + torch.einsum("btih,bihv->bthv", decay_seq * kq, seq_d)
    d_t = seq_d[:, window:]

    # 3. append the T entries past the committed cursor.
    entries = [(ring_k, k_t), (ring_d, d_t), (ring_g, g_t)]
    if ring_beta is not None:  # an exact entry's beta is +0: the fold takes its d as it is
        entries.append((ring_beta, torch.zeros_like(beta_t) if exact_reads else _gdn_copy_beta(beta_t)))
    _append(rows, c, commit, cursor, pending, *entries)
    return o.to(v.dtype).contiguous()


def gdn_materialize(
    checkpoint: Tensor,
    ring_k: Tensor,
    ring_d: Tensor,
    ring_g: Tensor,
    cursor: Tensor,
    rows: Tensor,
    read_checkpoint: Tensor | None = None,
    ring_beta: Tensor | None = None,
) -> Tensor:
    """Exact current state of ``rows`` (committed entries only), ``(n, value_heads, value_dim, key_dim)``.

    With a read copy the ring's d are corrected as the fold corrects them (``_gdn_read_copy_chain``).
    """
    cd = _compute_dtype(checkpoint)
    rows = rows.long()
    valid = _ring_valid(cursor[rows].long(), ring_k.shape[1])
    state, ring = checkpoint[rows].to(cd), (ring_k[rows].to(cd), ring_d[rows].to(cd), ring_g[rows].to(cd))
    if read_checkpoint is None:
        return _gdn_fold(state, *ring, valid.to(cd))
    return _gdn_read_copy_chain(state, read_checkpoint[rows].to(cd), *ring, ring_beta[rows].to(cd), valid)[0]


def gdn_conventional_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    rows: Tensor,
    use_qk_l2norm: bool,
    scale: float | None,
) -> Tensor:
    """Conventional GDN decoding: read, update and write the state every token."""
    share = v.shape[2] // k.shape[2]
    cd = _compute_dtype(v, state)
    rows = rows.long()
    s = state[rows].to(cd)  # (batch, HV, V, K)
    q_t, k_t = _gdn_prepare_qk(q, k, use_qk_l2norm, scale, cd)
    q_t, k_t = q_t.repeat_interleave(share, dim=2), k_t.repeat_interleave(share, dim=2)
    outputs = []
    for t in range(v.shape[1]):
        s = g[:, t].to(cd).exp()[:, :, None, None] * s
        r = torch.einsum("bhvk,bhk->bhv", s, k_t[:, t])
        d = beta[:, t].to(cd)[:, :, None] * (v[:, t].to(cd) - r)
        s = s + torch.einsum("bhv,bhk->bhvk", d, k_t[:, t])
        s = s.to(state.dtype).to(cd)  # the state is stored after every token
        outputs.append(torch.einsum("bhvk,bhk->bhv", s, q_t[:, t]))
    state[rows] = s.to(state.dtype)
    return torch.stack(outputs, dim=1).to(v.dtype).contiguous()


# ---------------------------------------------------------------------------
# commit (family-agnostic: a cursor move)
# ---------------------------------------------------------------------------


def commit(cursor: Tensor, pending: Tensor, rows: Tensor, accepted: Tensor) -> None:
    """Make the first ``accepted[b]`` pending entries of ``rows[b]`` part of its state.

    Device-side only (no host values), so it can be captured in a CUDA graph.
    """
    rows = rows.long()
    cursor[rows] = cursor[rows] + accepted.to(cursor.dtype)
    pending.index_fill_(0, rows, 0)


# ---------------------------------------------------------------------------
# the causal conv in front of the SSM, one decode step
# ---------------------------------------------------------------------------


def causal_conv_columns(inputs: Tensor, weight: Tensor, bias: Tensor | None, silu: bool) -> Tensor:
    """One output column per row and channel from its last ``taps`` inputs ``(batch, channels, taps)``.

    Computed in fp64 and rounded to ``inputs``' dtype at the end: products of 16-bit (and fp32) values
    are exact in fp64, so implementations that sum in fp64 (the Triton kernel, an eager step, an
    inductor-fused one, which would otherwise round intermediates differently) differ by about 1e-16
    relative before that rounding, which practically never reaches a 16-bit result.
    """
    out = (inputs.double() * weight.double()).sum(-1)
    if bias is not None:
        out = out + bias.double()
    if silu:
        out = torch.nn.functional.silu(out)
    return out.to(inputs.dtype)


def causal_conv_step(x: Tensor, weight: Tensor, bias: Tensor | None, window: Tensor, silu: bool) -> Tensor:
    """Depthwise causal conv of one new column ``x`` ``(batch, channels)`` after ``window`` ``(batch,
    channels, width)`` (the last ``width`` inputs, oldest first); the window moves on by one column in
    place. ``weight`` ``(channels, taps)``, ``width >= taps - 1``. Returns ``(batch, channels)`` in x's dtype.
    """
    taps = weight.shape[1]
    extended = torch.cat([window, x[..., None]], dim=-1)
    out = causal_conv_columns(extended[..., extended.shape[-1] - taps :], weight, bias, silu)
    window.copy_(extended[..., 1:])
    return out
