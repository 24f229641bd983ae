"""Triton kernels for Gated DeltaNet: the replay step (decoding and verification) and the conventional baseline.

Decoding, one token per row (docs/ops.md, SPEC §2). ``_gdn_replay_kernel``
runs one program per (tile group, value head, row). A program computes the
per-head quantities once (normalised q and k, the ring keys' dot products
``k_i . k_t`` and ``k_i . q_t`` with their decays), then for each tile of
value rows reads the checkpoint once for both ``S_c k`` and ``S_c q``, forms
``r = S_{t-1} k_t``, the corrected update ``d_t = beta (v - alpha r)`` and
``o_t``, and writes ``d_t`` into the ring. Rows whose ring is full fold it
first (``S <- exp(g_i) S + d_i k_i^T`` in fp32) and write the checkpoint.
``_gdn_append_kernel`` (one program per row) then writes the normalised key
and the log-decay, which every tile of a row reads, and moves the cursor.

Verification, T > 1 tokens per row (SPEC §3), three launches (decoding can
take them too: ``decode_launches=3``, or the ``gdn_decode_launches`` table):

1. ``_gdn_flush_kernel`` over (tile group, value head, row): rows whose ring
   cannot take T more entries fold it into the checkpoint (fp32, stored in
   the checkpoint dtype); every other program exits after reading its
   cursor. The only checkpoint write. Its "worklist" form (the decoding
   table's) has a fixed grid of a few programs per multiprocessor looping
   over the folding rows' items instead. Its "alongside" form
   (``_gdn_fold_finish_kernel``, in no table yet) is launched after launch 2
   and runs beside launch 3: it also finishes the rows it folds and appends
   their keys, and launch 3 skips them without waiting for it.
2. ``_gdn_weights_kernel`` over (key head, row): the key-side products, once
   per key head for its value heads, into a scratch of per-token weights
   (ring, causal of o, checkpoint decay) and the T x T matrix
   ``N = (I + diag(beta) C)^{-1} diag(beta)`` (C: the causal weights of r),
   solved per value head by forward substitution in fp32; plus the normalised
   k and scaled q of the new tokens; appends k and g at the row's ring
   positions and records the first of them.
3. ``_gdn_main_kernel`` over (tile, value head, row), shaped like the
   conventional kernel: from one read of a checkpoint tile and the ring's d
   slice, the checkpoint + ring parts A and B of r and o for all T tokens
   (rows x T), then all corrected updates at once, ``D = (V - A) N^T``, and
   the outputs ``O = B + D W'^T`` (W': causal weights of o), in registers:
   no token waits on another's d through memory. Writes the outputs and the
   d entries (one block store each), never the state. One program per row
   moves the cursor. Its ``"mma"`` form (the verification table's for drafts
   of 3 tokens or more) forms these products as tensor-core dots in tf32x3,
   the checkpoint product over key chunks whose loads are pipelined.


Launches are ordered, which is the only synchronisation between them: each
ring position and the cursor change only in a launch after every reader of
them. On sm_90+ launches 2 and 3 overlap the one before (programmatic
dependent launch, ``configs.replay_overlap``): their programs wait in-kernel
for it before touching anything it writes. Nothing is read on the host; the
only allocations are the output and the scratch, so a step can be captured
in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import reference
from .common import (
    allow_next_launch,
    check_form,
    device_context,
    fold_store_tile,
    fold_tile,
    folding_rows,
    head_suffix_sums,
    load_f32,
    marked_folding_rows,
    next_pow2,
    overlap_launches,
    pdl_launch_options,
    rank_rows,
    store_cast,
    suffix_sums,
    uses_float64,
    wait_for_previous_launch,
    worklist_grid,
    worklist_item,
)
from .configs import (
    GDN_READ_COPY_FOLD,
    LaunchConfig,
    gdn_conventional_config,
    gdn_decode_launches,
    gdn_flush_config,
    gdn_main_config,
    gdn_read_copy_fold_constexprs,
    gdn_replay_config,
    gdn_weights_config,
    replay_overlap,
)


@triton.jit
def _load_qk(
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
def _ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V: tl.constexpr):
    """Tile ``i_v`` of a checkpoint head (rows ``i_v * BLOCK_V ..``): row offsets and mask, pointers and mask."""
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    m_tile = m_v[:, None] & m_k[None, :]
    p_tile = p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
    return o_v, m_v, p_tile, m_tile


@triton.jit
def _load_tile_ring(p_ck_head, p_ring_row_d, i_v, n_ring, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V: tl.constexpr):
    """Tile ``i_v`` of a checkpoint head and the ring's d entries ``< n_ring`` of its rows, ``(rows, entries)``, in fp32."""
    o_v, m_v, p_tile, m_tile = _ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V)
    b_S = tl.load(p_tile, mask=m_tile, other=0.0).to(tl.float32)
    return o_v, m_v, p_tile, m_tile, b_S, _ring_d_slice(p_ring_row_d, o_v, m_v, n_ring, s_rd_l, s_rd_v, o_l)


@triton.jit
def _ring_d_slice(p_ring_row_d, o_v, m_v, n_ring, s_rd_l, s_rd_v, o_l):
    """The ring's d entries ``< n_ring`` of value rows ``o_v``, ``(rows, entries)``, in fp32."""
    return tl.load(
        p_ring_row_d + o_l[None, :] * s_rd_l + o_v[:, None] * s_rd_v, mask=(o_l[None, :] < n_ring) & m_v[:, None], other=0.0
    ).to(tl.float32)


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

    b_q, b_k = _load_qk(p_q, p_k, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM, True)
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
        o_v, m_v, p_tile, m_tile = _ckpt_tile(p_ck_head, i_v, s_ck_v, s_ck_k, o_k, m_k, V, BLOCK_V)
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
def _ends_with_copy_entry(p_ring_beta, slot, cur, s_rg_s, s_rg_l, s_rg_h, i_h_mark):
    """Whether a row's last committed ring entry (``cur - 1``) was formed against the read copy: its stored
    beta for value head ``i_h_mark`` is not +0 (``reference._gdn_ends_with_copy_entry``; a step stores the
    same kind of beta for every head of an entry, so any head tells). Elementwise: ``slot`` and ``cur`` may
    be scalars or vectors of rows."""
    p_last = p_ring_beta + slot * s_rg_s + tl.maximum(cur - 1, 0) * s_rg_l + i_h_mark * s_rg_h
    b_last = tl.load(p_last, mask=cur > 0, other=0.0)
    return (cur > 0) & (b_last.to(tl.int32, bitcast=True) != 0)


@triton.jit
def _copy_beta(b_beta):
    """The betas stored with entries formed against the read copy, in fp32: beta, -0 for 0
    (``reference._gdn_copy_beta``)."""
    b_beta = b_beta.to(tl.float32)
    # By the bits: compiled for the GPU, tl.where(b_beta == 0.0, -0.0, b_beta) came out as b_beta (its
    # sign bit lost: the CUDA tests failed on 2026-12-05, the interpreter kept it).
    b_bits = b_beta.to(tl.int32, bitcast=True)
    return tl.where(b_beta == 0.0, -2147483648, b_bits).to(tl.float32, bitcast=True)


@triton.jit
def _row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, i_h_mark, T, L, EXACT_READS: tl.constexpr):
    """A row's cursor and whether it folds before this step: its ring cannot take T more entries, or
    (``EXACT_READS``: verification with a read copy, which reads the checkpoint) it ends in entries formed
    against the copy, whose correction the step's exact reads cannot carry (``_ends_with_copy_entry`` on
    value head ``i_h_mark``)."""
    cur = tl.load(p_cursor + slot)
    folds = cur + T > L
    if EXACT_READS:
        folds = folds | _ends_with_copy_entry(p_ring_beta, slot, cur, s_rg_s, s_rg_l, s_rg_h, i_h_mark)
    return cur, folds


@triton.jit
def _gdn_folding_rows(p_rows, p_cursor, p_ring_beta, s_rg_s, s_rg_l, s_rg_h, batch, T, L, BLOCK_B: tl.constexpr, EXACT_READS: tl.constexpr):
    """``common.folding_rows`` with ``_row_folds``' decision."""
    if EXACT_READS:
        o_b = tl.arange(0, BLOCK_B)
        m_b = o_b < batch
        b_slot = tl.load(p_rows + o_b, mask=m_b, other=0).to(tl.int64)
        b_cur = tl.load(p_cursor + b_slot, mask=m_b, other=0)
        b_fold = m_b & ((b_cur + T > L) | _ends_with_copy_entry(p_ring_beta, b_slot, b_cur, s_rg_s, s_rg_l, s_rg_h, 0))
        b_rank, n_fold = rank_rows(b_fold)
        return o_b, b_fold, b_rank, n_fold
    else:
        return folding_rows(p_rows, p_cursor, batch, T, L, BLOCK_B)


