"""ReplayState: one layer's recurrent state as checkpoint + ring + cursors.

A state holds ``slots`` independent rows (requests). Each row has

* a **checkpoint**: the exact state after the row's last flush (and, with
  ``config.read_dtype``, a low-precision **read copy** of it that the steps
  read; SPEC §4);
* a **ring** of ``window`` entries: what the tokens since then added
  (Mamba-2: x, B, dt, dt*A; GDN: normalised k, corrected update d, log-decay g);
* a **cursor**: how many ring entries are committed, and **pending**: how
  many entries past the cursor a verification wrote but nobody committed yet.

The current state of a row is ``materialize(rows)``. Steps go through the
``replayssm::*_step`` ops; see ``replayssm.ops`` and docs/ops.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from . import ops
from .ops import reference
from .config import ReplayConfig


@dataclass(frozen=True)
class Mamba2Geometry:
    """Shape of one Mamba-2 layer's state: ``heads x head_dim x state_size``; B/C shared by ``groups``."""

    heads: int
    head_dim: int
    state_size: int
    groups: int

    def __post_init__(self) -> None:
        for name in ("heads", "head_dim", "state_size", "groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Mamba2Geometry.{name} must be a positive int, got {value!r}")
        if self.heads % self.groups:
            raise ValueError(f"Mamba2Geometry.groups ({self.groups}) must divide heads ({self.heads})")


