"""Helpers shared by the Triton kernel families: jit math and launch plumbing.

Only imported where Triton is present (``register_cuda_kernels`` imports the
kernel modules lazily, on the first call with CUDA tensors).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os

import torch
import triton
import triton.language as tl


@triton.jit
def softplus(x):
    """``log(1 + exp(x))`` as torch computes it (threshold 20), accurate for large negative x.

    ``log1p(e)`` uses the classic ``log(u) * e / (u - 1)`` with ``u = 1 + e``
    (exact to a few ulp where ``log(1 + e)`` would lose the digits of ``e``).
    """
    e = tl.exp(-tl.abs(x))
    u = 1.0 + e
    log1p_e = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p_e)


@triton.jit
def sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def round_like(x, p):
    """fp32 ``x`` rounded to the element type of pointer ``p``, returned in fp32: bf16 by the bits
    (round to nearest even; the interpreter's cast truncates, NOTES-TRITON), fp16 by a cast, wider types
    unchanged. For finite x. (fp8 e4m3, whose values come with a scale: ``round_e4m3``.)"""
    if p.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536: 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    elif p.dtype.element_ty == tl.float16:
        return x.to(tl.float16).to(tl.float32)
    else:
        return x


@triton.jit
def round_e4m3(x):
    """fp32 ``x`` rounded to nearest even on fp8 e4m3's grid and saturated at +-448, in fp32 (so its
    cast to e4m3 is exact). The interpreter's fp32 -> e4m3 cast does not round to nearest even (and
    libdevice's rint does not run there): adding ``1.5 * 2^(e + 20)``, whose fp32 ulp is e4m3's ulp
    ``2^(e - 3)`` at x's exponent e (at least -6, e4m3's smallest normal one), rounds |x| in the fp32
    add, and subtracting it back is exact. The sign is copied from x, so -0 and small negative values
    keep it, as torch's cast does."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    magic = (((e + 147) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5 * 2^(e + 20): biased e + 20 + 127
    q = tl.minimum((tl.abs(x) + magic) - magic, 448.0)
    return (q.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)  # -2^31: the sign bit


@triton.jit
def quantize_rows_e4m3(b_S):
    """The rows of an fp32 tile (each a whole row of the state) as fp8 e4m3 values, in fp32 and exact in
    e4m3, and an fp32 scale per row: ``scale = amax(|row|) / 448``, ``values = RNE(row / scale)``
    (``replay_math.quantize_rows_e4m3`` is the twin). Both divisions are IEEE-rounded (``div_rn``; Triton's
    ``/`` is not on the GPU), so the bits equal torch's. A row whose scale is 0 (all zeros, or amax below
    fp32's range times 448) is divided by 1: its values round to (signed) zeros."""
    b_scale = tl.math.div_rn(tl.max(tl.abs(b_S), axis=1), 448.0)
    b_div = tl.where(b_scale > 0, b_scale, 1.0)
    return round_e4m3(tl.math.div_rn(b_S, b_div[:, None])), b_scale


@triton.jit
def suffix_sums(b_log, o_l):
    """``out[i] = sum_{j > i} b_log[j]``: direct segment sums, no difference of cumulative sums."""
    return tl.sum(tl.where(o_l[None, :] > o_l[:, None], b_log[None, :], 0.0), axis=1)


@triton.jit
def head_suffix_sums(b_log, o_l):
    """``out[j, i] = sum_{m > i} b_log[j, m]`` per head j (entries past a row's history are zero in
    ``b_log``): ``suffix_sums`` for a (heads, entries) block."""
    return tl.sum(tl.where(o_l[None, None, :] > o_l[None, :, None], b_log[:, None, :], 0.0), axis=2)


