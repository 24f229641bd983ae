"""Triton kernels: the CUDA implementations of the replayssm ops.

``register_cuda_kernels()`` registers, for CUDA tensors, thin wrappers that
run the op's argument check and then the Triton launcher. Kernel modules
(and Triton itself) are imported on the first CUDA call, so ``import
replayssm`` imports no Triton and initialises no CUDA; without Triton every
op keeps its PyTorch reference.

Why ``custom_op`` + ``register_kernel("cuda")`` rather than
``torch.library.triton_op`` + ``wrap_triton``: the ops are defined once in
``replayssm.ops`` with ``custom_op`` (schema, ``mutates_args``, fake
implementation, CPU reference), and a device kernel is registered on them.
``triton_op`` would let ``torch.compile`` trace into the launchers and fuse
around them; under CUDA graphs (how decode loops run) the two are the same
kernels. Switching is a change to ``replayssm/ops/__init__.py`` only: define
the CUDA ops with ``triton_op`` and call these launchers with ``wrap_triton``.

``commit`` has a kernel too (a cursor move the reference cannot do inside a
CUDA graph); ``materialize`` keeps the reference (off the hot path), as do
fp64 calls (the kernels compute in fp32).

Layout: ``mamba2.py`` and ``gdn.py`` hold one family each (kernels and
launchers, each launcher with the signature of its reference twin in
``ops/reference.py``); ``conv.py`` the decode step of the causal conv in
front of both; ``commit.py`` the cursor move; ``configs.py`` the
hand-picked launch table; ``common.py`` shared jit helpers.
"""

from __future__ import annotations

import importlib
import importlib.util

_FAMILY = {
    "mamba2_step": "mamba2",
    "mamba2_conventional_step": "mamba2",
    "gdn_step": "gdn",
    "gdn_conventional_step": "gdn",
    "commit": "commit",
    "causal_conv_step": "conv",
}


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _launcher(op_name: str):
    module = importlib.import_module(f"{__name__}.{_FAMILY[op_name]}")
    return getattr(module, op_name)


def register_cuda_kernels() -> None:
    """Register the Triton implementations as the CUDA kernels of the replayssm ops.

    Each one runs the same argument check as the reference path first; the
    kernel module is imported on its first call.
    """
    if not triton_available():
        return
    from .. import _check_gdn_conventional, _check_mamba2_conventional, _checks
    from .. import causal_conv_step, commit, gdn_conventional_step, gdn_step, mamba2_conventional_step, mamba2_step

    @mamba2_step.register_kernel("cuda")
    def _(
        x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows, commit, dt_softplus,
        read_checkpoint,
    ):  # fmt: skip
        state = (checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows)
        _checks.check_mamba2_step(x, dt, A, B, C, D, dt_bias, z, *state, read_checkpoint)
        return _launcher("mamba2_step")(x, dt, A, B, C, D, dt_bias, z, *state, commit, dt_softplus, read_checkpoint)

    @mamba2_conventional_step.register_kernel("cuda")
    def _(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus):
        _check_mamba2_conventional(x, dt, A, B, C, D, dt_bias, z, state, rows)
        return _launcher("mamba2_conventional_step")(x, dt, A, B, C, D, dt_bias, z, state, rows, dt_softplus)

    @gdn_step.register_kernel("cuda")
    def _(
        q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, commit, use_qk_l2norm, scale, read_checkpoint,
        ring_beta,
    ):  # fmt: skip
        state = (checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows)
        _checks.check_gdn_step(q, k, v, g, beta, *state, scale, read_checkpoint, ring_beta)
        return _launcher("gdn_step")(q, k, v, g, beta, *state, commit, use_qk_l2norm, scale, read_checkpoint, ring_beta)

    @gdn_conventional_step.register_kernel("cuda")
    def _(q, k, v, g, beta, state, rows, use_qk_l2norm, scale):
        _check_gdn_conventional(q, k, v, g, beta, state, rows)
        return _launcher("gdn_conventional_step")(q, k, v, g, beta, state, rows, use_qk_l2norm, scale)

    @commit.register_kernel("cuda")
    def _(cursor, pending, rows, accepted):
        _checks.check_commit(cursor, pending, rows, accepted)
        _launcher("commit")(cursor, pending, rows, accepted)

    @causal_conv_step.register_kernel("cuda")
    def _(x, weight, bias, window, silu):
        _checks.check_causal_conv_step(x, weight, bias, window)
        return _launcher("causal_conv_step")(x, weight, bias, window, silu)
