"""Bytes a decode step must move through device memory: conventional vs replay.

The model behind the kernel floors in the benchmarks and the figures in the
docs (SPEC §6). Per decode step (one token per row, ``batch`` rows):

* conventional: read the state and write it back, every token;
* replay, averaged over one window cycle of L steps: read the checkpoint
  every step, write it once per L steps (the flush step folds the ring in
  registers, so its read is the same read), read the committed ring entries
  (the schedule of ``ops.mamba2_step``: cursors L, 1, 2, ..., L-1 at the start
  of the L steps, so (L + 1) / 2 entries on average) and write one entry.
  With a read copy (``read_dtype``, SPEC §4) the L - 1 steps that do not
  flush read the copy instead; the flush step reads the checkpoint for its
  fold and writes both. GDN's exact fold with a copy also reads the copy at
  the flush (the gap between the two corrects the ring's d), and its ring
  entries carry beta. An fp8 copy (Mamba-2) is 1 byte per value plus a 4-byte
  scale per row of ``state_size`` values.

Both also read the step's inputs and write its outputs once; those bytes
are listed separately so a floor can include or exclude them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SCALED_READ_DTYPES
from .state import GDNGeometry, Mamba2Geometry


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class Traffic:
    """Bytes per decode step for the whole batch; ``*_state`` excludes inputs/outputs."""

    conventional_state: float
    replay_state: float
    io: float
    checkpoint_bytes: int  # one copy of the state for the whole batch
    ring_entry_bytes: int  # one ring entry for the whole batch
    window: int

    @property
    def conventional(self) -> float:
        return self.conventional_state + self.io

    @property
    def replay(self) -> float:
        return self.replay_state + self.io

    @property
    def ratio(self) -> float:
        """How many times fewer bytes replay moves than conventional decoding."""
        return self.conventional / self.replay

    @property
    def state_bytes_written_per_token_conventional(self) -> float:
        return float(self.checkpoint_bytes)

    @property
    def state_bytes_written_per_token_replay(self) -> float:
        return self.checkpoint_bytes / self.window + self.ring_entry_bytes


def decode_traffic(
    geometry: Mamba2Geometry | GDNGeometry,
    batch: int,
    window: int = 16,
    state_dtype: torch.dtype = torch.float32,
    input_dtype: torch.dtype = torch.bfloat16,
    ring_dtype: torch.dtype | None = None,
    read_dtype: torch.dtype | None = None,
) -> Traffic:
    """Bytes per decode step (T = 1) for one layer; ``ring_dtype`` and ``read_dtype`` as in ``ReplayConfig``."""
    if batch < 1 or window < 1:
        raise ValueError(f"decode_traffic: batch and window must be >= 1, got batch={batch}, window={window}")
    s_state, s_in, f32 = _size(state_dtype), _size(input_dtype), 4
    scales = 0  # bytes of an fp8 read copy's scales
    if isinstance(geometry, Mamba2Geometry):
        g = geometry
        s_ring = _size(ring_dtype or input_dtype)
        state = g.heads * g.head_dim * g.state_size * s_state
        if read_dtype in SCALED_READ_DTYPES:
            scales = g.heads * g.head_dim * f32
        entry = g.heads * g.head_dim * s_ring + g.groups * g.state_size * s_ring + 2 * g.heads * f32
        # x, z in; y out; B, C; dt; parameters (A, D, dt_bias) are negligible.
        io = 3 * g.heads * g.head_dim * s_in + 2 * g.groups * g.state_size * s_in + g.heads * s_in
    elif isinstance(geometry, GDNGeometry):
        if read_dtype in SCALED_READ_DTYPES:
            raise ValueError(f"decode_traffic: read_dtype {read_dtype}: fp8 read copies (ReplayConfig.read_dtype) are Mamba-2-only for now")
        g = geometry
        s_ring = _size(ring_dtype or torch.float32)
        state = g.value_heads * g.value_dim * g.key_dim * s_state
        entry = g.key_heads * g.key_dim * s_ring + g.value_heads * g.value_dim * f32 + g.value_heads * f32
        # q, k, v in; o out; g, beta.
        io = 2 * g.key_heads * g.key_dim * s_in + 2 * g.value_heads * g.value_dim * s_in + 2 * g.value_heads * s_in
    else:
        raise TypeError(f"decode_traffic: geometry must be a Mamba2Geometry or GDNGeometry, got {type(geometry).__name__}")
    conventional = 2 * state
    exact_copy_fold = read_dtype is not None and isinstance(geometry, GDNGeometry)
    if exact_copy_fold:
        entry += g.value_heads * f32  # ring_beta
    ring_reads = (window + 1) / 2 * entry
    if read_dtype is None:
        replay = state + state / window + ring_reads + entry
    else:
        read = state // s_state * _size(read_dtype) + scales
        flush = 2 * state + (2 if exact_copy_fold else 1) * read
        replay = read * (window - 1) / window + flush / window + ring_reads + entry
    return Traffic(
        conventional_state=batch * conventional,
        replay_state=batch * replay,
        io=batch * io,
        checkpoint_bytes=batch * state,
        ring_entry_bytes=batch * entry,
        window=window,
    )