@triton.jit
def folding_rows(p_rows, p_cursor, batch, T, L, BLOCK_B: tl.constexpr):
    """The rows of a launch whose ring cannot take ``T`` more entries (``cursor + T > L``): they fold.

    Returns ``(o_b, b_fold, b_rank, n_fold)``: the row indices ``0 .. BLOCK_B - 1``, which of them fold,
    each folding row's rank among the folding rows (in row order), and their count. One vector load of
    the cursors; a work-list launch's programs each compute this (a few hundred integers) instead of a
    pre-pass launch writing a list.
    """
    o_b = tl.arange(0, BLOCK_B)
    m_b = o_b < batch
    b_slot = tl.load(p_rows + o_b, mask=m_b, other=0).to(tl.int64)
    b_cur = tl.load(p_cursor + b_slot, mask=m_b, other=0)
    b_fold = m_b & (b_cur + T > L)
    b_rank, n_fold = rank_rows(b_fold)
    return o_b, b_fold, b_rank, n_fold


@triton.jit
def rank_rows(b_fold):
    """Each marked row's rank among the marked rows (in row order), and their count."""
    b_count = b_fold.to(tl.int32)
    return tl.cumsum(b_count, axis=0) - 1, tl.sum(b_count, axis=0)


@triton.jit
def nth_folding_row(o_b, b_fold, b_rank, n):
    """The row index of the ``n``-th folding row (``folding_rows``' outputs; ``0 <= n < n_fold``)."""
    return tl.sum(tl.where(b_fold & (b_rank == n), o_b, 0), axis=0)


@triton.jit
def marked_folding_rows(p_pos, batch, BLOCK_B: tl.constexpr):
    """``folding_rows`` for a fold launch after the weights launch, which marks a folding row ``pos < 0``
    (its cursors are being moved meanwhile): ``(o_b, b_fold, b_rank, n_fold)``."""
    o_b = tl.arange(0, BLOCK_B)
    m_b = o_b < batch
    b_fold = m_b & (tl.load(p_pos + o_b, mask=m_b, other=0) < 0)
    b_rank, n_fold = rank_rows(b_fold)
    return o_b, b_fold, b_rank, n_fold


@triton.jit
def worklist_item(o_b, b_fold, b_rank, item, heads, SPLIT: tl.constexpr):
    """A fold work list's item ``item`` as (row, head, tile group): items run over the folding rows, then
    their heads, then ``SPLIT`` tile groups per head."""
    i_b = nth_folding_row(o_b, b_fold, b_rank, item // (heads * SPLIT))
    return i_b, (item // SPLIT) % heads, item % SPLIT


#: "worklist" fold launches: programs per multiprocessor when the launch table gives none.
WORKLIST_PROGRAMS_PER_SM = 2


def worklist_grid(device: torch.device, max_items: int, cfg) -> int:
    """Programs of a work-list launch: a fixed count (so a CUDA graph keeps one shape), at most one per
    possible item. On the CPU (interpreter) two "multiprocessors" are assumed: few programs, several
    items each."""
    per_sm = cfg.programs_per_sm or WORKLIST_PROGRAMS_PER_SM
    sms = _multiprocessors(device.index) if device.type == "cuda" else 2
    return max(1, min(max_items, per_sm * sms))


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index if index is not None else torch.cuda.current_device()).multi_processor_count


# -- overlapping a step's launches (programmatic dependent launch, sm_90+) ----------------------------
#
# A step of several launches (fold, weights, main) is a chain: each launch reads what the one before it
# wrote. With programmatic dependent launch the next launch's programs may start while the previous
# launch is still running, and block in ``wait_for_previous_launch`` until it has finished and its
# writes are visible. What a program does before that wait must not touch anything the previous
# launch (or its own launch, through other programs) writes: each kernel's docstring says what it
# does there. The first launch of a step is always a plain launch, since its inputs come from
# whatever ran before the op.


def overlap_launches(device: torch.device, requested: bool) -> bool:
    """Whether a step's later launches are made with ``launch_pdl`` (and their kernels wait in-kernel):
    ``requested``, on a CUDA device of compute capability 9.0 or newer, with a Triton that knows the
    option, not under the interpreter, and not turned off with ``REPLAYSSM_PDL=0``."""
    if not requested or device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    if os.environ.get("REPLAYSSM_PDL", "1") == "0":
        return False
    return _capability(device.index)[0] >= 9 and _triton_knows_pdl()


@functools.lru_cache(maxsize=None)
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index if index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _triton_knows_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)} and hasattr(tl.extra.cuda, "gdc_wait")


