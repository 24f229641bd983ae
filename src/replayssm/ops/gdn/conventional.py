"""The conventional GDN step (the baseline): read the state, update it, write it back, per token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..launch import LaunchConfig
from ..triton_helpers import check_form, device_context, load_f32, next_pow2, store_cast
from .launch import conventional_config
from .step import scale_or_default, tiles_of
from .tiles import load_qk, raw_beta, raw_decay


@triton.jit
def _gdn_conventional_kernel(
    p_q, p_k, p_v, p_g, p_beta, p_A_log, p_dt_bias, p_o, p_state, p_snap, p_rows,
    s_q_b, s_q_t, s_q_h, s_q_k,
    s_k_b, s_k_t, s_k_h, s_k_k,
    s_v_b, s_v_t, s_v_h, s_v_v,
    s_g_b, s_g_t, s_g_h,
    s_beta_b, s_beta_t, s_beta_h,
    s_o_b, s_o_t, s_o_h, s_o_v,
    s_st_s, s_st_h, s_st_v, s_st_k,
    s_sn_s, s_sn_t, s_sn_h, s_sn_v, s_sn_k,
    value_per_key, scale,
    T: tl.constexpr, V: tl.constexpr, K: tl.constexpr, L2NORM: tl.constexpr, SNAPSHOT: tl.constexpr, RAW_GATES: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, NUM_TILES: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """Read the state tile, apply T tokens one after another (rounding to the state dtype after each), write it.

    ``SNAPSHOT`` (the speculative baseline engines use today): the state after
    token t is written to snapshot slot t instead, and the input state is left as is.
    The sizes are compile-time constants, so that where they are multiples of the
    block the tile's loads and stores carry no mask (about 3% of the step at 8-row
    tiles on the H200). ``RAW_GATES``: g and beta are the raw a and b (``ops.gdn_step``'s fused gates).
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
            b_q, b_k = load_qk(
                p_q + t * s_q_t, p_k + t * s_k_t, i_b64, i_kh64, s_q_b, s_q_h, s_q_k, s_k_b, s_k_h, s_k_k, o_k, m_k, scale, L2NORM,
                MASK_K,
            )  # fmt: skip
            b_g = tl.load(p_g + i_b64 * s_g_b + t * s_g_t + i_h64 * s_g_h).to(tl.float32)
            b_beta = tl.load(p_beta + i_b64 * s_beta_b + t * s_beta_t + i_h64 * s_beta_h).to(tl.float32)
            if RAW_GATES:
                b_g = raw_decay(b_g, tl.load(p_A_log + i_h).to(tl.float32), tl.load(p_dt_bias + i_h).to(tl.float32))
                b_beta = raw_beta(b_beta, p_beta)
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


def gdn_conventional_step_out(
    q, k, v, g, beta, state, rows, use_qk_l2norm: bool, scale: float | None, o: Tensor, config: LaunchConfig | None = None,
    snapshots: Tensor | None = None, A_log: Tensor | None = None, dt_bias: Tensor | None = None,
) -> None:
    """The conventional step writing its outputs into ``o``; see ``replayssm.ops.gdn_conventional_step``.

    With ``snapshots`` ``(slots, T, value_heads, value_dim, key_dim)`` the state after each token t goes to
    ``snapshots[:, t]`` and ``state`` is only read (the snapshot baseline of speculative decoding).
    """
    batch, num_tokens, key_heads, key_dim = k.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    cfg = config or conventional_config(value_dim, key_dim)
    check_form("_gdn_conventional_kernel", cfg)
    num_tiles, split = tiles_of(value_dim, cfg)
    with device_context(v):
        _gdn_conventional_kernel[(split, value_heads, batch)](
            p_q=q, p_k=k, p_v=v, p_g=g, p_beta=beta, p_A_log=A_log, p_dt_bias=dt_bias, p_o=o, p_state=state, p_snap=snapshots, p_rows=rows,
            **dict(zip(("s_q_b", "s_q_t", "s_q_h", "s_q_k"), q.stride())),
            **dict(zip(("s_k_b", "s_k_t", "s_k_h", "s_k_k"), k.stride())),
            **dict(zip(("s_v_b", "s_v_t", "s_v_h", "s_v_v"), v.stride())),
            **dict(zip(("s_g_b", "s_g_t", "s_g_h"), g.stride())),
            **dict(zip(("s_beta_b", "s_beta_t", "s_beta_h"), beta.stride())),
            **dict(zip(("s_o_b", "s_o_t", "s_o_h", "s_o_v"), o.stride())),
            **dict(zip(("s_st_s", "s_st_h", "s_st_v", "s_st_k"), state.stride())),
            **dict(zip(("s_sn_s", "s_sn_t", "s_sn_h", "s_sn_v", "s_sn_k"), tuple(snapshots.stride()) if snapshots is not None else (0,) * 5)),
            value_per_key=value_heads // key_heads, scale=scale_or_default(scale, key_dim),
            T=num_tokens, V=value_dim, K=key_dim, L2NORM=use_qk_l2norm, SNAPSHOT=snapshots is not None,
            RAW_GATES=A_log is not None,
            BLOCK_V=cfg.block, BLOCK_K=next_pow2(key_dim), NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip


def gdn_conventional_step(
    q, k, v, g, beta, state, rows, use_qk_l2norm: bool, scale: float | None, A_log: Tensor | None = None, dt_bias: Tensor | None = None
) -> Tensor:
    """The launcher of ``replayssm.ops.gdn_conventional_step`` (fp32 / fp16 / bf16)."""
    o = torch.empty(v.shape, dtype=v.dtype, device=v.device)  # contiguous, as the fake kernel says (v may be strided)
    gdn_conventional_step_out(q, k, v, g, beta, state, rows, use_qk_l2norm, scale, o=o, A_log=A_log, dt_bias=dt_bias)
    return o
