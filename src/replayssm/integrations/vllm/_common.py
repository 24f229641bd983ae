"""What both layer adapters share: settings, start-up checks, the decode conv, batch layout.

The decode part of a vLLM step (single-token decoding, or speculative
verification of 1 + K tokens per row) is run by the replayssm ops; the
prefill part is handed to vLLM's own code with a prefill-only copy of the
batch metadata, and the state it writes becomes the row's checkpoint.

State per layer: the checkpoint **is** vLLM's own recurrent-state tensor
(``kv_cache[1]``: it is written by prefills and by replay flushes only); the
ring tensors are extra state tensors in each slot's page of vLLM's cache (so
vLLM counts them when it sizes the cache); the per-slot cursors are small
persistent tensors beside the pages. All are sized by vLLM's state slots.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from dataclasses import dataclass

import torch
from torch import Tensor

from ... import ops, speculation
from ...config import MAX_WINDOW, ReplayConfig
from ...state import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayState, gdn_ring_layout, mamba2_ring_layout

ENABLE_ENV = "REPLAYSSM_VLLM"
WINDOW_ENV = "REPLAYSSM_VLLM_WINDOW"
DEFAULT_WINDOW = 16

#: Architectures whose model class the plugin replaces so vLLM's cache sizing counts the ring
#: (``models.py``): architecture -> (class in replayssm.integrations.vllm.models, layer family).
ARCHITECTURES = {
    "NemotronHForCausalLM": ("ReplayNemotronHForCausalLM", "mamba2"),
    "Qwen3NextForCausalLM": ("ReplayQwen3NextForCausalLM", "gdn"),
}

#: How often the adapters ran: tests check that the plugin's layers are used.
COUNTS: collections.Counter = collections.Counter()


class ReplayConfigError(ValueError):
    """A vLLM configuration the adapter cannot honour; raised at start-up."""


def enabled() -> bool:
    """The switch: ``REPLAYSSM_VLLM=1`` (also ``true``, ``on``, ``yes``) turns the plugin on."""
    return os.environ.get(ENABLE_ENV, "").strip().lower() in ("1", "true", "on", "yes")


def window_from_env() -> int:
    raw = os.environ.get(WINDOW_ENV, "").strip()
    if not raw:
        return DEFAULT_WINDOW
    try:
        window = int(raw)
    except ValueError:
        raise ReplayConfigError(f"{WINDOW_ENV} must be an integer in [1, {MAX_WINDOW}], got {raw!r}") from None
    if not 1 <= window <= MAX_WINDOW:
        raise ReplayConfigError(f"{WINDOW_ENV} must be in [1, {MAX_WINDOW}], got {window}")
    return window


@dataclass(frozen=True)
class Settings:
    """The adapter's choices for one layer, checked against the vLLM config at construction."""

    window: int
    num_spec: int

    @property
    def tokens_per_step(self) -> int:
        """Tokens a decode row carries per step: 1, or 1 + K when verifying K drafts."""
        return 1 + self.num_spec


def settings_for(vllm_config, num_spec: int, layer: str) -> Settings:
    """Check the vLLM configuration for ``layer`` and return the settings (start-up errors here)."""
    arch = getattr(vllm_config.model_config, "architecture", None)
    if arch not in ARCHITECTURES:
        raise ReplayConfigError(
            f"replayssm vLLM adapter ({layer}): architecture {arch!r} is not supported yet "
            f"(supported: {', '.join(ARCHITECTURES)}): its cache sizing would not count the replay ring. "
            "Unset REPLAYSSM_VLLM to run it with stock vLLM."
        )
    cache = vllm_config.cache_config
    mode = getattr(cache, "mamba_cache_mode", "none")
    if mode != "none":
        raise ReplayConfigError(
            f"replayssm vLLM adapter ({layer}): prefix caching of Mamba/GDN states (mamba_cache_mode={mode!r}) "
            "is not supported: vLLM would cache the replay checkpoint, not the current state. "
            "Start vLLM with --no-enable-prefix-caching (LLM(..., enable_prefix_caching=False)), or unset REPLAYSSM_VLLM."
        )
    if getattr(cache, "use_replayssm", False):
        raise ReplayConfigError(
            f"replayssm vLLM adapter ({layer}): vLLM's built-in --use-replayssm is on as well; use one or the other."
        )
    window = window_from_env()
    if 1 + num_spec > window:
        raise ReplayConfigError(
            f"replayssm vLLM adapter ({layer}): window {window} is too small for speculative decoding with "
            f"num_speculative_tokens={num_spec}: a verification step carries {1 + num_spec} tokens, so set "
            f"{WINDOW_ENV} >= {1 + num_spec}."
        )
    ReplayConfig(window=window)  # the library's own validation
    return Settings(window=window, num_spec=num_spec)


