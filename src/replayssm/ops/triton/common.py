"""Helpers shared by the Triton kernel families: jit math and launch plumbing.

Only imported where Triton is present (``register_cuda_kernels`` imports the
kernel modules lazily, on the first call with CUDA tensors).
"""

from __future__ import annotations

import contextlib

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
def suffix_sums(b_log, o_l):
    """``out[i] = sum_{j > i} b_log[j]``: direct segment sums, no difference of cumulative sums."""
    return tl.sum(tl.where(o_l[None, :] > o_l[:, None], b_log[None, :], 0.0), axis=1)


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


# Ring entries per iteration of ``fold_rank1_store``'s loop: their loads are issued together, so a
# fold costs n / FOLD_CHUNK round trips to L2 instead of n.
FOLD_CHUNK = tl.constexpr(4)


@triton.jit
def fold_rank1_store(b_S, n, p_w, p_u, s_u_l, s_u_row, o_row, m_row, p_v, s_v_l, o_k, m_k, L, p_tile, m_tile):
    """Fold ``n`` ring entries into a checkpoint tile by rank-1 updates in fp32 and store it:
    ``S <- w[L] S + sum_{i<n} w[i] u_i[rows] v_i^T`` (u: the ring's row-side vectors, Mamba-2 x; v: B and
    w, the weights, from the step's scratch). For tiles of a few rows, too small for a ``tl.dot``. The
    decay comes first, so no second tile-sized accumulator. Returns the tile as stored, in fp32; the
    barrier makes every thread finish reading the ring before the caller overwrites its entries.
    """
    b_S = b_S * tl.load(p_w + L)
    for i0 in range(0, n, FOLD_CHUNK):
        for j in tl.static_range(FOLD_CHUNK):
            i = i0 + j
            live = i < n
            m_u = tl.where(live, m_row, False)  # (a bool scalar in a mask trips the interpreter)
            m_v = tl.where(live, m_k, False)
            b_u = tl.load(p_u + i * s_u_l + o_row * s_u_row, mask=m_u, other=0.0).to(tl.float32)
            b_v = tl.load(p_v + i * s_v_l + o_k, mask=m_v, other=0.0)
            b_w = tl.where(live, tl.load(p_w + tl.minimum(i, L)), 0.0)  # w[i >= n] is unwritten scratch
            b_S += (b_w * b_u)[:, None] * b_v[None, :]
    b_stored = b_S.to(p_tile.dtype.element_ty)
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
