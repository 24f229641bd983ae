"""Argument checks shared by every implementation of an op.

Every backend (the PyTorch reference, the Triton kernels) calls the same
check before it touches any tensor, so a bad call raises a clear error that
names the argument and leaves the state bit-identical.

Shape, dtype and device checks read only tensor metadata. Checks of values
that live on the device (row indices, cursors, accepted counts) need a host
read; they run unless a CUDA graph is being captured (where a host read is
impossible; captured steps are expected to have been validated eagerly
first) or a trusted caller turned them off with ``set_value_checks(False)``
(or ``REPLAYSSM_VALUE_CHECKS=0``): on CUDA each is a host synchronisation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import Tensor

from ..config import SCALED_READ_DTYPES

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
ACCUM_DTYPES = (torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)
READ_DTYPES = (torch.float16, torch.bfloat16)


def _names(dtypes: Sequence[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


class ArgChecker:
    """Collects the expectations of one op call and raises on the first miss."""

    def __init__(self, op: str, device: torch.device):
        self.op = op
        self.device = device

    def fail(self, exc: type[Exception], arg: str, message: str) -> None:
        raise exc(f"replayssm.{self.op}: argument '{arg}' {message}")

    def tensor(
        self,
        arg: str,
        t: Tensor | None,
        shape: Sequence[int | None],
        layout: str,
        dtypes: Sequence[torch.dtype],
        optional: bool = False,
    ) -> None:
        """Check a tensor's presence, rank, shape (None = any size), dtype and device."""
        if t is None:
            if not optional:
                self.fail(ValueError, arg, "is required, got None")
            return
        if not isinstance(t, Tensor):
            self.fail(TypeError, arg, f"must be a torch.Tensor, got {type(t).__name__}")
        expected = tuple("*" if s is None else s for s in shape)
        if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape)):
            self.fail(ValueError, arg, f"must have shape {layout} = {expected}, got {tuple(t.shape)}")
        if t.dtype not in dtypes:
            self.fail(TypeError, arg, f"must have dtype in ({_names(dtypes)}), got {t.dtype}")
        if t.device != self.device:
            self.fail(ValueError, arg, f"must be on {self.device} like the other inputs, got {t.device}")

    def condition(self, ok: bool, exc: type[Exception], arg: str, message: str) -> None:
        if not ok:
            self.fail(exc, arg, message)


_value_checks = os.environ.get("REPLAYSSM_VALUE_CHECKS", "1") != "0"


def set_value_checks(enabled: bool) -> bool:
    """Turn the host-side checks of device values on or off; returns the previous setting.

    Off saves one host synchronisation per op call on CUDA; a bad row index
    or accepted count then corrupts state instead of raising. Shape, dtype
    and device checks always run.
    """
    global _value_checks
    previous, _value_checks = _value_checks, bool(enabled)
    return previous


def value_checks_enabled() -> bool:
    return _value_checks


def values_checkable(t: Tensor) -> bool:
    """Whether device values may be read on the host now (see the module docstring)."""
    if not _value_checks or torch.compiler.is_compiling():  # (traced code sees no values: the op checks them)
        return False
    if t.device.type == "cpu" or t.device.type == "meta":
        return t.device.type == "cpu"
    if t.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    return True


def check_rows_and_cursors(
    ck: ArgChecker, rows: Tensor, cursor: Tensor, pending: Tensor, slots: int, window: int, num_tokens: int | None
) -> None:
    """Rows must be distinct slots; their cursors must be consistent with the ring."""
    if not values_checkable(rows):
        return
    rows_host = rows.detach().cpu().long()
    if rows_host.numel() and (int(rows_host.min()) < 0 or int(rows_host.max()) >= slots):
        ck.fail(IndexError, "rows", f"must index slots in [0, {slots}), got {rows_host.tolist()}")
    if rows_host.unique().numel() != rows_host.numel():
        ck.fail(ValueError, "rows", f"must not repeat a slot, got {rows_host.tolist()}")
    c = cursor.detach().cpu().long()[rows_host]
    p = pending.detach().cpu().long()[rows_host]
    if bool(((c < 0) | (c > window) | (p < 0) | (c + p > window)).any()):
        ck.fail(
            RuntimeError,
            "cursor",
            f"is corrupt for rows {rows_host.tolist()}: cursor {c.tolist()}, pending {p.tolist()}, window {window}",
        )
    del num_tokens  # T <= window is a shape check, done by the caller