@dataclass(frozen=True)
class GDNGeometry:
    """Shape of one Gated DeltaNet layer's state: ``value_heads x value_dim x key_dim``; keys shared by ``key_heads``."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    def __post_init__(self) -> None:
        for name in ("key_heads", "value_heads", "key_dim", "value_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GDNGeometry.{name} must be a positive int, got {value!r}")
        if self.value_heads % self.key_heads:
            raise ValueError(f"GDNGeometry.key_heads ({self.key_heads}) must divide value_heads ({self.value_heads})")


class ReplayState:
    """Base class: the tensors and row operations both families share.

    Subclasses name their ring tensors in ``_ring_names`` and implement
    ``step`` and ``materialize``.
    """

    _ring_names: tuple[str, ...] = ()

    def __init__(self, slots: int, config: ReplayConfig | None, device: torch.device | str | None):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"{type(self).__name__}: slots must be a positive int, got {slots!r}")
        self.config = config if config is not None else ReplayConfig()
        if not isinstance(self.config, ReplayConfig):
            raise TypeError(f"{type(self).__name__}: config must be a ReplayConfig, got {type(config).__name__}")
        self.slots = slots
        self.window = self.config.window
        # "cuda" names the current GPU; tensors on it say "cuda:0" (or its index): compare like with like.
        self.device = torch.empty(0, device=device).device if device is not None else torch.device("cpu")
        self.cursor = torch.zeros(slots, dtype=torch.int32, device=self.device)
        self.pending = torch.zeros(slots, dtype=torch.int32, device=self.device)

    # -- the tensors -----------------------------------------------------------

    def _tensor_names(self) -> tuple[str, ...]:
        read = ("read_checkpoint",) if self.read_checkpoint is not None else ()
        return ("checkpoint",) + read + self._ring_names + ("cursor", "pending")

    def _allocate_checkpoint(self, shape: tuple[int, ...]) -> None:
        """The checkpoint in ``config.state_dtype`` and, with ``config.read_dtype``, its read copy."""
        self.checkpoint = torch.zeros(shape, dtype=self.config.state_dtype, device=self.device)
        read_dtype = self.config.read_dtype
        self.read_checkpoint = torch.zeros(shape, dtype=read_dtype, device=self.device) if read_dtype is not None else None

    def _store_checkpoint(self, rows: Tensor, state: Tensor) -> None:
        """Make ``state`` the checkpoint of ``rows``, each copy rounded from it to its own dtype."""
        self.checkpoint[rows] = state.to(device=self.device, dtype=self.checkpoint.dtype)
        if self.read_checkpoint is not None:
            self.read_checkpoint[rows] = state.to(device=self.device, dtype=self.read_checkpoint.dtype)

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor of the state by name (checkpoint, read copy if any, ring, cursor, pending)."""
        return {name: getattr(self, name) for name in self._tensor_names()}

    @property
    def nbytes(self) -> int:
        """Device bytes held by the state (checkpoint, ring and cursors)."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @property
    def state_nbytes_per_row(self) -> int:
        """Bytes of one row's checkpoint: what a conventional decoder keeps per request."""
        return self.checkpoint[0].numel() * self.checkpoint.element_size()

    # -- row selection ---------------------------------------------------------

    def _rows(self, rows: Tensor | list[int] | range | None, arg: str = "rows") -> Tensor:
        """Normalise a row selection to an int64 tensor on the state's device and check it."""
        if rows is None:
            return torch.arange(self.slots, device=self.device)
        if not isinstance(rows, Tensor):
            rows = torch.tensor(list(rows), dtype=torch.int64)
        if rows.dim() != 1 or rows.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{type(self).__name__}: {arg} must be a 1-D integer tensor or list, got shape {tuple(rows.shape)} {rows.dtype}")
        rows = rows.to(device=self.device, dtype=torch.int64)
        if ops._checks.values_checkable(rows):
            host = rows.cpu()
            if host.numel() and (int(host.min()) < 0 or int(host.max()) >= self.slots):
                raise IndexError(f"{type(self).__name__}: {arg} must index slots in [0, {self.slots}), got {host.tolist()}")
        return rows

    def _check_devices(self, op: str, **tensors: Tensor | None) -> None:
        # Checked before dispatch: a tensor on another device would route the
        # call to that device's kernel (or, for meta tensors, past every check).
        for name, t in tensors.items():
            if isinstance(t, Tensor) and t.device != self.device:
                raise ValueError(f"replayssm.{op}: argument '{name}' must be on {self.device} like the state, got {t.device}")

    def _check_distinct(self, rows: Tensor, arg: str = "rows") -> None:
        if not ops._checks.values_checkable(rows):
            return
        host = rows.cpu()
        if host.unique().numel() != host.numel():
            raise ValueError(f"{type(self).__name__}: {arg} must not repeat a slot, got {host.tolist()}")

    # -- row operations ----------------------------------------------------------

    def reset(self, rows: Tensor | list[int] | None = None) -> None:
        """Start ``rows`` afresh: zero checkpoint, empty ring (a new request in that slot)."""
        rows = self._rows(rows)
        self.checkpoint[rows] = 0
        if self.read_checkpoint is not None:
            self.read_checkpoint[rows] = 0
        self.cursor[rows] = 0
        self.pending[rows] = 0

    def load(self, rows: Tensor | list[int] | None, state: Tensor) -> None:
        """Make ``state`` (e.g. what a prefill produced) the checkpoint of ``rows``; empties their rings.

        ``state`` has the layout of ``checkpoint`` with ``len(rows)`` rows; it
        is rounded to the checkpoint dtype (and to the read copy's, if any).
        """
        rows = self._rows(rows)
        self._check_distinct(rows)
        expected = (rows.shape[0],) + tuple(self.checkpoint.shape[1:])
        if not isinstance(state, Tensor) or tuple(state.shape) != expected:
            got = tuple(state.shape) if isinstance(state, Tensor) else type(state).__name__
            raise ValueError(f"{type(self).__name__}.load: state must have shape {expected}, got {got}")
        if not state.is_floating_point():
            raise TypeError(f"{type(self).__name__}.load: state must be a floating tensor, got {state.dtype}")
        self._store_checkpoint(rows, state)
        self.cursor[rows] = 0
        self.pending[rows] = 0

    def commit(self, accepted: Tensor | list[int], rows: Tensor | list[int] | None = None) -> None:
        """Accept the first ``accepted[i]`` entries of ``rows[i]``'s last verification; roll back the rest."""
        rows = self._rows(rows)
        if not isinstance(accepted, Tensor):
            accepted = torch.tensor(list(accepted), dtype=torch.int64)
        ops.commit(self.cursor, self.pending, rows, accepted.to(self.device))

    def _counts(self, count: int | Tensor | list[int], rows: Tensor, arg: str) -> Tensor:
        """Per-row counts as int64 on the device, checked against the rows' committed entries."""
        if isinstance(count, int):
            count = torch.full((rows.shape[0],), count, dtype=torch.int64, device=self.device)
        elif not isinstance(count, Tensor):
            count = torch.tensor(list(count), dtype=torch.int64, device=self.device)
        count = count.to(device=self.device, dtype=torch.int64)
        if count.shape != rows.shape:
            raise ValueError(f"{type(self).__name__}: {arg} must have one entry per row ({rows.shape[0]}), got shape {tuple(count.shape)}")
        committed = self.cursor[rows].long()
        if ops._checks.values_checkable(count) and bool(((count < 0) | (count > committed)).any()):
            raise ValueError(
                f"{type(self).__name__}: {arg} must be in [0, committed ring entries of the row]; "
                f"got {count.tolist()} for committed {committed.tolist()}"
            )
        return count

    def rollback(self, count: int | Tensor | list[int], rows: Tensor | list[int] | None = None) -> None:
        """Take back the last ``count[i]`` committed tokens of ``rows[i]``: a cursor move.

        Only tokens still in the ring can be taken back (``count <= cursor``):
        a flush makes the tokens before it final. Entries pending a commit are
        dropped.
        """
        rows = self._rows(rows)
        self._check_distinct(rows)
        count = self._counts(count, rows, "count")
        self.cursor[rows] = (self.cursor[rows].long() - count).to(self.cursor.dtype)
        self.pending.index_fill_(0, rows, 0)

    def fold(self, count: int | Tensor | list[int], rows: Tensor | list[int] | None = None) -> None:
        """Fold the first ``count[i]`` committed ring entries of ``rows[i]`` into its checkpoint.

        The later entries (committed and pending) move to the front of the
        ring, so they stay rollable. A partial flush: one checkpoint write per
        row, computed in fp32 and rounded to the checkpoint dtype.
        """
        rows = self._rows(rows)
        self._check_distinct(rows)
        count = self._counts(count, rows, "count")
        cursor = self.cursor[rows].clone()
        self.cursor[rows] = count.to(self.cursor.dtype)
        folded = self.materialize(rows)
        self.cursor[rows] = cursor
        self._store_checkpoint(rows, folded)
        # Entry j of each row becomes entry j + count of that row (beyond the end: unused copies).
        source = (torch.arange(self.window, device=self.device)[None, :] + count[:, None]).clamp_max(self.window - 1)
        for name in self._ring_names:
            ring = getattr(self, name)
            rows_ring = ring[rows]
            index = source.view(source.shape + (1,) * (rows_ring.dim() - 2)).expand_as(rows_ring)
            ring[rows] = rows_ring.gather(1, index)
        self.cursor[rows] = (cursor.long() - count).to(self.cursor.dtype)

    def resized(self, window: int) -> "ReplayState":
        """A copy of the state with another ring window (every row's entries must fit)."""
        config = dataclasses.replace(self.config, window=window)
        used = int((self.cursor.long() + self.pending.long()).max()) if self.slots else 0
        if used > window:
            raise ValueError(f"{type(self).__name__}.resized: window {window} cannot hold the {used} entries a row has")
        new = self._empty_like(self.slots, config)
        keep = min(window, self.window)
        for name, t in self.tensors().items():
            dst = getattr(new, name)
            if name in self._ring_names:
                dst[:, :keep].copy_(t[:, :keep])
            else:
                dst.copy_(t)
        return new

    def reorder(self, index: Tensor | list[int]) -> None:
        """In place: row i becomes a copy of old row ``index[i]`` (beam search; repeats allowed).

        ``index`` has one entry per slot. Tensors keep their storage, so
        buffers captured in a CUDA graph stay valid.
        """
        index = self._rows(index, arg="index")
        if index.shape[0] != self.slots:
            raise ValueError(f"{type(self).__name__}.reorder: index must have one entry per slot ({self.slots}), got {index.shape[0]}")
        for t in self.tensors().values():
            t.copy_(t.index_select(0, index))

    def select(self, rows: Tensor | list[int]) -> "ReplayState":
        """A new state holding copies of ``rows`` (in that order; repeats allowed): batch changes."""
        rows = self._rows(rows)
        new = self._empty_like(rows.shape[0], self.config)
        for name, t in self.tensors().items():
            getattr(new, name).copy_(t.index_select(0, rows))
        return new

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(slots={self.slots}, geometry={self.geometry}, window={self.window}, "
            f"state_dtype={self.checkpoint.dtype}, read_dtype={self.config.read_dtype}, device={self.device}, nbytes={self.nbytes})"
        )

    # subclass interface
    geometry: object
    checkpoint: Tensor
    read_checkpoint: Tensor | None = None

    def _empty_like(self, slots: int, config: ReplayConfig) -> "ReplayState":
        raise NotImplementedError

    def materialize(self, rows: Tensor | list[int] | None = None) -> Tensor:
        raise NotImplementedError


