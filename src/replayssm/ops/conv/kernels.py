"""Triton kernel for ``causal_conv_step``: a decode step of the depthwise causal conv, window moved in place.

Transformers' own decode step concatenates the window and the new column,
copies the result's tail back into the window and runs the conv on the
concatenation: three passes over a window of ``taps`` columns per channel
(at batch 256 and 8192 channels, 16 MiB of bf16 per layer, each pass). Here
one program reads a block of channels' windows once, writes them back moved
on by one column, and writes the output column.

Two forms. ``_causal_conv_step_w4_kernel`` takes transformers' window (rows
of 4 contiguous columns): each row is one vector load and one vector store
by the thread that holds it, split into columns and joined again in
registers. ``_causal_conv_step_kernel`` takes any window: it loads
(channels, columns) tiles (a warp's loads contiguous in memory) and stores
the moved-on tile after a barrier, since a column one thread stores may be
one another thread read. A first form that loaded and stored one column at
a time, each store waiting on the load before it, ran at about 1 TB/s (40
us per layer at batch 256 on the H200).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from ..triton_helpers import device_context, next_pow2

#: channels per program, and warps: one channel per thread (the w4 form at batch 256 on the H200, a window
#: out of L2: 14.1 us against 16.0 at 256 channels and 18.5 at 512; ``benchmarks/kernels.py conv``)
_BLOCK_CHANNELS = 128

_NUM_WARPS = 4


@triton.jit
def _causal_conv_step_kernel(
    p_x, p_weight, p_bias, p_window, p_out,
    channels,
    s_x_b, s_x_c, s_w_c, s_w_t, s_win_b, s_win_c, s_win_w, s_out_b,
    TAPS: tl.constexpr, WIDTH: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    i_b = tl.program_id(1).to(tl.int64)
    o_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    o_w = tl.arange(0, BLOCK_W)
    m_c = o_c < channels
    p_win = p_window + i_b * s_win_b + o_c[:, None] * s_win_c
    b_x = tl.load(p_x + i_b * s_x_b + o_c * s_x_c, mask=m_c, other=0.0)
    # Every load comes before the barrier and every store after it: the window is moved on in place, and a
    # column a thread stores may be one another thread reads. Loads of a (channels, columns) tile keep a
    # warp's accesses contiguous in memory.
    b_moved = tl.load(p_win + (o_w[None, :] + 1) * s_win_w, mask=m_c[:, None] & (o_w[None, :] + 1 < WIDTH), other=0.0)
    b_moved = tl.where(o_w[None, :] == WIDTH - 1, b_x[:, None], b_moved)
    # the conv's inputs: the window's last TAPS - 1 columns, then x
    b_in = tl.load(
        p_win + (o_w[None, :] + (WIDTH + 1 - TAPS)) * s_win_w, mask=m_c[:, None] & (o_w[None, :] < TAPS - 1), other=0.0
    )
    b_in = tl.where(o_w[None, :] == TAPS - 1, b_x[:, None], b_in)
    b_tap = tl.load(p_weight + o_c[:, None] * s_w_c + o_w[None, :] * s_w_t, mask=m_c[:, None] & (o_w[None, :] < TAPS), other=0.0)
    # products of the inputs are exact in fp64 (as in the reference): the sum rounds like the reference's
    b_acc = tl.sum(b_tap.to(tl.float64) * b_in.to(tl.float64), axis=1)
    if HAS_BIAS:
        b_acc += tl.load(p_bias + o_c, mask=m_c, other=0.0).to(tl.float64)
    if SILU:
        b_acc = b_acc / (1.0 + tl.exp(-b_acc))
    # through fp32, as torch rounds fp64 to 16-bit types (and the interpreter's direct fp64 -> bf16 cast
    # returns garbage)
    tl.store(p_out + i_b * s_out_b + o_c, b_acc.to(tl.float32).to(p_out.dtype.element_ty), mask=m_c)
    tl.debug_barrier()
    tl.store(p_win + o_w[None, :] * s_win_w, b_moved, mask=m_c[:, None] & (o_w[None, :] < WIDTH))


@triton.jit
def _tap(p_weight, o_c, m_c, s_w_c, s_w_t, t: tl.constexpr, b_col):
    b_w = tl.load(p_weight + o_c * s_w_c + t * s_w_t, mask=m_c, other=0.0)
    return b_w.to(tl.float64) * b_col.to(tl.float64)


@triton.jit
def _causal_conv_step_w4_kernel(
    p_x, p_weight, p_bias, p_window, p_out,
    channels,
    s_x_b, s_x_c, s_w_c, s_w_t, s_win_b, s_out_b,
    TAPS: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    """A contiguous window of 4 columns (transformers' for a 4-tap conv): each channel's row is one 8-byte
    vector, loaded and stored whole by the thread that holds it, split into columns in registers."""
    i_b = tl.program_id(1).to(tl.int64)
    o_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    o_w = tl.arange(0, 4)
    m_c = o_c < channels
    # constexpr row stride: the compiler sees each row as 4 aligned contiguous elements (one vector access)
    p_win = p_window + i_b * s_win_b + o_c[:, None] * 4 + o_w[None, :]
    b_x = tl.load(p_x + i_b * s_x_b + o_c * s_x_c, mask=m_c, other=0.0)
    b_row = tl.load(p_win, mask=m_c[:, None], other=0.0)
    # [c, p, q] = column 2p + q: split q, then p
    b_even, b_odd = tl.split(tl.reshape(b_row, (BLOCK_C, 2, 2)))
    b_c0, b_c2 = tl.split(b_even)
    b_c1, b_c3 = tl.split(b_odd)
    # the taps meet the last TAPS of (c0, c1, c2, c3, x); products exact in fp64, as in the reference
    b_acc = _tap(p_weight, o_c, m_c, s_w_c, s_w_t, TAPS - 1, b_x)
    if TAPS >= 2:
        b_acc += _tap(p_weight, o_c, m_c, s_w_c, s_w_t, TAPS - 2, b_c3)
    if TAPS >= 3:
        b_acc += _tap(p_weight, o_c, m_c, s_w_c, s_w_t, TAPS - 3, b_c2)
    if TAPS >= 4:
        b_acc += _tap(p_weight, o_c, m_c, s_w_c, s_w_t, TAPS - 4, b_c1)
    if TAPS >= 5:
        b_acc += _tap(p_weight, o_c, m_c, s_w_c, s_w_t, TAPS - 5, b_c0)
    if HAS_BIAS:
        b_acc += tl.load(p_bias + o_c, mask=m_c, other=0.0).to(tl.float64)
    if SILU:
        b_acc = b_acc / (1.0 + tl.exp(-b_acc))
    tl.store(p_out + i_b * s_out_b + o_c, b_acc.to(tl.float32).to(p_out.dtype.element_ty), mask=m_c)
    # the moved-on row (c1, c2, c3, x): join(join(c1, c3), join(c2, x)) is [c, q, p] -> column 2q + p
    b_moved = tl.reshape(tl.join(tl.join(b_c1, b_c3), tl.join(b_c2, b_x)), (BLOCK_C, 4))
    tl.store(p_win, b_moved, mask=m_c[:, None])


def causal_conv_step_out(
    x: Tensor, weight: Tensor, bias: Tensor | None, window: Tensor, silu: bool, out: Tensor,
    block_channels: int = _BLOCK_CHANNELS, num_warps: int = _NUM_WARPS, form: str | None = None,
) -> None:  # fmt: skip
    """``causal_conv_step`` writing its output into ``out`` ``(batch, channels)`` (unit channel stride).

    ``form``: ``"w4"`` (rows of 4 contiguous columns, at most 5 taps), ``"tile"`` (any window), None: w4
    where it fits. ``block_channels``, ``num_warps`` and ``form`` are for tests and experiments (the
    defaults are what the op uses)."""
    batch, channels = x.shape
    if batch == 0 or channels == 0:
        return
    fits_w4 = _fits_w4(weight, window)
    if form == "w4" and not fits_w4:
        raise ValueError(f"the w4 form takes rows of 4 contiguous columns and at most 5 taps, got window {tuple(window.shape)} "
                         f"strides {window.stride()} and {weight.shape[1]} taps")  # fmt: skip
    block = min(block_channels, next_pow2(channels))
    grid = (triton.cdiv(channels, block), batch)
    with device_context(x):
        if fits_w4 and form != "tile":
            _causal_conv_step_w4_kernel[grid](
                p_x=x, p_weight=weight, p_bias=bias, p_window=window, p_out=out, channels=channels,
                s_x_b=x.stride(0), s_x_c=x.stride(1), s_w_c=weight.stride(0), s_w_t=weight.stride(1),
                s_win_b=window.stride(0), s_out_b=out.stride(0),
                TAPS=weight.shape[1], HAS_BIAS=bias is not None, SILU=silu, BLOCK_C=block, num_warps=num_warps,
            )  # fmt: skip
            return
        _causal_conv_step_kernel[grid](
            p_x=x, p_weight=weight, p_bias=bias, p_window=window, p_out=out, channels=channels,
            s_x_b=x.stride(0), s_x_c=x.stride(1), s_w_c=weight.stride(0), s_w_t=weight.stride(1),
            s_win_b=window.stride(0), s_win_c=window.stride(1), s_win_w=window.stride(2), s_out_b=out.stride(0),
            TAPS=weight.shape[1], WIDTH=window.shape[2], HAS_BIAS=bias is not None, SILU=silu, BLOCK_C=block,
            BLOCK_W=next_pow2(max(window.shape[2], weight.shape[1])), num_warps=num_warps,
        )  # fmt: skip


def _fits_w4(weight: Tensor, window: Tensor) -> bool:
    """Whether ``_causal_conv_step_w4_kernel`` takes this window: rows of 4 contiguous columns, one after
    another, and at most 5 taps."""
    return window.shape[2] == 4 and window.stride(2) == 1 and window.stride(1) == 4 and weight.shape[1] <= 5


def causal_conv_step(x: Tensor, weight: Tensor, bias: Tensor | None, window: Tensor, silu: bool) -> Tensor:
    """The launcher of ``replayssm.ops.causal_conv_step`` (fp32 / fp16 / bf16: the kernels round their output
    through fp32, so fp64 calls take the reference)."""
    out = x.new_empty(x.shape)
    causal_conv_step_out(x, weight, bias, window, silu, out)
    return out