def _check_read_checkpoint(ck: ArgChecker, read_checkpoint, checkpoint: Tensor, layout: str, read_scale=None, scaled: bool = False) -> None:
    """The optional read copy (SPEC §4): the checkpoint's shape and strides (kernels address both with
    one set of strides), a 16-bit dtype, its own storage. ``scaled`` (Mamba-2): also fp8 e4m3, which
    comes with ``read_scale``, one fp32 scale per row of the state; elsewhere an fp8 copy is refused."""
    fp8 = isinstance(read_checkpoint, Tensor) and read_checkpoint.dtype in SCALED_READ_DTYPES
    if fp8 and not scaled:
        ck.fail(TypeError, "read_checkpoint", f"is {read_checkpoint.dtype}: fp8 read copies (ReplayConfig.read_dtype) are Mamba-2-only for now")
    dtypes = READ_DTYPES + SCALED_READ_DTYPES if scaled else READ_DTYPES
    ck.tensor("read_checkpoint", read_checkpoint, tuple(checkpoint.shape), layout, dtypes, optional=True)
    if scaled:
        _check_read_scale(ck, read_scale, read_checkpoint, checkpoint, layout, fp8)
    if read_checkpoint is None:
        return
    ck.condition(
        read_checkpoint.stride() == checkpoint.stride(),
        ValueError,
        "read_checkpoint",
        f"must have the checkpoint's strides {checkpoint.stride()}, got {read_checkpoint.stride()}",
    )
    ck.condition(
        read_checkpoint.untyped_storage().data_ptr() != checkpoint.untyped_storage().data_ptr(),
        ValueError,
        "read_checkpoint",
        "must not share storage with the checkpoint",
    )


def _check_read_scale(ck: ArgChecker, read_scale, read_checkpoint, checkpoint: Tensor, layout: str, fp8: bool) -> None:
    """An fp8 read copy's scales: present exactly with one, fp32, the checkpoint's shape less its last
    dimension (any strides: the kernels take them), in storage of their own."""
    if not fp8:
        ck.condition(read_scale is None, ValueError, "read_scale", "is only used with an fp8 read_checkpoint; pass None without one")
        return
    ck.condition(read_scale is not None, ValueError, "read_scale", f"is required with an {read_checkpoint.dtype} read_checkpoint, got None")
    rows_layout = layout.rsplit(",", 1)[0] + ")"  # one scale per row of the last dimension
    ck.tensor("read_scale", read_scale, tuple(checkpoint.shape[:-1]), rows_layout, (torch.float32,))
    shared = {t.untyped_storage().data_ptr() for t in (checkpoint, read_checkpoint)}
    ck.condition(
        read_scale.untyped_storage().data_ptr() not in shared, ValueError, "read_scale",
        "must not share storage with the checkpoint or the read copy",
    )  # fmt: skip