@triton.jit
def _gdn_flush_kernel(
    p_ckpt, p_read, p_ring_k, p_ring_d, p_ring_g, p_ring_beta, p_cursor, p_rows,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v,
    s_rg_s, s_rg_l, s_rg_h,
    V, K, L, value_per_key, batch, heads,
    T: tl.constexpr, WORKLIST: tl.constexpr, USE_PDL: tl.constexpr, HAS_READ: tl.constexpr, READ_FOLD: tl.constexpr, READ_DOT: tl.constexpr,
    EXACT_READS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr, BLOCK_B: tl.constexpr,
):  # fmt: skip
    """Verification launch 1: rows whose ring cannot take the T new entries (``cursor + T > L``) fold it,
    ``S <- exp(sum g) S + sum_i exp(suffix_i) d_i k_i^T`` in fp32 (one rank-L ``tl.dot`` per tile),
    stored in the checkpoint dtype. The only checkpoint write.

    Grid form: one program per (tile group, value head, row); a program of a row that does not fold
    reads its cursor and exits. ``WORKLIST`` form (``LaunchConfig.form == "worklist"``): a fixed grid of
    a few programs per multiprocessor looping over the (folding row, value head, tile group) items.

    ``USE_PDL``: the step's first launch (a plain one); it lets the weights launch start at once, since
    that launch waits before the only thing it does that this one could see (its append).

    ``HAS_READ``: the fold is the exact one of a ring formed against the read copy ``p_read``
    (``_fold_tile_read_copy``, which needs the ring's betas ``p_ring_beta``), or the plain one for a value
    head whose entries are all exact (beta 0), and it is also stored, rounded from fp32, into the copy
    (SPEC §4). ``EXACT_READS`` (verification with a copy): rows whose ring ends in entries formed against
    the copy fold too (``_row_folds``).
    """
    allow_next_launch(USE_PDL)
    if WORKLIST:
        o_b, b_fold, b_rank, n_fold = _gdn_folding_rows(p_rows, p_cursor, p_ring_beta, s_rg_s, s_rg_l, s_rg_h, batch, T, L, BLOCK_B, EXACT_READS)
        items, first, stride = n_fold * heads * SPLIT, tl.program_id(0), tl.num_programs(0)
    else:
        items, first, stride = 1, 0, 1
    for item in range(first, items, stride):
        if WORKLIST:
            i_b, i_h, i_s = worklist_item(o_b, b_fold, b_rank, item, heads, SPLIT)
        else:
            i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        _gdn_fold_head(
            p_ckpt, p_read, p_ring_k, p_ring_d, p_ring_g, p_ring_beta, p_cursor, p_rows,
            s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rk_s, s_rk_l, s_rk_h, s_rk_k,
            s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h,
            V, K, L, value_per_key, i_s, i_h, i_b,
            T, HAS_READ, READ_FOLD, READ_DOT, EXACT_READS, BLOCK_V, BLOCK_K, BLOCK_L, NUM_TILES, SPLIT,
        )  # fmt: skip


@triton.jit
def _fold_weights(p_ring_k, p_ring_g, slot, i_h64, i_kh64, cur, s_rk_s, s_rk_l, s_rk_h, s_rk_k, s_rg_s, s_rg_l, s_rg_h, o_k, m_k, o_l):
    """What a fold of a row's ``cur`` ring entries needs besides the d entries: the key head's ring keys
    (entries, K) and, for the value head, the fold weights ``exp(suffix_i)`` and the checkpoint decay
    ``exp(sum g)``, in fp32 (zero past the history)."""
    m_hist = o_l < cur
    b_rg = tl.load(p_ring_g + slot * s_rg_s + i_h64 * s_rg_h + o_l * s_rg_l, mask=m_hist, other=0.0).to(tl.float32)
    b_rk = tl.load(
        p_ring_k + slot * s_rk_s + i_kh64 * s_rk_h + o_l[:, None] * s_rk_l + o_k[None, :] * s_rk_k,
        mask=m_hist[:, None] & m_k[None, :], other=0.0,
    ).to(tl.float32)
    return b_rk, tl.where(m_hist, tl.exp(suffix_sums(b_rg, o_l)), 0.0), tl.exp(tl.sum(b_rg, axis=0))


@triton.jit
def _ring_g_beta(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, o_l):
    """A value head's ring log-decays and betas, in fp32, zero past the history (ring_beta has ring_g's
    strides)."""
    m_hist = o_l < cur
    offsets = slot * s_rg_s + i_h64 * s_rg_h + o_l * s_rg_l
    b_g = tl.load(p_ring_g + offsets, mask=m_hist, other=0.0).to(tl.float32)
    return b_g, tl.load(p_ring_beta + offsets, mask=m_hist, other=0.0).to(tl.float32)


@triton.jit
def _read_copy_correction(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, o_l):
    """What the exact fold with a read copy needs per (row, value head), besides the fold's own weights:
    ``exp(cum_j)`` (the ring's log-decays summed up to and including entry j) and the lower-triangular
    ``N = (I + A)^{-1} diag(beta)`` over the ring's entries, ``A = diag(beta) C``, ``C_ji = exp(cum_j -
    cum_i) k_i.k_j`` for i < j (``b_rk``: the entries' keys, zero past the history; ring_beta has ring_g's
    strides). Rows past the history are zero (beta 0 there), as are entries whose d is already exact.

    A is strictly lower triangular, so ``A^BLOCK_L = 0`` and the inverse is the finite product
    ``(I - A)(I + A^2)(I + A^4)...``: log2(BLOCK_L) - 1 squarings, each a pair of (entries, entries)
    ``tl.dot``s in fp32, in place of a forward substitution whose BLOCK_L steps each wait on the last.
    C takes differences of the sums: their rounding (1e-7 relative) scales corrections that are
    themselves of the copy's rounding, far below what fp32 can show in the state."""
    b_g, b_beta = _ring_g_beta(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, o_l)
    b_cum = tl.sum(tl.where(o_l[None, :] <= o_l[:, None], b_g[None, :], 0.0), axis=1)
    b_gram = tl.dot(b_rk, tl.trans(b_rk), input_precision="ieee")  # k_i . k_j, (entries, entries)
    b_C = tl.where(o_l[None, :] < o_l[:, None], tl.exp(b_cum[:, None] - b_cum[None, :]) * b_gram, 0.0)
    b_A = b_beta[:, None] * b_C
    b_inv = tl.where(o_l[:, None] == o_l[None, :], 1.0, 0.0) - b_A  # (I - A): the series up to A^1
    b_pow = b_A
    for m in tl.static_range(1, 8):  # BLOCK_L up to 256
        if (1 << m) < o_l.shape[0]:
            b_pow = tl.dot(b_pow, b_pow, input_precision="ieee")  # A^(2^m)
            b_inv += tl.dot(b_inv, b_pow, input_precision="ieee")  # times (I + A^(2^m))
    return tl.exp(b_cum), b_inv * b_beta[None, :]


@triton.jit
def _fold_tile_read_copy(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_exp_cum, b_N_ring, DOT: tl.constexpr):
    """The exact fold of a checkpoint tile (rows, K) whose ring entries were formed against a read copy.

    Each d was formed from ``S k`` read off the copy ``b_C`` (the tile as stored, in fp32), so it is the
    update of the state the steps read. With the gap ``D_0 = S - C``, entry j's true update is
    ``d_j + e_j``, ``e_j = -beta_j alpha_j D_j k_j`` with ``D_{j+1} = alpha_j D_j + e_j k_j^T``
    (``reference._gdn_read_copy_chain``, which runs this entry by entry). Unrolled, the tile's corrections
    (rows, entries) are ``E = -(D_0 K^T diag(exp(cum))) N^T`` (``_read_copy_correction``): two products
    with the ring's keys and N (``DOT``: ``ieee``, or ``tf32x3`` on the tensor cores), then the plain rank-L
    fold of ``d + e`` in fp32 (``ieee``)."""
    b_Q = tl.dot(b_S - b_C, tl.trans(b_rk), input_precision=DOT) * b_exp_cum[None, :]
    b_E = -tl.dot(b_Q, tl.trans(b_N_ring), input_precision=DOT)
    return fold_tile(b_S, b_decay_f, tl.trans((b_rd + b_E) * b_wf[None, :]), b_rk)


@triton.jit
def _read_copy_entries(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, o_l):
    """The "entries" fold's per-entry inputs besides d and k: ``alpha = exp(g)`` and beta, in fp32 (alpha 1
    and beta 0 past the history)."""
    b_g, b_beta = _ring_g_beta(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, o_l)
    return tl.exp(b_g), b_beta


@triton.jit
def _fold_tile_read_copy_entries(b_S, b_C, b_rd, b_rk, b_alpha, b_beta, cur, o_l):
    """``_fold_tile_read_copy`` entry by entry (the "entries" form): with ``D = S - C``, for each entry j
    ``e_j = -beta_j alpha_j D k_j``, ``D <- alpha_j D + e_j k_j^T``, ``S <- alpha_j S + (d_j + e_j) k_j^T``,
    in fp32 on the tile's rows. Entry j is picked out of the registers holding the ring's d and keys by a
    compare (their columns are not addressable)."""
    b_D = b_S - b_C
    for j in range(0, cur):
        pick = o_l == j
        b_k = tl.sum(tl.where(pick[:, None], b_rk, 0.0), axis=0)
        b_d = tl.sum(tl.where(pick[None, :], b_rd, 0.0), axis=1)
        alpha = tl.sum(tl.where(pick, b_alpha, 0.0), axis=0)
        beta = tl.sum(tl.where(pick, b_beta, 0.0), axis=0)
        b_e = -(beta * alpha) * tl.sum(b_D * b_k[None, :], axis=1)
        b_D = alpha * b_D + b_e[:, None] * b_k[None, :]
        b_S = alpha * b_S + (b_d + b_e)[:, None] * b_k[None, :]
    return b_S


@triton.jit
def _read_copy_fold_inputs(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, b_wf, o_l, FORM: tl.constexpr, DOT: tl.constexpr):
    """A value head's inputs of the exact fold with a read copy, in the launch's form ``FORM``:
    ``(exp(cum), N)`` ("blocked"), ``(M, exp(cum))`` ("merged") or ``(alpha, beta)`` ("entries").

    "merged" folds the two per-tile products of "blocked" into one: a tile's weighted updates are
    ``(d + e) * wf = d * wf - D_0 M`` with ``M = K^T diag(exp(cum)) N^T diag(wf)`` (keys, entries),
    formed here once per (row, value head), so each tile needs one product with M instead of one with
    the keys and one with N. ``DOT`` is the precision of the correction's products (``ieee`` or
    ``tf32x3``; the fold's own rank-L product is always ``ieee``)."""
    if FORM == "entries":
        return _read_copy_entries(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, o_l)
    else:
        b_exp_cum, b_N = _read_copy_correction(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, o_l)
        if FORM == "blocked":
            return b_exp_cum, b_N
        else:
            b_R = tl.trans(b_N) * b_exp_cum[:, None] * b_wf[None, :]  # R[j, i] = exp(cum_j) N_ij wf_i; M = K^T R
            return tl.dot(tl.trans(b_rk), b_R, input_precision="ieee"), b_exp_cum


