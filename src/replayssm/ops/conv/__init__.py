"""``causal_conv_step``: one decode step of the depthwise causal conv in front of the recurrence."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks
from ..dispatch import register_cuda
from . import reference


@torch.library.custom_op("replayssm::causal_conv_step", mutates_args=("window",))
def causal_conv_step(x: Tensor, weight: Tensor, bias: Tensor | None, window: Tensor, silu: bool) -> Tensor:
    """One decode step of the depthwise causal conv in front of a Mamba-2 or GDN recurrence.

    ``x`` ``(batch, channels)`` is the new column; ``window`` ``(batch, channels, width)`` (mutated)
    holds each channel's last ``width >= taps - 1`` inputs, oldest first, in x's dtype (transformers
    keeps ``width = taps``); ``weight`` ``(channels, taps)``, ``bias`` ``(channels,)`` or None. The output
    dots each channel's last ``taps`` inputs (the window's tail, then x) with its taps, adds the bias,
    applies SiLU if ``silu``, all in fp64, and rounds to x's dtype at the end (as torch rounds fp64:
    through fp32); the window then drops its oldest column and takes x. Returns ``(batch, channels)`` in
    x's dtype.
    """
    _checks.check_causal_conv_step(x, weight, bias, window)
    return reference.causal_conv_step(x, weight, bias, window, silu)


@causal_conv_step.register_fake
def _(x, weight, bias, window, silu):
    return x.new_empty(x.shape)


def _kernel():
    from .kernels import causal_conv_step as launch

    return launch


register_cuda(
    causal_conv_step, lambda x, weight, bias, window, silu: _checks.check_causal_conv_step(x, weight, bias, window), reference.causal_conv_step, _kernel
)