class Mamba2ReplayState(ReplayState):
    """Replay state of one Mamba-2 layer.

    Tensors (``L`` = window): checkpoint ``(slots, heads, head_dim,
    state_size)`` in ``config.state_dtype`` (read_checkpoint: the same in
    ``config.read_dtype``, or None); ring_x ``(slots, L, heads,
    head_dim)`` and ring_B ``(slots, L, groups, state_size)`` in the ring
    dtype; ring_dt and ring_logdecay ``(slots, L, heads)`` fp32; cursor and
    pending ``(slots,)`` int32.

    Args:
        geometry: the layer's state shape.
        slots: number of rows (requests) the state serves.
        config: window and dtypes (``ReplayConfig()`` by default).
        device: where the tensors live.
        activation_dtype: dtype the layer's activations arrive in; the ring
            keeps x and B in it unless ``config.ring_dtype`` says otherwise.
    """

    _ring_names = ("ring_x", "ring_B", "ring_dt", "ring_logdecay")

    def __init__(
        self,
        geometry: Mamba2Geometry,
        slots: int,
        config: ReplayConfig | None = None,
        device: torch.device | str | None = None,
        activation_dtype: torch.dtype = torch.float32,
    ):
        super().__init__(slots, config, device)
        if not isinstance(geometry, Mamba2Geometry):
            raise TypeError(f"Mamba2ReplayState: geometry must be a Mamba2Geometry, got {type(geometry).__name__}")
        self.geometry = geometry
        self.activation_dtype = activation_dtype
        g, L, dev = geometry, self.window, self.device
        ring_dtype = self.config.ring_dtype or activation_dtype
        self._allocate_checkpoint((slots, g.heads, g.head_dim, g.state_size))
        self.ring_x = torch.zeros(slots, L, g.heads, g.head_dim, dtype=ring_dtype, device=dev)
        self.ring_B = torch.zeros(slots, L, g.groups, g.state_size, dtype=ring_dtype, device=dev)
        self.ring_dt = torch.zeros(slots, L, g.heads, dtype=torch.float32, device=dev)
        self.ring_logdecay = torch.zeros(slots, L, g.heads, dtype=torch.float32, device=dev)

    def _empty_like(self, slots: int, config: ReplayConfig) -> "Mamba2ReplayState":
        return Mamba2ReplayState(self.geometry, slots, config, self.device, self.activation_dtype)

    def step(
        self,
        x: Tensor,
        dt: Tensor,
        A: Tensor,
        B: Tensor,
        C: Tensor,
        D: Tensor | None = None,
        dt_bias: Tensor | None = None,
        z: Tensor | None = None,
        rows: Tensor | list[int] | None = None,
        commit: bool = True,
        dt_softplus: bool = True,
    ) -> Tensor:
        """Decode (``commit=True``) or verify (``commit=False``) T tokens per row; see ``ops.mamba2_step``.

        ``rows`` defaults to ``0 .. batch-1``.
        """
        self._check_devices("mamba2_step", x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, z=z)
        rows = self._rows(rows if rows is not None else range(x.shape[0]))
        return ops.mamba2_step(
            x, dt, A, B, C, D, dt_bias, z,
            self.checkpoint, self.ring_x, self.ring_B, self.ring_dt, self.ring_logdecay, self.cursor, self.pending,
            rows, commit, dt_softplus, self.read_checkpoint,
        )  # fmt: skip

    def materialize(self, rows: Tensor | list[int] | None = None) -> Tensor:
        """Exact committed state ``(n, heads, head_dim, state_size)`` in fp32; writes nothing."""
        rows = self._rows(rows)
        return ops.mamba2_materialize(self.checkpoint, self.ring_x, self.ring_B, self.ring_dt, self.ring_logdecay, self.cursor, rows)