@triton.jit
def _fold_read_copy_tile(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_in0, b_in1, cur, o_l, FORM: tl.constexpr, DOT: tl.constexpr):
    """The exact fold of a tile with a read copy in the launch's form (``_read_copy_fold_inputs``)."""
    if FORM == "entries":
        return _fold_tile_read_copy_entries(b_S, b_C, b_rd, b_rk, b_in0, b_in1, cur, o_l)
    elif FORM == "merged":
        b_U = b_rd * b_wf[None, :] - tl.dot(b_S - b_C, b_in0, input_precision=DOT)  # (rows, entries)
        return fold_tile(b_S, b_decay_f, tl.trans(b_U), b_rk)
    else:
        return _fold_tile_read_copy(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_in0, b_in1, DOT)


@triton.jit
def _gdn_fold_head(
    p_ckpt, p_read, p_ring_k, p_ring_d, p_ring_g, p_ring_beta, p_cursor, p_rows,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h,
    V, K, L, value_per_key, i_s, i_h, i_b,
    T: tl.constexpr, HAS_READ: tl.constexpr, READ_FOLD: tl.constexpr, READ_DOT: tl.constexpr, EXACT_READS: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """One fold-launch work item: tile group ``i_s`` of value head ``i_h`` of row ``i_b``, if the row folds
    (``_row_folds``).

    With a read copy, a value head whose entries all have beta 0 (exact d: verification's, which read the
    checkpoint) takes the plain fold, which neither reads the copy nor forms corrections, and stores
    both; any other the exact one."""
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur, folds = _row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, 0, T, L, EXACT_READS)
    if folds:
        i_kh = i_h // value_per_key
        i_h64, i_kh64 = i_h.to(tl.int64), i_kh.to(tl.int64)
        o_k = tl.arange(0, BLOCK_K)
        o_l = tl.arange(0, BLOCK_L)
        m_k = o_k < K
        b_rk, b_wf, b_decay_f = _fold_weights(
            p_ring_k, p_ring_g, slot, i_h64, i_kh64, cur, s_rk_s, s_rk_l, s_rk_h, s_rk_k, s_rg_s, s_rg_l, s_rg_h, o_k, m_k, o_l
        )
        if HAS_READ:  # the plain fold where every entry's d is exact (beta 0), else the exact one
            b_beta = tl.load(p_ring_beta + slot * s_rg_s + i_h64 * s_rg_h + o_l * s_rg_l, mask=o_l < cur, other=0.0)
            if tl.max(tl.abs(b_beta), axis=0) == 0.0:
                _fold_head_tiles(
                    p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
                    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
                    True, False, READ_FOLD, READ_DOT, BLOCK_V, NUM_TILES, SPLIT,
                )  # fmt: skip
            else:
                _fold_head_tiles(
                    p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
                    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
                    True, True, READ_FOLD, READ_DOT, BLOCK_V, NUM_TILES, SPLIT,
                )  # fmt: skip
        else:
            _fold_head_tiles(
                p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
                s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
                False, False, READ_FOLD, READ_DOT, BLOCK_V, NUM_TILES, SPLIT,
            )  # fmt: skip


