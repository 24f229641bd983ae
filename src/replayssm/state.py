"""ReplayState: one layer's recurrent state as checkpoint + ring + cursors.

A state holds ``slots`` independent rows (requests). Each row has

* a **checkpoint**: the exact state after the row's last flush (and, with
  ``config.read_dtype``, a low-precision **read copy** of it that the steps
  read, with a scale per row of the state for an fp8 copy; SPEC §4);
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
from .ops.gdn import reference as gdn_reference
from .ops.replay_math import store_read_copy
from .config import SCALED_READ_DTYPES, ReplayConfig


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


RingLayout = list[tuple[str, tuple[int, ...], torch.dtype]]


def mamba2_ring_layout(geometry: Mamba2Geometry, window: int, ring_dtype: torch.dtype) -> RingLayout:
    """The ring tensors of one Mamba-2 slot: ``(name, shape, dtype)``, fp32 ones first.

    The one definition of the ring's layout: ``Mamba2ReplayState`` allocates
    it, and the vLLM plugin packs it into each slot's cache page.
    """
    g, L, f32 = geometry, window, torch.float32
    return [
        ("ring_dt", (L, g.heads), f32),
        ("ring_logdecay", (L, g.heads), f32),
        ("ring_x", (L, g.heads, g.head_dim), ring_dtype),
        ("ring_B", (L, g.groups, g.state_size), ring_dtype),
    ]


def gdn_ring_layout(geometry: GDNGeometry, window: int, key_dtype: torch.dtype, read_copy: bool) -> RingLayout:
    """The ring tensors of one GDN slot: ``(name, shape, dtype)``, fp32 ones first (see ``mamba2_ring_layout``).

    With a read copy the ring also keeps each entry's beta (``ring_beta``), which the exact fold needs.
    """
    g, L, f32 = geometry, window, torch.float32
    layout = [("ring_g", (L, g.value_heads), f32)]
    if read_copy:
        layout.append(("ring_beta", (L, g.value_heads), f32))
    return layout + [("ring_k", (L, g.key_heads, g.key_dim), key_dtype), ("ring_d", (L, g.value_heads, g.value_dim), f32)]


class ReplayState:
    """Base class: the tensors and row operations both families share.

    Subclasses give their ring's layout (``ring_layout``) and implement
    ``step``, ``conventional_step`` and ``materialize``. A state either
    allocates its tensors (the constructor) or wraps tensors owned elsewhere
    (``from_tensors``: vLLM's cache pages).
    """

    _ring_names: tuple[str, ...] = ()
    _geometry_type: type = object
    #: Whether the family's steps take a read copy with a scale per row (``SCALED_READ_DTYPES``: fp8).
    _scaled_read_copy: bool = False

    @classmethod
    def check_config(cls, config: ReplayConfig) -> None:
        """Raise ValueError if this family's states cannot take ``config`` (an fp8 read copy: Mamba-2 only)."""
        if config.read_dtype in SCALED_READ_DTYPES and not cls._scaled_read_copy:
            raise ValueError(
                f"{cls.__name__}: ReplayConfig.read_dtype={config.read_dtype} is not supported here: "
                "fp8 read copies are Mamba-2-only for now (use bfloat16 or float16)"
            )

    def _setup(self, geometry, slots: int, config: ReplayConfig | None, device: torch.device | str | None) -> None:
        name = type(self).__name__
        if not isinstance(geometry, self._geometry_type):
            raise TypeError(f"{name}: geometry must be a {self._geometry_type.__name__}, got {type(geometry).__name__}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"{name}: slots must be a positive int, got {slots!r}")
        self.config = config if config is not None else ReplayConfig()
        if not isinstance(self.config, ReplayConfig):
            raise TypeError(f"{name}: config must be a ReplayConfig, got {type(config).__name__}")
        self.check_config(self.config)
        self.geometry = geometry
        self.slots = slots
        self.window = self.config.window
        # "cuda" names the current GPU; tensors on it say "cuda:0" (or its index): compare like with like.
        self.device = torch.empty(0, device=device).device if device is not None else torch.device("cpu")

    def _allocate(self) -> None:
        """Zeroed tensors for every slot: checkpoint (and read copy, and its scales), the ring of ``ring_layout``, cursors."""
        shape = (self.slots,) + self.state_shape
        read_dtype = self.config.read_dtype
        self._bind(
            torch.zeros(shape, dtype=self.config.state_dtype, device=self.device),
            torch.zeros(shape, dtype=read_dtype, device=self.device) if read_dtype is not None else None,
            torch.zeros(shape[:-1], dtype=torch.float32, device=self.device) if read_dtype in SCALED_READ_DTYPES else None,
            {name: torch.zeros((self.slots,) + ring_shape, dtype=dtype, device=self.device) for name, ring_shape, dtype in self.ring_layout()},
            torch.zeros(self.slots, dtype=torch.int32, device=self.device),
            torch.zeros(self.slots, dtype=torch.int32, device=self.device),
        )

    def _bind(
        self, checkpoint: Tensor, read_checkpoint: Tensor | None, read_scale: Tensor | None, rings: dict[str, Tensor], cursor: Tensor,
        pending: Tensor,
    ) -> None:  # fmt: skip
        self.checkpoint = checkpoint
        self.read_checkpoint = read_checkpoint
        self.read_scale = read_scale
        self._ring_names = tuple(name for name, _, _ in self.ring_layout())
        for name in self._ring_names:
            setattr(self, name, rings[name])
        self.cursor = cursor
        self.pending = pending

    @classmethod
    def from_tensors(
        cls,
        geometry,
        checkpoint: Tensor,
        rings: dict[str, Tensor],
        cursor: Tensor,
        pending: Tensor,
        config: ReplayConfig | None = None,
        read_checkpoint: Tensor | None = None,
        read_scale: Tensor | None = None,
        **options,
    ) -> "ReplayState":
        """A state over tensors owned elsewhere (e.g. vLLM's cache pages); nothing is copied or zeroed.

        ``checkpoint`` is ``(slots,) + state_shape`` in ``config.state_dtype``;
        ``rings`` maps every name of ``ring_layout()`` to ``(slots,) + shape``
        in its dtype (any strides); ``cursor`` and ``pending`` are ``(slots,)``
        int32. ``read_checkpoint`` (with ``config.read_dtype``) is laid out like
        ``checkpoint``; ``read_scale`` (with an fp8 one) is ``(slots,) +
        state_shape[:-1]`` fp32. ``options``: the constructor's family options
        (``activation_dtype`` for Mamba-2). Every tensor is checked before the
        state is made.
        """
        state = cls.__new__(cls)
        if not isinstance(checkpoint, Tensor):
            raise TypeError(f"{cls.__name__}.from_tensors: checkpoint must be a Tensor, got {type(checkpoint).__name__}")
        state._setup(geometry, int(checkpoint.shape[0]), config, checkpoint.device)
        state._set_options(**options)
        slots, dev = state.slots, state.device
        expected = {"checkpoint": ((slots,) + state.state_shape, state.config.state_dtype), "cursor": ((slots,), torch.int32), "pending": ((slots,), torch.int32)}
        if state.config.read_dtype is not None:
            expected["read_checkpoint"] = ((slots,) + state.state_shape, state.config.read_dtype)
        elif read_checkpoint is not None:
            raise ValueError(f"{cls.__name__}.from_tensors: read_checkpoint given but config.read_dtype is None")
        if state.config.read_dtype in SCALED_READ_DTYPES:
            expected["read_scale"] = ((slots,) + state.state_shape[:-1], torch.float32)
        elif read_scale is not None:
            raise ValueError(f"{cls.__name__}.from_tensors: read_scale given but config.read_dtype is {state.config.read_dtype}, not fp8")
        expected.update({name: ((slots,) + shape, dtype) for name, shape, dtype in state.ring_layout()})
        given = dict(rings, checkpoint=checkpoint, read_checkpoint=read_checkpoint, read_scale=read_scale, cursor=cursor, pending=pending)
        unknown = set(rings) - set(expected)
        if unknown:
            raise ValueError(f"{cls.__name__}.from_tensors: rings has tensors the layout does not name: {sorted(unknown)}")
        for name, (shape, dtype) in expected.items():
            t = given.get(name)
            if not isinstance(t, Tensor):
                raise TypeError(f"{cls.__name__}.from_tensors: {name} must be a Tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape or t.dtype != dtype or t.device != dev:
                raise ValueError(
                    f"{cls.__name__}.from_tensors: {name} must be {shape} {dtype} on {dev}, got {tuple(t.shape)} {t.dtype} on {t.device}"
                )
        state._bind(checkpoint, read_checkpoint, read_scale, rings, cursor, pending)
        return state

    def _set_options(self) -> None:
        pass

    # -- the tensors -----------------------------------------------------------

    def _tensor_names(self) -> tuple[str, ...]:
        read = tuple(name for name in ("read_checkpoint", "read_scale") if getattr(self, name) is not None)
        return ("checkpoint",) + read + self._ring_names + ("cursor", "pending")

    def _store_checkpoint(self, rows: Tensor, state: Tensor) -> None:
        """Make ``state`` the checkpoint of ``rows``, each copy rounded from it to its own dtype (an fp8 copy
        quantised by rows from its fp32 values)."""
        self.checkpoint[rows] = state.to(device=self.device, dtype=self.checkpoint.dtype)
        if self.read_checkpoint is not None:
            store_read_copy(self.read_checkpoint, self.read_scale, rows, state.to(self.device))

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor of the state by name (checkpoint, read copy and its scales if any, ring, cursor, pending)."""
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

    def _check_inputs(self, op: str, optional: tuple[str, ...] = (), **tensors: Tensor | None) -> None:
        # Checked before dispatch: a non-tensor has no device to dispatch on, and a tensor on another
        # device would route the call to that device's kernel (or, for meta tensors, past every check).
        for name, t in tensors.items():
            if t is None and name in optional:
                continue
            if not isinstance(t, Tensor):
                raise TypeError(f"replayssm.{op}: argument '{name}' must be a Tensor, got {type(t).__name__}")
            if t.device != self.device:
                raise ValueError(f"replayssm.{op}: argument '{name}' must be on {self.device} like the state, got {t.device}")

    def _step_rows(self, rows, batch: int) -> Tensor:
        """A step's rows: ``rows``, or every slot when None (then the batch must be ``slots``)."""
        if rows is None and batch != self.slots:
            raise ValueError(
                f"{type(self).__name__}.step: rows=None means all {self.slots} slots, but the inputs have batch {batch}; "
                "pass rows (the slot of each batch row)"
            )
        return self._rows(rows)

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
        if self.read_scale is not None:
            self.read_scale[rows] = 0
        self.cursor[rows] = 0
        self.pending[rows] = 0

    def clear_ring(self, rows: Tensor | list[int] | None = None) -> None:
        """Empty the rings of ``rows`` and keep their checkpoints: for a checkpoint written in place (vLLM's prefill)."""
        rows = self._rows(rows)
        self.cursor[rows] = 0
        self.pending[rows] = 0

    def load(self, state: Tensor, rows: Tensor | list[int] | None = None) -> None:
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
    read_scale: Tensor | None = None

    def _empty_like(self, slots: int, config: ReplayConfig) -> "ReplayState":
        raise NotImplementedError

    def materialize(self, rows: Tensor | list[int] | None = None) -> Tensor:
        raise NotImplementedError


class Mamba2ReplayState(ReplayState):
    """Replay state of one Mamba-2 layer.

    Tensors (``L`` = window): checkpoint ``(slots, heads, head_dim,
    state_size)`` in ``config.state_dtype`` (read_checkpoint: the same in
    ``config.read_dtype``, or None; read_scale, with an fp8 read copy:
    ``(slots, heads, head_dim)`` fp32, else None); ring_x ``(slots, L, heads,
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

    _geometry_type = Mamba2Geometry
    _scaled_read_copy = True

    def __init__(
        self,
        geometry: Mamba2Geometry,
        slots: int,
        config: ReplayConfig | None = None,
        device: torch.device | str | None = None,
        activation_dtype: torch.dtype = torch.float32,
    ):
        self._setup(geometry, slots, config, device)
        self._set_options(activation_dtype)
        self._allocate()

    def _set_options(self, activation_dtype: torch.dtype = torch.float32) -> None:
        self.activation_dtype = activation_dtype

    @property
    def state_shape(self) -> tuple[int, int, int]:
        g = self.geometry
        return (g.heads, g.head_dim, g.state_size)

    def ring_layout(self) -> RingLayout:
        return mamba2_ring_layout(self.geometry, self.window, self.config.ring_dtype or self.activation_dtype)

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

        ``rows[b]`` is the slot of batch row b; None: every slot, in order. Reads no device value on the
        host when value checks are off or a CUDA graph is being captured (``ops.set_value_checks``).
        """
        self._check_inputs("mamba2_step", ("D", "dt_bias", "z"), x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, z=z)
        rows = self._step_rows(rows, x.shape[0])
        return ops.mamba2_step(
            x, dt, A, B, C, D, dt_bias, z,
            self.checkpoint, self.ring_x, self.ring_B, self.ring_dt, self.ring_logdecay, self.cursor, self.pending,
            rows, commit, dt_softplus, self.read_checkpoint, self.read_scale,
        )  # fmt: skip

    def conventional_step(
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
        dt_softplus: bool = True,
    ) -> Tensor:
        """The baseline: the conventional recurrence on the checkpoint, read and written every token
        (``ops.mamba2_conventional_step``); the ring is not used. For benchmarks and comparisons."""
        self._check_inputs("mamba2_conventional_step", ("D", "dt_bias", "z"), x=x, dt=dt, A=A, B=B, C=C, D=D, dt_bias=dt_bias, z=z)
        rows = self._step_rows(rows, x.shape[0])
        return ops.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, self.checkpoint, rows, dt_softplus)

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

    _geometry_type = GDNGeometry
    ring_beta: Tensor | None = None

    def __init__(
        self,
        geometry: GDNGeometry,
        slots: int,
        config: ReplayConfig | None = None,
        device: torch.device | str | None = None,
    ):
        self._setup(geometry, slots, config, device)
        self._allocate()

    @property
    def state_shape(self) -> tuple[int, int, int]:
        g = self.geometry
        return (g.value_heads, g.value_dim, g.key_dim)

    def ring_layout(self) -> RingLayout:
        return gdn_ring_layout(self.geometry, self.window, self.config.ring_dtype or torch.float32, self.config.read_dtype is not None)

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
        use_qk_l2norm: bool = True,
        scale: float | None = None,
        A_log: Tensor | None = None,
        dt_bias: Tensor | None = None,
    ) -> Tensor:
        """Decode (``commit=True``) or verify (``commit=False``) T tokens per row; see ``ops.gdn_step``.

        ``rows`` as for ``Mamba2ReplayState.step``. ``use_qk_l2norm`` (default True, as every supported
        model does): q and k are l2-normalised here; pass False only for keys already normalised.
        ``A_log``, ``dt_bias`` (the fused gates): ``g`` and ``beta`` are then the model's raw a and b, and
        the kernels form the gates (``ops.gdn_step``), as the integrations call it.
        """
        self._check_inputs("gdn_step", ("A_log", "dt_bias"), q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        rows = self._step_rows(rows, v.shape[0])
        return ops.gdn_step(
            q, k, v, g, beta,
            self.checkpoint, self.ring_k, self.ring_d, self.ring_g, self.cursor, self.pending,
            rows, commit, use_qk_l2norm, scale, self.read_checkpoint, self.ring_beta, A_log, dt_bias,
        )  # fmt: skip

    def conventional_step(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        rows: Tensor | list[int] | None = None,
        use_qk_l2norm: bool = True,
        scale: float | None = None,
        A_log: Tensor | None = None,
        dt_bias: Tensor | None = None,
    ) -> Tensor:
        """The baseline on the checkpoint (``ops.gdn_conventional_step``, the fused gates too); see
        ``Mamba2ReplayState.conventional_step``."""
        self._check_inputs("gdn_conventional_step", ("A_log", "dt_bias"), q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
        rows = self._step_rows(rows, v.shape[0])
        return ops.gdn_conventional_step(q, k, v, g, beta, self.checkpoint, rows, use_qk_l2norm, scale, A_log, dt_bias)

    def materialize(self, rows: Tensor | list[int] | None = None) -> Tensor:
        """Exact committed state ``(n, value_heads, value_dim, key_dim)`` in fp32; writes nothing."""
        rows = self._rows(rows)
        return ops.gdn_materialize(
            self.checkpoint, self.ring_k, self.ring_d, self.ring_g, self.cursor, rows, self.read_checkpoint, self.ring_beta
        )

    def fold(self, count: int | Tensor | list[int], rows: Tensor | list[int] | None = None) -> None:
        """``ReplayState.fold``. With a read copy, every entry of the rows is made exact first
        (``gdn_reference.gdn_settle_ring``): the entries the fold keeps were formed against the copy it
        replaces. The fold of exact entries is then the plain one."""
        if self.read_checkpoint is not None:
            rows_t = self._rows(rows)
            self._check_distinct(rows_t)
            self._counts(count, rows_t, "count")  # a bad count is refused before anything is written
            used = self.cursor[rows_t].long() + self.pending[rows_t].long()
            gdn_reference.gdn_settle_ring(
                self.checkpoint, self.read_checkpoint, self.ring_k, self.ring_d, self.ring_g, self.ring_beta, rows_t, used
            )
        super().fold(count, rows)