def check_mamba2_step(
    x, dt, A, B, C, D, dt_bias, z, checkpoint, ring_x, ring_B, ring_dt, ring_logdecay, cursor, pending, rows,
    read_checkpoint=None, read_scale=None,
) -> None:  # fmt: skip
    # The state tensors fix the geometry; the inputs are checked against them.
    ck = ArgChecker("mamba2_step", checkpoint.device if isinstance(checkpoint, Tensor) else torch.device("cpu"))
    ck.tensor("checkpoint", checkpoint, (None, None, None, None), "(slots, heads, head_dim, state_size)", STATE_DTYPES)
    slots, heads, head_dim, state_size = checkpoint.shape
    ck.tensor("ring_x", ring_x, (slots, None, heads, head_dim), "(slots, window, heads, head_dim)", FLOAT_DTYPES)
    window = ring_x.shape[1]
    ck.tensor("ring_B", ring_B, (slots, window, None, state_size), "(slots, window, groups, state_size)", FLOAT_DTYPES)
    groups = ring_B.shape[2]
    ck.condition(groups >= 1 and heads % groups == 0, ValueError, "ring_B", f"groups ({groups}) must divide heads ({heads})")
    ck.tensor("ring_dt", ring_dt, (slots, window, heads), "(slots, window, heads)", ACCUM_DTYPES)
    ck.tensor("ring_logdecay", ring_logdecay, (slots, window, heads), "(slots, window, heads)", ACCUM_DTYPES)
    ck.tensor("x", x, (None, None, heads, head_dim), "(batch, T, heads, head_dim)", FLOAT_DTYPES)
    batch, num_tokens = x.shape[:2]
    ck.condition(num_tokens >= 1, ValueError, "x", f"must carry at least one token (T >= 1), got T = {num_tokens}")
    ck.tensor("dt", dt, (batch, num_tokens, heads), "(batch, T, heads)", FLOAT_DTYPES)
    ck.tensor("A", A, (heads,), "(heads,)", FLOAT_DTYPES)
    ck.tensor("B", B, (batch, num_tokens, groups, state_size), "(batch, T, groups, state_size)", FLOAT_DTYPES)
    ck.tensor("C", C, (batch, num_tokens, groups, state_size), "(batch, T, groups, state_size)", FLOAT_DTYPES)
    ck.tensor("D", D, (heads,), "(heads,)", FLOAT_DTYPES, optional=True)
    ck.tensor("dt_bias", dt_bias, (heads,), "(heads,)", FLOAT_DTYPES, optional=True)
    ck.tensor("z", z, (batch, num_tokens, heads, head_dim), "(batch, T, heads, head_dim)", FLOAT_DTYPES, optional=True)
    _check_read_checkpoint(ck, read_checkpoint, checkpoint, "(slots, heads, head_dim, state_size)", read_scale, scaled=True)
    _check_cursor_rows(ck, "x", cursor, pending, rows, slots, batch, window, num_tokens)


def _check_ring_beta(ck: ArgChecker, ring_beta, read_checkpoint, ring_g: Tensor) -> None:
    """GDN's ring of betas: present exactly when there is a read copy (its exact fold needs them), laid
    out like ring_g (the kernels address both with one set of strides)."""
    if read_checkpoint is None:
        ck.condition(ring_beta is None, ValueError, "ring_beta", "is only used with a read_checkpoint; pass None without one")
        return
    ck.tensor("ring_beta", ring_beta, tuple(ring_g.shape), "(slots, window, value_heads)", (torch.float32, torch.float64))
    ck.condition(
        ring_beta.stride() == ring_g.stride(),
        ValueError,
        "ring_beta",
        f"must have ring_g's strides {ring_g.stride()}, got {ring_beta.stride()}",
    )


def check_gate_parameters(op: str, A_log, dt_bias, value_heads: int, device: torch.device) -> None:
    """The fused gates' parameters (``ops.gdn_step``): both or neither, ``(value_heads,)`` each."""
    ck = ArgChecker(op, device)
    missing, given = ("dt_bias", "A_log") if A_log is not None else ("A_log", "dt_bias")
    ck.condition(
        (A_log is None) == (dt_bias is None), ValueError, missing,
        f"is required with '{given}': the fused gates take both (pass neither for precomputed g and beta)",
    )  # fmt: skip
    ck.tensor("A_log", A_log, (value_heads,), "(value_heads,)", FLOAT_DTYPES, optional=True)
    ck.tensor("dt_bias", dt_bias, (value_heads,), "(value_heads,)", FLOAT_DTYPES, optional=True)
    for arg, t in (("A_log", A_log), ("dt_bias", dt_bias)):  # the kernels index them by head
        ck.condition(t is None or t.stride(0) == 1 or value_heads == 1, ValueError, arg, f"must be contiguous, got stride {None if t is None else t.stride()}")


