"""Triton kernel for ``commit``: a cursor move, graph-capturable on CUDA.

The reference writes ``pending[rows] = 0`` from a CPU scalar, which a CUDA
graph cannot capture; this kernel moves every cursor on the device.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from ..triton_helpers import device_context, next_pow2


@triton.jit
def _commit_kernel(p_cursor, p_pending, p_rows, p_accepted, batch, BLOCK: tl.constexpr):
    o_b = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_b = o_b < batch
    slot = tl.load(p_rows + o_b, mask=m_b, other=0).to(tl.int64)
    b_acc = tl.load(p_accepted + o_b, mask=m_b, other=0).to(tl.int32)
    b_cur = tl.load(p_cursor + slot, mask=m_b, other=0)
    tl.store(p_cursor + slot, b_cur + b_acc, mask=m_b)
    tl.store(p_pending + slot, tl.zeros_like(b_cur), mask=m_b)


def commit(cursor: Tensor, pending: Tensor, rows: Tensor, accepted: Tensor) -> None:
    """Same signature as ``reference.commit``: ``cursor[rows] += accepted``, ``pending[rows] = 0``."""
    batch = rows.shape[0]
    if batch == 0:
        return
    block = min(next_pow2(batch), 1024)
    with device_context(cursor):
        _commit_kernel[(triton.cdiv(batch, block),)](
            p_cursor=cursor, p_pending=pending, p_rows=rows, p_accepted=accepted, batch=batch, BLOCK=block
        )
