"""Mamba-2 ops: ``mamba2_step`` (replay decode / verify), ``mamba2_materialize`` and the conventional baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks
from ..dispatch import register_cuda
from . import reference

MUTATED = ("checkpoint", "ring_x", "ring_B", "ring_dt", "ring_logdecay", "cursor", "pending", "read_checkpoint", "read_scale")


# The mutated optional arguments (read_checkpoint, read_scale, ring_beta) carry no defaults on purpose: torch 2.11's
# ADInplaceOrView kernel for custom ops indexes the mutated arguments positionally, and the dispatcher drops
# trailing arguments equal to their defaults, so a default there fails every call (IndexError on CUDA).
# Pass None explicitly.
@torch.library.custom_op("replayssm::mamba2_step", mutates_args=MUTATED)
def mamba2_step(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    z: Tensor | None,
    checkpoint: Tensor,
    ring_x: Tensor,
    ring_B: Tensor,
    ring_dt: Tensor,
    ring_logdecay: Tensor,
    cursor: Tensor,
    pending: Tensor,
    rows: Tensor,
    commit: bool,
    dt_softplus: bool,
    read_checkpoint: Tensor | None,
    read_scale: Tensor | None,
) -> Tensor:
    """Replay decode / verification step of a Mamba-2 layer for T tokens per row.

    Inputs (as Hugging Face and vLLM mixers have them, before the gated norm):
        x ``(batch, T, heads, head_dim)``; dt ``(batch, T, heads)`` raw, before
        ``dt_bias`` and softplus; A ``(heads,)`` negative; B, C ``(batch, T,
        groups, state_size)``; D ``(heads,)`` or None; dt_bias ``(heads,)`` or
        None; z ``(batch, T, heads, head_dim)`` or None (output multiplied by
        ``silu(z)``).

    State (mutated; see ``Mamba2ReplayState``): checkpoint ``(slots, heads,
        head_dim, state_size)``; ring_x ``(slots, window, heads, head_dim)``;
        ring_B ``(slots, window, groups, state_size)``; ring_dt and
        ring_logdecay ``(slots, window, heads)`` fp32; cursor and pending
        ``(slots,)`` int32. ``rows[b]`` is the slot of batch row b.

    Behaviour per row (SPEC §2-3): if ``cursor + T > window`` the committed
    ring is folded into the checkpoint first (the only checkpoint write);
    outputs come from checkpoint + committed ring + causal terms among the T
    tokens; the T entries are written past the cursor. ``commit=True``
    (standard decoding) commits them at once; ``commit=False``
    (verification) leaves them pending for ``commit``. Uncommitted entries of
    an earlier call are dropped. Returns y ``(batch, T, heads, head_dim)`` in
    x's dtype.

    ``read_checkpoint`` (mutated, or None; SPEC §4): an fp16 / bf16 / fp8
    e4m3 copy of the checkpoint, same shape and strides. (No default: torch
    2.11 drops a defaulted trailing argument before marking the mutated
    ones.) With it every output reads the copy instead of the checkpoint,
    and a flush writes both from its fp32 fold (the copy rounded from the
    fold, not from the stored checkpoint). ``read_scale`` (mutated, or None):
    with an fp8 copy (and only then), ``(slots, heads, head_dim)`` fp32, the
    scale of each row of ``state_size`` values: the copy holds
    ``RNE(row / scale)`` with ``scale = amax(|row|) / 448``, and reads
    multiply by the scale (docs/ops.md, "Read copy").
    """
    _checks.check_mamba2_step(
        x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, read_checkpoint,
        read_scale,
    )  # fmt: skip
    return reference.mamba2_step(
        x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus,
        read_checkpoint, read_scale,
    )  # fmt: skip


@mamba2_step.register_fake
def _(
    x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus,
    read_checkpoint, read_scale,
):  # fmt: skip
    return x.new_empty(x.shape)


@torch.library.custom_op("replayssm::mamba2_materialize", mutates_args=())
def mamba2_materialize(
    checkpoint: Tensor,
    ring_x: Tensor,
    ring_B: Tensor,
    ring_dt: Tensor,
    ring_logdecay: Tensor,
    cursor: Tensor,
    rows: Tensor,
) -> Tensor:
    """Exact committed state of ``rows``: ``(n, heads, head_dim, state_size)``, fp32 (fp64 for an fp64 checkpoint)."""
    _checks.check_materialize(
        "mamba2_materialize",
        checkpoint,
        {"ring_x": ring_x, "ring_B": ring_B, "ring_dt": ring_dt, "ring_logdecay": ring_logdecay},
        cursor,
        rows,
    )
    return reference.mamba2_materialize(checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, rows)


@mamba2_materialize.register_fake
def _(checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, rows):
    dtype = torch.float64 if checkpoint.dtype == torch.float64 else torch.float32
    return checkpoint.new_empty((rows.shape[0],) + tuple(checkpoint.shape[1:]), dtype=dtype)


@torch.library.custom_op("replayssm::mamba2_conventional_step", mutates_args=("state",))
def mamba2_conventional_step(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    z: Tensor | None,
    state: Tensor,
    rows: Tensor,
    dt_softplus: bool,
) -> Tensor:
    """Conventional Mamba-2 decoding (the baseline): per token, read the state, update it, write it back.

    Same inputs as ``mamba2_step``; ``state`` is ``(slots, heads, head_dim,
    state_size)``. T > 1 tokens are processed one after another.
    """
    check_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows)
    return reference.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus)


@mamba2_conventional_step.register_fake
def _(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus):
    return x.new_empty(x.shape)


def check_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows) -> None:
    batch, num_tokens, heads, head_dim = x.shape
    groups, state_size = B.shape[2], B.shape[3]
    _checks.check_conventional(
        "mamba2_conventional_step",
        {
            "x": (x, (batch, num_tokens, heads, head_dim), "(batch, T, heads, head_dim)", False),
            "dt": (dt, (batch, num_tokens, heads), "(batch, T, heads)", False),
            "A": (A, (heads,), "(heads,)", False),
            "B": (B, (batch, num_tokens, groups, state_size), "(batch, T, groups, state_size)", False),
            "C": (C, (batch, num_tokens, groups, state_size), "(batch, T, groups, state_size)", False),
            "D": (D, (heads,), "(heads,)", True),
            "dt_bias": (dt_bias, (heads,), "(heads,)", True),
            "z": (z, (batch, num_tokens, heads, head_dim), "(batch, T, heads, head_dim)", True),
        },
        state,
        "(slots, heads, head_dim, state_size)",
        (heads, head_dim, state_size),
        rows,
    )
    if heads % groups:
        raise ValueError(f"replayssm.mamba2_conventional_step: argument 'B' groups ({groups}) must divide heads ({heads})")


def _check_step(x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus, read_checkpoint, read_scale):  # fmt: skip
    _checks.check_mamba2_step(x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, read_checkpoint, read_scale)  # fmt: skip


def _step_kernel():
    from .kernels import mamba2_step as launch

    return launch


def _conventional_kernel():
    from .conventional import mamba2_conventional_step as launch

    return launch


register_cuda(mamba2_step, _check_step, reference.mamba2_step, _step_kernel)
register_cuda(
    mamba2_conventional_step,
    lambda x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus: check_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows),
    reference.mamba2_conventional_step,
    _conventional_kernel,
)
