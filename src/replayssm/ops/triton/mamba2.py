"""Triton kernels for Mamba-2: the replay step (T = 1) and the conventional baseline.

Replay step, one token per row (docs/ops.md, SPEC §2). One launch of
``_mamba2_replay_kernel`` over (tile group, head, row) computes the outputs
and, for rows whose ring is full, folds the ring into the checkpoint (the
only checkpoint write, per row, decided inside the kernel). Then
``_mamba2_append_kernel`` (one program per row) appends the entry parts that
several programs of a row read (B, dt, dt*A) and moves the cursor. Two
launches because the cursor and those shared entries may only change once
every program of the row has read them; there is no grid-wide barrier.

The main kernel writes each head's ``x`` entry itself: only the program that
owns that head tile reads it, and in a flush a CTA barrier separates the
fold's reads from the write of position 0.

Both kernels read every device value they need (rows, cursors) on the
device: no host synchronisation, no allocation but the output, so a step can
be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import reference
from .common import device_context, fold_tile, next_pow2, sigmoid, softplus, suffix_sums, uses_float64
from .configs import LaunchConfig, mamba2_conventional_config, mamba2_replay_config


@triton.jit
def _mamba2_replay_kernel(
    p_x, p_dt, p_A, p_B, p_C, p_D, p_dt_bias, p_z, p_y,
    p_ckpt, p_ring_x, p_ring_B, p_ring_dt, p_ring_ld, p_cursor, p_rows,
    s_x_b, s_x_h, s_x_p,
    s_dt_b, s_dt_h,
    s_B_b, s_B_g, s_B_n,
    s_C_b, s_C_g, s_C_n,
    s_z_b, s_z_h, s_z_p,
    s_y_b, s_y_h, s_y_p,
    s_ck_s, s_ck_h, s_ck_p, s_ck_n,
    s_rx_s, s_rx_l, s_rx_h, s_rx_p,
    s_rB_s, s_rB_l, s_rB_g, s_rB_n,
    s_rdt_s, s_rdt_l, s_rdt_h,
    s_rld_s, s_rld_l, s_rld_h,
    P, N, L, heads_per_group,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_g = i_h // heads_per_group
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_g64, i_b64 = i_h.to(tl.int64), i_g.to(tl.int64), i_b.to(tl.int64)
    cur = tl.load(p_cursor + slot)
    flush = cur + 1 > L
    c_eff = tl.where(flush, 0, cur)

    o_n = tl.arange(0, BLOCK_N)
    o_l = tl.arange(0, BLOCK_L)
    m_n = o_n < N
    m_hist = o_l < cur  # the committed entries (folded if the row flushes)
    m_ring = o_l < c_eff  # the entries the outputs read from the ring

    p_ck_head = p_ckpt + slot * s_ck_s + i_h.to(tl.int64) * s_ck_h
    # Issue the first tile's load before the per-program prologue (software prefetch).
    o_p = i_s * BLOCK_P + tl.arange(0, BLOCK_P)
    b_S_next = tl.load(
        p_ck_head + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n,
        mask=(o_p[:, None] < P) & (o_n[None, :] < N), other=0.0,
    )

    # The token: dt after bias and softplus, its log-decay, B and C of the head's group.
    b_dt = tl.load(p_dt + i_b64 * s_dt_b + i_h64 * s_dt_h).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(p_dt_bias + i_h).to(tl.float32)
    if DT_SOFTPLUS:
        b_dt = softplus(b_dt)
    b_A = tl.load(p_A + i_h).to(tl.float32)
    b_ld = b_dt * b_A
    b_B = tl.load(p_B + i_b64 * s_B_b + i_g64 * s_B_g + o_n * s_B_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(p_C + i_b64 * s_C_b + i_g64 * s_C_g + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)

    # Ring weights, once per program: exp(G(i, t)) dt_i (B_i . C_t) for the committed entries.
    p_ring_row_ld = p_ring_ld + slot * s_rld_s + i_h64 * s_rld_h
    p_ring_row_dt = p_ring_dt + slot * s_rdt_s + i_h64 * s_rdt_h
    b_rld = tl.load(p_ring_row_ld + o_l * s_rld_l, mask=m_hist, other=0.0).to(tl.float32)
    b_rdt = tl.load(p_ring_row_dt + o_l * s_rdt_l, mask=m_hist, other=0.0).to(tl.float32)
    p_ring_row_B = p_ring_B + slot * s_rB_s + i_g64 * s_rB_g
    b_rB = tl.load(
        p_ring_row_B + o_l[:, None] * s_rB_l + o_n[None, :] * s_rB_n, mask=m_hist[:, None] & m_n[None, :], other=0.0
    ).to(tl.float32)
    b_suffix = suffix_sums(b_rld, o_l)
    # fold weights (used when the row flushes) and output weights (zero then: the ring is empty after the fold)
    b_wf = tl.where(m_hist, tl.exp(b_suffix) * b_rdt, 0.0)
    b_decay_f = tl.exp(tl.sum(b_rld, axis=0))
    b_w = tl.where(m_ring, tl.exp(b_suffix + b_ld) * b_rdt * tl.sum(b_rB * b_C[None, :], axis=1), 0.0)
    b_decay = tl.exp(tl.where(flush, 0.0, tl.sum(b_rld, axis=0)) + b_ld)
    b_w_t = b_dt * tl.sum(b_B * b_C, axis=0)
    if HAS_D:
        b_D = tl.load(p_D + i_h).to(tl.float32)

    p_ring_row_x = p_ring_x + slot * s_rx_s + i_h64 * s_rx_h
    for i_p in range(i_s, NUM_TILES, SPLIT):
        o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        m_tile = m_p[:, None] & m_n[None, :]
        p_tile = p_ck_head + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n
        b_S = b_S_next.to(tl.float32)
        o_p_next = (i_p + SPLIT) * BLOCK_P + tl.arange(0, BLOCK_P)
        b_S_next = tl.load(
            p_ck_head + o_p_next[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n,
            mask=(o_p_next[:, None] < P) & m_n[None, :], other=0.0,
        )
        b_rx = tl.load(
            p_ring_row_x + o_l[:, None] * s_rx_l + o_p[None, :] * s_rx_p, mask=m_hist[:, None] & m_p[None, :], other=0.0
        ).to(tl.float32)
        if flush:
            # Fold the ring in one rank-L update, in fp32: S <- exp(G) S + sum_i exp(G_i) dt_i x_i B_i^T.
            b_S = fold_tile(b_S, b_decay_f, b_rx * b_wf[:, None], b_rB)
            b_S_stored = b_S.to(p_ckpt.dtype.element_ty)
            tl.store(p_tile, b_S_stored, mask=m_tile)
            # Outputs use the checkpoint as stored.
            b_S = b_S_stored.to(tl.float32)
            # Every thread has read ring_x[0] before anyone overwrites it below.
            tl.debug_barrier()
        b_x_raw = tl.load(p_x + i_b64 * s_x_b + i_h64 * s_x_h + o_p * s_x_p, mask=m_p, other=0.0)
        b_x = b_x_raw.to(tl.float32)
        b_y = b_decay * tl.sum(b_S * b_C[None, :], axis=1) + tl.sum(b_w[:, None] * b_rx, axis=0) + b_w_t * b_x
        if HAS_D:
            b_y += b_D * b_x
        if HAS_Z:
            b_z = tl.load(p_z + i_b64 * s_z_b + i_h64 * s_z_h + o_p * s_z_p, mask=m_p, other=0.0).to(tl.float32)
            b_y = b_y * b_z * sigmoid(b_z)
        tl.store(p_y + i_b64 * s_y_b + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_p)
        tl.store(p_ring_row_x + c_eff * s_rx_l + o_p * s_rx_p, b_x_raw.to(p_ring_x.dtype.element_ty), mask=m_p)


@triton.jit
def _mamba2_verify_kernel(
    p_x, p_dt, p_A, p_B, p_C, p_D, p_dt_bias, p_z, p_y,
    p_ckpt, p_ring_x, p_ring_B, p_ring_dt, p_ring_ld, p_cursor, p_rows,
    s_x_b, s_x_t, s_x_h, s_x_p,
    s_dt_b, s_dt_t, s_dt_h,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_z_b, s_z_t, s_z_h, s_z_p,
    s_y_b, s_y_t, s_y_h, s_y_p,
    s_ck_s, s_ck_h, s_ck_p, s_ck_n,
    s_rx_s, s_rx_l, s_rx_h, s_rx_p,
    s_rB_s, s_rB_l, s_rB_g, s_rB_n,
    s_rdt_s, s_rdt_l, s_rdt_h,
    s_rld_s, s_rld_l, s_rld_h,
    P, N, L, heads_per_group,
    T: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """T >= 2 tokens per row (verification): outputs from checkpoint + committed ring + causal terms.

    Same structure as ``_mamba2_replay_kernel``; the per-program weights become
    ``T x L`` (ring) and ``T x T`` (causal, among the new tokens) matrices.
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_g = i_h // heads_per_group
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_g64, i_b64 = i_h.to(tl.int64), i_g.to(tl.int64), i_b.to(tl.int64)
    cur = tl.load(p_cursor + slot)
    flush = cur + T > L
    c_eff = tl.where(flush, 0, cur)

    o_n = tl.arange(0, BLOCK_N)
    o_l = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    m_n = o_n < N
    m_t = o_t < T
    m_hist = o_l < cur
    m_ring = o_l < c_eff

    p_ck_head = p_ckpt + slot * s_ck_s + i_h.to(tl.int64) * s_ck_h
    o_p = i_s * BLOCK_P + tl.arange(0, BLOCK_P)
    b_S_next = tl.load(
        p_ck_head + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n,
        mask=(o_p[:, None] < P) & (o_n[None, :] < N), other=0.0,
    )

    b_dt = tl.load(p_dt + i_b64 * s_dt_b + o_t * s_dt_t + i_h64 * s_dt_h, mask=m_t, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(p_dt_bias + i_h).to(tl.float32)
    if DT_SOFTPLUS:
        b_dt = softplus(b_dt)
    b_dt = tl.where(m_t, b_dt, 0.0)
    b_A = tl.load(p_A + i_h).to(tl.float32)
    b_ld = b_dt * b_A
    # cum[t] = sum_{u <= t} l_u; seg[t, s] = sum_{s < u <= t} l_u (direct sums)
    b_cum = tl.sum(tl.where(o_t[None, :] <= o_t[:, None], b_ld[None, :], 0.0), axis=1)
    m_seg = (o_t[None, None, :] > o_t[None, :, None]) & (o_t[None, None, :] <= o_t[:, None, None])
    b_seg_new = tl.sum(tl.where(m_seg, b_ld[None, None, :], 0.0), axis=2)

    p_ring_row_ld = p_ring_ld + slot * s_rld_s + i_h64 * s_rld_h
    p_ring_row_dt = p_ring_dt + slot * s_rdt_s + i_h64 * s_rdt_h
    b_rld = tl.load(p_ring_row_ld + o_l * s_rld_l, mask=m_hist, other=0.0).to(tl.float32)
    b_rdt = tl.load(p_ring_row_dt + o_l * s_rdt_l, mask=m_hist, other=0.0).to(tl.float32)
    p_ring_row_B = p_ring_B + slot * s_rB_s + i_g64 * s_rB_g
    b_rB = tl.load(
        p_ring_row_B + o_l[:, None] * s_rB_l + o_n[None, :] * s_rB_n, mask=m_hist[:, None] & m_n[None, :], other=0.0
    ).to(tl.float32)
    b_suffix = suffix_sums(b_rld, o_l)
    b_wf = tl.where(m_hist, tl.exp(b_suffix) * b_rdt, 0.0)
    b_decay_f = tl.exp(tl.sum(b_rld, axis=0))
    p_B_row = p_B + i_b64 * s_B_b + i_g64 * s_B_g
    p_C_row = p_C + i_b64 * s_C_b + i_g64 * s_C_g
    b_Bn = tl.load(p_B_row + o_t[:, None] * s_B_t + o_n[None, :] * s_B_n, mask=m_t[:, None] & m_n[None, :], other=0.0).to(tl.float32)
    # B.C products, once per program: ring entries x tokens, and tokens x tokens.
    b_wr = tl.zeros((BLOCK_T, BLOCK_L), dtype=tl.float32)
    b_wn = tl.zeros((BLOCK_T, BLOCK_T), dtype=tl.float32)
    for t in tl.static_range(T):
        b_C_t = tl.load(p_C_row + t * s_C_t + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
        b_wr = tl.where(o_t[:, None] == t, tl.sum(b_rB * b_C_t[None, :], axis=1)[None, :], b_wr)
        b_wn = tl.where(o_t[:, None] == t, tl.sum(b_Bn * b_C_t[None, :], axis=1)[None, :], b_wn)
    b_wr = tl.where(m_t[:, None] & m_ring[None, :], tl.exp(b_suffix[None, :] + b_cum[:, None]) * b_rdt[None, :] * b_wr, 0.0)
    m_causal = (o_t[None, :] <= o_t[:, None]) & m_t[:, None]
    b_wn = tl.where(m_causal, tl.exp(b_seg_new) * b_dt[None, :] * b_wn, 0.0)
    b_decay = tl.exp(tl.where(flush, 0.0, tl.sum(b_rld, axis=0)) + b_cum)
    if HAS_D:
        b_D = tl.load(p_D + i_h).to(tl.float32)

    p_ring_row_x = p_ring_x + slot * s_rx_s + i_h64 * s_rx_h
    p_x_row = p_x + i_b64 * s_x_b + i_h64 * s_x_h
    for i_p in range(i_s, NUM_TILES, SPLIT):
        o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        m_tile = m_p[:, None] & m_n[None, :]
        p_tile = p_ck_head + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n
        b_S = b_S_next.to(tl.float32)
        o_p_next = (i_p + SPLIT) * BLOCK_P + tl.arange(0, BLOCK_P)
        b_S_next = tl.load(
            p_ck_head + o_p_next[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n,
            mask=(o_p_next[:, None] < P) & m_n[None, :], other=0.0,
        )
        b_rx = tl.load(
            p_ring_row_x + o_l[:, None] * s_rx_l + o_p[None, :] * s_rx_p, mask=m_hist[:, None] & m_p[None, :], other=0.0
        ).to(tl.float32)
        if flush:
            b_S = fold_tile(b_S, b_decay_f, b_rx * b_wf[:, None], b_rB)
            b_S_stored = b_S.to(p_ckpt.dtype.element_ty)
            tl.store(p_tile, b_S_stored, mask=m_tile)
            b_S = b_S_stored.to(tl.float32)
            tl.debug_barrier()
        b_xn = tl.load(p_x_row + o_t[:, None] * s_x_t + o_p[None, :] * s_x_p, mask=m_t[:, None] & m_p[None, :], other=0.0).to(tl.float32)
        for t in tl.static_range(T):
            b_C_t = tl.load(p_C_row + t * s_C_t + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
            b_wr_t = tl.sum(tl.where(o_t[:, None] == t, b_wr, 0.0), axis=0)
            b_wn_t = tl.sum(tl.where(o_t[:, None] == t, b_wn, 0.0), axis=0)
            b_decay_t = tl.sum(tl.where(o_t == t, b_decay, 0.0), axis=0)
            b_y = b_decay_t * tl.sum(b_S * b_C_t[None, :], axis=1)
            b_y += tl.sum(b_wr_t[:, None] * b_rx, axis=0) + tl.sum(b_wn_t[:, None] * b_xn, axis=0)
            b_x_raw = tl.load(p_x_row + t * s_x_t + o_p * s_x_p, mask=m_p, other=0.0)
            if HAS_D:
                b_y += b_D * b_x_raw.to(tl.float32)
            if HAS_Z:
                b_z = tl.load(p_z + i_b64 * s_z_b + t * s_z_t + i_h64 * s_z_h + o_p * s_z_p, mask=m_p, other=0.0).to(tl.float32)
                b_y = b_y * b_z * sigmoid(b_z)
            tl.store(p_y + i_b64 * s_y_b + t * s_y_t + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_p)
            tl.store(p_ring_row_x + (c_eff + t) * s_rx_l + o_p * s_rx_p, b_x_raw.to(p_ring_x.dtype.element_ty), mask=m_p)


@triton.jit
def _mamba2_append_kernel(
    p_dt, p_A, p_B, p_dt_bias,
    p_ring_B, p_ring_dt, p_ring_ld, p_cursor, p_pending, p_rows,
    s_dt_b, s_dt_t, s_dt_h,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_rB_s, s_rB_l, s_rB_g, s_rB_n,
    s_rdt_s, s_rdt_l, s_rdt_h,
    s_rld_s, s_rld_l, s_rld_h,
    T, L, H, G, N,
    COMMIT: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_GN: tl.constexpr,
):  # fmt: skip
    """Per row: write B, dt and dt*A of the T tokens at ring positions c..c+T-1; move the cursor."""
    i_b = tl.program_id(0)
    i_b64 = i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur = tl.load(p_cursor + slot)
    c_eff = tl.where(cur + T > L, 0, cur)
    o_h = tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_gn = tl.arange(0, BLOCK_GN)
    m_gn = o_gn < G * N
    o_g, o_n = o_gn // N, o_gn % N
    b_A = tl.load(p_A + o_h, mask=m_h, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_bias = tl.load(p_dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)
    for t in range(0, T):
        pos = (c_eff + t).to(tl.int64)
        b_dt = tl.load(p_dt + i_b64 * s_dt_b + t * s_dt_t + o_h * s_dt_h, mask=m_h, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            b_dt += b_bias
        if DT_SOFTPLUS:
            b_dt = softplus(b_dt)
        tl.store(p_ring_dt + slot * s_rdt_s + pos * s_rdt_l + o_h * s_rdt_h, b_dt, mask=m_h)
        tl.store(p_ring_ld + slot * s_rld_s + pos * s_rld_l + o_h * s_rld_h, b_dt * b_A, mask=m_h)
        b_B = tl.load(p_B + i_b64 * s_B_b + t * s_B_t + o_g * s_B_g + o_n * s_B_n, mask=m_gn, other=0.0)
        tl.store(
            p_ring_B + slot * s_rB_s + pos * s_rB_l + o_g * s_rB_g + o_n * s_rB_n,
            b_B.to(p_ring_B.dtype.element_ty),
            mask=m_gn,
        )
    if COMMIT:
        tl.store(p_cursor + slot, (c_eff + T).to(tl.int32))
        tl.store(p_pending + slot, 0)
    else:
        tl.store(p_cursor + slot, c_eff.to(tl.int32))
        tl.store(p_pending + slot, T)


@triton.jit
def _mamba2_conventional_kernel(
    p_x, p_dt, p_A, p_B, p_C, p_D, p_dt_bias, p_z, p_y, p_state, p_snap, p_rows,
    s_x_b, s_x_t, s_x_h, s_x_p,
    s_dt_b, s_dt_t, s_dt_h,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_z_b, s_z_t, s_z_h, s_z_p,
    s_y_b, s_y_t, s_y_h, s_y_p,
    s_st_s, s_st_h, s_st_p, s_st_n,
    s_sn_s, s_sn_t, s_sn_h, s_sn_p, s_sn_n,
    T, P, N, heads_per_group,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr, SNAPSHOT: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Read the state tile, apply T tokens one after another (rounding to the state dtype after each), write it.

    ``SNAPSHOT`` (the speculative baseline engines use today): the state after
    token t is written to snapshot slot t instead, and the input state is left as is.
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_g = i_h // heads_per_group
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_g64, i_b64 = i_h.to(tl.int64), i_g.to(tl.int64), i_b.to(tl.int64)
    o_n = tl.arange(0, BLOCK_N)
    m_n = o_n < N
    b_A = tl.load(p_A + i_h).to(tl.float32)
    if HAS_D:
        b_D = tl.load(p_D + i_h).to(tl.float32)
    if HAS_DT_BIAS:
        b_bias = tl.load(p_dt_bias + i_h).to(tl.float32)
    for i_p in range(i_s, NUM_TILES, SPLIT):
        o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        m_tile = m_p[:, None] & m_n[None, :]
        p_tile = p_state + slot * s_st_s + i_h64 * s_st_h + o_p[:, None].to(tl.int64) * s_st_p + o_n[None, :] * s_st_n
        b_S = tl.load(p_tile, mask=m_tile, other=0.0).to(tl.float32)
        for t in range(0, T):
            b_dt = tl.load(p_dt + i_b64 * s_dt_b + t * s_dt_t + i_h64 * s_dt_h).to(tl.float32)
            if HAS_DT_BIAS:
                b_dt += b_bias
            if DT_SOFTPLUS:
                b_dt = softplus(b_dt)
            b_B = tl.load(p_B + i_b64 * s_B_b + t * s_B_t + i_g64 * s_B_g + o_n * s_B_n, mask=m_n, other=0.0).to(tl.float32)
            b_C = tl.load(p_C + i_b64 * s_C_b + t * s_C_t + i_g64 * s_C_g + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
            b_x = tl.load(p_x + i_b64 * s_x_b + t * s_x_t + i_h64 * s_x_h + o_p * s_x_p, mask=m_p, other=0.0).to(tl.float32)
            b_S = b_S * tl.exp(b_dt * b_A) + (b_dt * b_x)[:, None] * b_B[None, :]
            b_S = b_S.to(p_state.dtype.element_ty).to(tl.float32)
            b_y = tl.sum(b_S * b_C[None, :], axis=1)
            if HAS_D:
                b_y += b_D * b_x
            if HAS_Z:
                b_z = tl.load(p_z + i_b64 * s_z_b + t * s_z_t + i_h64 * s_z_h + o_p * s_z_p, mask=m_p, other=0.0).to(tl.float32)
                b_y = b_y * b_z * sigmoid(b_z)
            tl.store(p_y + i_b64 * s_y_b + t * s_y_t + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_p)
            if SNAPSHOT:
                p_snap_tile = p_snap + slot * s_sn_s + t * s_sn_t + i_h64 * s_sn_h + o_p[:, None].to(tl.int64) * s_sn_p + o_n[None, :] * s_sn_n
                tl.store(p_snap_tile, b_S.to(p_snap.dtype.element_ty), mask=m_tile)
        if not SNAPSHOT:
            tl.store(p_tile, b_S.to(p_state.dtype.element_ty), mask=m_tile)


# ---------------------------------------------------------------------------
# launchers (same signatures as the reference twins in ops/reference.py)
# ---------------------------------------------------------------------------


def _strides(t: Tensor | None, n: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * n


def _tiles(dim: int, cfg: LaunchConfig) -> tuple[int, int]:
    num_tiles = triton.cdiv(dim, cfg.block)
    return num_tiles, min(cfg.split, num_tiles)


def mamba2_step_out(
    x, dt, A, B, C, D, dt_bias, z,
    checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending,
    rows, commit: bool, dt_softplus: bool, y: Tensor, config: LaunchConfig | None = None,
) -> None:  # fmt: skip
    """The replay step writing its outputs into ``y``; see ``replayssm.ops.mamba2_step``.

    T = 1 (decoding) runs ``_mamba2_replay_kernel``, T > 1 (verification) ``_mamba2_verify_kernel``.
    """
    batch, num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    window = ring_x.shape[1]
    cfg = config or mamba2_replay_config(head_dim, state_size)
    num_tiles, split = _tiles(head_dim, cfg)
    if num_tokens > 1:
        with device_context(x):
            _mamba2_verify_kernel[(split, heads, batch)](
                p_x=x, p_dt=dt, p_A=A, p_B=B, p_C=C, p_D=D, p_dt_bias=dt_bias, p_z=z, p_y=y,
                p_ckpt=checkpoint, p_ring_x=ring_x, p_ring_B=ring_B, p_ring_dt=ring_dt, p_ring_ld=ring_logdecay,
                p_cursor=cursor, p_rows=rows,
                **dict(zip(("s_x_b", "s_x_t", "s_x_h", "s_x_p"), x.stride())),
                **dict(zip(("s_dt_b", "s_dt_t", "s_dt_h"), dt.stride())),
                **dict(zip(("s_B_b", "s_B_t", "s_B_g", "s_B_n"), B.stride())),
                **dict(zip(("s_C_b", "s_C_t", "s_C_g", "s_C_n"), C.stride())),
                **dict(zip(("s_z_b", "s_z_t", "s_z_h", "s_z_p"), _strides(z, 4))),
                **dict(zip(("s_y_b", "s_y_t", "s_y_h", "s_y_p"), y.stride())),
                **dict(zip(("s_ck_s", "s_ck_h", "s_ck_p", "s_ck_n"), checkpoint.stride())),
                **dict(zip(("s_rx_s", "s_rx_l", "s_rx_h", "s_rx_p"), ring_x.stride())),
                **dict(zip(("s_rB_s", "s_rB_l", "s_rB_g", "s_rB_n"), ring_B.stride())),
                **dict(zip(("s_rdt_s", "s_rdt_l", "s_rdt_h"), ring_dt.stride())),
                **dict(zip(("s_rld_s", "s_rld_l", "s_rld_h"), ring_logdecay.stride())),
                P=head_dim, N=state_size, L=window, heads_per_group=heads // groups, T=num_tokens,
                HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
                BLOCK_P=cfg.block, BLOCK_N=next_pow2(state_size), BLOCK_L=max(next_pow2(window), 16),
                BLOCK_T=max(next_pow2(num_tokens), 2), NUM_TILES=num_tiles, SPLIT=split,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
            _mamba2_append(dt, A, B, dt_bias, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus)
        return
    x1, dt1, B1, C1, y1 = x[:, 0], dt[:, 0], B[:, 0], C[:, 0], y[:, 0]
    z1 = z[:, 0] if z is not None else None
    with device_context(x):
        _mamba2_replay_kernel[(split, heads, batch)](
            p_x=x1, p_dt=dt1, p_A=A, p_B=B1, p_C=C1, p_D=D, p_dt_bias=dt_bias, p_z=z1, p_y=y1,
            p_ckpt=checkpoint, p_ring_x=ring_x, p_ring_B=ring_B, p_ring_dt=ring_dt, p_ring_ld=ring_logdecay,
            p_cursor=cursor, p_rows=rows,
            s_x_b=x1.stride(0), s_x_h=x1.stride(1), s_x_p=x1.stride(2),
            s_dt_b=dt1.stride(0), s_dt_h=dt1.stride(1),
            s_B_b=B1.stride(0), s_B_g=B1.stride(1), s_B_n=B1.stride(2),
            s_C_b=C1.stride(0), s_C_g=C1.stride(1), s_C_n=C1.stride(2),
            **dict(zip(("s_z_b", "s_z_h", "s_z_p"), _strides(z1, 3))),
            s_y_b=y1.stride(0), s_y_h=y1.stride(1), s_y_p=y1.stride(2),
            **dict(zip(("s_ck_s", "s_ck_h", "s_ck_p", "s_ck_n"), checkpoint.stride())),
            **dict(zip(("s_rx_s", "s_rx_l", "s_rx_h", "s_rx_p"), ring_x.stride())),
            **dict(zip(("s_rB_s", "s_rB_l", "s_rB_g", "s_rB_n"), ring_B.stride())),
            **dict(zip(("s_rdt_s", "s_rdt_l", "s_rdt_h"), ring_dt.stride())),
            **dict(zip(("s_rld_s", "s_rld_l", "s_rld_h"), ring_logdecay.stride())),
            P=head_dim, N=state_size, L=window, heads_per_group=heads // groups,
            HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
            BLOCK_P=cfg.block, BLOCK_N=next_pow2(state_size), BLOCK_L=max(next_pow2(window), 16),
            NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        _mamba2_append(dt, A, B, dt_bias, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus)


def _mamba2_append(dt, A, B, dt_bias, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus) -> None:
    batch, num_tokens, heads = dt.shape
    groups, state_size = B.shape[2], B.shape[3]
    _mamba2_append_kernel[(batch,)](
        p_dt=dt, p_A=A, p_B=B, p_dt_bias=dt_bias,
        p_ring_B=ring_B, p_ring_dt=ring_dt, p_ring_ld=ring_logdecay, p_cursor=cursor, p_pending=pending, p_rows=rows,
        **dict(zip(("s_dt_b", "s_dt_t", "s_dt_h"), dt.stride())),
        **dict(zip(("s_B_b", "s_B_t", "s_B_g", "s_B_n"), B.stride())),
        **dict(zip(("s_rB_s", "s_rB_l", "s_rB_g", "s_rB_n"), ring_B.stride())),
        **dict(zip(("s_rdt_s", "s_rdt_l", "s_rdt_h"), ring_dt.stride())),
        **dict(zip(("s_rld_s", "s_rld_l", "s_rld_h"), ring_logdecay.stride())),
        T=num_tokens, L=ring_B.shape[1], H=heads, G=groups, N=state_size,
        COMMIT=commit, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
        BLOCK_H=next_pow2(heads), BLOCK_GN=next_pow2(groups * state_size),
        num_warps=4,
    )  # fmt: skip


def mamba2_step(
    x, dt, A, B, C, D, dt_bias, z,
    checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending,
    rows, commit: bool, dt_softplus: bool,
) -> Tensor:  # fmt: skip
    """Replay step: Triton in fp32/fp16/bf16, the reference for fp64."""
    args = (x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus)
    if uses_float64(x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay):
        return reference.mamba2_step(*args)
    y = torch.empty_like(x)
    mamba2_step_out(*args, y=y)
    return y


def mamba2_conventional_step_out(
    x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus: bool, y: Tensor, config: LaunchConfig | None = None,
    snapshots: Tensor | None = None,
) -> None:
    """The conventional step writing its outputs into ``y``; see ``replayssm.ops.mamba2_conventional_step``.

    With ``snapshots`` ``(slots, T, heads, head_dim, state_size)`` the state after each token t goes to
    ``snapshots[:, t]`` and ``state`` is only read (the snapshot baseline of speculative decoding).
    """
    batch, num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    cfg = config or mamba2_conventional_config(head_dim, state_size)
    num_tiles, split = _tiles(head_dim, cfg)
    with device_context(x):
        _mamba2_conventional_kernel[(split, heads, batch)](
            p_x=x, p_dt=dt, p_A=A, p_B=B, p_C=C, p_D=D, p_dt_bias=dt_bias, p_z=z, p_y=y, p_state=state, p_snap=snapshots, p_rows=rows,
            **dict(zip(("s_x_b", "s_x_t", "s_x_h", "s_x_p"), x.stride())),
            **dict(zip(("s_dt_b", "s_dt_t", "s_dt_h"), dt.stride())),
            **dict(zip(("s_B_b", "s_B_t", "s_B_g", "s_B_n"), B.stride())),
            **dict(zip(("s_C_b", "s_C_t", "s_C_g", "s_C_n"), C.stride())),
            **dict(zip(("s_z_b", "s_z_t", "s_z_h", "s_z_p"), _strides(z, 4))),
            **dict(zip(("s_y_b", "s_y_t", "s_y_h", "s_y_p"), y.stride())),
            **dict(zip(("s_st_s", "s_st_h", "s_st_p", "s_st_n"), state.stride())),
            **dict(zip(("s_sn_s", "s_sn_t", "s_sn_h", "s_sn_p", "s_sn_n"), _strides(snapshots, 5))),
            T=num_tokens, P=head_dim, N=state_size, heads_per_group=heads // groups,
            HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
            SNAPSHOT=snapshots is not None,
            BLOCK_P=cfg.block, BLOCK_N=next_pow2(state_size), NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip


def mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus: bool) -> Tensor:
    """Conventional step: Triton in fp32/fp16/bf16, the reference for fp64."""
    if uses_float64(x, dt, A, B, C, D, dt_bias, z, state):
        return reference.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus)
    y = torch.empty_like(x)
    mamba2_conventional_step_out(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus, y=y)
    return y
