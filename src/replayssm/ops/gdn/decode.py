"""GDN decoding in one kernel (T = 1): the form the launch table picks for shapes it has no three-launch entry for."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import fold_store_tile, suffix_sums
from .tiles import ckpt_tile, load_qk, raw_beta, raw_decay


@triton.jit
def _gdn_replay_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_A_log, p_dt_bias, p_o,
    p_ckpt, p_ring_k, p_ring_d, p_ring_g, p_cursor, p_rows,
    s_q_b, s_q_h, s_q_k,
    s_k_b, s_k_h, s_k_k,
    s_v_b, s_v_h, s_v_v,
    s_g_b, s_g_h,
    s_beta_b, s_beta_h,
    s_o_b, s_o_h, s_o_v,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v,
    s_rg_s, s_rg_l, s_rg_h,
    V, K, L, value_per_key, scale,
    L2NORM: tl.constexpr, RAW_GATES: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    cur = tl.load(p_cursor + slot)
    flush = cur + 1 > L
    c_eff = tl.where(flush, 0, cur)

    o_k = tl.arange(0, BLOCK_K)
    o_l = tl.arange(0, BLOCK_L)
    m_k = o_k < K
    m_hist = o_l < cur  # the committed entries (folded if the row flushes)
    m_ring = o_l < c_eff  # the entries the outputs read from the ring

    p_ck_head = p_ckpt + slot * s_ck_s + i_h.to(tl.int64) * s_ck_h
    # Issue the first tile's load before the per-program prologue (software prefetch).
    o_v = i_s * BLOCK_V + tl.arange(0, BLOCK_V)
    b_S_next = tl.load(
        p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k,
        mask=(o_v[:, None] < V) & (o_k[None, :] < K), other=0.0,
    )

    b_q, b_k = load_qk(p_q, p_k, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM, True)
    b_g = tl.load(p_g + i_b64 * s_g_b + i_h64 * s_g_h).to(tl.float32)
    b_beta = tl.load(p_beta + i_b64 * s_beta_b + i_h64 * s_beta_h).to(tl.float32)
    if RAW_GATES:
        b_g = raw_decay(b_g, tl.load(p_A_log + i_h).to(tl.float32), tl.load(p_dt_bias + i_h).to(tl.float32))
        b_beta = raw_beta(b_beta, p_beta)

    # Per head, once: decays and key products of the committed ring entries.
    p_ring_row_g = p_ring_g + slot * s_rg_s + i_h64 * s_rg_h
    p_ring_row_k = p_ring_k + slot * s_rk_s + i_kh64 * s_rk_h
    b_rg = tl.load(p_ring_row_g + o_l * s_rg_l, mask=m_hist, other=0.0).to(tl.float32)
    b_rk = tl.load(
        p_ring_row_k + o_l[:, None] * s_rk_l + o_k[None, :] * s_rk_k, mask=m_hist[:, None] & m_k[None, :], other=0.0
    ).to(tl.float32)
    b_suffix = suffix_sums(b_rg, o_l)
    # fold weights (used when the row flushes) and output weights (zero then: the ring is empty after the fold)
    b_wf = tl.where(m_hist, tl.exp(b_suffix), 0.0)
    b_decay_f = tl.exp(tl.sum(b_rg, axis=0))
    b_seg = tl.exp(b_suffix + b_g)
    b_wk = tl.where(m_ring, b_seg * tl.sum(b_rk * b_k[None, :], axis=1), 0.0)
    b_wq = tl.where(m_ring, b_seg * tl.sum(b_rk * b_q[None, :], axis=1), 0.0)
    b_decay = tl.exp(tl.where(flush, 0.0, tl.sum(b_rg, axis=0)) + b_g)
    b_kq = tl.sum(b_k * b_q, axis=0)

    p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v, m_v, p_tile, m_tile = ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V)
        b_S = b_S_next.to(tl.float32)
        o_v_next = (i_v + SPLIT) * BLOCK_V + tl.arange(0, BLOCK_V)
        b_S_next = tl.load(
            p_ck_head + o_v_next[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k,
            mask=(o_v_next[:, None] < V) & m_k[None, :], other=0.0,
        )
        b_rd = tl.load(
            p_ring_row_d + o_l[:, None] * s_rd_l + o_v[None, :] * s_rd_v, mask=m_hist[:, None] & m_v[None, :], other=0.0
        ).to(tl.float32)
        if flush:
            # Fold the ring in one rank-L update in fp32; the outputs use the stored tile.
            b_S = fold_store_tile(b_S, b_decay_f, b_rd * b_wf[:, None], b_rk, p_tile, m_tile)
        b_v = tl.load(p_v + i_b64 * s_v_b + i_h64 * s_v_h + o_v * s_v_v, mask=m_v, other=0.0).to(tl.float32)
        # alpha_t S_{t-1} k_t and alpha_t S_{t-1} q_t from one read of the tile.
        b_r = b_decay * tl.sum(b_S * b_k[None, :], axis=1) + tl.sum(b_wk[:, None] * b_rd, axis=0)
        b_s = b_decay * tl.sum(b_S * b_q[None, :], axis=1) + tl.sum(b_wq[:, None] * b_rd, axis=0)
        b_d = b_beta * (b_v - b_r)
        b_o = b_s + b_kq * b_d
        tl.store(p_o + i_b64 * s_o_b + i_h64 * s_o_h + o_v * s_o_v, b_o.to(p_o.dtype.element_ty), mask=m_v)
        tl.store(p_ring_row_d + c_eff * s_rd_l + o_v * s_rd_v, b_d.to(p_ring_d.dtype.element_ty), mask=m_v)


@triton.jit
def _gdn_append_kernel(
    p_k, p_g, p_A_log, p_dt_bias, p_ring_k, p_ring_g, p_cursor, p_pending, p_rows,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_g_b, s_g_t, s_g_h,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rg_s, s_rg_l, s_rg_h,
    T, L, HK, HV, K,
    COMMIT: tl.constexpr, L2NORM: tl.constexpr, RAW_GATES: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HV: tl.constexpr,
):  # fmt: skip
    """Per row: write the normalised keys and log-decays of the T tokens at c..c+T-1; move the cursor.
    ``RAW_GATES``: ``p_g`` holds the raw a (``raw_decay``)."""
    i_b = tl.program_id(0)
    i_b64 = i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur = tl.load(p_cursor + slot)
    c_eff = tl.where(cur + T > L, 0, cur)
    o_hk = tl.arange(0, BLOCK_HK)
    o_k = tl.arange(0, BLOCK_K)
    o_hv = tl.arange(0, BLOCK_HV)
    m_kk = (o_hk[:, None] < HK) & (o_k[None, :] < K)
    m_hv = o_hv < HV
    if RAW_GATES:
        b_A_log = tl.load(p_A_log + o_hv, mask=m_hv, other=0.0).to(tl.float32)
        b_dt_bias = tl.load(p_dt_bias + o_hv, mask=m_hv, other=0.0).to(tl.float32)
    for t in range(0, T):
        pos = (c_eff + t).to(tl.int64)
        b_k = tl.load(p_k + i_b64 * s_k_b + t * s_k_t + o_hk[:, None] * s_k_h + o_k[None, :] * s_k_k, mask=m_kk, other=0.0)
        b_k = b_k.to(tl.float32)
        if L2NORM:
            b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=1) + 1e-6)[:, None]
        tl.store(
            p_ring_k + slot * s_rk_s + pos * s_rk_l + o_hk[:, None] * s_rk_h + o_k[None, :] * s_rk_k,
            b_k.to(p_ring_k.dtype.element_ty),
            mask=m_kk,
        )
        b_g = tl.load(p_g + i_b64 * s_g_b + t * s_g_t + o_hv * s_g_h, mask=m_hv, other=0.0).to(tl.float32)
        if RAW_GATES:
            b_g = raw_decay(b_g, b_A_log, b_dt_bias)
        tl.store(p_ring_g + slot * s_rg_s + pos * s_rg_l + o_hv * s_rg_h, b_g.to(p_ring_g.dtype.element_ty), mask=m_hv)
    if COMMIT:
        tl.store(p_cursor + slot, (c_eff + T).to(tl.int32))
        tl.store(p_pending + slot, 0)
    else:
        tl.store(p_cursor + slot, c_eff.to(tl.int32))
        tl.store(p_pending + slot, T)