@triton.jit
def _fold_head_tiles(
    p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
    HAS_READ: tl.constexpr, CORRECT: tl.constexpr, READ_FOLD: tl.constexpr, READ_DOT: tl.constexpr, BLOCK_V: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Fold tiles ``i_s, i_s + SPLIT, ...`` of one (row, value head) and store them, into the copy too
    (``HAS_READ``); ``CORRECT``: the exact fold of a ring formed against the copy (``_fold_read_copy_tile``),
    else the plain rank-L one."""
    if CORRECT:
        b_in0, b_in1 = _read_copy_fold_inputs(
            p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, b_wf, o_l, READ_FOLD, READ_DOT
        )
    p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
    p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v, _, p_tile, m_tile, b_S, b_rd = _load_tile_ring(
            p_ck_head, p_ring_row_d, i_v, cur, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V
        )
        if HAS_READ:
            p_read_tile = p_read + slot * s_ck_s + i_h64 * s_ck_h + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
        if CORRECT:
            b_C = tl.load(p_read_tile, mask=m_tile, other=0.0).to(tl.float32)
            b_S = _fold_read_copy_tile(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_in0, b_in1, cur, o_l, READ_FOLD, READ_DOT)
        else:
            b_S = fold_tile(b_S, b_decay_f, tl.trans(b_rd * b_wf[None, :]), b_rk)
        tl.store(p_tile, b_S.to(p_ckpt.dtype.element_ty), mask=m_tile)
        if HAS_READ:
            tl.store(p_read_tile, b_S.to(p_read.dtype.element_ty), mask=m_tile)


@triton.jit
def _gdn_weights_kernel(
    p_q, p_k, p_g, p_beta, p_ring_k, p_ring_g, p_ring_beta, p_cursor, p_rows, p_w, p_qk, p_pos, p_arrive,
    s_q_b, s_q_t, s_q_h, s_q_k,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_g_b, s_g_t, s_g_h,
    s_beta_b, s_beta_t, s_beta_h,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rg_s, s_rg_l, s_rg_h,
    s_w_b, s_w_h, s_w_t,
    s_qk_b, s_qk_h, s_qk_i, s_qk_t,
    K, L, value_per_key, scale,
    T: tl.constexpr, L2NORM: tl.constexpr, USE_PDL: tl.constexpr, ALONGSIDE: tl.constexpr, HAS_READ: tl.constexpr,
    EXACT_READS: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    RING_DOT: tl.constexpr = False, BLOCK_M: tl.constexpr = 16,
):  # fmt: skip
    """Verification launch 2, one program per (key head, row): the main launch's weights, and the append.

    With c the row's committed entries after launch 1 (0 if it folded: ``_row_folds``), ``suffix_i`` the log-decays
    of ring entries i+1..c-1 and ``cum_t`` those of the new tokens up to t, for each value head j of
    the key head and token t, into ``w[b, j, t]`` (``2L + 2T + 1`` entries): at i < L the ring weights
    of r, ``exp(suffix_i + cum_t) k_i.k_t`` (zero for i >= c); at L + i those of o (``k_i.q_t``); at
    2L + s row t of ``N = (I + diag(beta) C)^{-1} diag(beta)``, C the causal weights of r
    (``c_ts = exp(seg(s, t)) k_s.k_t`` for s < t), so that the corrected updates are
    ``d = N (v - a)`` with a the checkpoint + ring part of r (launch 3); at 2L + T + s the causal
    weights of o (``exp(seg(s, t)) k_s.q_t``, s <= t); at 2L + 2T the checkpoint decay
    ``exp(sum_{i<c} g_i + cum_t)``. N is lower triangular and the same for every value row of the
    head; it is solved here in fp32 by forward substitution, row t being
    ``beta_t (e_t - sum_{s<t} c_ts N[s, :])`` (T = 1: ``N = [beta]``). The key products are formed
    once per key head; the normalised k_t and scaled q_t go to ``qk[b, kh, 0 | 1, t]`` for launch 3.
    Then k_t and g_t are appended at ring position c + t and ``pos[b]`` gets c; launch 3 moves the
    cursor.

    ``RING_DOT`` (``LaunchConfig.form == "dot"``, the verification table's for longer drafts): the ring
    keys' products with all 2T new keys and queries as one ``tl.dot`` (tf32x3, ring and token rows padded
    to 16) before the token loop, which then only picks its two columns; otherwise each token takes two
    sums over the (ring, keys) block, whose key axis lies across the lanes (shuffles).

    ``USE_PDL`` (launched with ``launch_pdl``): this launch may start while launch 1 still folds. It reads
    nothing launch 1 writes (the checkpoint) and writes only scratch before it waits; the append, which
    overwrites ring entries a folding row's fold reads, comes after the wait. It lets launch 3 start at
    once: launch 3 waits for this launch, which ends only after launch 1 has.

    ``ALONGSIDE`` (the fold launch's ``"alongside"`` form, launched after this one): this is the step's
    first launch, a plain one, and waits for nothing. A row that folds gets ``pos = -1 - cursor`` and
    no append here (its fold, after this launch, still has to read the old entries); the fold launch's
    counts ``arrive[row, key head]`` are zeroed.

    ``HAS_READ`` (a read copy): the betas are appended too, into ``p_ring_beta`` (ring_g's strides), for
    the exact fold (-0 for a beta of 0: ``reference._gdn_copy_beta``); ``EXACT_READS`` (verification with
    a copy, which the main launch reads off the checkpoint): +0, the d being exact.
    """
    allow_next_launch(USE_PDL)
    i_kh, i_b = tl.program_id(0), tl.program_id(1)
    i_kh64, i_b64 = i_kh.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    # (Its own first value head's mark: another program of the row may overwrite head 0's with its append.)
    cur, folds = _row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, i_kh * value_per_key, T, L, EXACT_READS)
    c_eff = tl.where(folds, 0, cur)
    o_k = tl.arange(0, BLOCK_K)
    o_l = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    o_j = tl.arange(0, BLOCK_J)
    m_k = o_k < K
    m_t = o_t < T
    m_j = o_j < value_per_key
    m_tk = m_t[:, None] & m_k[None, :]
    m_jt = m_j[:, None] & m_t[None, :]
    m_jl = m_j[:, None] & (o_l[None, :] < c_eff)
    o_h = (i_kh * value_per_key + o_j).to(tl.int64)
    # The new tokens (tokens, K): normalised keys, scaled queries.
    b_K = tl.load(p_k + i_b64 * s_k_b + i_kh64 * s_k_h + o_t[:, None] * s_k_t + o_k[None, :] * s_k_k, mask=m_tk, other=0.0).to(tl.float32)
    b_Q = tl.load(p_q + i_b64 * s_q_b + i_kh64 * s_q_h + o_t[:, None] * s_q_t + o_k[None, :] * s_q_k, mask=m_tk, other=0.0).to(tl.float32)
    if L2NORM:
        b_K = b_K * tl.rsqrt(tl.sum(b_K * b_K, axis=1) + 1e-6)[:, None]
        b_Q = b_Q * tl.rsqrt(tl.sum(b_Q * b_Q, axis=1) + 1e-6)[:, None]
    b_Q = b_Q * scale
    p_qk_row = p_qk + i_b64 * s_qk_b + i_kh64 * s_qk_h
    tl.store(p_qk_row + o_t[:, None] * s_qk_t + o_k[None, :], b_K, mask=m_tk)
    tl.store(p_qk_row + s_qk_i + o_t[:, None] * s_qk_t + o_k[None, :], b_Q, mask=m_tk)
    # The committed ring: keys (entries, K), log-decays (heads, entries).
    b_rk = tl.load(
        p_ring_k + slot * s_rk_s + i_kh64 * s_rk_h + o_l[:, None] * s_rk_l + o_k[None, :] * s_rk_k,
        mask=(o_l[:, None] < c_eff) & m_k[None, :], other=0.0,
    ).to(tl.float32)
    b_rg = tl.load(p_ring_g + slot * s_rg_s + o_l[None, :] * s_rg_l + o_h[:, None] * s_rg_h, mask=m_jl, other=0.0).to(tl.float32)
    b_g = tl.load(p_g + i_b64 * s_g_b + o_t[None, :] * s_g_t + o_h[:, None] * s_g_h, mask=m_jt, other=0.0).to(tl.float32)
    b_suffix = head_suffix_sums(b_rg, o_l)
    b_ring_total = tl.sum(b_rg, axis=1)
    p_w_rows = p_w + i_b64 * s_w_b + o_h * s_w_h
    m_wl = m_j[:, None] & (o_l[None, :] < L)
    tl.debug_barrier()  # the qk rows stored above are read back below as vectors, by other threads
    if RING_DOT:
        # The ring keys' products with every new key and query at once, one tl.dot (tf32x3): column m of
        # b_G is k_t's (m = t) or q_t's (m = T + t) products with the L ring keys. The reductions it
        # replaces run across the lanes, 2T of them over the (ring, keys) block.
        o_m = tl.arange(0, BLOCK_M)
        m_kq = o_m < 2 * T
        t_of_m = tl.where(o_m < T, o_m, o_m - T)
        p_KQ = p_qk_row + t_of_m * s_qk_t + tl.where(o_m < T, 0, s_qk_i)
        b_KQ = tl.load(p_KQ[:, None] + o_k[None, :], mask=m_kq[:, None] & m_k[None, :], other=0.0)
        b_G = tl.dot(b_rk, tl.trans(b_KQ), input_precision="tf32x3")  # (ring, m)
    # N = (I + diag(beta) C)^{-1} diag(beta) per value head, C the causal weights of r (c_ts, s < t):
    # row t is beta_t (e_t - sum_{s<t} c_ts N[s, :]) (forward substitution), kept as (heads, T, T).
    b_N = tl.zeros((BLOCK_J, BLOCK_T, BLOCK_T), dtype=tl.float32)
    for t in tl.static_range(T):
        b_k_t = tl.load(p_qk_row + t * s_qk_t + o_k, mask=m_k, other=0.0)
        b_q_t = tl.load(p_qk_row + s_qk_i + t * s_qk_t + o_k, mask=m_k, other=0.0)
        b_cum_t = tl.sum(tl.where(o_t[None, :] <= t, b_g, 0.0), axis=1)  # (heads,)
        # seg[j, s] = sum_{s < u <= t} g[j, u]
        m_seg = (o_t[None, None, :] > o_t[None, :, None]) & (o_t[None, None, :] <= t)
        b_dec_new = tl.exp(tl.sum(tl.where(m_seg, b_g[:, None, :], 0.0), axis=2))
        b_dec_ring = tl.where(m_jl, tl.exp(b_suffix + b_cum_t[:, None]), 0.0)
        p_w_t = p_w_rows + t * s_w_t
        if RING_DOT:
            b_rk_k = tl.sum(tl.where(o_m[None, :] == t, b_G, 0.0), axis=1)  # column t of the ring products
            tl.store(p_w_t[:, None] + o_l[None, :], b_dec_ring * b_rk_k[None, :], mask=m_wl)
            b_rk_q = tl.sum(tl.where(o_m[None, :] == T + t, b_G, 0.0), axis=1)
            tl.store(p_w_t[:, None] + L + o_l[None, :], b_dec_ring * b_rk_q[None, :], mask=m_wl)
        else:
            tl.store(p_w_t[:, None] + o_l[None, :], b_dec_ring * tl.sum(b_rk * b_k_t[None, :], axis=1)[None, :], mask=m_wl)
            tl.store(p_w_t[:, None] + L + o_l[None, :], b_dec_ring * tl.sum(b_rk * b_q_t[None, :], axis=1)[None, :], mask=m_wl)
        b_wk_new = tl.where(o_t[None, :] < t, b_dec_new * tl.sum(b_K * b_k_t[None, :], axis=1)[None, :], 0.0)
        b_wq_new = tl.where(o_t[None, :] <= t, b_dec_new * tl.sum(b_K * b_q_t[None, :], axis=1)[None, :], 0.0)
        b_beta_t = tl.load(p_beta + i_b64 * s_beta_b + t * s_beta_t + o_h * s_beta_h, mask=m_j, other=0.0).to(tl.float32)
        # (heads, T): beta_t (e_t - sum_{s<t} c_ts N[s, :]); rows s >= t of b_N are still zero, as is c_ts there.
        b_N_t = b_beta_t[:, None] * (tl.where(o_t[None, :] == t, 1.0, 0.0) - tl.sum(b_wk_new[:, :, None] * b_N, axis=1))
        b_N = tl.where(o_t[None, :, None] == t, b_N_t[:, None, :], b_N)
        tl.store(p_w_t[:, None] + 2 * L + o_t[None, :], b_N_t, mask=m_jt)
        tl.store(p_w_t[:, None] + (2 * L + T) + o_t[None, :], b_wq_new, mask=m_jt)
        tl.store(p_w_t + (2 * L + 2 * T), tl.exp(b_ring_total + b_cum_t), mask=m_j)
    # Append: the T keys (this key head) and log-decays (its value heads) at ring positions c .. c + T - 1,
    # once launch 1 (which reads a folding row's old entries) has finished; alongside, for the rows that do
    # not fold (the fold launch appends for the others).
    if ALONGSIDE:
        # (tokens,) by a vector compare: the interpreter turns a bool block & a scalar compare into int32
        b_appends = (tl.where(folds, 1, 0) + o_t * 0) == 0
        m_tk = m_tk & b_appends[:, None]
        m_jt = m_jt & b_appends[None, :]
        tl.store(p_arrive + i_b * tl.num_programs(0) + i_kh, 0)
        pos = tl.where(folds, -1 - cur, cur)
    else:
        wait_for_previous_launch(USE_PDL)
        pos = c_eff
    tl.store(
        p_ring_k + slot * s_rk_s + (c_eff + o_t[:, None]) * s_rk_l + i_kh64 * s_rk_h + o_k[None, :] * s_rk_k,
        b_K.to(p_ring_k.dtype.element_ty), mask=m_tk,
    )
    p_rg_new = slot * s_rg_s + (c_eff + o_t[None, :]) * s_rg_l + o_h[:, None] * s_rg_h
    tl.store(p_ring_g + p_rg_new, b_g.to(p_ring_g.dtype.element_ty), mask=m_jt)
    if HAS_READ:
        if EXACT_READS:
            b_beta = tl.zeros((BLOCK_J, BLOCK_T), dtype=tl.float32)
        else:
            b_beta = _copy_beta(tl.load(p_beta + i_b64 * s_beta_b + o_t[None, :] * s_beta_t + o_h[:, None] * s_beta_h, mask=m_jt, other=0.0))
        tl.store(p_ring_beta + p_rg_new, b_beta.to(p_ring_beta.dtype.element_ty), mask=m_jt)
    tl.store(p_pos + i_b, pos, mask=i_kh == 0)


@triton.jit
def _main_tile_mma(
    p_ck_head, p_ring_row_d, p_v_row, p_KQ, m_KQ, i_v, c_eff,
    s_ck_v, s_ck_k, s_rd_l, s_rd_v, s_v_t, s_v_v,
    b_W_ring, b_decays, b_N_m, b_P, b_Wo_m, o_m, o_l, T, V, K,
    BLOCK_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_KC: tl.constexpr,
):  # fmt: skip
    """The main launch's ``"mma"`` form for one tile: the T tokens' products as ``tl.dot``s on the tensor
    cores, fp32 emulated by three tf32 products each (``input_precision="tf32x3"``: about 1e-6 relative
    where tf32 alone gives 1e-3), in (token rows m, tile rows) blocks.

    The ``BLOCK_M`` (16) token rows hold keys at m = 0..T-1 and queries at T..2T-1, zero beyond, so one
    product ``[K; Q] S^T`` gives ``A^T`` and ``B^T`` together:
    ``AB = decay [K; Q] S^T + [Wk; Wq] R^T`` (R: the ring's d slice), then ``D^T = N (V - AB)`` (N zero
    outside its T x T corner, so the B rows drop out) and ``O^T = P AB + Wo D^T`` (P moves row T + t to
    t). Rows >= T of D and O are zero. The per-token form's K-wide row sums are cross-lane shuffles,
    2T per tile row (Nsight Compute, T = 4: the launch issue-bound, docs/kernels.md run 13).

    ``[K; Q] S^T`` is summed over key chunks of ``BLOCK_KC`` columns, each chunk of the checkpoint tile
    and of the token block (``p_KQ``: a pointer per token row, unit stride along K) loaded for its own
    dot: neither whole block sits in registers, and the launch's ``num_stages`` pipelines the chunk loads
    (run 17: 293 against 330 us for whole-tile dots, T = 4, 16/32 heads).
    """
    o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
    m_v = o_v < V
    o_c = tl.arange(0, BLOCK_KC)
    b_acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for kc in range(0, BLOCK_K, BLOCK_KC):
        m_c = (kc + o_c) < K
        b_S = tl.load(
            p_ck_head + o_v[:, None].to(tl.int64) * s_ck_v + (kc + o_c)[None, :] * s_ck_k, mask=m_v[:, None] & m_c[None, :], other=0.0
        ).to(tl.float32)
        b_KQ = tl.load(p_KQ[:, None] + (kc + o_c)[None, :], mask=m_KQ[:, None] & m_c[None, :], other=0.0)
        b_acc = tl.dot(b_KQ, tl.trans(b_S), b_acc, input_precision="tf32x3")
    b_rd = _ring_d_slice(p_ring_row_d, o_v, m_v, c_eff, s_rd_l, s_rd_v, o_l)
    b_AB = b_decays[:, None] * b_acc + tl.dot(b_W_ring, tl.trans(b_rd), input_precision="tf32x3")
    m_mv = (o_m[:, None] < T) & m_v[None, :]
    b_V = tl.load(p_v_row + o_m[:, None] * s_v_t + o_v[None, :] * s_v_v, mask=m_mv, other=0.0).to(tl.float32)
    b_D = tl.dot(b_N_m, b_V - b_AB, input_precision="tf32x3")
    b_O = tl.dot(b_P, b_AB, input_precision="tf32x3") + tl.dot(b_Wo_m, b_D, input_precision="tf32x3")
    return o_v, m_mv, b_D, b_O


@triton.jit
def _gdn_main_kernel(
    p_v, p_o, p_ckpt, p_ring_d, p_cursor, p_pending, p_rows, p_w, p_qk, p_pos,
    s_v_b, s_v_t, s_v_h, s_v_v,
    s_o_b, s_o_t, s_o_h, s_o_v,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v,
    s_w_b, s_w_h, s_w_t,
    s_qk_b, s_qk_h, s_qk_i, s_qk_t,
    V, K, L, value_per_key,
    T: tl.constexpr, COMMIT: tl.constexpr, USE_PDL: tl.constexpr, MMA: tl.constexpr, ALONGSIDE: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr, BLOCK_KC: tl.constexpr,
):  # fmt: skip
    """Verification launch 3, shaped like the conventional kernel: per tile of value rows, from one read
    of the checkpoint tile, the ring's d slice and the new v, the (rows, T) blocks
    ``A[:, t] = decay_t S k_t + sum_i wk_ti d_i`` and ``B[:, t] = decay_t S q_t + sum_i wq_ti d_i``
    (a static loop over tokens inserting columns; no token depends on another), then
    ``D = (V - A) N^T`` (``d_t = beta_t (v_t - a_t - sum_{s<t} c_ts d_s)`` solved for all t at once with
    the weights launch's N) and ``O = B + D W'^T`` (W' the causal weights of o, s <= t) as (rows, T, T)
    products in registers. Writes O and D (ring positions c..c+T-1) with one block store each, never
    the checkpoint. The earlier token-by-token form (d_t to the ring, a barrier, re-read for the next
    token) made the launch latency-bound: 421 us at T = 4 against 144 us at T = 1 (H200, batch 256).
    One program per row moves the cursor: nothing here reads it.

    ``USE_PDL`` (launched with ``launch_pdl``): this launch may start while launch 2 (and launch 1 before
    it) still run; its programs wait for launch 2 before reading anything but their row's slot.
    (Reading the first checkpoint tile before the wait, and again after it for a row that launch 1
    folded, was slower: docs/kernels.md run 11.)

    ``MMA`` (``LaunchConfig.form == "mma"``): the same products as tensor-core dots over ``BLOCK_M`` (16)
    token rows, ``_main_tile_mma``, over key chunks of ``BLOCK_KC`` columns.

    ``ALONGSIDE`` (the fold launch's ``"alongside"`` form): launched after the fold launch and run beside
    it, without waiting: that launch folds and finishes the rows marked ``pos < 0``, whose tiles are
    skipped here (one program still moves the cursor), and writes nothing else this launch reads. This
    launch starts only after the weights launch has finished (the fold launch's programs let it start
    after their wait for that launch). Its last program waits for the fold launch before it ends.
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    if ALONGSIDE:
        c_eff = tl.load(p_pos + i_b)
        tiles_end = tl.where(c_eff < 0, 0, NUM_TILES)
        c_eff = tl.maximum(c_eff, 0)  # a folded row's ring holds the T new entries from position 0
    else:
        wait_for_previous_launch(USE_PDL)
        c_eff = tl.load(p_pos + i_b)
        tiles_end = NUM_TILES
    if (i_s == 0) & (i_h == 0):
        if COMMIT:
            tl.store(p_cursor + slot, c_eff + T)
            tl.store(p_pending + slot, 0)
        else:
            tl.store(p_cursor + slot, c_eff)
            tl.store(p_pending + slot, T)
    o_k = tl.arange(0, BLOCK_K)
    o_l = tl.arange(0, BLOCK_L)
    o_t = tl.arange(0, BLOCK_T)
    m_k = o_k < K
    m_ring = o_l < c_eff
    p_w_row = p_w + i_b64 * s_w_b + i_h64 * s_w_h
    p_qk_row = p_qk + i_b64 * s_qk_b + i_kh64 * s_qk_h
    p_v_row = p_v + i_b64 * s_v_b + i_h64 * s_v_h
    p_o_row = p_o + i_b64 * s_o_b + i_h64 * s_o_h
    p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
    p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
    m_t = o_t < T
    if MMA:
        # Per program, the padded token rows m (``BLOCK_M``): key k_t at m = t, query q_t at m = T + t,
        # zero rows beyond 2T; their ring weights and checkpoint decays; N, P and Wo as (m, m) blocks.
        o_m = tl.arange(0, BLOCK_M)
        m_key = o_m < T
        m_used = o_m < 2 * T
        t_of_m = tl.where(m_key, o_m, o_m - T)
        p_KQ = p_qk_row + (t_of_m * s_qk_t + tl.where(m_key, 0, s_qk_i))
        p_w_m = p_w_row + t_of_m * s_w_t
        b_W_ring = tl.load(p_w_m[:, None] + tl.where(m_key, 0, L)[:, None] + o_l[None, :], mask=m_used[:, None] & m_ring[None, :], other=0.0)
        b_decays = tl.load(p_w_m + (2 * L + 2 * T), mask=m_used, other=0.0)
        m_tt = m_key[:, None] & m_key[None, :]
        b_N_m = tl.load(p_w_m[:, None] + 2 * L + o_m[None, :], mask=m_tt, other=0.0)
        b_Wo_m = tl.load(p_w_m[:, None] + (2 * L + T) + o_m[None, :], mask=m_tt, other=0.0)
        b_P = tl.where(m_key[:, None] & (o_m[None, :] == o_m[:, None] + T), 1.0, 0.0)
    else:
        # Per program, once: N (d = N (v - a), see the weights launch) and the causal weights of o, (T, T).
        b_N, b_Wq = _token_mixing(p_w_row, s_w_t, o_t, m_t, L, T)
    for i_v in range(i_s, tiles_end, SPLIT):
        if MMA:
            o_v, m_mv, b_Dm, b_Om = _main_tile_mma(
                p_ck_head, p_ring_row_d, p_v_row, p_KQ, m_used, i_v, c_eff, s_ck_v, s_ck_k, s_rd_l, s_rd_v, s_v_t, s_v_v,
                b_W_ring, b_decays, b_N_m, b_P, b_Wo_m, o_m, o_l, T, V, K, BLOCK_V, BLOCK_M, BLOCK_K, BLOCK_KC,
            )  # fmt: skip
            tl.store(p_o_row + o_m[:, None] * s_o_t + o_v[None, :] * s_o_v, b_Om.to(p_o.dtype.element_ty), mask=m_mv)
            tl.store(
                p_ring_row_d + (c_eff + o_m[:, None]) * s_rd_l + o_v[None, :] * s_rd_v, b_Dm.to(p_ring_d.dtype.element_ty), mask=m_mv
            )
        else:
            o_v, m_v, _, _, b_S, b_rd = _load_tile_ring(
                p_ck_head, p_ring_row_d, i_v, c_eff, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V
            )
            # Per token, the checkpoint + ring parts of r_t and o_t as columns of A and B (rows, tokens): no
            # token reads another's result, so nothing waits on memory between tokens.
            b_A = tl.zeros((BLOCK_V, BLOCK_T), dtype=tl.float32)
            b_B = tl.zeros((BLOCK_V, BLOCK_T), dtype=tl.float32)
            for t in tl.static_range(T):
                p_w_t = p_w_row + t * s_w_t
                b_k_t = tl.load(p_qk_row + t * s_qk_t + o_k, mask=m_k, other=0.0)
                b_q_t = tl.load(p_qk_row + s_qk_i + t * s_qk_t + o_k, mask=m_k, other=0.0)
                b_decay = tl.load(p_w_t + (2 * L + 2 * T))
                b_wk = tl.load(p_w_t + o_l, mask=m_ring, other=0.0)
                b_wq = tl.load(p_w_t + L + o_l, mask=m_ring, other=0.0)
                # Every block is (rows, .) like the tile, so each sum runs along axis 1.
                b_a = b_decay * tl.sum(b_S * b_k_t[None, :], axis=1) + tl.sum(b_wk[None, :] * b_rd, axis=1)
                b_b = b_decay * tl.sum(b_S * b_q_t[None, :], axis=1) + tl.sum(b_wq[None, :] * b_rd, axis=1)
                b_A = tl.where(o_t[None, :] == t, b_a[:, None], b_A)
                b_B = tl.where(o_t[None, :] == t, b_b[:, None], b_B)
            b_V = tl.load(p_v_row + o_t[None, :] * s_v_t + o_v[:, None] * s_v_v, mask=m_v[:, None] & m_t[None, :], other=0.0)
            # D = (V - A) N^T, O = B + D Wq'^T: (rows, T, T) products, summed over the last axis.
            b_D = tl.sum((b_V.to(tl.float32) - b_A)[:, None, :] * b_N[None, :, :], axis=2)
            b_O = b_B + tl.sum(b_D[:, None, :] * b_Wq[None, :, :], axis=2)
            _store_tokens(p_o_row, p_ring_row_d, b_O, b_D, c_eff, o_v, m_v, o_t, m_t, s_o_t, s_o_v, s_rd_l, s_rd_v)
    if ALONGSIDE:
        # The grid's last program waits for the fold launch, so that this launch ends after it (a launch
        # that waits for nothing could end first; programmatic dependent launch orders by the wait).
        if (i_s == tl.num_programs(0) - 1) & (i_h == tl.num_programs(1) - 1) & (i_b == tl.num_programs(2) - 1):
            wait_for_previous_launch(USE_PDL)


@triton.jit
def _token_mixing(p_w_row, s_w_t, o_t, m_t, L, T: tl.constexpr):
    """The weights launch's (T, T) blocks for one (row, value head): N (``d = N (v - a)``) and W' (the
    causal weights of o)."""
    p_w_tt = p_w_row + o_t[:, None] * s_w_t + o_t[None, :]
    m_tt = m_t[:, None] & m_t[None, :]
    return tl.load(p_w_tt + 2 * L, mask=m_tt, other=0.0), tl.load(p_w_tt + (2 * L + T), mask=m_tt, other=0.0)


@triton.jit
def _tokens_from_folded_tile(
    b_S, p_w_row, p_qk_row, p_v_row, o_v, m_v, o_k, m_k, o_t, m_t, b_N, b_Wq, s_w_t, s_qk_t, s_qk_i, s_v_t, s_v_v, L,
    T: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr,
):  # fmt: skip
    """The per-token form for a tile just folded (rows, K; fp32, the ring empty): the corrected updates
    D and outputs O of the T tokens, (rows, T) each, from the checkpoint part alone. Per token the
    columns ``decay_t S k_t`` and ``decay_t S q_t`` of A and B, then ``D = (V - A) N^T`` and
    ``O = B + D W'^T`` as (rows, T, T) products summed over the last axis.

    The main launch's per-token form does the same with the ring's part added, written out in place:
    run 18's build, with that body moved into a helper like this one (its loads in another order),
    took 166.7 against 150.3 us for the decode main launch."""
    b_A = tl.zeros((BLOCK_V, BLOCK_T), dtype=tl.float32)
    b_B = tl.zeros((BLOCK_V, BLOCK_T), dtype=tl.float32)
    for t in tl.static_range(T):
        b_decay = tl.load(p_w_row + t * s_w_t + (2 * L + 2 * T))
        b_k_t = tl.load(p_qk_row + t * s_qk_t + o_k, mask=m_k, other=0.0)
        b_q_t = tl.load(p_qk_row + s_qk_i + t * s_qk_t + o_k, mask=m_k, other=0.0)
        b_A = tl.where(o_t[None, :] == t, b_decay * tl.sum(b_S * b_k_t[None, :], axis=1)[:, None], b_A)
        b_B = tl.where(o_t[None, :] == t, b_decay * tl.sum(b_S * b_q_t[None, :], axis=1)[:, None], b_B)
    b_V = tl.load(p_v_row + o_t[None, :] * s_v_t + o_v[:, None] * s_v_v, mask=m_v[:, None] & m_t[None, :], other=0.0)
    b_D = tl.sum((b_V.to(tl.float32) - b_A)[:, None, :] * b_N[None, :, :], axis=2)
    b_O = b_B + tl.sum(b_D[:, None, :] * b_Wq[None, :, :], axis=2)
    return b_D, b_O


@triton.jit
def _store_tokens(p_o_row, p_ring_row_d, b_O, b_D, c_eff, o_v, m_v, o_t, m_t, s_o_t, s_o_v, s_rd_l, s_rd_v):
    """Store a tile's outputs (rows, T) and its d entries at ring positions c .. c + T - 1 (fp32 in the
    state classes; only the fold reads them back)."""
    m_vt = m_v[:, None] & m_t[None, :]
    tl.store(p_o_row + o_t[None, :] * s_o_t + o_v[:, None] * s_o_v, b_O.to(p_o_row.dtype.element_ty), mask=m_vt)
    tl.store(
        p_ring_row_d + (c_eff + o_t[None, :]) * s_rd_l + o_v[:, None] * s_rd_v, b_D.to(p_ring_row_d.dtype.element_ty), mask=m_vt
    )


@triton.jit
def _gdn_fold_finish_kernel(
    p_v, p_o, p_g, p_beta, p_ckpt, p_read, p_ring_k, p_ring_d, p_ring_g, p_ring_beta, p_rows, p_w, p_qk, p_pos, p_arrive,
    s_v_b, s_v_t, s_v_h, s_v_v, s_o_b, s_o_t, s_o_h, s_o_v, s_g_b, s_g_t, s_g_h, s_beta_b, s_beta_t, s_beta_h,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h,
    s_w_b, s_w_h, s_w_t, s_qk_b, s_qk_h, s_qk_i, s_qk_t,
    V, K, L, value_per_key, batch, heads,
    T: tl.constexpr, USE_PDL: tl.constexpr, HAS_READ: tl.constexpr, READ_FOLD: tl.constexpr, READ_DOT: tl.constexpr,
    EXACT_READS: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """The fold launch of the ``"alongside"`` form, launched after the weights launch and before the main
    launch, which does not wait for it: a fixed grid of programs looping over the (folding row, value
    head, tile group) items, like the ``"worklist"`` fold. The folding rows are those the weights launch
    marked (``pos < 0``); nothing here reads the cursors, which the main launch moves meanwhile.

    An item folds its tiles into the checkpoint (fp32, one rank-L ``tl.dot`` per tile, stored in the
    checkpoint dtype), then finishes the T tokens from each stored tile with an empty ring (the
    per-token form: outputs, and d at ring positions 0 .. T - 1), so the main launch skips these rows.
    The new keys and log-decays go to ring positions 0 .. T - 1 too, which every item of the key head
    reads first: each item counts itself in ``arrive[row, key head]`` (zeroed by the weights launch)
    once it holds them, and the last of them writes the entries. No item waits for another.

    ``USE_PDL``: its programs wait for the weights launch (its scratch), then let the main launch start.
    So the main launch's programs start only after the weights launch has finished, and run beside
    this launch, touching only the rows it does not. The main launch's last program waits for this
    launch before it ends, so whatever follows the op sees this launch's writes.

    ``HAS_READ``: the fold is the exact one of a ring formed against the read copy ``p_read``
    (``_fold_tile_read_copy``; zero corrections for exact entries), it is also stored in the copy, the
    tokens read that (SPEC §4), and the new betas are appended with the log-decays. ``EXACT_READS``
    (verification with a copy): the tokens read the checkpoint instead, and their betas are +0.
    """
    wait_for_previous_launch(USE_PDL)
    allow_next_launch(USE_PDL)
    worker, workers = tl.program_id(0), tl.num_programs(0)
    o_b, b_fold, b_rank, n_fold = marked_folding_rows(p_pos, batch, BLOCK_B)
    items = n_fold * heads * SPLIT
    for item in range(worker, items, workers):
        i_b, i_h, i_s = worklist_item(o_b, b_fold, b_rank, item, heads, SPLIT)
        i_kh = i_h // value_per_key
        i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
        slot = tl.load(p_rows + i_b).to(tl.int64)
        cur = -1 - tl.load(p_pos + i_b)
        o_k = tl.arange(0, BLOCK_K)
        o_l = tl.arange(0, BLOCK_L)
        o_t = tl.arange(0, BLOCK_T)
        m_k = o_k < K
        m_t = o_t < T
        b_rk, b_wf, b_decay_f = _fold_weights(
            p_ring_k, p_ring_g, slot, i_h64, i_kh64, cur, s_rk_s, s_rk_l, s_rk_h, s_rk_k, s_rg_s, s_rg_l, s_rg_h, o_k, m_k, o_l
        )
        if HAS_READ:
            b_in0, b_in1 = _read_copy_fold_inputs(
                p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, b_wf, o_l, READ_FOLD, READ_DOT
            )
        tl.debug_barrier()  # every thread holds its part of the old keys, decays (and betas) before the count below
        arrived = tl.atomic_add(p_arrive + i_b * (heads // value_per_key) + i_kh, 1, sem="acq_rel")
        p_qk_row = p_qk + i_b64 * s_qk_b + i_kh64 * s_qk_h
        if arrived == value_per_key * SPLIT - 1:
            # The key head's last item: the new keys (normalised, from the weights launch's scratch) and the
            # log-decays of its value heads at ring positions 0 .. T - 1.
            o_j = tl.arange(0, BLOCK_J)
            m_jt = (o_j[:, None] < value_per_key) & m_t[None, :]
            m_tk = m_t[:, None] & m_k[None, :]
            b_K = tl.load(p_qk_row + o_t[:, None] * s_qk_t + o_k[None, :], mask=m_tk, other=0.0)
            tl.store(
                p_ring_k + slot * s_rk_s + o_t[:, None] * s_rk_l + i_kh64 * s_rk_h + o_k[None, :] * s_rk_k,
                b_K.to(p_ring_k.dtype.element_ty), mask=m_tk,
            )
            o_hj = (i_kh * value_per_key + o_j).to(tl.int64)
            b_g = tl.load(p_g + i_b64 * s_g_b + o_t[None, :] * s_g_t + o_hj[:, None] * s_g_h, mask=m_jt, other=0.0)
            p_rg_new = slot * s_rg_s + o_t[None, :] * s_rg_l + o_hj[:, None] * s_rg_h
            tl.store(p_ring_g + p_rg_new, b_g.to(p_ring_g.dtype.element_ty), mask=m_jt)
            if HAS_READ:
                if EXACT_READS:  # verification read the checkpoint: exact d, beta +0
                    b_bt = tl.zeros((BLOCK_J, BLOCK_T), dtype=tl.float32)
                else:
                    b_bt = _copy_beta(tl.load(p_beta + i_b64 * s_beta_b + o_t[None, :] * s_beta_t + o_hj[:, None] * s_beta_h, mask=m_jt, other=0.0))
                tl.store(p_ring_beta + p_rg_new, b_bt.to(p_ring_beta.dtype.element_ty), mask=m_jt)
        p_w_row = p_w + i_b64 * s_w_b + i_h64 * s_w_h
        b_N, b_Wq = _token_mixing(p_w_row, s_w_t, o_t, m_t, L, T)
        p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
        p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
        p_v_row = p_v + i_b64 * s_v_b + i_h64 * s_v_h
        p_o_row = p_o + i_b64 * s_o_b + i_h64 * s_o_h
        for i_v in range(i_s, NUM_TILES, SPLIT):
            o_v, m_v, p_tile, m_tile, b_S, b_rd = _load_tile_ring(
                p_ck_head, p_ring_row_d, i_v, cur, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V
            )
            # The stored tile, in fp32 (the barrier inside: its old d entries are read before they are overwritten).
            if HAS_READ:
                p_read_tile = p_read + slot * s_ck_s + i_h64 * s_ck_h + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
                b_C = tl.load(p_read_tile, mask=m_tile, other=0.0).to(tl.float32)
                b_S = _fold_read_copy_tile(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_in0, b_in1, cur, o_l, READ_FOLD, READ_DOT)
                b_stored = b_S.to(p_ckpt.dtype.element_ty)
                tl.store(p_tile, b_stored, mask=m_tile)
                b_read = b_S.to(p_read.dtype.element_ty)
                tl.store(p_read_tile, b_read, mask=m_tile)
                tl.debug_barrier()  # the old d entries are read before the tokens' d overwrite them
                # The tokens read the checkpoint in verification (EXACT_READS), the copy in decoding.
                if EXACT_READS:
                    b_S = b_stored.to(tl.float32)
                else:
                    b_S = b_read.to(tl.float32)
            else:
                b_S = fold_store_tile(b_S, b_decay_f, tl.trans(b_rd * b_wf[None, :]), b_rk, p_tile, m_tile)
            b_D, b_O = _tokens_from_folded_tile(
                b_S, p_w_row, p_qk_row, p_v_row, o_v, m_v, o_k, m_k, o_t, m_t, b_N, b_Wq, s_w_t, s_qk_t, s_qk_i, s_v_t, s_v_v, L,
                T, BLOCK_V, BLOCK_T,
            )  # fmt: skip
            _store_tokens(p_o_row, p_ring_row_d, b_O, b_D, 0, o_v, m_v, o_t, m_t, s_o_t, s_o_v, s_rd_l, s_rd_v)


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
    value_per_key, scale,
    T: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Read the state tile, apply T tokens one after another (rounding to the state dtype after each), write it.

    ``SNAPSHOT`` (the speculative baseline engines use today): the state after
    token t is written to snapshot slot t instead, and the input state is left as is.
    The sizes are compile-time constants, so that where they are multiples of the
    block the tile's loads and stores carry no mask (about 3% of the step at 8-row
    tiles on the H200: benchmarks/experiments/gdn_conventional_forms.py).
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    slot = tl.load(p_rows + i_b).to(tl.int64)
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    MASK_K: tl.constexpr = BLOCK_K != K
    MASK_V: tl.constexpr = V % BLOCK_V != 0
    o_k = tl.arange(0, BLOCK_K)
    m_k = o_k < K
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v = i_v * BLOCK_V + tl.arange(0, BLOCK_V)
        m_v = o_v < V
        m_tile = m_v[:, None] & m_k[None, :]
        p_tile = p_state + slot * s_st_s + i_h64 * s_st_h + o_v[:, None].to(tl.int64) * s_st_v + o_k[None, :] * s_st_k
        b_S = load_f32(p_tile, m_tile, MASK_V or MASK_K)
        for t in tl.static_range(0, T):
            b_q, b_k = _load_qk(
                p_q + t * s_q_t, p_k + t * s_k_t, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM,
                MASK_K,
            )  # fmt: skip
            b_g = tl.load(p_g + i_b64 * s_g_b + t * s_g_t + i_h64 * s_g_h).to(tl.float32)
            b_beta = tl.load(p_beta + i_b64 * s_beta_b + t * s_beta_t + i_h64 * s_beta_h).to(tl.float32)
            b_v = load_f32(p_v + i_b64 * s_v_b + t * s_v_t + i_h64 * s_v_h + o_v * s_v_v, m_v, MASK_V)
            b_S = b_S * tl.exp(b_g)
            b_d = b_beta * (b_v - tl.sum(b_S * b_k[None, :], axis=1))
            b_S = b_S + b_d[:, None] * b_k[None, :]
            b_S = b_S.to(p_state.dtype.element_ty).to(tl.float32)
            b_o = tl.sum(b_S * b_q[None, :], axis=1)
            store_cast(p_o + i_b64 * s_o_b + t * s_o_t + i_h64 * s_o_h + o_v * s_o_v, b_o, m_v, MASK_V)
            if SNAPSHOT:
                p_snap_tile = p_snap + slot * s_sn_s + t * s_sn_t + i_h64 * s_sn_h + o_v[:, None].to(tl.int64) * s_sn_v + o_k[None, :] * s_sn_k
                store_cast(p_snap_tile, b_S, m_tile, MASK_V or MASK_K)
        if not SNAPSHOT:
            store_cast(p_tile, b_S, m_tile, MASK_V or MASK_K)


# ---------------------------------------------------------------------------
# launchers (same signatures as the reference twins in ops/reference.py)
# ---------------------------------------------------------------------------


#: Key columns per dot of the main launch's "mma" form (_main_tile_mma). Run 17 (T = 4, 16/32 heads, 16-row
#: tiles): 32 with 3 stages 375-378 us per verify step, 16 on 32-row tiles 381-382, whole-tile dots 411-413.
_MMA_KEY_CHUNK = 32


def _scale(scale: float | None, key_dim: int) -> float:
    return key_dim**-0.5 if scale is None else float(scale)


def _tiles(dim: int, cfg: LaunchConfig) -> tuple[int, int]:
    num_tiles = triton.cdiv(dim, cfg.block)
    return num_tiles, min(cfg.split, num_tiles)


def gdn_step_out(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None, o: Tensor, config: LaunchConfig | None = None,
    flush_config: LaunchConfig | None = None, decode_launches: int | None = None, weights_config: LaunchConfig | None = None,
    overlap: bool | None = None, read_checkpoint: Tensor | None = None, ring_beta: Tensor | None = None,
    read_copy_fold: str | None = None,
) -> None:  # fmt: skip
    """The replay step writing its outputs into ``o``; see ``replayssm.ops.gdn_step``.

    T = 1 (decoding) runs ``_gdn_replay_kernel`` (``config``, default from the replay table) and the
    append, or, with ``decode_launches=3`` (default from ``gdn_decode_launches``), the three launches
    of verification. T > 1 (verification) runs ``_gdn_flush_kernel`` (``flush_config``, default from
    ``gdn_flush_config``), ``_gdn_weights_kernel`` (``weights_config``: only its ``num_warps`` counts;
    default from ``gdn_weights_config``) and ``_gdn_main_kernel`` (``config``, default from
    ``gdn_main_config``). ``overlap`` (default ``replay_overlap()``): the weights and main launches
    with programmatic dependent launch where the GPU has it (``common.overlap_launches``).
    ``read_checkpoint`` (SPEC §4): the main launch reads it instead of the checkpoint, and the fold
    launches write both, folding exactly with ``ring_beta`` (required with a copy) in the form
    ``read_copy_fold`` (default ``configs.GDN_READ_COPY_FOLD``); decoding then always takes the three
    launches (the single kernel reads and folds the same tiles, so it has no read copy).
    """
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    if decode_launches is None:
        decode_launches = 3 if read_checkpoint is not None else gdn_decode_launches(value_dim, key_dim)
    if decode_launches not in (1, 3):
        raise ValueError(f"gdn_step_out: decode_launches must be 1 or 3, got {decode_launches}")
    if decode_launches == 1 and num_tokens == 1 and read_checkpoint is not None:
        raise ValueError("gdn_step_out: the single decode kernel has no read copy; pass decode_launches=3 with read_checkpoint")
    if (read_checkpoint is None) != (ring_beta is None):
        raise ValueError("gdn_step_out: ring_beta goes with read_checkpoint (the exact fold of a copy needs it): pass both or neither")
    read_fold = gdn_read_copy_fold_constexprs(read_copy_fold or GDN_READ_COPY_FOLD)  # (checks the name)
    if num_tokens > 1 or decode_launches == 3:
        _gdn_three_launches(
            q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, o, config, flush_config,
            weights_config, replay_overlap() if overlap is None else overlap, read_checkpoint, ring_beta, read_fold,
        )  # fmt: skip
        return
    window = ring_k.shape[1]
    cfg = config or gdn_replay_config(value_dim, key_dim)
    check_form("_gdn_replay_kernel", cfg)
    num_tiles, split = _tiles(value_dim, cfg)
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


def _gdn_three_launches(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending,
    rows, commit, use_qk_l2norm, scale, o, config, flush_config, weights_config, overlap: bool, read_checkpoint: Tensor | None,
    ring_beta: Tensor | None, read_fold: dict,
) -> None:  # fmt: skip
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    window = ring_k.shape[1]
    value_per_key = value_heads // key_heads
    block_k, block_l, block_t = next_pow2(key_dim), next_pow2(window), next_pow2(num_tokens)
    # Per-call scratch (like the output): weights per (row, value head, token), normalised k / scaled q
    # per (row, key head), each row's first new ring position.
    weights = torch.empty(batch, value_heads, num_tokens, 2 * window + 2 * num_tokens + 1, dtype=torch.float32, device=v.device)
    qk = torch.empty(batch, key_heads, 2, num_tokens, key_dim, dtype=torch.float32, device=v.device)
    pos = torch.empty(batch, dtype=torch.int32, device=v.device)
    ck_strides = dict(zip(("s_ck_s", "s_ck_h", "s_ck_v", "s_ck_k"), checkpoint.stride()))
    rk_strides = dict(zip(("s_rk_s", "s_rk_l", "s_rk_h", "s_rk_k"), ring_k.stride()))
    rd_strides = dict(zip(("s_rd_s", "s_rd_l", "s_rd_h", "s_rd_v"), ring_d.stride()))
    rg_strides = dict(zip(("s_rg_s", "s_rg_l", "s_rg_h"), ring_g.stride()))
    scratch_strides = dict(
        **dict(zip(("s_w_b", "s_w_h", "s_w_t"), weights.stride()[:3])),
        **dict(zip(("s_qk_b", "s_qk_h", "s_qk_i", "s_qk_t"), qk.stride()[:4])),
    )  # fmt: skip
    # Every launch's configuration is checked before the first launch: a bad one must not leave a half-done step.
    fcfg = flush_config or gdn_flush_config(value_dim, key_dim, num_tokens, read_checkpoint is not None)
    wcfg = weights_config or gdn_weights_config(value_dim, key_dim, num_tokens)
    cfg = config or gdn_main_config(value_dim, key_dim, num_tokens, read_checkpoint is not None)
    check_form("_gdn_flush_kernel", fcfg, ("", "worklist", "alongside"))
    check_form("_gdn_weights_kernel", wcfg, ("", "dot"))
    ring_dot = wcfg.form == "dot"
    check_form("_gdn_main_kernel", cfg, ("", "mma"))
    mma = cfg.form == "mma"
    if mma and (cfg.block < 16 or key_dim < 16):
        raise ValueError(f"_gdn_main_kernel: the 'mma' form needs tiles of >= 16 rows and key_dim >= 16 (tl.dot), got {cfg.block} / {key_dim}")
    if fcfg.block < 16:
        raise ValueError(f"_gdn_flush_kernel: the fold needs tiles of >= 16 rows (tl.dot), got {fcfg.block}")
    fold_tiles, fold_split = _tiles(value_dim, fcfg)
    # "alongside": the fold launch after the weights launch, beside the main launch (docs/kernels.md run 19)
    alongside = fcfg.form == "alongside"
    work_list = fcfg.form in ("worklist", "alongside")
    flush_grid = (worklist_grid(v.device, batch * value_heads * fold_split, fcfg),) if work_list else (fold_split, value_heads, batch)
    arrive = torch.empty(batch, key_heads, dtype=torch.int32, device=v.device) if alongside else pos
    use_pdl = overlap_launches(v.device, overlap)
    later = pdl_launch_options(use_pdl)  # the launches after the step's first, a plain one (its inputs come from before the op)
    has_read = read_checkpoint is not None
    ring_beta_arg = ring_beta if has_read else ring_g  # (not read without a copy)
    # Verification with a copy reads the checkpoint (docs/ops.md, "Read copy"); decoding reads the copy.
    exact_reads = has_read and num_tokens > 1
    fold_args = dict(
        p_ckpt=checkpoint, p_read=read_checkpoint, HAS_READ=has_read, EXACT_READS=exact_reads, **read_fold,
        p_ring_k=ring_k, p_ring_d=ring_d, p_ring_g=ring_g, p_ring_beta=ring_beta_arg, p_rows=rows, **ck_strides, **rk_strides, **rd_strides,
        **rg_strides, V=value_dim, K=key_dim, L=window, value_per_key=value_per_key, batch=batch, heads=value_heads, T=num_tokens,
        USE_PDL=use_pdl, BLOCK_V=fcfg.block, BLOCK_K=block_k, BLOCK_L=max(block_l, 16), NUM_TILES=fold_tiles, SPLIT=fold_split,
        BLOCK_B=next_pow2(batch), num_warps=fcfg.num_warps, num_stages=fcfg.num_stages,
    )  # fmt: skip
    with device_context(v):
        if not alongside:
            _gdn_flush_kernel[flush_grid](p_cursor=cursor, WORKLIST=work_list, **fold_args)
        _gdn_weights_kernel[(key_heads, batch)](
            p_q=q, p_k=k, p_g=g, p_beta=beta, p_ring_k=ring_k, p_ring_g=ring_g, p_ring_beta=ring_beta_arg, p_cursor=cursor, p_rows=rows,
            p_w=weights, p_qk=qk, p_pos=pos, p_arrive=arrive, HAS_READ=has_read, EXACT_READS=exact_reads,
            **dict(zip(("s_q_b", "s_q_t", "s_q_h", "s_q_k"), q.stride())),
            **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
            **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
            **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
            **rk_strides, **rg_strides, **scratch_strides,
            K=key_dim, L=window, value_per_key=value_per_key, scale=_scale(scale, key_dim),
            T=num_tokens, L2NORM=use_qk_l2norm, USE_PDL=use_pdl, ALONGSIDE=alongside,
            BLOCK_J=next_pow2(value_per_key), BLOCK_K=max(block_k, 16) if ring_dot else block_k,
            BLOCK_L=max(block_l, 16) if ring_dot else block_l, BLOCK_T=block_t,
            **(dict(RING_DOT=True, BLOCK_M=max(16, next_pow2(2 * num_tokens))) if ring_dot else {}),
            num_warps=wcfg.num_warps, **({} if alongside else later),
        )  # fmt: skip
        if alongside:
            _gdn_fold_finish_kernel[flush_grid](
                p_v=v, p_o=o, p_g=g, p_beta=beta, p_w=weights, p_qk=qk, p_pos=pos, p_arrive=arrive,
                **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
                **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
                **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
                **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
                **scratch_strides, BLOCK_T=block_t, BLOCK_J=next_pow2(value_per_key), **fold_args, **later,
            )  # fmt: skip
        num_tiles, split = _tiles(value_dim, cfg)
        _gdn_main_kernel[(split, value_heads, batch)](
            # The checkpoint this launch reads: the read copy in decoding with one (same strides).
            p_v=v, p_o=o, p_ckpt=read_checkpoint if has_read and not exact_reads else checkpoint, p_ring_d=ring_d,
            p_cursor=cursor, p_pending=pending, p_rows=rows,
            p_w=weights, p_qk=qk, p_pos=pos,
            **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
            **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
            **ck_strides, **rd_strides, **scratch_strides,
            V=value_dim, K=key_dim, L=window, value_per_key=value_per_key, T=num_tokens, COMMIT=commit,
            USE_PDL=use_pdl, MMA=mma, ALONGSIDE=alongside,
            BLOCK_V=cfg.block, BLOCK_K=block_k, BLOCK_L=max(block_l, 16) if mma else block_l, BLOCK_T=block_t,
            BLOCK_M=max(16, next_pow2(2 * num_tokens)), NUM_TILES=num_tiles, SPLIT=split, BLOCK_KC=min(_MMA_KEY_CHUNK, block_k),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **later,
        )  # fmt: skip


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
    rows, commit: bool, use_qk_l2norm: bool, scale: float | None, read_checkpoint: Tensor | None = None,
    ring_beta: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Replay step: Triton in fp32/fp16/bf16, the reference for fp64."""
    args = (q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale)
    if uses_float64(q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, ring_beta):
        return reference.gdn_step(*args, read_checkpoint, ring_beta)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous, as the fake kernel says (v may be strided)
    gdn_step_out(*args, o=o, read_checkpoint=read_checkpoint, ring_beta=ring_beta)
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
    check_form("_gdn_conventional_kernel", cfg)
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
            value_per_key=value_heads // key_heads, scale=_scale(scale, key_dim),
            T=num_tokens, V=value_dim, K=key_dim, L2NORM=use_qk_l2norm, SNAPSHOT=snapshots is not None,
            BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip


def gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm: bool, scale: float | None) -> Tensor:
    """Conventional step: Triton in fp32/fp16/bf16, the reference for fp64."""
    if uses_float64(q, k, v, g, beta, state):
        return reference.gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm, scale)
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous, as the fake kernel says (v may be strided)
    gdn_conventional_step_out(q, k, v, g, beta, state, rows, use_qk_l2norm, scale, o=o)
    return o
