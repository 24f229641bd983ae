"""The replayssm op surface: ``torch.library`` custom ops under ``replayssm::``.

Each op has one schema, one argument check (``_checks``), a fake
implementation for ``torch.compile``, and per-device implementations:

* the pure-PyTorch reference (``reference.py``) serves every device that has
  no dedicated kernel (the CPU path, and the reference the kernels are tested
  against);
* Triton kernels register themselves as the CUDA implementation where they
  exist (``triton/``).

The ops mutate the state tensors they are given and return only fresh
outputs (never a mutated input). ``ReplayState`` (``replayssm.state``) owns
the state tensors and is the convenient way to call them; docs/ops.md
documents the layouts and the exact contract.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _checks, reference
from ._checks import set_value_checks

__all__ = [
    "set_value_checks",
    "mamba2_step",
    "mamba2_materialize",
    "mamba2_conventional_step",
    "gdn_step",
    "gdn_materialize",
    "gdn_conventional_step",
    "commit",
    "causal_conv_step",
]

_MAMBA2_STATE = ("checkpoint", "ring_x", "ring_B", "ring_dt", "ring_logdecay", "cursor", "pending", "read_checkpoint")
_GDN_STATE = ("checkpoint", "ring_k", "ring_d", "ring_g", "cursor", "pending", "read_checkpoint", "ring_beta")


# ---------------------------------------------------------------------------
# Mamba-2
# ---------------------------------------------------------------------------


# The mutated optional arguments (read_checkpoint, ring_beta) carry no defaults on purpose: torch 2.11's
# ADInplaceOrView kernel for custom ops indexes the mutated arguments positionally, and the dispatcher drops
# trailing arguments equal to their defaults, so a default there fails every call (IndexError; H200 run,
# 2026-12-04). Pass None explicitly.
@torch.library.custom_op("replayssm::mamba2_step", mutates_args=_MAMBA2_STATE)
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

    ``read_checkpoint`` (mutated, or None; SPEC §4): an fp16 / bf16 copy of
    the checkpoint, same shape and strides. (No default: torch 2.11 drops a
    defaulted trailing argument before marking the mutated ones.) With it every output reads the
    copy instead of the checkpoint, and a flush writes both from its fp32
    fold (the copy rounded from the fold, not from the stored checkpoint).
    """
    _checks.check_mamba2_step(
        x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, read_checkpoint
    )
    return reference.mamba2_step(
        x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus,
        read_checkpoint,
    )  # fmt: skip


@mamba2_step.register_fake
def _(
    x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus,
    read_checkpoint,
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
    _check_mamba2_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows)
    return reference.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus)


@mamba2_conventional_step.register_fake
def _(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus):
    return x.new_empty(x.shape)


def _check_mamba2_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows) -> None:
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


# ---------------------------------------------------------------------------
# Gated DeltaNet
# ---------------------------------------------------------------------------


@torch.library.custom_op("replayssm::gdn_step", mutates_args=_GDN_STATE)
def gdn_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    checkpoint: Tensor,
    ring_k: Tensor,
    ring_d: Tensor,
    ring_g: Tensor,
    cursor: Tensor,
    pending: Tensor,
    rows: Tensor,
    commit: bool,
    use_qk_l2norm: bool,
    scale: float | None,
    read_checkpoint: Tensor | None,
    ring_beta: Tensor | None,
) -> Tensor:
    """Replay decode / verification step of a Gated DeltaNet layer for T tokens per row.

    Inputs: q, k ``(batch, T, key_heads, key_dim)``; v ``(batch, T,
        value_heads, value_dim)``; g ``(batch, T, value_heads)`` log-decay
        (alpha = exp(g)); beta ``(batch, T, value_heads)`` in (0, 1). Value
        head h uses key head ``h // (value_heads // key_heads)``. With
        ``use_qk_l2norm`` q and k are l2-normalised in fp32 first (eps 1e-6,
        as the Hugging Face and fla paths do); q is scaled by ``scale``
        (default ``key_dim ** -0.5``).

    State (mutated; see ``GDNReplayState``): checkpoint ``(slots, value_heads,
        value_dim, key_dim)``; ring_k ``(slots, window, key_heads, key_dim)``
        (the normalised keys); ring_d ``(slots, window, value_heads,
        value_dim)`` fp32 (corrected updates); ring_g ``(slots, window,
        value_heads)`` fp32; cursor, pending ``(slots,)`` int32.

    Same per-row behaviour as ``mamba2_step``; for T > 1 the corrected
    updates of the T tokens solve the unit lower-triangular system of SPEC §3.
    Returns o ``(batch, T, value_heads, value_dim)`` in v's dtype.

    ``read_checkpoint``: as for ``mamba2_step``. In decoding (T = 1) both
    reads of the state (``S q`` for the output and ``S k`` for the corrected
    update) come from the copy, so each d is the update of the state the
    steps read. With a copy, ``ring_beta`` ``(slots, window, value_heads)``
    fp32, laid out like ring_g (mutated; None without a copy) keeps each
    entry's beta, and the fold corrects every d by the gap between
    checkpoint and copy (SPEC §4: the copy never feeds the recurrence).
    Verification (T > 1) reads the checkpoint instead, storing beta +0 with
    its exact d, after folding rows whose ring ends in decode entries
    (docs/ops.md, "Read copy").
    """
    _checks.check_gdn_step(
        q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, scale, read_checkpoint, ring_beta
    )
    return reference.gdn_step(
        q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint,
        ring_beta,
    )  # fmt: skip


