"""Triton kernels for Gated DeltaNet: the replay step (T = 1) and the conventional baseline.

Replay step, one token per row (docs/ops.md, SPEC §2). ``_gdn_replay_kernel``
runs one program per (tile group, value head, row). A program computes the
per-head quantities once (normalised q and k, the ring keys' dot products
``k_i . k_t`` and ``k_i . q_t`` with their decays), then for each tile of
value rows reads the checkpoint once for both ``S_c k`` and ``S_c q``, forms
``r = S_{t-1} k_t``, the corrected update ``d_t = beta (v - alpha r)`` and
``o_t``, and writes ``d_t`` into the ring. Rows whose ring is full fold it
first (``S <- exp(g_i) S + d_i k_i^T`` in fp32) and write the checkpoint.
``_gdn_append_kernel`` (one program per row) then writes the normalised key
and the log-decay, which every tile of a row reads, and moves the cursor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import reference
from .common import device_context, fold_store_tile, next_pow2, suffix_sums, uses_float64
from .configs import LaunchConfig, gdn_conventional_config, gdn_replay_config


@triton.jit
def _load_qk(p_q, p_k, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM: tl.constexpr):
    b_q = tl.load(p_q + i_b64 * s_q_b + i_kh64 * s_q_h + o_k * s_q_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(p_k + i_b64 * s_k_b + i_kh64 * s_k_h + o_k * s_k_k, mask=m_k, other=0.0).to(tl.float32)
    if L2NORM:
        b_q = b_q * tl.rsqrt(tl.sum(b_q * b_q, axis=0) + 1e-6)
        b_k = b_k * tl.rsqrt(tl.sum(b_k * b_k, axis=0) + 1e-6)
    return b_q * scale, b_k


@triton.jit
def _gdn_replay_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_o,
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
    L2NORM: tl.constexpr,
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

    b_q, b_k = _load_qk(p_q, p_k, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM)
    b_g = tl.load(p_g + i_b64 * s_g_b + i_h64 * s_g_h).to(tl.float32)
    b_beta = tl.load(p_beta + i_b64 * s_beta_b + i_h64 * s_beta_h).to(tl.float32)

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
        o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        m_tile = m_v[:, None] & m_k[None, :]
        p_tile = p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
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
def _gdn_verify_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_o,
    p_ckpt, p_ring_k, p_ring_d, p_ring_g, p_cursor, p_rows,
    s_q_b, s_q_t, s_q_h, s_q_k,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_v_b, s_v_t, s_v_h, s_v_v,
    s_g_b, s_g_t, s_g_h,
    s_beta_b, s_beta_t, s_beta_h,
    s_o_b, s_o_t, s_o_h, s_o_v,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v,
    s_rg_s, s_rg_l, s_rg_h,
    V, K, L, value_per_key, scale,
    T: tl.constexpr, L2NORM: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """T >= 2 tokens per row (verification). The T corrected updates solve the unit lower-triangular
    system of SPEC §3 by forward substitution, per value row, in registers."""
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    cur = tl.load(p_cursor + slot)
    flush = cur + T > L
    c_eff = tl.where(flush, 0, cur)

    o_k = tl.arange(0, BLOCK_K)
    o_l = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    m_k = o_k < K
    m_t = o_t < T
    m_hist = o_l < cur
    m_ring = o_l < c_eff
    m_tk = m_t[:, None] & m_k[None, :]

    p_ck_head = p_ckpt + slot * s_ck_s + i_h.to(tl.int64) * s_ck_h
    o_v = i_s * BLOCK_V + tl.arange(0, BLOCK_V)
    b_S_next = tl.load(
        p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k,
        mask=(o_v[:, None] < V) & (o_k[None, :] < K), other=0.0,
    )

    b_Q = tl.load(p_q + i_b64 * s_q_b + i_kh64 * s_q_h + o_t[:, None] * s_q_t + o_k[None, :] * s_q_k, mask=m_tk, other=0.0).to(tl.float32)
    b_K = tl.load(p_k + i_b64 * s_k_b + i_kh64 * s_k_h + o_t[:, None] * s_k_t + o_k[None, :] * s_k_k, mask=m_tk, other=0.0).to(tl.float32)
    if L2NORM:
        b_Q = b_Q * tl.rsqrt(tl.sum(b_Q * b_Q, axis=1) + 1e-6)[:, None]
        b_K = b_K * tl.rsqrt(tl.sum(b_K * b_K, axis=1) + 1e-6)[:, None]
    b_Q = b_Q * scale
    b_g = tl.load(p_g + i_b64 * s_g_b + o_t * s_g_t + i_h64 * s_g_h, mask=m_t, other=0.0).to(tl.float32)
    b_beta = tl.load(p_beta + i_b64 * s_beta_b + o_t * s_beta_t + i_h64 * s_beta_h, mask=m_t, other=0.0).to(tl.float32)
    b_cum = tl.sum(tl.where(o_t[None, :] <= o_t[:, None], b_g[None, :], 0.0), axis=1)
    m_seg = (o_t[None, None, :] > o_t[None, :, None]) & (o_t[None, None, :] <= o_t[:, None, None])
    b_seg_new = tl.sum(tl.where(m_seg, b_g[None, None, :], 0.0), axis=2)

    p_ring_row_g = p_ring_g + slot * s_rg_s + i_h64 * s_rg_h
    p_ring_row_k = p_ring_k + slot * s_rk_s + i_kh64 * s_rk_h
    b_rg = tl.load(p_ring_row_g + o_l * s_rg_l, mask=m_hist, other=0.0).to(tl.float32)
    b_rk = tl.load(
        p_ring_row_k + o_l[:, None] * s_rk_l + o_k[None, :] * s_rk_k, mask=m_hist[:, None] & m_k[None, :], other=0.0
    ).to(tl.float32)
    b_suffix = suffix_sums(b_rg, o_l)
    b_wf = tl.where(m_hist, tl.exp(b_suffix), 0.0)
    b_decay_f = tl.exp(tl.sum(b_rg, axis=0))
    # Key products, once per program: (ring entries | earlier tokens) x (k_t | q_t).
    b_kk_r = tl.zeros((BLOCK_T, BLOCK_L), dtype=tl.float32)
    b_kq_r = tl.zeros((BLOCK_T, BLOCK_L), dtype=tl.float32)
    b_kk_n = tl.zeros((BLOCK_T, BLOCK_T), dtype=tl.float32)
    b_kq_n = tl.zeros((BLOCK_T, BLOCK_T), dtype=tl.float32)
    for t in tl.static_range(T):
        b_k_t = tl.sum(tl.where(o_t[:, None] == t, b_K, 0.0), axis=0)
        b_q_t = tl.sum(tl.where(o_t[:, None] == t, b_Q, 0.0), axis=0)
        b_kk_r = tl.where(o_t[:, None] == t, tl.sum(b_rk * b_k_t[None, :], axis=1)[None, :], b_kk_r)
        b_kq_r = tl.where(o_t[:, None] == t, tl.sum(b_rk * b_q_t[None, :], axis=1)[None, :], b_kq_r)
        b_kk_n = tl.where(o_t[:, None] == t, tl.sum(b_K * b_k_t[None, :], axis=1)[None, :], b_kk_n)
        b_kq_n = tl.where(o_t[:, None] == t, tl.sum(b_K * b_q_t[None, :], axis=1)[None, :], b_kq_n)
    b_dec_r = tl.where(m_t[:, None] & m_ring[None, :], tl.exp(b_suffix[None, :] + b_cum[:, None]), 0.0)
    b_wk_r, b_wq_r = b_dec_r * b_kk_r, b_dec_r * b_kq_r
    b_dec_n = tl.exp(b_seg_new)
    b_wk_n = tl.where((o_t[None, :] < o_t[:, None]) & m_t[:, None], b_dec_n * b_kk_n, 0.0)  # strictly earlier tokens
    b_wq_n = tl.where((o_t[None, :] <= o_t[:, None]) & m_t[:, None], b_dec_n * b_kq_n, 0.0)  # the token itself too
    b_decay = tl.exp(tl.where(flush, 0.0, tl.sum(b_rg, axis=0)) + b_cum)

    p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        m_tile = m_v[:, None] & m_k[None, :]
        p_tile = p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
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
        b_Dn = tl.zeros((BLOCK_T, BLOCK_V), dtype=tl.float32)
        for t in tl.static_range(T):
            b_k_t = tl.sum(tl.where(o_t[:, None] == t, b_K, 0.0), axis=0)
            b_q_t = tl.sum(tl.where(o_t[:, None] == t, b_Q, 0.0), axis=0)
            b_decay_t = tl.sum(tl.where(o_t == t, b_decay, 0.0), axis=0)
            b_beta_t = tl.sum(tl.where(o_t == t, b_beta, 0.0), axis=0)
            b_wk_r_t = tl.sum(tl.where(o_t[:, None] == t, b_wk_r, 0.0), axis=0)
            b_wq_r_t = tl.sum(tl.where(o_t[:, None] == t, b_wq_r, 0.0), axis=0)
            b_wk_n_t = tl.sum(tl.where(o_t[:, None] == t, b_wk_n, 0.0), axis=0)
            b_wq_n_t = tl.sum(tl.where(o_t[:, None] == t, b_wq_n, 0.0), axis=0)
            b_v = tl.load(p_v + i_b64 * s_v_b + t * s_v_t + i_h64 * s_v_h + o_v * s_v_v, mask=m_v, other=0.0).to(tl.float32)
            b_r = b_decay_t * tl.sum(b_S * b_k_t[None, :], axis=1)
            b_r += tl.sum(b_wk_r_t[:, None] * b_rd, axis=0) + tl.sum(b_wk_n_t[:, None] * b_Dn, axis=0)
            b_d = b_beta_t * (b_v - b_r)
            b_Dn = tl.where(o_t[:, None] == t, b_d[None, :], b_Dn)
            b_o = b_decay_t * tl.sum(b_S * b_q_t[None, :], axis=1)
            b_o += tl.sum(b_wq_r_t[:, None] * b_rd, axis=0) + tl.sum(b_wq_n_t[:, None] * b_Dn, axis=0)
            tl.store(p_o + i_b64 * s_o_b + t * s_o_t + i_h64 * s_o_h + o_v * s_o_v, b_o.to(p_o.dtype.element_ty), mask=m_v)
            tl.store(p_ring_row_d + (c_eff + t) * s_rd_l + o_v * s_rd_v, b_d.to(p_ring_d.dtype.element_ty), mask=m_v)


@triton.jit
def _gdn_append_kernel(
    p_k, p_g, p_ring_k, p_ring_g, p_cursor, p_pending, p_rows,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_g_b, s_g_t, s_g_h,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rg_s, s_rg_l, s_rg_h,
    T, L, HK, HV, K,
    COMMIT: tl.constexpr, L2NORM: tl.constexpr,
    BLOCK_HK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HV: tl.constexpr,
):  # fmt: skip
    """Per row: write the normalised keys and log-decays of the T tokens at c..c+T-1; move the cursor."""
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
        tl.store(p_ring_g + slot * s_rg_s + pos * s_rg_l + o_hv * s_rg_h, b_g.to(p_ring_g.dtype.element_ty), mask=m_hv)
    if COMMIT:
        tl.store(p_cursor + slot, (c_eff + T).to(tl.int32))
        tl.store(p_pending + slot, 0)
    else:
        tl.store(p_cursor + slot, c_eff.to(tl.int32))
        tl.store(p_pending + slot, T)


@triton.jit
def _gdn_conventional_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_o, p_state, p_snap, p_rows,
    s_q_b, s_q_t, s_q_h, s_q_k,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_v_b, s_v_t, s_v_h, s_v_v,
    s_g_b, s_g_t, s_g_h,
    s_beta_b, s_beta_t, s_beta_h,
    s_o_b, s_o_t, s_o_h, s_o_v,
    s_st_s, s_st_h, s_st_v, s_st_k,
    s_sn_s, s_sn_t, s_sn_h, s_sn_v, s_sn_k,
    T, V, K, value_per_key, scale,
    L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Read the state tile, apply T tokens one after another (rounding to the state dtype after each), write it.

    ``SNAPSHOT`` (the speculative baseline engines use today): the state after
    token t is written to snapshot slot t instead, and the input state is left as is.
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < K
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        m_tile = m_v[:, None] & m_k[None, :]
        p_tile = p_state + slot * s_st_s + i_h64 * s_st_h + o_v[:, None].to(tl.int64) * s_st_v + o_k[None, :] * s_st_k
        b_S = tl.load(p_tile, mask=m_tile, other=0.0).to(tl.float32)
        for t in range(0, T):
            b_q, b_k = _load_qk(
                p_q + t * s_q_t, p_k + t * s_k_t, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM
            )
            b_g = tl.load(p_g + i_b64 * s_g_b + t * s_g_t + i_h64 * s_g_h).to(tl.float32)
            b_beta = tl.load(p_beta + i_b64 * s_beta_b + t * s_beta_t + i_h64 * s_beta_h).to(tl.float32)
            b_v = tl.load(p_v + i_b64 * s_v_b + t * s_v_t + i_h64 * s_v_h + o_v * s_v_v, mask=m_v, other=0.0).to(tl.float32)
            b_S = b_S * tl.exp(b_g)
            b_d = b_beta * (b_v - tl.sum(b_S * b_k[None, :], axis=1))
            b_S = b_S + b_d[:, None] * b_k[None, :]
            b_S = b_S.to(p_state.dtype.element_ty).to(tl.float32)
            b_o = tl.sum(b_S * b_q[None, :], axis=1)
            tl.store(p_o + i_b64 * s_o_b + t * s_o_t + i_h64 * s_o_h + o_v * s_o_v, b_o.to(p_o.dtype.element_ty), mask=m_v)
            if SNAPSHOT:
                p_snap_tile = p_snap + slot * s_sn_s + t * s_sn_t + i_h64 * s_sn_h + o_v[:, None].to(tl.int64) * s_sn_v + o_k[None, :] * s_sn_k
                tl.store(p_snap_tile, b_S.to(p_snap.dtype.element_ty), mask=m_tile)
        if not SNAPSHOT:
            tl.store(p_tile, b_S.to(p_state.dtype.element_ty), mask=m_tile)


# ---------------------------------------------------------------------------
# launchers (same signatures as the reference twins in ops/reference.py)
# ---------------------------------------------------------------------------


def _scale(scale: float | None, key_dim: int) -> float:
    return key_dim**-0.5 if scale is None else float(scale)


def _tiles(dim: int, cfg: LaunchConfig) -> tuple[int, int]:
    num_tiles = triton.cdiv(dim, cfg.block)
    return num_tiles, min(cfg.split, num_tiles)


def gdn_step_out(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None, o: Tensor, config: LaunchConfig | None = None,
) -> None:  # fmt: skip
    """The replay step writing its outputs into ``o``; see ``replayssm.ops.gdn_step``.

    T = 1 (decoding) runs ``_gdn_replay_kernel``, T > 1 (verification) ``_gdn_verify_kernel``.
    """
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    window = ring_k.shape[1]
    cfg = config or gdn_replay_config(value_dim, key_dim)
    num_tiles, split = _tiles(value_dim, cfg)
    if num_tokens > 1:
        with device_context(v):
            _gdn_verify_kernel[(split, value_heads, batch)](
                p_q=q, p_k=k, p_v=v, p_g=g, p_beta=beta, p_o=o,
                p_ckpt=checkpoint, p_ring_k=ring_k, p_ring_d=ring_d, p_ring_g=ring_g, p_cursor=cursor, p_rows=rows,
                **dict(zip(("s_q_b", "s_q_t", "s_q_h", "s_q_k"), q.stride())),
                **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
                **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
                **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
                **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
                **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
                **dict(zip(("s_ck_s", "s_ck_h", "s_ck_v", "s_ck_k"), checkpoint.stride())),
                **dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride())),
                **dict(zip(("s_rd_s", "s_rd_l", "s_rd_h", "s_rd_v"), ring_d.stride())),
                **dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride())),
                V=value_dim, K=key_dim, L=window, value_per_key=value_heads // key_heads, scale=_scale(scale, key_dim),
                T=num_tokens, L2NORM=use_qk_l2norm,
                BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), BLOCK_L=max(next_pow2(window), 16),
                BLOCK_T=max(next_pow2(num_tokens), 2), NUM_TILES=num_tiles, SPLIT=split,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
            _gdn_append(k, g, ring_k, ring_g, cursor, pending, rows, commit, use_qk_l2norm, value_heads)
        return
    q1, k1, v1, g1, beta1, o1 = q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], o[:, 0]
    with device_context(v):
        _gdn_replay_kernel[(split, value_heads, batch)](
            p_q=q1, p_k=k1, p_v=v1, p_g=g1, p_beta=beta1, p_o=o1,
            p_ckpt=checkpoint, p_ring_k=ring_k, p_ring_d=ring_d, p_ring_g=ring_g, p_cursor=cursor, p_rows=rows,
            s_q_b=q1.stride(0), s_q_h=q1.stride(1), s_q_k=q1.stride(2),
            s_k_b=k1.stride(0), s_k_h=k1.stride(1), s_k_k=k1.stride(2),
            s_v_b=v1.stride(0), s_v_h=v1.stride(1), s_v_v=v1.stride(2),
            s_g_b=g1.stride(0), s_g_h=g1.stride(1),
            s_beta_b=beta1.stride(0), s_beta_h=beta1.stride(1),
            s_o_b=o1.stride(0), s_o_h=o1.stride(1), s_o_v=o1.stride(2),
            **dict(zip(("s_ck_s", "s_ck_h", "s_ck_v", "s_ck_k"), checkpoint.stride())),
            **dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride())),
            **dict(zip(("s_rd_s", "s_rd_l", "s_rd_h", "s_rd_v"), ring_d.stride())),
            **dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride())),
            V=value_dim, K=key_dim, L=window, value_per_key=value_heads // key_heads, scale=_scale(scale, key_dim),
            L2NORM=use_qk_l2norm,
            BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), BLOCK_L=max(next_pow2(window), 16),
            NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        _gdn_append(k, g, ring_k, ring_g, cursor, pending, rows, commit, use_qk_l2norm, value_heads)


def _gdn_append(k, g, ring_k, ring_g, cursor, pending, rows, commit, use_qk_l2norm, value_heads) -> None:
    batch, num_tokens, key_heads, key_dim = k.shape
    _gdn_append_kernel[(batch,)](
        p_k=k, p_g=g, p_ring_k=ring_k, p_ring_g=ring_g, p_cursor=cursor, p_pending=pending, p_rows=rows,
        **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
        **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
        **dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride())),
        **dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride())),
        T=num_tokens, L=ring_k.shape[1], HK=key_heads, HV=value_heads, K=key_dim,
        COMMIT=commit, L2NORM=use_qk_l2norm,
        BLOCK_HK=next_pow2(key_heads), BLOCK_K=next_pow2(key_dim), BLOCK_HV=next_pow2(value_heads),
        num_warps=4,
    )  # fmt: skip


def gdn_step(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None,
) -> Tensor:  # fmt: skip
    """Replay step: Triton in fp32/fp16/bf16, the reference for fp64."""
    args = (q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale)
    if uses_float64(q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g):
        return reference.gdn_step(*args)
    o = torch.empty_like(v)
    gdn_step_out(*args, o=o)
    return o


def gdn_conventional_step_out(
    q, k, v, g, beta, state, rows, use_qk_l2norm: bool, scale: float | None, o: Tensor, config: LaunchConfig | None = None,
    snapshots: Tensor | None = None,
) -> None:
    """The conventional step writing its outputs into ``o``; see ``replayssm.ops.gdn_conventional_step``.

    With ``snapshots`` ``(slots, T, value_heads, value_dim, key_dim)`` the state after each token t goes to
    ``snapshots[:, t]`` and ``state`` is only read (the snapshot baseline of speculative decoding).
    """
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    cfg = config or gdn_conventional_config(value_dim, key_dim)
    num_tiles, split = _tiles(value_dim, cfg)
    with device_context(v):
        _gdn_conventional_kernel[(split, value_heads, batch)](
            p_q=q, p_k=k, p_v=v, p_g=g, p_beta=beta, p_o=o, p_state=state, p_snap=snapshots, p_rows=rows,
            **dict(zip(("s_q_b", "s_q_t", "s_q_h", "s_q_k"), q.stride())),
            **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
            **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
            **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
            **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
            **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
            **dict(zip(("s_st_s", "s_st_h", "s_st_v", "s_st_k"), state.stride())),
            **dict(zip(("s_sn_s", "s_sn_t", "s_sn_h", "s_sn_v", "s_sn_k"), tuple(snapshots.stride()) if snapshots is not None else (0,) * 5)),
            T=num_tokens, V=value_dim, K=key_dim, value_per_key=value_heads // key_heads, scale=_scale(scale, key_dim),
            L2NORM=use_qk_l2norm, SNAPSHOT=snapshots is not None,
            BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip


def gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm: bool, scale: float | None) -> Tensor:
    """Conventional step: Triton in fp32/fp16/bf16, the reference for fp64."""
    if uses_float64(q, k, v, g, beta, state):
        return reference.gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm, scale)
    o = torch.empty_like(v)
    gdn_conventional_step_out(q, k, v, g, beta, state, rows, use_qk_l2norm, scale, o=o)
    return o
