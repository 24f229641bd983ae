"""GDN verification launches (and decoding where the table picks three launches): key-side weights, then outputs."""

from __future__ import annotations

import triton
import triton.language as tl

from ..triton_helpers import allow_next_launch, head_suffix_sums, wait_for_previous_launch
from .tiles import load_tile_ring, raw_beta, raw_decay, ring_d_slice, row_folds


@triton.jit
def _copy_beta(b_beta):
    """The betas stored with entries formed against the read copy, in fp32: beta, -0 for 0
    (``reference._gdn_copy_beta``)."""
    b_beta = b_beta.to(tl.float32)
    # By the bits: compiled for the GPU, tl.where(b_beta == 0.0, -0.0, b_beta) came out as b_beta (its
    # sign bit lost: the CUDA tests caught it, the interpreter keeps it).
    b_bits = b_beta.to(tl.int32, bitcast=True)
    return tl.where(b_beta == 0.0, -2147483648, b_bits).to(tl.float32, bitcast=True)


@triton.jit
def _gdn_weights_kernel(
    p_q, p_k, p_g, p_beta, p_A_log, p_dt_bias, p_ring_k, p_ring_g, p_ring_beta, p_cursor, p_rows, p_w, p_qk, p_pos,
    s_q_b, s_q_t, s_q_h, s_q_k,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_g_b, s_g_t, s_g_h,
    s_beta_b, s_beta_t, s_beta_h,
    s_rk_s, s_rk_l, s_rk_h, s_rk_k,
    s_rg_s, s_rg_l, s_rg_h,
    s_w_b, s_w_h, s_w_t,
    s_qk_b, s_qk_h, s_qk_i, s_qk_t,
    K, L, value_per_key, scale,
    T: tl.constexpr, L2NORM: tl.constexpr, USE_PDL: tl.constexpr, HAS_READ: tl.constexpr,
    EXACT_READS: tl.constexpr, RAW_GATES: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    BLOCK_T: tl.constexpr, RING_DOT: tl.constexpr = False, BLOCK_M: tl.constexpr = 16,
):  # fmt: skip
    """Verification launch 2, one program per (key head, row): the main launch's weights, and the append.

    With c the row's committed entries after launch 1 (0 if it folded: ``row_folds``), ``suffix_i`` the log-decays
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

    ``HAS_READ`` (a read copy): the betas are appended too, into ``p_ring_beta`` (ring_g's strides), for
    the exact fold (-0 for a beta of 0: ``reference._gdn_copy_beta``); ``EXACT_READS`` (verification with
    a copy, which the main launch reads off the checkpoint): +0, the d being exact.

    ``RAW_GATES`` (``ops.gdn_step(A_log=, dt_bias=)``): g and beta are the raw a and b, the gates formed
    here (``raw_decay``, ``raw_beta``); only this launch reads them.
    """
    allow_next_launch(USE_PDL)
    i_kh, i_b = tl.program_id(0), tl.program_id(1)
    i_kh64, i_b64 = i_kh.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    # (Its own first value head's mark: another program of the row may overwrite head 0's with its append.)
    cur, folds = row_folds(p_cursor, p_ring_beta, slot, s_rg_s, s_rg_l, s_rg_h, i_kh * value_per_key, T, L, EXACT_READS)
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
    if RAW_GATES:
        b_A_log = tl.load(p_A_log + o_h, mask=m_j, other=0.0).to(tl.float32)
        b_dt_bias = tl.load(p_dt_bias + o_h, mask=m_j, other=0.0).to(tl.float32)
        b_g = tl.where(m_jt, raw_decay(b_g, b_A_log[:, None], b_dt_bias[:, None]), 0.0)
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
        if RAW_GATES:
            b_beta_t = tl.where(m_j, raw_beta(b_beta_t, p_beta), 0.0)
        # (heads, T): beta_t (e_t - sum_{s<t} c_ts N[s, :]); rows s >= t of b_N are still zero, as is c_ts there.
        b_N_t = b_beta_t[:, None] * (tl.where(o_t[None, :] == t, 1.0, 0.0) - tl.sum(b_wk_new[:, :, None] * b_N, axis=1))
        b_N = tl.where(o_t[None, :, None] == t, b_N_t[:, None, :], b_N)
        tl.store(p_w_t[:, None] + 2 * L + o_t[None, :], b_N_t, mask=m_jt)
        tl.store(p_w_t[:, None] + (2 * L + T) + o_t[None, :], b_wq_new, mask=m_jt)
        tl.store(p_w_t + (2 * L + 2 * T), tl.exp(b_ring_total + b_cum_t), mask=m_j)
    # Append: the T keys (this key head) and log-decays (its value heads) at ring positions c .. c + T - 1,
    # once launch 1 (which reads a folding row's old entries) has finished.
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
            b_beta = tl.load(p_beta + i_b64 * s_beta_b + o_t[None, :] * s_beta_t + o_h[:, None] * s_beta_h, mask=m_jt, other=0.0)
            if RAW_GATES:
                b_beta = raw_beta(b_beta.to(tl.float32), p_beta)
            b_beta = _copy_beta(b_beta)
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
    2T per tile row (Nsight Compute, T = 4: the launch issue-bound).

    ``[K; Q] S^T`` is summed over key chunks of ``BLOCK_KC`` columns, each chunk of the checkpoint tile
    and of the token block (``p_KQ``: a pointer per token row, unit stride along K) loaded for its own
    dot: neither whole block sits in registers, and the launch's ``num_stages`` pipelines the chunk loads
    (293 against 330 us for whole-tile dots, T = 4, 16/32 heads, H200).
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
    b_rd = ring_d_slice(p_ring_row_d, o_v, m_v, c_eff, s_rd_l, s_rd_v, o_l)
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
    T: tl.constexpr, COMMIT: tl.constexpr, USE_PDL: tl.constexpr, MMA: tl.constexpr,
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
    folded, was slower: docs/kernels.md, "Forms tried and lost".)

    ``MMA`` (``LaunchConfig.form == "mma"``): the same products as tensor-core dots over ``BLOCK_M`` (16)
    token rows, ``_main_tile_mma``, over key chunks of ``BLOCK_KC`` columns.
    """
    i_s, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_kh = i_h // value_per_key
    i_h64, i_kh64, i_b64 = i_h.to(tl.int64), i_kh.to(tl.int64), i_b.to(tl.int64)
    slot = tl.load(p_rows + i_b).to(tl.int64)
    wait_for_previous_launch(USE_PDL)
    c_eff = tl.load(p_pos + i_b)
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
    for i_v in range(i_s, NUM_TILES, SPLIT):
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
            o_v, m_v, _, _, b_S, b_rd = load_tile_ring(
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


@triton.jit
def _token_mixing(p_w_row, s_w_t, o_t, m_t, L, T: tl.constexpr):
    """The weights launch's (T, T) blocks for one (row, value head): N (``d = N (v - a)``) and W' (the
    causal weights of o)."""
    p_w_tt = p_w_row + o_t[:, None] * s_w_t + o_t[None, :]
    m_tt = m_t[:, None] & m_t[None, :]
    return tl.load(p_w_tt + 2 * L, mask=m_tt, other=0.0), tl.load(p_w_tt + (2 * L + T), mask=m_tt, other=0.0)


@triton.jit
def _store_tokens(p_o_row, p_ring_row_d, b_O, b_D, c_eff, o_v, m_v, o_t, m_t, s_o_t, s_o_v, s_rd_l, s_rd_v):
    """Store a tile's outputs (rows, T) and its d entries at ring positions c .. c + T - 1 (fp32 in the
    state classes; only the fold reads them back)."""
    m_vt = m_v[:, None] & m_t[None, :]
    tl.store(p_o_row + o_t[None, :] * s_o_t + o_v[:, None] * s_o_v, b_O.to(p_o_row.dtype.element_ty), mask=m_vt)
    tl.store(
        p_ring_row_d + (c_eff + o_t[None, :]) * s_rd_l + o_v[:, None] * s_rd_v, b_D.to(p_ring_row_d.dtype.element_ty), mask=m_vt
    )