def check_gdn_step(
    q, k, v, g, beta, checkpoint, ring_k, ring_d, ring_g, cursor, pending, rows, scale, read_checkpoint=None, ring_beta=None,
    A_log=None, dt_bias=None,
) -> None:  # fmt: skip
    ck = ArgChecker("gdn_step", checkpoint.device if isinstance(checkpoint, Tensor) else torch.device("cpu"))
    ck.tensor("checkpoint", checkpoint, (None, None, None, None), "(slots, value_heads, value_dim, key_dim)", STATE_DTYPES)
    slots, value_heads, value_dim, key_dim = checkpoint.shape
    ck.tensor("ring_k", ring_k, (slots, None, None, key_dim), "(slots, window, key_heads, key_dim)", FLOAT_DTYPES)
    window, key_heads = ring_k.shape[1], ring_k.shape[2]
    ck.condition(
        key_heads >= 1 and value_heads % key_heads == 0,
        ValueError,
        "ring_k",
        f"key_heads ({key_heads}) must divide value_heads ({value_heads})",
    )
    ck.tensor("ring_d", ring_d, (slots, window, value_heads, value_dim), "(slots, window, value_heads, value_dim)", ACCUM_DTYPES)
    ck.tensor("ring_g", ring_g, (slots, window, value_heads), "(slots, window, value_heads)", ACCUM_DTYPES)
    ck.tensor("v", v, (None, None, value_heads, value_dim), "(batch, T, value_heads, value_dim)", FLOAT_DTYPES)
    batch, num_tokens = v.shape[:2]
    ck.condition(num_tokens >= 1, ValueError, "v", f"must carry at least one token (T >= 1), got T = {num_tokens}")
    ck.tensor("q", q, (batch, num_tokens, key_heads, key_dim), "(batch, T, key_heads, key_dim)", FLOAT_DTYPES)
    ck.tensor("k", k, (batch, num_tokens, key_heads, key_dim), "(batch, T, key_heads, key_dim)", FLOAT_DTYPES)
    ck.tensor("g", g, (batch, num_tokens, value_heads), "(batch, T, value_heads)", FLOAT_DTYPES)
    ck.tensor("beta", beta, (batch, num_tokens, value_heads), "(batch, T, value_heads)", FLOAT_DTYPES)
    ck.condition(scale is None or scale > 0, ValueError, "scale", f"must be None or positive, got {scale}")
    check_gate_parameters("gdn_step", A_log, dt_bias, value_heads, ck.device)
    _check_read_checkpoint(ck, read_checkpoint, checkpoint, "(slots, value_heads, value_dim, key_dim)")
    _check_ring_beta(ck, ring_beta, read_checkpoint, ring_g)
    _check_cursor_rows(ck, "v", cursor, pending, rows, slots, batch, window, num_tokens)


def _check_cursor_rows(ck, token_arg, cursor, pending, rows, slots, batch, window, num_tokens) -> None:
    ck.condition(window >= 1, ValueError, "ring", f"window must be >= 1, got {window}")
    ck.condition(
        num_tokens <= window,
        ValueError,
        token_arg,
        f"carries T = {num_tokens} tokens per row, more than the ring window {window} allows; use a longer window",
    )
    ck.tensor("cursor", cursor, (slots,), "(slots,)", (torch.int32,))
    ck.tensor("pending", pending, (slots,), "(slots,)", (torch.int32,))
    ck.tensor("rows", rows, (batch,), "(batch,)", INDEX_DTYPES)
    check_rows_and_cursors(ck, rows, cursor, pending, slots, window, num_tokens)


def check_commit(cursor, pending, rows, accepted) -> None:
    ck = ArgChecker("commit", cursor.device if isinstance(cursor, Tensor) else torch.device("cpu"))
    ck.tensor("cursor", cursor, (None,), "(slots,)", (torch.int32,))
    slots = cursor.shape[0]
    ck.tensor("pending", pending, (slots,), "(slots,)", (torch.int32,))
    ck.tensor("rows", rows, (None,), "(batch,)", INDEX_DTYPES)
    ck.tensor("accepted", accepted, (rows.shape[0],), "(batch,)", INDEX_DTYPES)
    if not values_checkable(accepted):
        return
    rows_host = rows.detach().cpu().long()
    if rows_host.numel() and (int(rows_host.min()) < 0 or int(rows_host.max()) >= slots):
        ck.fail(IndexError, "rows", f"must index slots in [0, {slots}), got {rows_host.tolist()}")
    if rows_host.unique().numel() != rows_host.numel():
        ck.fail(ValueError, "rows", f"must not repeat a slot, got {rows_host.tolist()}")
    acc = accepted.detach().cpu().long()
    p = pending.detach().cpu().long()[rows_host]
    bad = (acc < 0) | (acc > p)
    if bool(bad.any()):
        ck.fail(
            ValueError,
            "accepted",
            f"must be in [0, pending tokens of the row]; got accepted {acc.tolist()} for pending {p.tolist()}",
        )