@gdn_step.register_fake
def _(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint, ring_beta
):  # fmt: skip
    return v.new_empty(v.shape)


@torch.library.custom_op("replayssm::gdn_materialize", mutates_args=())
def gdn_materialize(
    checkpoint: Tensor,
    ring_k: Tensor,
    ring_d: Tensor,
    ring_g: Tensor,
    cursor: Tensor,
    rows: Tensor,
    read_checkpoint: Tensor | None = None,
    ring_beta: Tensor | None = None,
) -> Tensor:
    """Exact committed state of ``rows``: ``(n, value_heads, value_dim, key_dim)``, fp32 (fp64 for an fp64 checkpoint).

    With a read copy, pass it and ``ring_beta``: the ring's d are corrected as the fold corrects them.
    """
    rings = {"ring_k": ring_k, "ring_d": ring_d, "ring_g": ring_g}
    _checks.check_materialize("gdn_materialize", checkpoint, rings, cursor, rows, read_checkpoint, ring_beta)
    return reference.gdn_materialize(checkpoint, ring_k, ring_d, ring_g, cursor, rows, read_checkpoint, ring_beta)


@gdn_materialize.register_fake
def _(checkpoint, ring_k, ring_d, ring_g, cursor, rows, read_checkpoint=None, ring_beta=None):
    dtype = torch.float64 if checkpoint.dtype == torch.float64 else torch.float32
    return checkpoint.new_empty((rows.shape[0],) + tuple(checkpoint.shape[1:]), dtype=dtype)


@torch.library.custom_op("replayssm::gdn_conventional_step", mutates_args=("state",))
def gdn_conventional_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    rows: Tensor,
    use_qk_l2norm: bool,
    scale: float | None,
) -> Tensor:
    """Conventional GDN decoding (the baseline): per token, read the state, update it, write it back.

    Same inputs as ``gdn_step``; ``state`` is ``(slots, value_heads,
    value_dim, key_dim)``.
    """
    _check_gdn_conventional(q, k, v, g, beta, state, rows)
    return reference.gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm, scale)


@gdn_conventional_step.register_fake
def _(q, k, v, g, beta, state, rows, use_qk_l2norm, scale):
    return v.new_empty(v.shape)


def _check_gdn_conventional(q, k, v, g, beta, state, rows) -> None:
    batch, num_tokens, value_heads, value_dim = v.shape
    key_heads, key_dim = k.shape[2], k.shape[3]
    _checks.check_conventional(
        "gdn_conventional_step",
        {
            "v": (v, (batch, num_tokens, value_heads, value_dim), "(batch, T, value_heads, value_dim)", False),
            "q": (q, (batch, num_tokens, key_heads, key_dim), "(batch, T, key_heads, key_dim)", False),
            "k": (k, (batch, num_tokens, key_heads, key_dim), "(batch, T, key_heads, key_dim)", False),
            "g": (g, (batch, num_tokens, value_heads), "(batch, T, value_heads)", False),
            "beta": (beta, (batch, num_tokens, value_heads), "(batch, T, value_heads)", False),
        },
        state,
        "(slots, value_heads, value_dim, key_dim)",
        (value_heads, value_dim, key_dim),
        rows,
    )
    if value_heads % key_heads:
        raise ValueError(f"replayssm.gdn_conventional_step: argument 'k' key_heads ({key_heads}) must divide value_heads ({value_heads})")


# ---------------------------------------------------------------------------
# commit
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# the causal conv in front of the SSM
# ---------------------------------------------------------------------------


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


# CUDA implementations (Triton) register themselves here; the reference above
# serves CUDA tensors for any op that has no kernel yet.
from .triton import register_cuda_kernels as _register_cuda_kernels  # noqa: E402

_register_cuda_kernels()