def geometry_from_shapes(family: str, shapes) -> Mamba2Geometry | GDNGeometry:
    """A layer's geometry from vLLM's ``(conv_state, ssm_state)`` shapes for one slot.

    ``shapes`` as the layer's ``get_state_shape`` or the model class's
    ``get_mamba_state_shape_from_config`` give them, after tensor
    parallelism; the group / key-head count is recovered from the conv
    width (``conv_dim = heads*head_dim + 2*groups*state`` for Mamba-2,
    ``2*key_heads*K + value_heads*V`` for GDN).
    """
    conv_dim = max(shapes[0])  # (dim, W-1+K) or (W-1+K, dim): dim is the larger
    if family == "mamba2":
        heads, head_dim, state = shapes[1]
        return Mamba2Geometry(heads=heads, head_dim=head_dim, state_size=state, groups=(conv_dim - heads * head_dim) // (2 * state))
    value_heads, value_dim, key_dim = shapes[1]
    key_heads = (conv_dim - value_heads * value_dim) // (2 * key_dim)
    return GDNGeometry(key_heads=key_heads, value_heads=value_heads, key_dim=key_dim, value_dim=value_dim)


def ring_layout(family: str, shapes, activation_dtype: torch.dtype, window: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The ring tensors one state slot adds to vLLM's page: the state's own layout (``replayssm.state``)."""
    geometry = geometry_from_shapes(family, shapes)
    if family == "mamba2":
        return mamba2_ring_layout(geometry, window, activation_dtype)
    return gdn_ring_layout(geometry, window, torch.float32, read_copy=False)


class ReplayLayerMixin:
    """What both layer subclasses add to vLLM's layer: settings, cache spec, the ring in vLLM's pages.

    Put first in the bases, before the vLLM layer class. The ring tensors are
    extra state tensors of the layer (``get_state_shape`` /
    ``get_state_dtype``), so vLLM packs them into each slot's page and counts
    them when it sizes the cache; the model classes report the same shapes
    (``models.py``). Cursors (8 bytes per slot) live beside the pages.
    """

    replay: Settings
    replay_state: ReplayState | None
    _replay_family: str

    def _init_replay(self, num_spec: int, prefix: str, family: str) -> None:
        from vllm.config import get_current_vllm_config

        self.replay = settings_for(get_current_vllm_config(), num_spec, prefix)
        self.replay_state = None
        self._replay_family = family
        count(f"{family}_layers")

    def _ring_layout(self, base_shapes):
        return ring_layout(self._replay_family, base_shapes, self.model_config.dtype, self.replay.window)

    def get_state_shape(self):
        base = tuple(super().get_state_shape())
        if not hasattr(self, "replay"):  # asked during the base class's construction
            return base
        return base + tuple(shape for _, shape, _ in self._ring_layout(base))

    def get_state_dtype(self):
        base = tuple(super().get_state_dtype())
        if not hasattr(self, "replay"):
            return base
        return base + tuple(dtype for _, _, dtype in self._ring_layout(tuple(super().get_state_shape())))

    def bind_kv_cache(self, kv_cache) -> None:
        super().bind_kv_cache(kv_cache)  # slices the page into (conv, ssm, ring...)
        base = tuple(super().get_state_shape())
        names = [name for name, _, _ in self._ring_layout(base)]
        rings = dict(zip(names, self.kv_cache[len(base) :]))
        checkpoint = self._checkpoint()
        slots, dev = checkpoint.shape[0], checkpoint.device
        cursors = [torch.zeros(slots, dtype=torch.int32, device=dev) for _ in range(2)]
        config = ReplayConfig(window=self.replay.window, state_dtype=checkpoint.dtype)
        geometry = geometry_from_shapes(self._replay_family, base)
        if self._replay_family == "mamba2":
            self.replay_state = Mamba2ReplayState.from_tensors(
                geometry, checkpoint, rings, *cursors, config, activation_dtype=self.model_config.dtype
            )
        else:
            self.replay_state = GDNReplayState.from_tensors(geometry, checkpoint, rings, *cursors, config)
        page = self.kv_cache[1].untyped_storage().data_ptr()
        count("ring_tensors_in_pages", sum(rings[n].untyped_storage().data_ptr() == page for n in names))
        count("ring_bytes", sum(t.numel() * t.element_size() for t in (*rings.values(), *cursors)))

    def _checkpoint(self) -> Tensor:
        """vLLM's recurrent-state tensor, which is the replay checkpoint, as ``(slots,) + state_shape``."""
        return self.kv_cache[1]

    def get_kv_cache_spec(self, vllm_config):
        spec = super().get_kv_cache_spec(vllm_config)
        if spec is not None and getattr(spec, "num_speculative_blocks", 0):
            # Verification reads one checkpoint and keeps drafts in the ring:
            # stock vLLM's 1 + K state slots per request are not needed.
            spec = dataclasses.replace(spec, num_speculative_blocks=0)
        return spec


# ---------------------------------------------------------------------------
# Batch layout
# ---------------------------------------------------------------------------


@dataclass
class DecodeRows:
    """The decode rows of a step: their slots and how their tokens sit in the flat token axis.

    Speculative rows carry up to ``T = 1 + K`` tokens; they are padded to
    exactly ``T`` per row (zeros after the real tokens) so that every row has
    the same length for the ops and the conv window keeps a fixed layout.
    Padded entries land in the ring as pending and are never committed.
    """

    slots: Tensor  # (n,) int64
    T: int
    token_index: Tensor | None  # (num_tokens,) positions in the padded (n*T) axis; None when T == 1
    accepted: Tensor | None  # (n,) accepted counts of the previous verification (spec only)

    @property
    def n(self) -> int:
        return self.slots.shape[0]

    def pad(self, x: Tensor) -> Tensor:
        """(num_tokens, ...) -> (n, T, ...) with zeros in the padding."""
        if self.token_index is None:
            return x.reshape(self.n, 1, *x.shape[1:])
        out = x.new_zeros((self.n * self.T,) + tuple(x.shape[1:]))
        out.index_copy_(0, self.token_index, x)
        return out.view(self.n, self.T, *x.shape[1:])

    def unpad(self, y: Tensor) -> Tensor:
        """(n, T, ...) -> (num_tokens, ...)."""
        flat = y.reshape(self.n * self.T, *y.shape[2:])
        return flat if self.token_index is None else flat.index_select(0, self.token_index)


def spec_rows(slots: Tensor, query_start_loc: Tensor, num_tokens: int, T: int, accepted: Tensor) -> DecodeRows:
    """Rows of a verification step: ``query_start_loc`` (n + 1,) over ``num_tokens`` flat tokens."""
    n = slots.shape[0]
    qsl = query_start_loc[: n + 1].long()
    lengths = qsl[1:] - qsl[:-1]
    row = torch.repeat_interleave(torch.arange(n, device=slots.device), lengths, output_size=num_tokens)
    token_index = row * T + (torch.arange(num_tokens, device=slots.device) - qsl[:-1][row])
    return DecodeRows(slots=slots.long(), T=T, token_index=token_index, accepted=accepted[:n])


# ---------------------------------------------------------------------------
# The decode conv, with rollback
# ---------------------------------------------------------------------------


def commit_previous(rows: DecodeRows, state: ReplayState) -> Tensor:
    """Commit the previous verification of ``rows`` and return each row's conv-window offset.

    vLLM's ``num_accepted_tokens`` counts the tokens of the row's previous
    verification that are part of the sequence (the bonus token included, so
    >= 1). A row whose previous step was a prefill has nothing pending, and
    commits 0. The conv buffer of a verifying row holds
    ``[w_2 .. w_{W-1}, x_1 .. x_T]``; after ``a`` accepted tokens the window
    ends at ``x_a``, i.e. starts at offset ``max(a - 1, 0)``.
    """
    if rows.accepted is None:
        return torch.zeros_like(rows.slots)
    return (speculation.commit_verified(state, rows.slots, rows.accepted) - 1).clamp(min=0)


def conv_decode(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    activation: str | None,
    rows: DecodeRows,
    offset: Tensor,
) -> Tensor:
    """Depthwise causal conv of the decode tokens, through ``ops.causal_conv_step``; updates the rows' conv buffers.

    ``x`` (n, T, dim); ``conv_state`` (slots, dim, S) with S = W - 1 (+ K with
    speculative decoding); ``weight`` (dim, W). The window for row b is
    ``conv_state[slot, :, offset[b] : offset[b] + W - 1]``; each token moves a copy of it on by one
    column. Afterwards the buffer holds the last S columns of ``[window, x]``, so that the next
    verification can start after any accepted token.
    """
    n, T, dim = x.shape
    width = weight.shape[-1]
    S = conv_state.shape[-1]
    buf = conv_state.index_select(0, rows.slots)  # (n, dim, S)
    cols = offset.view(n, 1, 1) + torch.arange(width - 1, device=x.device).view(1, 1, -1)
    start = buf.gather(2, cols.expand(n, dim, width - 1))
    window = start.to(x.dtype, copy=True)  # the op moves it on in place; ``start`` stays for the buffer
    silu = activation in ("silu", "swish")
    out = torch.stack([ops.causal_conv_step(x[:, t], weight, bias, window, silu) for t in range(T)], dim=1)
    full = torch.cat([start, x.transpose(1, 2).to(buf.dtype)], dim=-1)  # (n, dim, W-1+T)
    conv_state.index_copy_(0, rows.slots, full[..., -S:])
    return out


def conv_state_dim_last(conv: Tensor, dim_first: bool) -> Tensor:
    """vLLM's conv cache as (slots, dim, S) whichever layout it is stored in."""
    return conv if dim_first else conv.transpose(-1, -2)


# ---------------------------------------------------------------------------
# Handing the prefill to vLLM
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def swapped_metadata(prefix: str, metadata):
    """Within the block, vLLM code that reads this layer's attention metadata sees ``metadata``."""
    from vllm.forward_context import get_forward_context

    table = get_forward_context().attn_metadata
    old = table[prefix]
    table[prefix] = metadata
    try:
        yield
    finally:
        table[prefix] = old


def replace(metadata, **changes):
    return dataclasses.replace(metadata, **changes)


def fold_before_prefill(state: ReplayState, slots: Tensor, has_initial: Tensor | None) -> None:
    """Make vLLM's state tensor hold the exact state of prefill rows that resume from a prior state.

    A prefill chunk with an initial state reads vLLM's state tensor, which
    holds the checkpoint; rows whose ring holds committed entries are folded
    first (``speculation.resume``, which refuses a row with an unconfirmed
    verification).
    """
    if has_initial is None or slots.numel() == 0:
        return
    speculation.resume(state, slots[has_initial.to(torch.bool)])


def count(key: str, n: int = 1) -> None:
    COUNTS[key] += n


_SEEN_SLOTS: dict[str, set[int]] = {}


def note_prefill_slots(layer: str, slots: Tensor) -> None:
    """Count prefills that land in a slot an earlier request of ``layer`` used (CPU only: a host read)."""
    if slots.device.type != "cpu":
        return
    seen = _SEEN_SLOTS.setdefault(layer, set())
    values = slots.tolist()
    COUNTS["prefill_slot_reuse"] += sum(v in seen for v in values)
    seen.update(values)
