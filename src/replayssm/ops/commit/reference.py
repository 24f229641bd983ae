"""The PyTorch twin of ``commit``."""

from __future__ import annotations

from torch import Tensor


def commit(cursor: Tensor, pending: Tensor, rows: Tensor, accepted: Tensor) -> None:
    """Make the first ``accepted[b]`` pending entries of ``rows[b]`` part of its state.

    Device-side only (no host values), so it can be captured in a CUDA graph.
    """
    rows = rows.long()
    cursor[rows] = cursor[rows] + accepted.to(cursor.dtype)
    pending.index_fill_(0, rows, 0)
