"""The conventional Mamba-2 step (the baseline): read the state, update it, write it back, per token."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..launch import LaunchConfig
from ..triton_helpers import check_form, device_context, next_pow2, sigmoid, softplus
from .kernels import strides_or_zeros, tiles_of
from .launch import conventional_config


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
    cfg = config or conventional_config(head_dim, state_size)
    check_form("_mamba2_conventional_kernel", cfg)
    num_tiles, split = tiles_of(head_dim, cfg)
    with device_context(x):
        _mamba2_conventional_kernel[(split, heads, batch)](
            p_x=x, p_dt=dt, p_A=A, p_B=B, p_C=C, p_D=D, p_dt_bias=dt_bias, p_z=z, p_y=y, p_state=state, p_snap=snapshots, p_rows=rows,
            **dict(zip(("s_x_b", "s_x_t", "s_x_h", "s_x_p"), x.stride())),
            **dict(zip(("s_dt_b", "s_dt_t", "s_dt_h"), dt.stride())),
            **dict(zip(("s_B_b", "s_B_t", "s_B_g", "s_B_n"), B.stride())),
            **dict(zip(("s_C_b", "s_C_t", "s_C_g", "s_C_n"), C.stride())),
            **dict(zip(("s_z_b", "s_z_t", "s_z_h", "s_z_p"), strides_or_zeros(z, 4))),
            **dict(zip(("s_y_b", "s_y_t", "s_y_h", "s_y_p"), y.stride())),
            **dict(zip(("s_st_s", "s_st_h", "s_st_p", "s_st_n"), state.stride())),
            **dict(zip(("s_sn_s", "s_sn_t", "s_sn_h", "s_sn_p", "s_sn_n"), strides_or_zeros(snapshots, 5))),
            T=num_tokens, P=head_dim, N=state_size, heads_per_group=heads // groups,
            HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, DT_SOFTPLUS=dt_softplus,
            SNAPSHOT=snapshots is not None,
            BLOCK_P=cfg.block, BLOCK_N=next_pow2(state_size), NUM_TILES=num_tiles, SPLIT=split,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip


def mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus: bool) -> Tensor:
    """The launcher of ``replayssm.ops.mamba2_conventional_step`` (fp32 / fp16 / bf16)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, as the fake kernel says (x may be strided)
    mamba2_conventional_step_out(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus, y=y)
    return y
