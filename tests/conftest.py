"""Test-wide settings.

Without a GPU, Triton kernels run under the interpreter: the variable must be
set before any kernel module is imported, so it is set here, first.

The interpreter (Triton 3.9) truncates fp32 -> bf16 casts, where the GPU
rounds to nearest even (``cvt.rn.bf16.f32``).
Kernels whose bf16 stores are compared exactly with torch's rounding (the
read copy of the checkpoint, tests/test_read_copy.py) need the GPU's
semantics, so the interpreter's cast is made to round like torch here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _round_bf16_casts_to_nearest_even() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    truncating = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16).view(torch.int16).numpy()
            return interpreter.TensorHandle(rounded.view(np.uint16), tl.bfloat16)
        return truncating(self, src, dst_type)

    builder.cast_impl = cast_impl


if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        _round_bf16_casts_to_nearest_even()
    except ImportError:  # no Triton: the kernel tests skip themselves
        pass

HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_cuda)
