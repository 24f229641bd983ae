"""GDN fold launch: rows whose ring is full fold it into the checkpoint (the only checkpoint write)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import allow_next_launch, fold_tile, folding_rows, rank_rows, suffix_sums, worklist_item
from .tiles import ends_with_copy_entry, load_tile_ring, row_folds


@triton.jit
def _gdn_folding_rows(p_rows, p_cursor, p_ring_beta, s_rg_s, s_rg_l, s_rg_h, batch, T, L, BLOCK_B: tl.constexpr, EXACT_READS: tl.constexpr):
    """``triton_helpers.folding_rows`` with ``row_folds``' decision."""
    if EXACT_READS:
        o_b = tl.arange(0, BLOCK_B)
        m_b = o_b < batch
        b_slot = tl.load(p_rows + o_b, mask=m_b, other=0).to(tl.int64)
        b_cur = tl.load(p_cursor + b_slot, mask=m_b, other=0)
        b_fold = m_b & ((b_cur + T > L) | ends_with_copy_entry(p_ring_beta, b_slot, b_cur, s_rg_s, s_rg_l, s_rg_h, 0))
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
    T: tl.constexpr, WORKLIST: tl.constexpr, USE_PDL: tl.constexpr, HAS_READ: tl.constexpr,
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
    (``_fold_read_copy_tile``, which needs the ring's betas ``p_ring_beta``), or the plain one for a value
    head whose entries are all exact (beta 0), and it is also stored, rounded from fp32, into the copy
    (SPEC §4). ``EXACT_READS`` (verification with a copy): rows whose ring ends in entries formed against
    the copy fold too (``row_folds``).
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
            T, HAS_READ, EXACT_READS, BLOCK_V, BLOCK_K, BLOCK_L, NUM_TILES, SPLIT,
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
def _read_copy_fold_matrix(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, b_wf, o_l):
    """The matrix ``M = K^T diag(exp(cum)) N^T diag(wf)`` (keys, entries) of one (row, value head), formed once
    for all its tiles.

    Each d was formed from ``S k`` read off the copy C, so it is the update of the state the steps read.
    With the gap ``D_0 = S - C``, entry j's true update is ``d_j + e_j``, ``e_j = -beta_j alpha_j D_j k_j``
    with ``D_{j+1} = alpha_j D_j + e_j k_j^T`` (``reference._gdn_read_copy_chain`` runs this entry by entry).
    Unrolled, a tile's weighted true updates are ``(d + e) * wf = d * wf - D_0 M``: one product per tile."""
    b_exp_cum, b_N = _read_copy_correction(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, o_l)
    b_R = tl.trans(b_N) * b_exp_cum[:, None] * b_wf[None, :]  # R[j, i] = exp(cum_j) N_ij wf_i; M = K^T R
    return tl.dot(tl.trans(b_rk), b_R, input_precision="ieee")


@triton.jit
def _fold_read_copy_tile(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_M):
    """The exact fold of a checkpoint tile (rows, K; ``b_C`` its read copy in fp32) whose ring entries were
    formed against the copy: the plain rank-L fold of the corrected updates ``d * wf - (S - C) M``, in fp32."""
    b_U = b_rd * b_wf[None, :] - tl.dot(b_S - b_C, b_M, input_precision="ieee")  # (rows, entries)
    return fold_tile(b_S, b_decay_f, tl.trans(b_U), b_rk)


@triton.jit
def _gdn_fold_head(
    p_ckpt, p_read, p_ring_k, p_ring_d, p_ring_g, p_ring_beta, p_cursor, p_rows,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h,
    V, K, L, value_per_key, i_s, i_h, i_b,
    T: tl.constexpr, HAS_READ: tl.constexpr, EXACT_READS: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """One fold-launch work item: tile group ``i_s`` of value head ``i_h`` of row ``i_b``, if the row folds
    (``row_folds``).

    With a read copy, a value head whose entries all have beta 0 (exact d: verification's, which read the
    checkpoint) takes the plain fold, which neither reads the copy nor forms corrections, and stores
    both; any other the exact one."""
    slot = tl.load(p_rows + i_b).to(tl.int64)
    cur, folds = row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, 0, T, L, EXACT_READS)
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
                    True, False, BLOCK_V, NUM_TILES, SPLIT,
                )  # fmt: skip
            else:
                _fold_head_tiles(
                    p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
                    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
                    True, True, BLOCK_V, NUM_TILES, SPLIT,
                )  # fmt: skip
        else:
            _fold_head_tiles(
                p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
                s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
                False, False, BLOCK_V, NUM_TILES, SPLIT,
            )  # fmt: skip


@triton.jit
def _fold_head_tiles(
    p_ckpt, p_read, p_ring_d, p_ring_g, p_ring_beta, slot, i_h64, cur, i_s, b_rk, b_wf, b_decay_f, o_k, m_k, o_l,
    s_ck_s, s_ck_h, s_ck_v, s_ck_k, s_rd_s, s_rd_l, s_rd_h, s_rd_v, s_rg_s, s_rg_l, s_rg_h, V,
    HAS_READ: tl.constexpr, CORRECT: tl.constexpr, BLOCK_V: tl.constexpr,
    NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Fold tiles ``i_s, i_s + SPLIT, ...`` of one (row, value head) and store them, into the copy too
    (``HAS_READ``); ``CORRECT``: the exact fold of a ring formed against the copy (``_fold_read_copy_tile``),
    else the plain rank-L one."""
    if CORRECT:
        b_M = _read_copy_fold_matrix(p_ring_g, p_ring_beta, slot, i_h64, cur, s_rg_s, s_rg_l, s_rg_h, b_rk, b_wf, o_l)
    p_ck_head = p_ckpt + slot * s_ck_s + i_h64 * s_ck_h
    p_ring_row_d = p_ring_d + slot * s_rd_s + i_h64 * s_rd_h
    for i_v in range(i_s, NUM_TILES, SPLIT):
        o_v, _, p_tile, m_tile, b_S, b_rd = load_tile_ring(
            p_ck_head, p_ring_row_d, i_v, cur, s_ck_v, s_ck_k, s_rd_l, s_rd_v, o_k, m_k, o_l, V, BLOCK_V
        )
        if HAS_READ:
            p_read_tile = p_read + slot * s_ck_s + i_h64 * s_ck_h + o_v[:, None].to(tl.int64) * s_ck_v + o_k[None, :] * s_ck_k
        if CORRECT:
            b_C = tl.load(p_read_tile, mask=m_tile, other=0.0).to(tl.float32)
            b_S = _fold_read_copy_tile(b_S, b_C, b_rd, b_rk, b_wf, b_decay_f, b_M)
        else:
            b_S = fold_tile(b_S, b_decay_f, tl.trans(b_rd * b_wf[None, :]), b_rk)
        tl.store(p_tile, b_S.to(p_ckpt.dtype.element_ty), mask=m_tile)
        if HAS_READ:
            tl.store(p_read_tile, b_S.to(p_read.dtype.element_ty), mask=m_tile)
