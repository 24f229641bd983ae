"""Triton kernels: the CUDA implementations of the replayssm ops.

``register_cuda_kernels()`` registers each kernel family as the CUDA
implementation of its op. Until a family has kernels, CUDA tensors are
served by the PyTorch reference.
"""

from __future__ import annotations


def register_cuda_kernels() -> None:
    """Register the Triton implementations that exist (none yet)."""
