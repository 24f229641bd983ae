"""Triton kernels for Mamba-2: the replay step (decoding and verification) and the conventional baseline.

Replay step, T tokens per row (T = 1 decoding, T > 1 verification; docs/ops.md,
SPEC §2-3), three launches:

1. ``_mamba2_flush_kernel`` over (tile group, head, row): rows whose ring
   cannot take T more entries fold it into the checkpoint (fp32, stored in
   the checkpoint dtype); for T = 1 they also compute their output from the
   stored tile; every other program exits after reading its cursor. The only
   checkpoint write.
2. ``_mamba2_weights_kernel`` over (group, row): per head and new token, the
   weights the main launch needs (ring weights ``exp(G(i, t)) dt_i (B_i .
   C_t)``, the checkpoint decay, the causal weights among the new tokens)
   into a small scratch tensor; appends B, dt, dt*A at the row's ring
   positions; records the first of them.
3. ``_mamba2_main_kernel`` over (tile, head, row), shaped like the
   conventional kernel: one read of a checkpoint tile plus the ring's x
   slice gives the T outputs (T = 1: of the rows that did not fold); writes
   the tile's x entries; never writes the state. One program per row moves
   the cursor (and, for verification, records T pending entries): nothing
   in this launch reads it.

Decoding (T = 1) with ``fold_in_main`` (table ``_MAMBA2_FOLD_IN_MAIN``) does not run launch 1:
launch 2 comes first and also writes a folding row's fold weights and a copy of its ring B (which its
append overwrites), and launch 3's tile programs of that row fold the ring into their tile (rank-1
updates), write it and carry on as if the ring were empty. No program exists only to read a cursor
and exit, and a folded tile is read once. Verification (T > 1) always folds in launch 1.

Launches are ordered, which is the only synchronisation needed: each ring
position and the cursor change only in a launch after every reader of them.
On sm_90+ the launches after the first overlap the one before (programmatic
dependent launch, ``launch.OVERLAP_LAUNCHES``): their programs wait in-kernel
for it before touching anything it writes.
Everything is read on the device (no host synchronisation); the only
allocations are the output and the scratch, so a step can be captured in a
CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import launch as launch_defaults
from ..launch import LaunchConfig
from ..triton_helpers import (
    allow_next_launch,
    check_form,
    device_context,
    fold_tile,
    head_suffix_sums,
    next_pow2,
    overlap_launches,
    pdl_launch_options,
    quantize_rows_e4m3,
    sigmoid,
    softplus,
    suffix_sums,
    wait_for_previous_launch,
)
from . import launch

# Ring entries per iteration of ``fold_ring_store``'s loop: their loads are issued together, so a
# fold costs n / FOLD_CHUNK round trips to L2 instead of n. (Unrolling over the whole ring, or one
# tl.dot from two block loads, cost more registers in every program of the launch than the latency they
# hid: docs/kernels.md, "Forms tried and lost".)
FOLD_CHUNK = tl.constexpr(4)


@triton.jit
def _fold_entry(i, n, p_w, p_u, s_u_l, s_u_row, o_row, m_row, p_v, s_v_l, o_k, m_k, L):
    """Ring entry i of a rank-1 fold: ``w[i] u_i[rows]`` and ``v_i[cols]`` in fp32, zeros for i >= n."""
    live = i < n
    m_u = tl.where(live, m_row, False)  # (a bool scalar in a mask trips the interpreter)
    m_v = tl.where(live, m_k, False)
    b_u = tl.load(p_u + i * s_u_l + o_row * s_u_row, mask=m_u, other=0.0).to(tl.float32)
    b_v = tl.load(p_v + i * s_v_l + o_k, mask=m_v, other=0.0)
    b_w = tl.where(live, tl.load(p_w + tl.minimum(i, L)), 0.0)  # w[i >= n] is unwritten scratch
    return b_w * b_u, b_v


@triton.jit
def fold_ring_store(b_S, n, p_w, p_u, s_u_l, s_u_row, o_row, m_row, p_v, s_v_l, o_k, m_k, L, p_tile, m_tile):
    """Fold ``n`` ring entries into a checkpoint tile by rank-1 updates in fp32 and store it:
    ``S <- w[L] S + sum_{i<n} w[i] u_i[rows] v_i^T`` (u: x from the ring; v: B and w, the weights,
    from the step's scratch). For tiles of a few rows, too small for a ``tl.dot``. The
    decay comes first, so no second tile-sized accumulator. Returns the tile as stored, in fp32; the
    barrier makes every thread finish reading the ring before the caller overwrites its entries.
    """
    b_S = b_S * tl.load(p_w + L)
    for i0 in range(0, n, FOLD_CHUNK):
        for j in tl.static_range(FOLD_CHUNK):
            b_wu, b_v = _fold_entry(i0 + j, n, p_w, p_u, s_u_l, s_u_row, o_row, m_row, p_v, s_v_l, o_k, m_k, L)
            b_S += b_wu[:, None] * b_v[None, :]
    b_stored = b_S.to(p_tile.dtype.element_ty)
    tl.store(p_tile, b_stored, mask=m_tile)
    tl.debug_barrier()
    return b_stored.to(tl.float32)


@triton.jit
def _mamba2_flush_kernel(
    p_x, p_dt, p_A, p_B, p_C, p_D, p_dt_bias, p_z, p_y,
    p_ckpt, p_read, p_read_scale, p_ring_x, p_ring_B, p_ring_dt, p_ring_ld, p_cursor, p_rows,
    s_x_b, s_x_h, s_x_p,
    s_dt_b, s_dt_h,
    s_B_b, s_B_g, s_B_n,
    s_C_b, s_C_g, s_C_n,
    s_z_b, s_z_h, s_z_p,
    s_y_b, s_y_h, s_y_p,
    s_ck_s, s_ck_h, s_ck_p, s_ck_n,
    s_rs_s, s_rs_h, s_rs_p,
    s_rx_s, s_rx_l, s_rx_h, s_rx_p,
    s_rB_s, s_rB_l, s_rB_g, s_rB_n,
    s_rdt_s, s_rdt_l, s_rdt_h,
    s_rld_s, s_rld_l, s_rld_h,
    P, N, L, heads_per_group,
    T: tl.constexpr, USE_PDL: tl.constexpr, HAS_READ: tl.constexpr, HAS_READ_SCALE: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Launch 1: rows whose ring cannot take the T new entries (``cursor + T > L``) fold it; others exit.

    Fold in fp32 (one rank-L ``tl.dot`` per tile), store in the checkpoint dtype. For T = 1 the
    folding rows also get their output here, ``y = exp(l_t) S C_t + (dt_t B_t.C_t + D) x_t`` from the
    stored (rounded) tile (after a fold the ring is empty, so no other term enters), and the main
    launch skips them; for T > 1 the main launch computes every row's outputs from the stored tile.

    ``USE_PDL``: the step's first launch (a plain one); it lets the weights launch start at once (that
    launch waits before its append, the only thing it does that this one could see).

    ``HAS_READ``: the fold is also stored, rounded from fp32, into the read copy ``p_read`` (the
    checkpoint's strides), and the T = 1 outputs read that rounded tile (SPEC §4). ``HAS_READ_SCALE``
    (an fp8 copy): each tile row is a whole state row, so its scale (``p_read_scale``, amax / 448) comes
    from the fp32 fold in registers; the copy takes ``RNE(row / scale)`` and the T = 1 outputs apply the
    scale once per row, after the product with C.
    """
    allow_next_launch(USE_PDL)
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur = tl.load(p_cursor + slot)
    if cur + T > L:
        i_g = i_h // heads_per_group
        i_h64, i_g64, i_b64 = i_h.to(tl.int64), i_g.to(tl.int64), i_b.to(tl.int64)
        o_n = tl.arange(0, BLOCK_N)
        o_l = tl.arange(0, BLOCK_L)
        m_n = o_n < N
        m_hist = o_l < cur
        b_rld = tl.load(p_ring_ld + slot * s_rld_s + i_h64 * s_rld_h + o_l * s_rld_l, mask=m_hist, other=0.0).to(tl.float32)
        b_rdt = tl.load(p_ring_dt + slot * s_rdt_s + i_h64 * s_rdt_h + o_l * s_rdt_l, mask=m_hist, other=0.0).to(tl.float32)
        b_rB = tl.load(
            p_ring_B + slot * s_rB_s + i_g64 * s_rB_g + o_l[:, None] * s_rB_l + o_n[None, :] * s_rB_n,
            mask=m_hist[:, None] & m_n[None, :], other=0.0,
        ).to(tl.float32)
        b_wf = tl.where(m_hist, tl.exp(suffix_sums(b_rld, o_l)) * b_rdt, 0.0)
        b_decay_f = tl.exp(tl.sum(b_rld, axis=0))
        if T == 1:
            # The token's scalars.
            b_dt = tl.load(p_dt + i_b64 * s_dt_b + i_h64 * s_dt_h).to(tl.float32)
            if HAS_DT_BIAS:
                b_dt += tl.load(p_dt_bias + i_h).to(tl.float32)
            if DT_SOFTPLUS:
                b_dt = softplus(b_dt)
            b_decay = tl.exp(b_dt * tl.load(p_A + i_h).to(tl.float32))
            b_B = tl.load(p_B + i_b64 * s_B_b + i_g64 * s_B_g + o_n * s_B_n, mask=m_n, other=0.0).to(tl.float32)
            b_C = tl.load(p_C + i_b64 * s_C_b + i_g64 * s_C_g + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
            b_wx = b_dt * tl.sum(b_B * b_C, axis=0)
            if HAS_D:
                b_wx += tl.load(p_D + i_h).to(tl.float32)
        p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
        p_ring_row_x = p_ring_x + slot * s_rx_s + i_h64 * s_rx_h
        for i_p in range(i_s, NUM_TILES, SPLIT):
            o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
            m_p = o_p < P
            m_tile = m_p[:, None] & m_n[None, :]
            p_tile = p_ck_head + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n
            b_S = tl.load(p_tile, mask=m_tile, other=0.0).to(tl.float32)
            b_rx = tl.load(
                p_ring_row_x + o_l[:, None] * s_rx_l + o_p[None, :] * s_rx_p, mask=m_hist[:, None] & m_p[None, :], other=0.0
            ).to(tl.float32)
            # S <- exp(G) S + sum_i exp(G_i) dt_i x_i B_i^T, in fp32.
            b_S = fold_tile(b_S, b_decay_f, b_rx * b_wf[:, None], b_rB)
            b_S_read = b_S.to(p_ckpt.dtype.element_ty)
            tl.store(p_tile, b_S_read, mask=m_tile)
            if HAS_READ:
                if HAS_READ_SCALE:
                    b_S, b_row_scale = quantize_rows_e4m3(b_S)  # b_S: the values, exact in e4m3
                    tl.store(p_read_scale + slot * s_rs_s + i_h64 * s_rs_h + o_p * s_rs_p, b_row_scale, mask=m_p)
                b_S_read = b_S.to(p_read.dtype.element_ty)
                tl.store(
                    p_read + slot * s_ck_s + i_h64 * s_ck_h + o_p[:, None].to(tl.int64) * s_ck_p + o_n[None, :] * s_ck_n,
                    b_S_read, mask=m_tile,
                )  # fmt: skip
            if T == 1:
                b_x = tl.load(p_x + i_b64 * s_x_b + i_h64 * s_x_h + o_p * s_x_p, mask=m_p, other=0.0).to(tl.float32)
                b_SC = tl.sum(b_S_read.to(tl.float32) * b_C[None, :], axis=1)
                if HAS_READ_SCALE:
                    b_SC = b_SC * b_row_scale
                b_y = b_decay * b_SC + b_wx * b_x
                if HAS_Z:
                    b_z = tl.load(p_z + i_b64 * s_z_b + i_h64 * s_z_h + o_p * s_z_p, mask=m_p, other=0.0).to(tl.float32)
                    b_y = b_y * b_z * sigmoid(b_z)
                tl.store(p_y + i_b64 * s_y_b + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_p)


@triton.jit
def _mamba2_weights_kernel(
    p_dt, p_A, p_B, p_C, p_D, p_dt_bias,
    p_ring_B, p_ring_dt, p_ring_ld, p_cursor, p_rows, p_w, p_pos, p_fold_w, p_fold_B,
    s_dt_b, s_dt_t, s_dt_h,
    s_B_b, s_B_t, s_B_g, s_B_n,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_rB_s, s_rB_l, s_rB_g, s_rB_n,
    s_rdt_s, s_rdt_l, s_rdt_h,
    s_rld_s, s_rld_l, s_rld_h,
    s_w_b, s_w_h, s_w_t,
    s_fw_b, s_fw_h,
    s_fB_b, s_fB_g, s_fB_l,
    N, L, heads_per_group,
    T: tl.constexpr, FOLD_IN_MAIN: tl.constexpr, USE_PDL: tl.constexpr,
    HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr, DT_SOFTPLUS: tl.constexpr,
    BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """Launch 2, one program per (group, row): the scalars of the main launch, and the append.

    With c the row's committed entries after launch 1 (0 if it folded) and ``cum_t`` the sum of the
    new tokens' log-decays up to t, for each head h of the group and each new token t, into
    ``w[b, h, t]``: the ring weights ``exp(G(i) + cum_t) dt_i (B_i . C_t)`` for i < c (zero beyond),
    at L the checkpoint decay ``exp(sum_i l_i + cum_t)``, at L + 1 + s the causal weights
    ``exp(cum_t - cum_s) dt_s (B_s . C_t)`` for s <= t (plus D at s = t). The B.C products are
    formed once per group. Then the entry parts every tile reads (B, dt, dt*A) of token t go to
    ring position c + t, and ``pos[b]`` gets c, or -1 for a T = 1 row that launch 1 folded (it has
    its output). Positions >= c are read by no program of this launch; launch 3 moves the cursor.

    ``FOLD_IN_MAIN`` (T = 1 only; no launch 1, this launch runs first): a row whose ring is full also gets its
    fold weights ``exp(G_i) dt_i`` (per head, entries < cursor) and the fold decay into ``fold_w[b, h]``
    and its ring B entries copied to ``fold_B[b, g]`` before the append overwrites them; ``pos[b]``
    gets ``-1 - cursor`` (the main launch folds that many entries into each tile, then uses c = 0).

    ``USE_PDL``: after launch 1 this launch is made with ``launch_pdl`` and may start while launch 1
    still folds: it reads nothing launch 1 writes and writes only scratch before it waits; the append,
    which overwrites entries a folding row's fold reads, comes after the wait. (The step's first launch
    with ``FOLD_IN_MAIN``: the wait is then a no-op.) It lets launch 3 start at once; launch 3 waits for
    this launch, which ends only after launch 1 has.
    """
    allow_next_launch(USE_PDL)
    i_g, i_b = tl.program_id(0), tl.program_id(1)
    i_g64, i_b64 = i_g.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur = tl.load(p_cursor + slot)
    flush = cur + T > L
    c_eff = tl.where(flush, 0, cur)
    # Ring entries read: those the outputs use (< c), and with FOLD_IN_MAIN also a folding row's whole history.
    n_read = cur if FOLD_IN_MAIN else c_eff
    o_n = tl.arange(0, BLOCK_N)
    o_l = tl.arange(0, BLOCK_L)
    o_j = tl.arange(0, BLOCK_J)
    o_t = tl.arange(0, BLOCK_T)
    m_n = o_n < N
    m_j = o_j < heads_per_group
    m_t = o_t < T
    m_ring = o_l < c_eff
    m_read = o_l < n_read
    o_h = (i_g * heads_per_group + o_j).to(tl.int64)
    m_jt = m_j[:, None] & m_t[None, :]
    # The new tokens' dt and log-decays, (heads, tokens).
    b_dt = tl.load(p_dt + i_b64 * s_dt_b + o_t[None, :] * s_dt_t + o_h[:, None] * s_dt_h, mask=m_jt, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(p_dt_bias + o_h, mask=m_j, other=0.0).to(tl.float32)[:, None]
    if DT_SOFTPLUS:
        b_dt = softplus(b_dt)
    b_dt = tl.where(m_jt, b_dt, 0.0)
    b_ld = b_dt * tl.load(p_A + o_h, mask=m_j, other=0.0).to(tl.float32)[:, None]
    if HAS_D:
        b_D = tl.load(p_D + o_h, mask=m_j, other=0.0).to(tl.float32)
    # The committed ring: B (entries, state), dt and log-decay (heads, entries).
    b_rB = tl.load(
        p_ring_B + slot * s_rB_s + i_g64 * s_rB_g + o_l[:, None] * s_rB_l + o_n[None, :] * s_rB_n,
        mask=m_read[:, None] & m_n[None, :], other=0.0,
    ).to(tl.float32)
    m_jl = m_j[:, None] & m_ring[None, :]
    m_jr = m_j[:, None] & m_read[None, :]
    b_rld = tl.load(p_ring_ld + slot * s_rld_s + o_l[None, :] * s_rld_l + o_h[:, None] * s_rld_h, mask=m_jr, other=0.0).to(tl.float32)
    b_rdt = tl.load(p_ring_dt + slot * s_rdt_s + o_l[None, :] * s_rdt_l + o_h[:, None] * s_rdt_h, mask=m_jr, other=0.0).to(tl.float32)
    b_suffix = head_suffix_sums(b_rld, o_l)  # suffix[j, i] = sum_{m > i} l[j, m]
    b_read_total = tl.sum(b_rld, axis=1)
    b_ring_total = tl.where(flush, 0.0, b_read_total)  # the outputs' checkpoint decay: a folded ring is in the checkpoint
    p_w_rows = p_w + i_b64 * s_w_b + o_h * s_w_h
    if FOLD_IN_MAIN:
        if flush:
            # The fold's weights exp(G_i) dt_i and decay per head, and the B entries the append overwrites.
            p_fw_rows = p_fold_w + i_b64 * s_fw_b + o_h * s_fw_h
            tl.store(p_fw_rows[:, None] + o_l[None, :], tl.exp(b_suffix) * b_rdt, mask=m_jr)
            tl.store(p_fw_rows + L, tl.exp(b_read_total), mask=m_j)
            tl.store(
                p_fold_B + i_b64 * s_fB_b + i_g64 * s_fB_g + o_l[:, None] * s_fB_l + o_n[None, :], b_rB,
                mask=m_read[:, None] & m_n[None, :],
            )
        tl.debug_barrier()  # every thread has read the old entries before the append below overwrites them
    p_B_row = p_B + i_b64 * s_B_b + i_g64 * s_B_g
    p_C_row = p_C + i_b64 * s_C_b + i_g64 * s_C_g
    b_Bn = tl.load(p_B_row + o_t[:, None] * s_B_t + o_n[None, :] * s_B_n, mask=m_t[:, None] & m_n[None, :], other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        b_C_t = tl.load(p_C_row + t * s_C_t + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
        b_bc_ring = tl.sum(b_rB * b_C_t[None, :], axis=1)  # (entries,)
        b_bc_new = tl.sum(b_Bn * b_C_t[None, :], axis=1)  # (tokens,)
        b_cum_t = tl.sum(tl.where(o_t[None, :] <= t, b_ld, 0.0), axis=1)  # (heads,)
        # seg[j, s] = sum_{s < u <= t} l[j, u]
        m_seg = (o_t[None, None, :] > o_t[None, :, None]) & (o_t[None, None, :] <= t)
        b_seg = tl.sum(tl.where(m_seg, b_ld[:, None, :], 0.0), axis=2)
        b_w_ring = tl.where(m_jl, tl.exp(b_suffix + b_cum_t[:, None]) * b_rdt * b_bc_ring[None, :], 0.0)
        b_w_new = tl.where(m_jt & (o_t[None, :] <= t), tl.exp(b_seg) * b_dt * b_bc_new[None, :], 0.0)
        if HAS_D:
            b_w_new += tl.where(o_t[None, :] == t, b_D[:, None], 0.0)
        b_decay_t = tl.exp(b_ring_total + b_cum_t)
        p_w_t = p_w_rows + t * s_w_t
        tl.store(p_w_t[:, None] + o_l[None, :], b_w_ring, mask=m_j[:, None] & (o_l[None, :] < L))
        tl.store(p_w_t + L, b_decay_t, mask=m_j)
        tl.store(p_w_t[:, None] + (L + 1) + o_t[None, :], b_w_new, mask=m_jt)
    # Append: token t's B (per group), dt and dt*A (per head) at ring position c + t, once launch 1
    # (which reads a folding row's old entries) has finished.
    wait_for_previous_launch(USE_PDL)
    for t in tl.static_range(T):
        pos_t = c_eff + t
        b_B_raw = tl.load(p_B_row + t * s_B_t + o_n * s_B_n, mask=m_n, other=0.0)
        tl.store(p_ring_B + slot * s_rB_s + pos_t * s_rB_l + i_g64 * s_rB_g + o_n * s_rB_n, b_B_raw.to(p_ring_B.dtype.element_ty), mask=m_n)
        b_dt_t = tl.sum(tl.where(o_t[None, :] == t, b_dt, 0.0), axis=1)
        b_ld_t = tl.sum(tl.where(o_t[None, :] == t, b_ld, 0.0), axis=1)
        tl.store(p_ring_dt + slot * s_rdt_s + pos_t * s_rdt_l + o_h * s_rdt_h, b_dt_t, mask=m_j)
        tl.store(p_ring_ld + slot * s_rld_s + pos_t * s_rld_l + o_h * s_rld_h, b_ld_t, mask=m_j)
    if FOLD_IN_MAIN:
        b_pos = tl.where(flush, -1 - cur, c_eff)
    elif T == 1:
        b_pos = tl.where(flush, -1, c_eff)
    else:
        b_pos = c_eff
    tl.store(p_pos + i_b, b_pos.to(tl.int32), mask=i_g == 0)


@triton.jit
def _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, k, N, N_CHUNK: tl.constexpr):
    """The token block's chunk k of N: the tile's (1, rows, N_CHUNK) columns, loaded in the (T, rows,
    N_CHUNK) product's layout, and C's (T, N_CHUNK) block."""
    o_nk = k * N_CHUNK + tl.arange(0, N_CHUNK)
    m_nk = o_nk < N
    b_S_k = tl.load(p_rows_ck[None, :, None] + o_nk[None, None, :] * s_ck_n, mask=m_p[None, :, None] & m_nk[None, None, :], other=0.0)
    b_C_k = tl.load(p_C_row + o_t[:, None] * s_C_t + o_nk[None, :] * s_C_n, mask=m_t[:, None] & m_nk[None, :], other=0.0)
    return b_S_k, b_C_k


@triton.jit
def _mamba2_main_kernel(
    p_x, p_C, p_z, p_y, p_ckpt, p_read_scale, p_ring_x, p_cursor, p_pending, p_rows, p_w, p_pos, p_fold_w, p_fold_B,
    s_x_b, s_x_t, s_x_h, s_x_p,
    s_C_b, s_C_t, s_C_g, s_C_n,
    s_z_b, s_z_t, s_z_h, s_z_p,
    s_y_b, s_y_t, s_y_h, s_y_p,
    s_ck_s, s_ck_h, s_ck_p, s_ck_n,
    s_rs_s, s_rs_h, s_rs_p,
    s_rx_s, s_rx_l, s_rx_h, s_rx_p,
    s_w_b, s_w_h, s_w_t,
    s_fw_b, s_fw_h,
    s_fB_b, s_fB_g, s_fB_l,
    P, N, L, heads_per_group,
    T: tl.constexpr, COMMIT: tl.constexpr, HAS_Z: tl.constexpr, FOLD_IN_MAIN: tl.constexpr, HAS_READ_SCALE: tl.constexpr,
    TOKEN_BLOCK: tl.constexpr, N_CHUNK: tl.constexpr, PREFETCH: tl.constexpr, USE_PDL: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Launch 3, shaped like the conventional kernel: per state tile, the T outputs
    ``y_t = decay_t S C_t + sum_i w_ti x_i + sum_{s <= t} w'_ts x_s`` from one read of the tile, the
    ring's x slice and the new x; writes the y and the tile's x entries, never the state; moves the
    cursor (once per row). T = 1 rows that launch 1 folded only get their x entry.

    ``FOLD_IN_MAIN`` (T = 1 only; no launch 1): a row with ``pos = -1 - n`` first folds its n ring entries into
    the tile, ``S <- decay S + sum_i (exp(G_i) dt_i x_i) B_i^T`` by rank-1 updates in fp32 (the tile
    is too small for a ``tl.dot``; the weights and B come from launch 2's fold scratch), writes the
    tile (the step's only state write) and continues from it as stored, with an empty ring.

    Forms (``LaunchConfig.form``; the launcher turns them into constexprs):

    * ``""``: for T > 1 one token at a time (C_t, the weights row, a 128-wide reduction of S C_t and
      a short one over the ring: T dependent round trips and reductions per program).
    * ``"tokens_prefetched"`` (``TOKEN_BLOCK``, T > 1 only): all T outputs of the tile as one block. The
      C block, the weights block (T, L + 1 + T), the ring x slice and the new x are each loaded once;
      ``S C^T`` is a (T, rows, N_CHUNK) broadcast product accumulated over N chunks and reduced once
      (one set of cross-thread reductions for all T, where the per-token form has T); y is stored as
      a (T, rows) block. The tile is loaded as (1, rows, N_CHUNK) blocks so that they land in the
      product's layout. Each chunk's loads are issued ``PREFETCH`` chunks before its product
      (``LaunchConfig.num_stages - 1``, 1 to 4; the launch itself runs on one stage): without that,
      each chunk's loads waited for the previous chunk's layout conversion, one DRAM round trip per
      chunk.

    ``HAS_READ_SCALE``: ``p_ckpt`` is an fp8 read copy whose rows carry a scale (``p_read_scale``); each
    tile row's products with C are summed from the stored values, then multiplied by the row's scale.

    ``USE_PDL`` (launched with ``launch_pdl``): this launch may start while launch 2 (and launch 1
    before it) still run; its programs wait for launch 2 before reading anything but their row's slot.
    (Reading the first checkpoint tile before the wait was slower: docs/kernels.md, "Forms tried and lost".)
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_g = i_h // heads_per_group
    i_h64, i_g64, i_b64 = i_h.to(tl.int64), i_g.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    wait_for_previous_launch(USE_PDL)
    pos = tl.load(p_pos + i_b)
    if FOLD_IN_MAIN:
        live = True
        n_fold = -1 - pos  # entries to fold first (< 0: none)
    else:
        live = pos >= 0  # False only for a T = 1 row folded by launch 1 (which wrote its output)
    c_eff = tl.maximum(pos, 0)
    first = (i_s == 0) & (i_h == 0)
    if COMMIT:
        tl.store(p_cursor + slot, c_eff + T, mask=first)
        tl.store(p_pending + slot, 0, mask=first)
    else:
        tl.store(p_cursor + slot, c_eff, mask=first)
        tl.store(p_pending + slot, T, mask=first)
    o_n = tl.arange(0, BLOCK_N)
    o_l = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    m_n = o_n < N
    m_ring = o_l < c_eff
    m_t = o_t < T
    p_w_row = p_w + i_b64 * s_w_b + i_h64 * s_w_h
    p_C_row = p_C + i_b64 * s_C_b + i_g64 * s_C_g
    p_x_row = p_x + i_b64 * s_x_b + i_h64 * s_x_h
    if T == 1:  # hoisted: the decode step's only token
        b_C = tl.load(p_C_row + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
        b_w = tl.load(p_w_row + o_l, mask=m_ring, other=0.0)
        b_decay = tl.load(p_w_row + L)
        b_wx = tl.load(p_w_row + L + 1)
    p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
    p_ring_row_x = p_ring_x + slot * s_rx_s + i_h64 * s_rx_h
    for i_p in range(i_s, NUM_TILES, SPLIT):
        o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        m_out = tl.where(live, m_p, False)  # (m_p & live: a bool scalar in a mask trips the interpreter)
        if HAS_READ_SCALE:
            b_row_scale = tl.load(p_read_scale + slot * s_rs_s + i_h64 * s_rs_h + o_p * s_rs_p, mask=m_out, other=0.0)
        p_rows_ck = p_ck_head + o_p.to(tl.int64) * s_ck_p
        p_tile = p_rows_ck[:, None] + o_n[None, :] * s_ck_n
        if not TOKEN_BLOCK:  # (the token block reads the tile by N chunks)
            b_S = tl.load(p_tile, mask=m_out[:, None] & m_n[None, :], other=0.0).to(tl.float32)
            if FOLD_IN_MAIN:
                if n_fold >= 0:
                    b_S = fold_ring_store(
                        b_S, n_fold, p_fold_w + i_b64 * s_fw_b + i_h64 * s_fw_h, p_ring_row_x, s_rx_l, s_rx_p, o_p, m_p,
                        p_fold_B + i_b64 * s_fB_b + i_g64 * s_fB_g, s_fB_l, o_n, m_n, L, p_tile, m_p[:, None] & m_n[None, :],
                    )  # fmt: skip
        b_rx = tl.load(
            p_ring_row_x + o_l[:, None] * s_rx_l + o_p[None, :] * s_rx_p, mask=m_ring[:, None] & m_p[None, :], other=0.0
        ).to(tl.float32)
        if T == 1:
            b_x_raw = tl.load(p_x_row + o_p * s_x_p, mask=m_p, other=0.0)
            b_SC = tl.sum(b_S * b_C[None, :], axis=1)
            if HAS_READ_SCALE:
                b_SC = b_SC * b_row_scale
            b_y = b_decay * b_SC + tl.sum(b_w[:, None] * b_rx, axis=0) + b_wx * b_x_raw.to(tl.float32)
            if HAS_Z:
                b_z = tl.load(p_z + i_b64 * s_z_b + i_h64 * s_z_h + o_p * s_z_p, mask=m_out, other=0.0).to(tl.float32)
                b_y = b_y * b_z * sigmoid(b_z)
            tl.store(p_y + i_b64 * s_y_b + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_out)
            tl.store(p_ring_row_x + c_eff * s_rx_l + o_p * s_rx_p, b_x_raw.to(p_ring_x.dtype.element_ty), mask=m_p)
        elif TOKEN_BLOCK:
            m_tp = m_t[:, None] & m_p[None, :]
            b_xn = tl.load(p_x_row + o_t[:, None] * s_x_t + o_p[None, :] * s_x_p, mask=m_tp, other=0.0)
            p_w_tok = p_w_row + o_t * s_w_t
            b_decay_t = tl.load(p_w_tok + L, mask=m_t, other=0.0)
            b_w_ring = tl.load(p_w_tok[:, None] + o_l[None, :], mask=m_t[:, None] & m_ring[None, :], other=0.0)
            b_w_new = tl.load(p_w_tok[:, None] + (L + 1) + o_t[None, :], mask=m_t[:, None] & (o_t[None, :] <= o_t[:, None]), other=0.0)
            # S C^T: products summed over the N chunks in registers, one cross-thread reduction at the end.
            # The tile chunk is loaded in 3D (the product's layout); C, small, is the operand converted.
            b_SC = tl.zeros((BLOCK_T, BLOCK_P, N_CHUNK), dtype=tl.float32)
            # PREFETCH (1 to 4) chunks in flight: slots a, b, c, d hold chunks k, k + 1, k + 2, k + 3 (as far as
            # PREFETCH goes; a chunk past the tile's last is a masked-off load).
            b_S_a, b_C_a = _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, 0, N, N_CHUNK)
            if PREFETCH >= 2:
                b_S_b, b_C_b = _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, 1, N, N_CHUNK)
            if PREFETCH >= 3:
                b_S_c, b_C_c = _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, 2, N, N_CHUNK)
            if PREFETCH >= 4:
                b_S_d, b_C_d = _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, 3, N, N_CHUNK)
            for k in tl.static_range(BLOCK_N // N_CHUNK):
                b_S_k, b_C_k = b_S_a, b_C_a
                if PREFETCH >= 2:
                    b_S_a, b_C_a = b_S_b, b_C_b
                if PREFETCH >= 3:
                    b_S_b, b_C_b = b_S_c, b_C_c
                if PREFETCH >= 4:
                    b_S_c, b_C_c = b_S_d, b_C_d
                if k + PREFETCH < BLOCK_N // N_CHUNK:
                    b_S_n, b_C_n = _token_block_chunk(p_rows_ck, p_C_row, s_ck_n, s_C_t, s_C_n, o_t, m_t, m_p, k + PREFETCH, N, N_CHUNK)
                    if PREFETCH == 1:
                        b_S_a, b_C_a = b_S_n, b_C_n
                    elif PREFETCH == 2:
                        b_S_b, b_C_b = b_S_n, b_C_n
                    elif PREFETCH == 3:
                        b_S_c, b_C_c = b_S_n, b_C_n
                    else:
                        b_S_d, b_C_d = b_S_n, b_C_n
                b_SC += b_S_k.to(tl.float32) * b_C_k.to(tl.float32)[:, None, :]
            b_Y = tl.sum(b_SC, axis=2)
            if HAS_READ_SCALE:
                b_Y = b_Y * b_row_scale[None, :]
            b_Y = b_decay_t[:, None] * b_Y
            b_Y += tl.sum(b_w_ring[:, :, None] * b_rx[None, :, :], axis=1)
            b_Y += tl.sum(b_w_new[:, :, None] * b_xn.to(tl.float32)[None, :, :], axis=1)
            if HAS_Z:
                b_Z = tl.load(p_z + i_b64 * s_z_b + o_t[:, None] * s_z_t + i_h64 * s_z_h + o_p[None, :] * s_z_p, mask=m_tp, other=0.0).to(tl.float32)
                b_Y = b_Y * b_Z * sigmoid(b_Z)
            tl.store(p_y + i_b64 * s_y_b + o_t[:, None] * s_y_t + i_h64 * s_y_h + o_p[None, :] * s_y_p, b_Y.to(p_y.dtype.element_ty), mask=m_tp)
            tl.store(p_ring_row_x + (c_eff + o_t[:, None]) * s_rx_l + o_p[None, :] * s_rx_p, b_xn.to(p_ring_x.dtype.element_ty), mask=m_tp)
        else:
            b_xn = tl.load(p_x_row + o_t[:, None] * s_x_t + o_p[None, :] * s_x_p, mask=m_t[:, None] & m_p[None, :], other=0.0)
            b_xn_f = b_xn.to(tl.float32)
            for t in tl.static_range(T):
                p_w_t = p_w_row + t * s_w_t
                b_C_t = tl.load(p_C_row + t * s_C_t + o_n * s_C_n, mask=m_n, other=0.0).to(tl.float32)
                b_w_t = tl.load(p_w_t + o_l, mask=m_ring, other=0.0)
                b_wn_t = tl.load(p_w_t + (L + 1) + o_t, mask=o_t <= t, other=0.0)
                b_SC_t = tl.sum(b_S * b_C_t[None, :], axis=1)
                if HAS_READ_SCALE:
                    b_SC_t = b_SC_t * b_row_scale
                b_y = tl.load(p_w_t + L) * b_SC_t
                b_y += tl.sum(b_w_t[:, None] * b_rx, axis=0) + tl.sum(b_wn_t[:, None] * b_xn_f, axis=0)
                if HAS_Z:
                    b_z = tl.load(p_z + i_b64 * s_z_b + t * s_z_t + i_h64 * s_z_h + o_p * s_z_p, mask=m_p, other=0.0).to(tl.float32)
                    b_y = b_y * b_z * sigmoid(b_z)
                tl.store(p_y + i_b64 * s_y_b + t * s_y_t + i_h64 * s_y_h + o_p * s_y_p, b_y.to(p_y.dtype.element_ty), mask=m_p)
            # The new x entries at ring positions c .. c + T - 1 (a (T, tile) block).
            tl.store(
                p_ring_row_x + (c_eff + o_t[:, None]) * s_rx_l + o_p[None, :] * s_rx_p,
                b_xn.to(p_ring_x.dtype.element_ty), mask=m_t[:, None] & m_p[None, :],
            )


def strides_or_zeros(t: Tensor | None, n: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * n


def tiles_of(dim: int, cfg: LaunchConfig) -> tuple[int, int]:
    num_tiles = triton.cdiv(dim, cfg.block)
    return num_tiles, min(cfg.split, num_tiles)


# fp32 accumulators per thread for the token block's (T, rows, N_CHUNK) product.
_TOKEN_BLOCK_REGISTERS = 32


def _main_form(cfg: LaunchConfig, num_tokens: int, block_t: int, block_n: int) -> dict:
    """``_mamba2_main_kernel``'s form constexprs from ``cfg.form`` ("" or "tokens_prefetched"; see its
    docstring). The token block applies to T > 1; at T = 1 every form is the decode step's."""
    check_form("_mamba2_main_kernel", cfg, ("", "tokens_prefetched"))
    if not cfg.form:
        return dict(TOKEN_BLOCK=False, N_CHUNK=block_n, PREFETCH=0)
    if cfg.num_stages not in (2, 3, 4, 5):
        raise ValueError(f"_mamba2_main_kernel: the 'tokens_prefetched' form takes num_stages 2 to 5 (1 to 4 chunks ahead), got {cfg.num_stages}")
    per_chunk = 32 * cfg.num_warps * _TOKEN_BLOCK_REGISTERS // (block_t * cfg.block)
    n_chunk = min(block_n, max(1, next_pow2(per_chunk + 1) // 2))  # the power of two <= per_chunk
    return dict(TOKEN_BLOCK=num_tokens > 1, N_CHUNK=n_chunk, PREFETCH=cfg.num_stages - 1)


def mamba2_step_out(
    x, dt, A, B, C, D, dt_bias, z,
    checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending,
    rows, commit: bool, dt_softplus: bool, y: Tensor, config: LaunchConfig | None = None,
    flush_config: LaunchConfig | None = None, fold_in_main: bool | None = None, weights_config: LaunchConfig | None = None,
    overlap: bool | None = None, read_checkpoint: Tensor | None = None, read_scale: Tensor | None = None,
) -> None:  # fmt: skip
    """The replay step writing its outputs into ``y``; see ``replayssm.ops.mamba2_step``.

    Three launches for any T: ``_mamba2_flush_kernel`` (``flush_config``), ``_mamba2_weights_kernel``
    (``weights_config``: only its ``num_warps`` counts; default from ``launch.weights_launch_config``),
    ``_mamba2_main_kernel`` (``config``; default from the replay table for T = 1, the verify table
    for T > 1). ``fold_in_main`` (T = 1 only; default from ``launch.fold_in_main``): no flush launch;
    the main launch folds full rings tile by tile. ``config.form`` picks the main launch's form (see
    ``_mamba2_main_kernel``). ``overlap`` (default ``launch.OVERLAP_LAUNCHES``): the launches after the first
    with programmatic dependent launch where the GPU has it (``triton_helpers.overlap_launches``).
    ``read_checkpoint`` (SPEC §4): the main launch reads it instead of the checkpoint; the flush launch
    writes both (so a step with a read copy always runs the flush launch: ``fold_in_main`` is off).
    ``read_scale``: an fp8 copy's scale per state row; the flush launch writes it, the main launch reads it.
    """
    batch, num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    window = ring_x.shape[1]
    heads_per_group = heads // groups
    block_n, block_l, block_t = next_pow2(state_size), max(next_pow2(window), 16), next_pow2(num_tokens)
    # Per-call scratch (like the output): the main launch's per-(row, head, token) weights and each row's ring position.
    weights = torch.empty(batch, heads, num_tokens, window + 1 + num_tokens, dtype=torch.float32, device=x.device)
    pos = torch.empty(batch, dtype=torch.int32, device=x.device)
    if fold_in_main is None:
        fold_in_main = read_checkpoint is None and launch.fold_in_main(head_dim, state_size, num_tokens)
    if fold_in_main and read_checkpoint is not None:
        raise ValueError("mamba2_step_out: fold_in_main does not write a read copy; pass fold_in_main=False with read_checkpoint")
    if read_scale is not None and x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < (8, 9):
        # Triton has no fp8 e4m3 (float8e4nv) before sm_89.
        raise ValueError(
            f"mamba2_step_out: an fp8 read copy needs a GPU of compute capability 8.9 or newer, got {torch.cuda.get_device_capability(x.device)}"
        )
    if fold_in_main and num_tokens > 1:
        # (Verification's token-block forms once folded each N chunk as they loaded it: 45% slower than the
        # flush launch; docs/kernels.md, "Forms tried and lost".)
        raise ValueError(f"mamba2_step_out: fold_in_main is for decoding (T = 1), got T = {num_tokens} tokens")
    # The fold's scratch (FOLD_IN_MAIN): per-head weights and decay, and the B entries the append overwrites.
    fold_w = torch.empty(batch, heads, window + 1, dtype=torch.float32, device=x.device) if fold_in_main else None
    fold_B = torch.empty(batch, groups, window, state_size, dtype=torch.float32, device=x.device) if fold_in_main else None
    fold_strides = dict(
        **dict(zip(("s_fw_b", "s_fw_h"), strides_or_zeros(fold_w, 3)[:2])),
        **dict(zip(("s_fB_b", "s_fB_g", "s_fB_l"), strides_or_zeros(fold_B, 4)[:3])),
    )  # fmt: skip
    x1, dt1, B1, C1, y1 = x[:, 0], dt[:, 0], B[:, 0], C[:, 0], y[:, 0]
    z1 = z[:, 0] if z is not None else None
    ring_strides = dict(
        **dict(zip(("s_rB_s", "s_rB_l", "s_rB_g", "s_rB_n"), ring_B.stride())),
        **dict(zip(("s_rdt_s", "s_rdt_l", "s_rdt_h"), ring_dt.stride())),
        **dict(zip(("s_rld_s", "s_rld_l", "s_rld_h"), ring_logdecay.stride())),
    )  # fmt: skip
    read_scale_strides = dict(zip(("s_rs_s", "s_rs_h", "s_rs_p"), strides_or_zeros(read_scale, 3)))
    flags = dict(HAS_D=D is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus)
    fcfg = flush_config or launch.flush_config(head_dim, state_size)
    # Every launch's configuration is checked before the first launch: a bad form must not leave a half-done step.
    if config is None:
        config = launch.main_config(head_dim, state_size, num_tokens, read_checkpoint is not None)
    main_form = _main_form(config, num_tokens, block_t, block_n)
    wcfg = weights_config or launch.weights_launch_config(head_dim, state_size, num_tokens)
    check_form("_mamba2_flush_kernel", fcfg)
    check_form("_mamba2_weights_kernel", wcfg)
    if not fold_in_main and fcfg.block < 16:
        raise ValueError(f"_mamba2_flush_kernel: the fold needs tiles of >= 16 rows (tl.dot), got {fcfg.block}")
    num_tiles, split = tiles_of(head_dim, fcfg)
    use_pdl = overlap_launches(x.device, launch_defaults.OVERLAP_LAUNCHES if overlap is None else overlap)
    later = pdl_launch_options(use_pdl)  # the launches after the step's first (a plain one: its inputs come from before the op)
    with device_context(x):
        if not fold_in_main:
            _mamba2_flush_kernel[(split, heads, batch)](
                p_x=x1, p_dt=dt1, p_A=A, p_B=B1, p_C=C1, p_D=D, p_dt_bias=dt_bias, p_z=z1, p_y=y1,
                p_ckpt=checkpoint, p_read=read_checkpoint, p_read_scale=read_scale, p_ring_x=ring_x, p_ring_B=ring_B, p_ring_dt=ring_dt,
                p_ring_ld=ring_logdecay, p_cursor=cursor, p_rows=rows,
                s_x_b=x1.stride(0), s_x_h=x1.stride(1), s_x_p=x1.stride(2),
                s_dt_b=dt1.stride(0), s_dt_h=dt1.stride(1),
                s_B_b=B1.stride(0), s_B_g=B1.stride(1), s_B_n=B1.stride(2),
                s_C_b=C1.stride(0), s_C_g=C1.stride(1), s_C_n=C1.stride(2),
                **dict(zip(("s_z_b", "s_z_h", "s_z_p"), strides_or_zeros(z1, 3))),
                s_y_b=y1.stride(0), s_y_h=y1.stride(1), s_y_p=y1.stride(2),
                **dict(zip(("s_ck_s", "s_ck_h", "s_ck_p", "s_ck_n"), checkpoint.stride())),
                **read_scale_strides,
                **dict(zip(("s_rx_s", "s_rx_l", "s_rx_h", "s_rx_p"), ring_x.stride())),
                **ring_strides,
                P=head_dim, N=state_size, L=window, heads_per_group=heads_per_group, T=num_tokens, USE_PDL=use_pdl,
                HAS_READ=read_checkpoint is not None, HAS_READ_SCALE=read_scale is not None, HAS_Z=z is not None, **flags,
                BLOCK_P=fcfg.block, BLOCK_N=block_n, BLOCK_L=block_l, NUM_TILES=num_tiles, SPLIT=split,
                num_warps=fcfg.num_warps, num_stages=fcfg.num_stages,
            )  # fmt: skip
        _mamba2_weights_kernel[(groups, batch)](
            p_dt=dt, p_A=A, p_B=B, p_C=C, p_D=D, p_dt_bias=dt_bias,
            p_ring_B=ring_B, p_ring_dt=ring_dt, p_ring_ld=ring_logdecay, p_cursor=cursor, p_rows=rows,
            p_w=weights, p_pos=pos, p_fold_w=fold_w, p_fold_B=fold_B,
            **dict(zip(("s_dt_b", "s_dt_t", "s_dt_h"), dt.stride())),
            **dict(zip(("s_B_b", "s_B_t", "s_B_g", "s_B_n"), B.stride())),
            **dict(zip(("s_C_b", "s_C_t", "s_C_g", "s_C_n"), C.stride())),
            **ring_strides,
            **dict(zip(("s_w_b", "s_w_h", "s_w_t"), weights.stride()[:3])),
            **fold_strides,
            N=state_size, L=window, heads_per_group=heads_per_group, T=num_tokens, FOLD_IN_MAIN=fold_in_main, USE_PDL=use_pdl,
            **flags, BLOCK_J=next_pow2(heads_per_group), BLOCK_N=block_n, BLOCK_L=block_l, BLOCK_T=block_t,
            num_warps=wcfg.num_warps, **({} if fold_in_main else later),
        )  # fmt: skip
        num_tiles, split = tiles_of(head_dim, config)
        _mamba2_main_kernel[(split, heads, batch)](
            # The checkpoint this launch reads: the read copy where there is one (same strides).
            p_x=x, p_C=C, p_z=z, p_y=y, p_ckpt=checkpoint if read_checkpoint is None else read_checkpoint, p_read_scale=read_scale,
            p_ring_x=ring_x,
            p_cursor=cursor, p_pending=pending, p_rows=rows, p_w=weights, p_pos=pos, p_fold_w=fold_w, p_fold_B=fold_B,
            **dict(zip(("s_x_b", "s_x_t", "s_x_h", "s_x_p"), x.stride())),
            **dict(zip(("s_C_b", "s_C_t", "s_C_g", "s_C_n"), C.stride())),
            **dict(zip(("s_z_b", "s_z_t", "s_z_h", "s_z_p"), strides_or_zeros(z, 4))),
            **dict(zip(("s_y_b", "s_y_t", "s_y_h", "s_y_p"), y.stride())),
            **dict(zip(("s_ck_s", "s_ck_h", "s_ck_p", "s_ck_n"), checkpoint.stride())),
            **read_scale_strides,
            **dict(zip(("s_rx_s", "s_rx_l", "s_rx_h", "s_rx_p"), ring_x.stride())),
            **dict(zip(("s_w_b", "s_w_h", "s_w_t"), weights.stride()[:3])),
            **fold_strides,
            P=head_dim, N=state_size, L=window, heads_per_group=heads_per_group,
            T=num_tokens, COMMIT=commit, HAS_Z=z is not None, FOLD_IN_MAIN=fold_in_main, HAS_READ_SCALE=read_scale is not None,
            **main_form, USE_PDL=use_pdl,
            BLOCK_P=config.block, BLOCK_N=block_n, BLOCK_L=block_l, BLOCK_T=block_t, NUM_TILES=num_tiles, SPLIT=split,
            num_warps=config.num_warps, num_stages=1 if main_form["PREFETCH"] else config.num_stages, **later,
        )  # fmt: skip


def mamba2_step(
    x, dt, A, B, C, D, dt_bias, z,
    checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending,
    rows, commit: bool, dt_softplus: bool, read_checkpoint: Tensor | None = None, read_scale: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """The launcher of ``replayssm.ops.mamba2_step`` (fp32 / fp16 / bf16)."""
    args = (x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, as the fake kernel says (x may be strided)
    mamba2_step_out(*args, y=y, read_checkpoint=read_checkpoint, read_scale=read_scale)
    return y
