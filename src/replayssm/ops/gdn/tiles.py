"""Tile loads and row decisions shared by the GDN kernels (decode, fold, verify, conventional)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import load_f32, round_like, sigmoid, softplus


@triton.jit
def load_qk(
    p_q, p_k, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM: tl.constexpr,
    MASK_K: tl.constexpr,
):  # fmt: skip
    """q (l2-normalised and scaled) and k (l2-normalised) of one row and key head, in fp32."""
    b_q = load_f32(p_q + i_b64 * s_q_b + i_kh64 * s_q_h + o_k * s_q_k, m_k, MASK_K)
    b_k = load_f32(p_k + i_b64 * s_k_b + i_kh64 * s_k_h + o_k * s_k_k, m_k, MASK_K)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + 1e-6)
    return b_q * scale, b_k


@triton.jit
def ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V: tl.constexpr):
    """Tile ``i_v`` of a checkpoint head (rows ``i_v * BLOCK_V ..``): row offsets and mask, pointers and mask."""
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    m_tile = m_v[:, None] & m_k[None, :]
    p_tile = p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
    return o_v, m_v, p_tile, m_tile


@triton.jit
def load_tile_ring(p_ck_head, p_ring_row_d, i_v, n_ring, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V: tl.constexpr):
    """Tile ``i_v`` of a checkpoint head and the ring's d entries ``< n_ring`` of its rows, ``(rows, entries)``, in fp32."""
    o_v, m_v, p_tile, m_tile = ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V)
    b_S = tl.load(p_tile, mask=m_tile, other=0.0).to(tl.float32)
    return o_v, m_v, p_tile, m_tile, b_S, ring_d_slice(p_ring_row_d, o_v, m_v, n_ring, s_rd_l, s_rd_v, o_l)


@triton.jit
def ring_d_slice(p_ring_row_d, o_v, m_v, n_ring, s_rd_l, s_rd_v, o_l):
    """The ring's d entries ``< n_ring`` of value rows ``o_v``, ``(rows, entries)``, in fp32."""
    return tl.load(
        p_ring_row_d + o_l[None, :] * s_rd_l + o_v[:, None] * s_rd_v, mask=(o_l[None, :] < n_ring) & m_v[:, None], other=0.0
    ).to(tl.float32)


@triton.jit
def ends_with_copy_entry(p_ring_beta, slot, cur, s_rg_s, s_rg_l, s_rg_h, i_h_mark):
    """Whether a row's last committed ring entry (``cur - 1``) was formed against the read copy: its stored
    beta for value head ``i_h_mark`` is not +0 (``reference._gdn_ends_with_copy_entry``; a step stores the
    same kind of beta for every head of an entry, so any head tells). Elementwise: ``slot`` and ``cur`` may
    be scalars or vectors of rows."""
    p_last = p_ring_beta + slot * s_rg_s + tl.maximum(cur - 1, 0) * s_rg_l + i_h_mark * s_rg_h
    b_last = tl.load(p_last, mask=cur > 0, other=0.0)
    return (cur > 0) & (b_last.to(tl.int32, bitcast=True) != 0)


@triton.jit
def row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, i_h_mark, T, L, EXACT_READS: tl.constexpr):
    """A row's cursor and whether it folds before this step: its ring cannot take T more entries, or
    (``EXACT_READS``: verification with a read copy, which reads the checkpoint) it ends in entries formed
    against the copy, whose correction the step's exact reads cannot carry (``ends_with_copy_entry`` on
    value head ``i_h_mark``)."""
    cur = tl.load(p_cursor + slot)
    folds = cur + T > L
    if EXACT_READS:
        folds = folds | ends_with_copy_entry(p_ring_beta, slot, cur, s_rg_s, s_rg_l, s_rg_h, i_h_mark)
    return cur, folds


# The fused gates (``ops.gdn_step(A_log=, dt_bias=)``): the kernels take the model's raw gate inputs a
# (in place of g) and b (in place of beta) and form the gates as the models do; ``reference.gates`` is
# the twin.


@triton.jit
def raw_decay(b_a, b_A_log, b_dt_bias):
    """``g = -exp(A_log) softplus(a + dt_bias)`` in fp32 (``A_log`` and ``dt_bias`` broadcast to ``b_a``)."""
    return -tl.exp(b_A_log) * softplus(b_a + b_dt_bias)


@triton.jit
def raw_beta(b_b, p_b):
    """``beta = sigmoid(b)`` rounded to b's dtype (``p_b``'s element type), in fp32: a bf16 model's
    ``b.sigmoid()`` stores it so, as does vLLM's gating kernel."""
    return round_like(sigmoid(b_b), p_b)
