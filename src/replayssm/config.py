"""The user's choices for replay decoding, validated once on construction."""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Checkpoint dtypes that work today (the fold is always computed in fp32).
CHECKPOINT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Dtypes the ring may keep activation copies in (Mamba-2 x and B, GDN k).
RING_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Dtypes of the read copy of the checkpoint (SPEC §4): what every step's
#: outputs read, written at each flush from the fp32 fold. fp8 e4m3 comes
#: with a scale per row of the state (Mamba-2 only for now).
READ_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
#: Read dtypes stored as values plus an fp32 scale per row (``read_scale``).
SCALED_READ_DTYPES = (torch.float8_e4m3fn,)
#: Windows above this are refused: the ring is re-read every step, so a long
#: window trades checkpoint writes for ring reads and stops paying off well
#: before this (see replayssm.traffic).
MAX_WINDOW = 256


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class ReplayConfig:
    """How a replay state is laid out.

    Args:
        window: ring length L. A row folds its ring into the checkpoint (one
            checkpoint write) once per L committed tokens. Speculative
            verification of T tokens needs ``T <= window``.
        state_dtype: dtype of the checkpoint (the recurrence copy). fp32 by
            default; fp16 and bf16 halve its traffic at the cost of rounding
            that accumulates at every flush.
        ring_dtype: dtype of the activation copies the ring keeps (Mamba-2's
            x and B, GDN's normalised k). ``None`` keeps Mamba-2 activations
            in the dtype the layer runs in and GDN keys in fp32 (they are
            normalised in fp32, and rounding them would put bf16 error into
            every fold). Quantities computed in fp32 (dt, log-decays, GDN's
            corrected update) are always kept in fp32.
        read_dtype: dtype of a second, low-precision copy of the checkpoint
            that the steps read (SPEC §4): fp16, bf16 or fp8 e4m3
            (``torch.float8_e4m3fn``), or ``None`` (the default) for reads
            from the checkpoint itself. A flush writes both copies from its
            fp32 fold; every other step reads the read copy only, so a
            non-flush step moves half the checkpoint bytes of an fp32 read
            (16-bit copies), or about a quarter (fp8). An fp8 copy keeps an
            fp32 scale per row of the state (``read_scale``: amax / 448 of
            the row's ``state_size`` values; docs/ops.md) and is Mamba-2-only
            for now: a GDN state refuses it. The checkpoint
            (``state_dtype``) still carries the recurrence: Mamba-2's
            recurrence never sees the read copy's rounding, only its outputs
            do. GDN's does at one remove: the
            corrected update ``d = beta (v - S k)`` is computed from the read
            copy (SPEC §5: GDN reads with q and k), then folded exactly.
    """

    window: int = 16
    state_dtype: torch.dtype = torch.float32
    ring_dtype: torch.dtype | None = None
    read_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int):
            raise TypeError(f"ReplayConfig.window must be an int, got {type(self.window).__name__}")
        if not 1 <= self.window <= MAX_WINDOW:
            raise ValueError(f"ReplayConfig.window must be in [1, {MAX_WINDOW}], got {self.window}")
        if self.state_dtype not in CHECKPOINT_DTYPES:
            names = ", ".join(_dtype_name(d) for d in CHECKPOINT_DTYPES)
            raise ValueError(f"ReplayConfig.state_dtype must be one of {names}, got {self.state_dtype}")
        if self.ring_dtype is not None and self.ring_dtype not in RING_DTYPES:
            names = ", ".join(_dtype_name(d) for d in RING_DTYPES)
            raise ValueError(f"ReplayConfig.ring_dtype must be None or one of {names}, got {self.ring_dtype}")
        if self.read_dtype is not None and self.read_dtype not in READ_DTYPES:
            names = ", ".join(_dtype_name(d) for d in READ_DTYPES)
            raise ValueError(f"ReplayConfig.read_dtype must be None or one of {names}, got {self.read_dtype}")
