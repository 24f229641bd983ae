"""The PyTorch twin of ``causal_conv_step``."""

from __future__ import annotations

import torch
from torch import Tensor


def causal_conv_columns(inputs: Tensor, weight: Tensor, bias: Tensor | None, silu: bool) -> Tensor:
    """One output column per row and channel from its last ``taps`` inputs ``(batch, channels, taps)``.

    Computed in fp64 and rounded to ``inputs``' dtype at the end: products of 16-bit (and fp32) values
    are exact in fp64, so implementations that sum in fp64 (the Triton kernel, an eager step, an
    inductor-fused one, which would otherwise round intermediates differently) differ by about 1e-16
    relative before that rounding, which practically never reaches a 16-bit result.
    """
    out = (inputs.double() * weight.double()).sum(-1)
    if bias is not None:
        out = out + bias.double()
    if silu:
        out = torch.nn.functional.silu(out)
    return out.to(inputs.dtype)


def causal_conv_step(x: Tensor, weight: Tensor, bias: Tensor | None, window: Tensor, silu: bool) -> Tensor:
    """Depthwise causal conv of one new column ``x`` ``(batch, channels)`` after ``window`` ``(batch,
    channels, width)`` (the last ``width`` inputs, oldest first); the window moves on by one column in
    place. ``weight`` ``(channels, taps)``, ``width >= taps - 1``. Returns ``(batch, channels)`` in x's dtype.
    """
    taps = weight.shape[1]
    extended = torch.cat([window, x[..., None]], dim=-1)
    out = causal_conv_columns(extended[..., extended.shape[-1] - taps :], weight, bias, silu)
    window.copy_(extended[..., 1:])
    return out