class GDNReplayState(ReplayState):
    """Replay state of one Gated DeltaNet layer.

    Tensors (``L`` = window): checkpoint ``(slots, value_heads, value_dim,
    key_dim)`` in ``config.state_dtype`` (read_checkpoint: the same in
    ``config.read_dtype``, or None; key_dim contiguous, as vLLM lays it
    out; Hugging Face keeps the transpose); ring_k ``(slots, L, key_heads,
    key_dim)`` (normalised keys, fp32 unless ``config.ring_dtype``); ring_d
    ``(slots, L, value_heads, value_dim)`` and ring_g ``(slots, L,
    value_heads)`` fp32; cursor and pending ``(slots,)`` int32. With a read
    copy also ring_beta ``(slots, L, value_heads)`` fp32: each decode entry's
    beta (-0 for 0), which the exact fold needs to correct its d; +0 for an
    exact d (a verify step's, or one a partial fold has settled;
    ``ops.gdn_step``).
    """

    _ring_names = ("ring_k", "ring_d", "ring_g")
    ring_beta: Tensor | None = None

    def __init__(
        self,
        geometry: GDNGeometry,
        slots: int,
        config: ReplayConfig | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__(slots, config, device)
        if not isinstance(geometry, GDNGeometry):
            raise TypeError(f"GDNReplayState: geometry must be a GDNGeometry, got {type(geometry).__name__}")
        self.geometry = geometry
        g, L, dev = geometry, self.window, self.device
        ring_dtype = self.config.ring_dtype or torch.float32
        self._allocate_checkpoint((slots, g.value_heads, g.value_dim, g.key_dim))
        self.ring_k = torch.zeros(slots, L, g.key_heads, g.key_dim, dtype=ring_dtype, device=dev)
        self.ring_d = torch.zeros(slots, L, g.value_heads, g.value_dim, dtype=torch.float32, device=dev)
        self.ring_g = torch.zeros(slots, L, g.value_heads, dtype=torch.float32, device=dev)
        if self.read_checkpoint is not None:
            self.ring_beta = torch.zeros(slots, L, g.value_heads, dtype=torch.float32, device=dev)
            self._ring_names = self._ring_names + ("ring_beta",)

    def _empty_like(self, slots: int, config: ReplayConfig) -> "GDNReplayState":
        return GDNReplayState(self.geometry, slots, config, self.device)

    def step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        rows: Tensor | list[int] | None = None,
        commit: bool = True,
        use_qk_l2norm: bool = False,
        scale: float | None = None,
    ) -> Tensor:
        """Decode (``commit=True``) or verify (``commit=False``) T tokens per row; see ``ops.gdn_step``."""
        self._check_devices("gdn_step", q=q, k=k, v=v, g=g, beta=beta)
        rows = self._rows(rows if rows is not None else range(v.shape[0]))
        return ops.gdn_step(
            q, k, v, g, beta,
            self.checkpoint, self.ring_k, self.ring_d, self.ring_g, self.cursor, self.pending,
            rows, commit, use_qk_l2norm, scale, self.read_checkpoint, self.ring_beta,
        )  # fmt: skip

    def materialize(self, rows: Tensor | list[int] | None = None) -> Tensor:
        """Exact committed state ``(n, value_heads, value_dim, key_dim)`` in fp32; writes nothing."""
        rows = self._rows(rows)
        return ops.gdn_materialize(
            self.checkpoint, self.ring_k, self.ring_d, self.ring_g, self.cursor, rows, self.read_checkpoint, self.ring_beta
        )

    def fold(self, count: int | Tensor | list[int], rows: Tensor | list[int] | None = None) -> None:
        """``ReplayState.fold``. With a read copy, every entry of the rows is made exact first
        (``reference.gdn_settle_ring``): the entries the fold keeps were formed against the copy it
        replaces. The fold of exact entries is then the plain one."""
        if self.read_checkpoint is not None:
            rows_t = self._rows(rows)
            self._check_distinct(rows_t)
            self._counts(count, rows_t, "count")  # a bad count is refused before anything is written
            used = self.cursor[rows_t].long() + self.pending[rows_t].long()
            reference.gdn_settle_ring(
                self.checkpoint, self.read_checkpoint, self.ring_k, self.ring_d, self.ring_g, self.ring_beta, rows_t, used
            )
        super().fold(count, rows)
