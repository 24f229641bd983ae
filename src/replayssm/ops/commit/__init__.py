"""``commit``: accept the first entries of a verification, drop the rest (a cursor move)."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks
from ..dispatch import register_cuda
from . import reference


@torch.library.custom_op("replayssm::commit", mutates_args=("cursor", "pending"))
def commit(cursor: Tensor, pending: Tensor, rows: Tensor, accepted: Tensor) -> None:
    """Accept the first ``accepted[b]`` pending entries of slot ``rows[b]``; drop the rest.

    A cursor move: nothing else is read or written. ``0 <= accepted[b] <=
    pending[rows[b]]`` (the T of that row's last verification).
    """
    _checks.check_commit(cursor, pending, rows, accepted)
    reference.commit(cursor, pending, rows, accepted)


@commit.register_fake
def _(cursor, pending, rows, accepted):
    return None


def _kernel():
    from .kernels import commit as launch

    return launch


register_cuda(commit, _checks.check_commit, reference.commit, _kernel)
