"""Gated DeltaNet ops: ``gdn_step`` (replay decode / verify), ``gdn_materialize`` and the conventional baseline."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _checks
from ..dispatch import register_cuda
from . import reference

MUTATED = ("checkpoint", "ring_k", "ring_d", "ring_g", "cursor", "pending", "read_checkpoint", "ring_beta")


@torch.library.custom_op("replayssm::gdn_step", mutates_args=MUTATED)
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
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
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

    Fused gates: with ``A_log`` and ``dt_bias`` ``(value_heads,)`` the op
    takes the model's raw gate inputs in place of the gates, a in ``g``'s
    place and b in ``beta``'s (same shapes), and forms them as the models
    do: ``g = -exp(A_log) softplus(a + dt_bias)`` in fp32, ``beta =
    sigmoid(b)`` rounded to b's dtype (``reference.gates``). This is what
    the integrations call: the gates cost no separate launches.
    """
    _checks.check_gdn_step(
        q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, scale, read_checkpoint, ring_beta, A_log, dt_bias
    )
    return reference.gdn_step(
        q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint,
        ring_beta, A_log, dt_bias,
    )  # fmt: skip


@gdn_step.register_fake
def _(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint, ring_beta,
    A_log=None, dt_bias=None,
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
    A_log: Tensor | None = None,
    dt_bias: Tensor | None = None,
) -> Tensor:
    """Conventional GDN decoding (the baseline): per token, read the state, update it, write it back.

    Same inputs as ``gdn_step`` (the fused gates too); ``state`` is
    ``(slots, value_heads, value_dim, key_dim)``.
    """
    check_conventional(q, k, v, g, beta, state, rows, A_log, dt_bias)
    return reference.gdn_conventional_step(q, k, v, g, beta, state, rows, use_qk_l2norm, scale, A_log, dt_bias)


@gdn_conventional_step.register_fake
def _(q, k, v, g, beta, state, rows, use_qk_l2norm, scale, A_log=None, dt_bias=None):
    return v.new_empty(v.shape)


def check_conventional(q, k, v, g, beta, state, rows, A_log=None, dt_bias=None) -> None:
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
    _checks.check_gate_parameters("gdn_conventional_step", A_log, dt_bias, value_heads, state.device)


def _check_step(q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint, ring_beta, A_log=None, dt_bias=None):  # fmt: skip
    _checks.check_gdn_step(q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, scale, read_checkpoint, ring_beta, A_log, dt_bias)  # fmt: skip


def _step_kernel():
    from .step import gdn_step as launch

    return launch


def _conventional_kernel():
    from .conventional import gdn_conventional_step as launch

    return launch


register_cuda(gdn_step, _check_step, reference.gdn_step, _step_kernel)
register_cuda(
    gdn_conventional_step,
    lambda q, k, v, g, beta, state, rows, use_qk_l2norm, scale, A_log=None, dt_bias=None: check_conventional(
        q, k, v, g, beta, state, rows, A_log, dt_bias
    ),
    reference.gdn_conventional_step,
    _conventional_kernel,
)
