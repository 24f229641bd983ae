"""The math both families' PyTorch twins share (``mamba2/reference.py``, ``gdn/reference.py``).

The twins are the CPU path and what every Triton kernel is tested against.
They favour clarity over speed, but stay vectorised over rows and heads so
the CPU path is usable.

Conventions (SPEC §1-3):

* Mamba-2 state per head is ``(head_dim P, state_size N)``; GDN state per
  value head is ``(value_dim V, key_dim K)``. In both the key-like dimension
  (N or K) is the contiguous one.
* Head ``h`` of Mamba-2 uses group ``h // (heads // groups)``; value head
  ``h`` of GDN uses key head ``h // (value_heads // key_heads)``.
* Arithmetic runs in fp32 (fp64 when the inputs are fp64). Decay products are
  formed from direct sums of log-decays over each segment, never from
  differences of cumulative sums, so they do not lose digits to cancellation.

The replay step for T tokens of one row with committed cursor ``c``:

1. if ``c + T > window``, fold the ``c`` committed ring entries into the
   checkpoint (the only checkpoint write), and ``c = 0``;
2. compute the T outputs from the checkpoint (or its read copy, SPEC §4), the
   ``c`` ring entries and the causal terms among the T tokens;
3. write the T entries at ring positions ``c .. c+T-1``; with ``commit`` they
   are committed at once (``cursor = c + T``), otherwise they are pending
   until ``commit``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def segment_sums(log_decay: Tensor, query_positions: Tensor) -> tuple[Tensor, Tensor]:
    """Sums of log-decays over segments ending at each query position.

    Args:
        log_decay: ``(batch, E, heads)`` log-decays of a sequence of E entries.
        query_positions: ``(Q,)`` entry indices at which states are wanted.

    Returns:
        ``prefix (batch, Q, heads)``: sum of ``log_decay[0..m]`` (decay of the
        checkpoint up to and including entry m), and
        ``segment (batch, Q, E, heads)``: sum of ``log_decay[i+1..m]`` for
        ``i <= m`` (decay applied to entry i's update), ``-inf`` for ``i > m``
        so that ``exp`` gives exactly zero for non-causal terms.
    """
    num_entries = log_decay.shape[1]
    j = torch.arange(num_entries, device=log_decay.device)
    m = query_positions.to(log_decay.device)
    prefix_mask = (j[None, :] <= m[:, None]).to(log_decay.dtype)  # (Q, E)
    # segment_mask[q, i, j] = i < j <= m_q
    segment_mask = ((j[None, :, None] < j[None, None, :]) & (j[None, None, :] <= m[:, None, None])).to(log_decay.dtype)
    finite = torch.isfinite(log_decay)
    all_finite = _all_finite(finite)
    # The masks select by multiplying: a non-finite log-decay outside a segment (a later token's) would
    # give 0 x inf. So the sums run over the finite values, and the non-finite ones are added back only
    # to the segments that hold them.
    values = log_decay if all_finite else torch.where(finite, log_decay, torch.zeros((), dtype=log_decay.dtype, device=log_decay.device))
    prefix = torch.einsum("qj,bjh->bqh", prefix_mask, values)
    segment = torch.einsum("qij,bjh->bqih", segment_mask, values)
    if not all_finite:
        kinds = torch.stack([log_decay.isnan(), log_decay.isposinf(), log_decay.isneginf()], dim=-1).to(log_decay.dtype)
        prefix = prefix + _nonfinite_sum(torch.einsum("qj,bjhk->bqhk", prefix_mask, kinds))
        segment = segment + _nonfinite_sum(torch.einsum("qij,bjhk->bqihk", segment_mask, kinds))
    causal = j[None, :] <= m[:, None]  # (Q, E)
    segment = segment.masked_fill(~causal[None, :, :, None], float("-inf"))
    return prefix, segment


def _all_finite(finite: Tensor) -> bool:
    """Whether the fast path (plain sums) may be taken: only on the CPU, where the check costs no device sync
    (``materialize`` runs here on every device, maybe under CUDA graph capture: it takes the general path)."""
    return finite.device.type == "cpu" and bool(finite.all())


def _nonfinite_sum(counts: Tensor) -> Tensor:
    """The sum of the non-finite terms of a segment from their counts ``(..., 3)`` (NaN, +inf, -inf): 0 where
    it has none (exact counts: 0/1 masks times 0/1 indicators)."""
    nan, pos, neg = (counts[..., i] > 0 for i in range(3))
    out = torch.where(neg, float("-inf"), 0.0).to(counts.dtype)
    out = torch.where(pos, float("inf"), out)
    return torch.where(nan | (pos & neg), float("nan"), out)


def causal_sum(equation: str, weights: Tensor, values: Tensor, causal: Tensor) -> Tensor:
    """``einsum(equation, weights, values)`` over a sequence axis, where ``weights`` are 0 for terms outside
    ``causal`` ``(T, E)`` (token t's sum covers entries ``causal[t]``) and ``values`` ``(batch, E, heads, D)``
    may hold a non-finite entry that only later tokens reach (a draft token's): its 0 weight must not make
    0 x inf. Such entries are summed as 0 and make NaN exactly the outputs they are causal to.
    """
    finite = torch.isfinite(values)
    if _all_finite(finite):
        return torch.einsum(equation, weights, values)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    out = torch.einsum(equation, weights, torch.where(finite, values, zero))
    reached = torch.einsum("ti,bihd->bthd", causal.to(values.dtype), (~finite).to(values.dtype)) > 0
    return torch.where(reached, float("nan"), out)


def fold_weights(log_decay: Tensor) -> tuple[Tensor, Tensor]:
    """Decay of the checkpoint and of each entry's update at the end of a sequence."""
    num_entries = log_decay.shape[1]
    prefix, segment = segment_sums(log_decay, torch.tensor([num_entries - 1]))
    return prefix[:, 0], segment[:, 0]  # (batch, heads), (batch, E, heads)


def ring_valid(cursor: Tensor, window: int) -> Tensor:
    """``(batch, window)`` mask of ring slots holding committed entries."""
    return torch.arange(window, device=cursor.device)[None, :] < cursor[:, None]


def live_entries(ring: Tensor, valid: Tensor) -> Tensor:
    """``ring`` ``(batch, window, ...)`` with its dead entries (``valid`` False) replaced by 0.

    Dead entries (rolled back, reset, never written) may hold anything, NaN and inf included: they are
    selected out, never multiplied by 0 (0 x NaN is NaN). Live entries pass through unchanged.
    """
    mask = valid.view(valid.shape + (1,) * (ring.dim() - valid.dim()))
    return torch.where(mask, ring, torch.zeros((), dtype=ring.dtype, device=ring.device))


def scatter_ring(ring: Tensor, rows: Tensor, start: Tensor, values: Tensor) -> None:
    """``ring[rows[b], start[b] + t] = values[b, t]`` for every row b and token t."""
    num_tokens = values.shape[1]
    positions = start[:, None] + torch.arange(num_tokens, device=start.device)[None, :]
    ring[rows[:, None], positions] = values.to(ring.dtype)


def append_entries(rows: Tensor, start: Tensor, commit: bool, cursor: Tensor, pending: Tensor, *rings: tuple[Tensor, Tensor]) -> None:
    """Write the T new entries of each ring at ``start``; commit them or leave them pending."""
    num_tokens = rings[0][1].shape[1]
    for ring, values in rings:
        scatter_ring(ring, rows, start, values)
    if commit:
        cursor[rows] = (start + num_tokens).to(cursor.dtype)
        pending.index_fill_(0, rows, 0)
    else:
        cursor[rows] = start.to(cursor.dtype)
        pending.index_fill_(0, rows, num_tokens)


def store_fold(
    folded: Tensor, flush: Tensor, rows: Tensor, checkpoint: Tensor, read_checkpoint: Tensor | None, state: Tensor,
    read_scale: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """Store the fold of the flushing rows and return the state the outputs read, per row.

    The checkpoint (and the read copy, if any: SPEC §4) take the fold rounded to their dtypes (an fp8
    copy: quantised by rows, with ``read_scale``); the outputs read the read copy where there is one,
    else the checkpoint, as stored.
    """
    stored = folded.to(checkpoint.dtype)
    checkpoint[rows[flush]] = stored[flush]
    if read_checkpoint is not None:
        store_read_copy(read_checkpoint, read_scale, rows[flush], folded[flush])
        return read_copy(read_checkpoint, read_scale, rows, folded.dtype)
    return torch.where(flush[:, None, None, None], stored.to(folded.dtype), state)


# -- the read copy (SPEC §4): 16-bit values, or fp8 e4m3 values with an fp32 scale per row -------------

E4M3_MAX = 448.0


def quantize_rows_e4m3(state: Tensor) -> tuple[Tensor, Tensor]:
    """``state`` ``(..., N)`` as fp8 e4m3 values and an fp32 scale per row of N, from its fp32 values:
    ``scale = amax(|row|) / 448``, ``values = RNE(row / scale)`` saturated at +-448 (torch's cast rounds
    to nearest even). A row whose scale is 0 is divided by 1 (its values round to signed zeros). The
    twin of ``triton_helpers.quantize_rows_e4m3``."""
    s = state.float()
    amax = s.abs().amax(-1)
    # Divided by a tensor: a scalar divisor may be applied as a multiply by its reciprocal (on CUDA), not IEEE-rounded.
    scale = amax / torch.full_like(amax, E4M3_MAX)
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = (s / divisor[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return values, scale


def store_read_copy(read_checkpoint: Tensor, read_scale: Tensor | None, index: Tensor, state: Tensor) -> None:
    """Make ``state`` the read copy of slots ``index``: rounded to its dtype, or (with ``read_scale``)
    quantised by rows (``quantize_rows_e4m3``)."""
    if read_scale is None:
        read_checkpoint[index] = state.to(read_checkpoint.dtype)
    else:
        read_checkpoint[index], read_scale[index] = quantize_rows_e4m3(state)


def read_copy(read_checkpoint: Tensor, read_scale: Tensor | None, index: Tensor, dtype: torch.dtype) -> Tensor:
    """The read copy of slots ``index`` as the steps read it, in ``dtype``: its values, times their row's
    scale where there is one."""
    values = read_checkpoint[index].to(dtype)
    return values if read_scale is None else values * read_scale[index].to(dtype)[..., None]
