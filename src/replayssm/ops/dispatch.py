"""Where each op call goes: the one place that decides between a Triton kernel and the PyTorch twin.

Every op is a ``torch.library.custom_op`` whose default implementation (every
device without a kernel: the CPU) runs the argument check and the family's
``reference``. ``register_cuda`` gives it a CUDA implementation that runs the
same check and then the Triton launcher, except in float64, which the
kernels do not compute in: those calls go to the reference. Kernel modules
(and Triton) are imported on the first CUDA call, so ``import replayssm``
initialises neither Triton nor CUDA; without Triton, CUDA calls keep the
reference.

Why ``custom_op`` + ``register_kernel("cuda")`` and not ``triton_op`` +
``wrap_triton``: the ops need a CPU reference implementation, ``mutates_args``
and a fake implementation on every torch the project supports (2.11 to 2.13);
under CUDA graphs, how decode loops run, both give the same kernels, and
``triton_op`` would only let ``torch.compile`` trace into the launchers.
docs/kernels.md, "Registration".
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch
from torch import Tensor


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def uses_float64(args) -> bool:
    return any(isinstance(a, Tensor) and a.dtype == torch.float64 for a in args)


def register_cuda(op, check: Callable, reference: Callable, kernel: Callable[[], Callable]) -> None:
    """Register ``op``'s CUDA implementation: ``check(*args)``, then ``kernel()(*args)``, or ``reference(*args)`` in fp64.

    ``kernel`` returns the launcher (importing its module on first use); the
    launcher has the reference's signature. ``check`` takes the op's arguments.
    """
    if not triton_available():
        return

    @op.register_kernel("cuda")
    def _(*args):
        check(*args)
        if uses_float64(args):
            return reference(*args)
        return kernel()(*args)