def check_materialize(op: str, checkpoint, rings: dict, cursor, rows, read_checkpoint=None, ring_beta=None) -> None:
    """``ring_beta`` (GDN): checked against ``rings["ring_g"]``, with the read copy."""
    ck = ArgChecker(op, checkpoint.device if isinstance(checkpoint, Tensor) else torch.device("cpu"))
    ck.tensor("checkpoint", checkpoint, (None, None, None, None), "(slots, heads, dim, key_dim)", STATE_DTYPES)
    slots = checkpoint.shape[0]
    window = None
    for name, t in rings.items():
        ck.tensor(name, t, (slots, window) + (None,) * (t.dim() - 2 if isinstance(t, Tensor) else 0), "(slots, window, ...)", FLOAT_DTYPES)
        window = t.shape[1]
    if "ring_g" in rings:
        _check_read_checkpoint(ck, read_checkpoint, checkpoint, "(slots, value_heads, value_dim, key_dim)")
        _check_ring_beta(ck, ring_beta, read_checkpoint, rings["ring_g"])
    ck.tensor("cursor", cursor, (slots,), "(slots,)", (torch.int32,))
    ck.tensor("rows", rows, (None,), "(n,)", INDEX_DTYPES)
    check_rows_and_cursors(ck, rows, cursor, torch.zeros_like(cursor), slots, window, None)


def check_conventional(op: str, ck_inputs: dict, state: Tensor, state_layout: str, state_shape: tuple, rows: Tensor) -> None:
    ck = ArgChecker(op, state.device if isinstance(state, Tensor) else torch.device("cpu"))
    for name, (t, shape, layout, optional) in ck_inputs.items():
        ck.tensor(name, t, shape, layout, FLOAT_DTYPES, optional=optional)
    ck.tensor("state", state, (None,) + tuple(state_shape), state_layout, STATE_DTYPES)
    batch = next(iter(ck_inputs.values()))[0].shape[0]
    ck.tensor("rows", rows, (batch,), "(batch,)", INDEX_DTYPES)
    if values_checkable(rows):
        rows_host = rows.detach().cpu().long()
        slots = state.shape[0]
        if rows_host.numel() and (int(rows_host.min()) < 0 or int(rows_host.max()) >= slots):
            ck.fail(IndexError, "rows", f"must index slots in [0, {slots}), got {rows_host.tolist()}")
        if rows_host.unique().numel() != rows_host.numel():
            ck.fail(ValueError, "rows", f"must not repeat a slot, got {rows_host.tolist()}")


def check_causal_conv_step(x, weight, bias, window) -> None:
    ck = ArgChecker("causal_conv_step", x.device if isinstance(x, Tensor) else torch.device("cpu"))
    ck.tensor("x", x, (None, None), "(batch, channels)", FLOAT_DTYPES)
    batch, channels = x.shape
    ck.tensor("weight", weight, (channels, None), "(channels, taps)", FLOAT_DTYPES)
    taps = weight.shape[1]
    ck.condition(taps >= 1, ValueError, "weight", "must have at least one tap, got 0")
    ck.tensor("bias", bias, (channels,), "(channels,)", FLOAT_DTYPES, optional=True)
    ck.tensor("window", window, (batch, channels, None), "(batch, channels, width)", (x.dtype,))
    ck.condition(
        window.shape[2] >= taps - 1,
        ValueError,
        "window",
        f"must hold at least taps - 1 = {taps - 1} columns, got width {window.shape[2]}",
    )
