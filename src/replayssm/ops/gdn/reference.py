"""The PyTorch twin of the Gated DeltaNet ops: the CPU path and what the kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..replay_math import append_entries, causal_sum, compute_dtype, fold_weights, live_entries, ring_valid, segment_sums, store_fold


def _l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    # Same formula as the Hugging Face and fla GDN paths.
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _gdn_fold(state: Tensor, ring_k: Tensor, ring_d: Tensor, ring_g: Tensor, valid: Tensor) -> Tensor:
    """State after the valid ring entries (``valid``: bool ``(batch, E)``): ``exp(G) S + sum_i exp(G_i) d_i k_i^T``."""
    value_heads, key_heads = state.shape[1], ring_k.shape[2]
    # Every ring tensor is selected: a dead entry's garbage must not meet a zero weight.
    decay, weights = fold_weights(live_entries(ring_g, valid))
    k_heads = live_entries(ring_k, valid).repeat_interleave(value_heads // key_heads, dim=2)  # (batch, E, value_heads, K)
    update = torch.einsum("beh,behv,behk->bhvk", weights.exp(), live_entries(ring_d, valid), k_heads)
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
    invalid entries. Invalid entries are selected out before any product (they may hold NaN or inf).
    """
    value_heads, key_heads = state.shape[1], ring_k.shape[2]
    k_heads = live_entries(ring_k, valid).repeat_interleave(value_heads // key_heads, dim=2)  # (batch, E, HV, K)
    ring_g, ring_d, ring_beta = live_entries(ring_g, valid), live_entries(ring_d, valid), live_entries(ring_beta, valid)
    gap, folded = state - copy, state
    corrections = torch.zeros_like(ring_d)
    for j in range(ring_k.shape[1]):
        live = valid[:, j, None]  # (batch, 1)
        alpha = torch.where(live, ring_g[:, j].exp(), 1.0)  # (batch, HV)
        k = k_heads[:, j]
        e = torch.where(live[..., None], -(ring_beta[:, j] * alpha)[..., None] * torch.einsum("bhvk,bhk->bhv", gap, k), 0.0)
        d = ring_d[:, j]
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
    cd = compute_dtype(checkpoint)
    valid = ring_valid(count.to(rows.device).long(), ring_k.shape[1])
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


def gates(g: Tensor, beta: Tensor, A_log: Tensor | None, dt_bias: Tensor | None, cd: torch.dtype) -> tuple[Tensor, Tensor]:
    """The decays and betas in ``cd``: as given, or (the fused gates, ``A_log`` given) formed from the raw a
    (in ``g``'s place) and b (in ``beta``'s) as the models form them: ``g = -exp(A_log) softplus(a +
    dt_bias)``, ``beta = sigmoid(b)`` rounded to b's dtype (a bf16 model's ``b.sigmoid()``; vLLM's gating
    kernel stores it so too)."""
    if A_log is None:
        return g.to(cd), beta.to(cd)
    decay = -A_log.to(cd).exp() * F.softplus(g.to(cd) + dt_bias.to(cd))
    return decay, torch.sigmoid(beta.to(torch.promote_types(beta.dtype, torch.float32))).to(beta.dtype).to(cd)


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
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
) -> Tensor:
    """Reference replay step for Gated DeltaNet; see ``replayssm.ops.gdn_step``."""
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads = v.shape[2]
    window = ring_k.shape[1]
    share = value_heads // key_heads
    cd = compute_dtype(v, checkpoint)
    rows = rows.long()
    c = cursor[rows].long()

    q_t, k_t = _gdn_prepare_qk(q, k, use_qk_l2norm, scale, cd)
    (g_t, beta_t), v_t = gates(g, beta, A_log, dt_bias, cd), v.to(cd)
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
            folded = _gdn_fold(state, ring_k_r, ring_d_r, ring_g_r, ring_valid(c, window))
        else:  # the ring's d may have been formed against the copy: the exact fold corrects them
            folded, _ = _gdn_read_copy_chain(
                state, read_checkpoint[rows].to(cd), ring_k_r, ring_d_r, ring_g_r, ring_beta[rows].to(cd), ring_valid(c, window)
            )
        state = store_fold(folded, flush, rows, checkpoint, read_checkpoint, state)
        c = torch.where(flush, torch.zeros_like(c), c)
    elif read_checkpoint is not None:
        state = read_checkpoint[rows].to(cd)
    if exact_reads:  # the checkpoint as stored
        state = checkpoint[rows].to(cd)

    # 2. outputs. Sequence = committed ring entries, then the T new tokens whose
    #    corrected updates d_t are solved for in order (unit lower-triangular).
    #    Dead ring entries (past the cursor) are selected out, so their garbage never reaches the sums.
    valid = ring_valid(c, window)
    log_decay = torch.cat([live_entries(ring_g_r, valid), g_t], dim=1)  # (batch, L+T, HV)
    seq_k = torch.cat([live_entries(ring_k_r, valid), k_t], dim=1).repeat_interleave(share, dim=2)  # (batch, L+T, HV, K)
    q_heads = q_t.repeat_interleave(share, dim=2)  # (batch, T, HV, K)
    k_heads = k_t.repeat_interleave(share, dim=2)
    prefix, segment = segment_sums(log_decay, window + torch.arange(num_tokens))
    decay_seq = segment.exp()  # (batch, T, L+T, HV), zero for non-causal entries

    # One read of the checkpoint serves S k and S q.
    S_k = torch.einsum("bhvk,bthk->bthv", state, k_heads) * prefix.exp()[..., None]
    S_q = torch.einsum("bhvk,bthk->bthv", state, q_heads) * prefix.exp()[..., None]
    kk = torch.einsum("bihk,bthk->btih", seq_k, k_heads)  # k_i . k_t
    kq = torch.einsum("bihk,bthk->btih", seq_k, q_heads)  # k_i . q_t

    seq_d = torch.cat([live_entries(ring_d_r, valid), torch.zeros_like(v_t)], dim=1)  # (batch, L+T, HV, V)
    for t in range(num_tokens):
        before = window + t  # entries strictly before token t
        w = decay_seq[:, t, :before] * kk[:, t, :before]  # (batch, before, HV)
        alpha_r = S_k[:, t] + torch.einsum("bih,bihv->bhv", w, seq_d[:, :before])  # alpha_t * S_{t-1} k_t
        seq_d[:, before] = beta_t[:, t, :, None] * (v_t[:, t] - alpha_r)
    # A later token's terms are selected out, not weighted by exp(-inf) = 0: its k or d may be non-finite.
    causal = torch.arange(window + num_tokens, device=v.device)[None, :] <= (window + torch.arange(num_tokens, device=v.device))[:, None]
    o = S_q + causal_sum("btih,bihv->bthv", torch.where(causal[None, :, :, None], decay_seq * kq, 0.0), seq_d, causal)
    d_t = seq_d[:, window:]

    # 3. append the T entries past the committed cursor.
    entries = [(ring_k, k_t), (ring_d, d_t), (ring_g, g_t)]
    if ring_beta is not None:  # an exact entry's beta is +0: the fold takes its d as it is
        entries.append((ring_beta, torch.zeros_like(beta_t) if exact_reads else _gdn_copy_beta(beta_t)))
    append_entries(rows, c, commit, cursor, pending, *entries)
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
    cd = compute_dtype(checkpoint)
    rows = rows.long()
    valid = ring_valid(cursor[rows].long(), ring_k.shape[1])
    state, ring = checkpoint[rows].to(cd), (ring_k[rows].to(cd), ring_d[rows].to(cd), ring_g[rows].to(cd))
    if read_checkpoint is None:
        return _gdn_fold(state, *ring, valid)
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
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
) -> Tensor:
    """Conventional GDN decoding: read, update and write the state every token."""
    share = v.shape[2] // k.shape[2]
    cd = compute_dtype(v, state)
    rows = rows.long()
    s = state[rows].to(cd)  # (batch, HV, V, K)
    q_t, k_t = _gdn_prepare_qk(q, k, use_qk_l2norm, scale, cd)
    q_t, k_t = q_t.repeat_interleave(share, dim=2), k_t.repeat_interleave(share, dim=2)
    g, beta = gates(g, beta, A_log, dt_bias, cd)
    outputs = []
    for t in range(v.shape[1]):
        s = g[:, t].exp()[:, :, None, None] * s
        r = torch.einsum("bhvk,bhk->bhv", s, k_t[:, t])
        d = beta[:, t][:, :, None] * (v[:, t].to(cd) - r)
        s = s + torch.einsum("bhv,bhk->bhvk", d, k_t[:, t])
        s = s.to(state.dtype).to(cd)  # the state is stored after every token
        outputs.append(torch.einsum("bhvk,bhk->bhv", s, q_t[:, t]))
    state[rows] = s.to(state.dtype)
    return torch.stack(outputs, dim=1).to(v.dtype).contiguous()