def pdl_launch_options(overlap: bool) -> dict:
    """Launch keywords of a launch that may start before the previous one ends (empty otherwise)."""
    return {"launch_pdl": True} if overlap else {}


@triton.jit
def wait_for_previous_launch(USE_PDL: tl.constexpr):
    """Block until the previous launch has finished and its writes are visible (a no-op without PDL)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def allow_next_launch(USE_PDL: tl.constexpr):
    """Let the next launch's programs start once every program of this one has got here (or ended)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def load_f32(p, mask, MASKED: tl.constexpr):
    """Load as fp32; masked (zeros outside) only where the block can run past the tensor (``MASKED``,
    a compile-time fact of the sizes: unmasked loads vectorise without the predicate)."""
    if MASKED:
        return tl.load(p, mask=mask, other=0.0).to(tl.float32)
    return tl.load(p).to(tl.float32)


@triton.jit
def store_cast(p, x, mask, MASKED: tl.constexpr):
    """Store in the pointer's dtype; masked only where the block can run past the tensor (``MASKED``)."""
    if MASKED:
        tl.store(p, x.to(p.dtype.element_ty), mask=mask)
    else:
        tl.store(p, x.to(p.dtype.element_ty))


def check_form(kernel: str, cfg, forms: tuple[str, ...] = ("",)) -> None:
    """Raise if a launch table gives ``kernel`` a ``LaunchConfig.form`` it does not have (before any launch)."""
    if cfg.form not in forms:
        raise ValueError(f"{kernel} has no form {cfg.form!r} (known: {', '.join(repr(f) for f in forms)})")


@triton.jit
def fold_tile(b_S, b_decay, b_U, b_W):
    """``decay * S + U^T W`` in fp32: the ring folded into a checkpoint tile as one rank-L update.

    ``b_U`` ``(L, rows)`` holds the weighted row-side vectors (Mamba-2 ``exp(G_i) dt_i x_i``, GDN
    ``exp(G_i) d_i``), ``b_W`` ``(L, key_dim)`` the key-side ones (B_i, k_i); both fp32, so the
    product is exact fp32 arithmetic (``ieee``: no tf32, no bf16 operands). ``L >= 16`` (padded
    entries are zero).
    """
    return b_decay * b_S + tl.dot(tl.trans(b_U), b_W, input_precision="ieee")


@triton.jit
def fold_store_tile(b_S, b_decay, b_U, b_W, p_tile, m_tile):
    """Flush one checkpoint tile: fold the ring in (``fold_tile``), store it in the checkpoint's
    dtype, and return it as stored (in fp32) so outputs use the checkpoint as stored.

    The barrier makes every thread finish reading ring entry 0 before the caller overwrites it
    with the new token's entry.
    """
    b_stored = fold_tile(b_S, b_decay, b_U, b_W).to(p_tile.dtype.element_ty)
    tl.store(p_tile, b_stored, mask=m_tile)
    tl.debug_barrier()
    return b_stored.to(tl.float32)


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def device_context(t: torch.Tensor):
    """``torch.cuda.device`` for CUDA tensors; nothing for CPU tensors (interpreter)."""
    if t.device.type == "cuda":
        return torch.cuda.device(t.device.index)
    return contextlib.nullcontext()


def uses_float64(*tensors: torch.Tensor | None) -> bool:
    """The kernels compute in fp32; fp64 calls go to the reference (which computes in fp64)."""
    return any(t is not None and t.dtype == torch.float64 for t in tensors)
