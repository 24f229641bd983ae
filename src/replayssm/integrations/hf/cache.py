"""The replay cache layer: transformers' own linear-attention cache layer, with the recurrent state kept as replay.

A patched model does not need a cache class of its own. The first time a
patched mixer sees a ``DynamicCache`` (the one ``generate`` builds, or one the
user passes), the cache is *adopted*: each linear-attention layer that belongs
to a patched mixer gets its class swapped, in place, for a subclass that mixes
in :class:`ReplayLayerMixin`. The layer keeps everything transformers gave it
(the conv window and its past recording, and for "hybrid" layers the
attention keys and values); the recurrent state lives in a
:class:`~replayssm.ReplayState` instead of ``recurrent_states``.

What the layer adds:

* ``update_recurrent_state`` (called by the model's own chunked path at
  prefill) loads the state as the replay checkpoint;
* decode and verification steps (see the adapters) go through the replay ops;
  outside past recording a step commits at once;
* with past recording on (assisted decoding), a step leaves its tokens
  pending and ``crop(-n)`` rolls back by moving cursors: pending tokens are
  dropped by ``commit``, tokens committed since the previous crop by a cursor
  decrement. A step that would fold such tokens into the checkpoint first
  folds only the ones before the last crop, so a rollback always finds its
  tokens in the ring; a speculative run longer than the window enlarges the
  ring (once, up to ``MAX_WINDOW``);
* ``is_croppable`` is true; ``reorder_cache``, ``batch_select_indices``,
  ``batch_repeat_interleave`` and ``reset`` act on the replay rows too.

All rows of one cache advance together (generate's batches do), so the ring
bookkeeping needed for rollback is a handful of host integers per layer; the
device cursors stay the source of truth.
"""

from __future__ import annotations

import weakref
from abc import ABC

import torch
from torch import Tensor

from ...speculation import UniformSpeculation
from ...state import ReplayState

try:  # transformers >= 5
    from transformers.cache_utils import CacheLayerMixin, LinearAttentionCacheLayerMixin
except ImportError as exc:  # pragma: no cover - guarded by patch()
    raise ImportError("replayssm.integrations.hf needs transformers >= 5.17 (LinearAttentionCacheLayerMixin)") from exc

#: In past-recording mode, a prefill keeps its last tokens (up to this many, or
#: the window if longer) in the ring, pending, so a crop right after the
#: prefill (assisted decoding verifies its first candidates inside the prompt
#: forward) can still roll them back.
PREFILL_ROLLBACK = 24

CONVENTIONAL_CANNOT_RECORD = (
    "replayssm: a model patched with step='conventional' cannot roll back (it is the benchmarks' baseline), so it "
    "cannot run assisted decoding; patch it with step='replay'"
)


class ReplayLayerMixin(ABC):
    """Mixed into a cache's linear-attention layer class by :func:`adopt_cache`.

    CPython refuses an in-place class swap when a mixin comes first in the
    bases, so the swapped class is ``type(name, (transformers_class,),
    methods of this class)``, registered as a virtual subclass of it; the
    methods reach the transformers implementation through ``_replay_base``.

    Attributes added to the layer: ``replay`` (the :class:`ReplayState`, made
    at the first prefill), ``speculation`` (its
    :class:`~replayssm.speculation.UniformSpeculation`: the host bookkeeping
    of pending and rollable tokens) and ``replay_adapter`` (the mixer adapter
    that owns the layer).
    """

    replay: ReplayState | None
    speculation: UniformSpeculation | None
    replay_adapter: object

    def _replay_init(self, adapter) -> None:
        self.replay = None
        self.speculation = None
        self.replay_adapter = adapter
        self._replay_rows = None
        self.rolled_back = 0  # tokens taken back by crops, over the layer's life (for tests and the demo)
        self.seen_tokens = 0  # tokens the state holds (what get_seq_length reports for all-SSM caches)
        self.shrink_after_crop = False  # the ring grew for a prefill's rollable tail: restore the window at the next crop
        #: captured verification (verify.py): host bookkeeping runs outside the step, the conv window is static
        self.captured = False
        self._verify_cols = None  # the conv columns of the last verification (a static buffer when captured)

    # -- what transformers calls -----------------------------------------------

    def update_recurrent_state(self, recurrent_states: Tensor | list[Tensor], state_idx: int = 0, **kwargs) -> Tensor:
        """Load a state computed by the model's chunked path (a prefill) as the replay checkpoint.

        transformers >= 5.25 may pass a list (the states after each of the last tokens, kept for its own
        rollback); replay rolls back through the ring, so only the last one is loaded.
        """
        if state_idx != 0:
            raise ValueError(f"replayssm: a replay layer holds one recurrent state, got state_idx={state_idx}")
        if isinstance(recurrent_states, (list, tuple)):
            recurrent_states = recurrent_states[-1]
        adapter = self.replay_adapter
        state = adapter.state_from_hf(recurrent_states)
        slots = state.shape[0]
        if self.replay is None or self.replay.slots != slots or self.replay.device != state.device:
            self._set_state(adapter.new_state(slots, adapter.config, state.device))
        self.replay.load(state)
        self.speculation.restart()
        return recurrent_states

    @property
    def is_croppable(self) -> bool:
        return self.replay_adapter.context.step == "replay"

    def activate_past_recording(self, **kwargs) -> None:
        """Past recording (assisted decoding) keeps the tokens since the last crop rollable, in the ring.

        transformers >= 5.25 also asks the model's chunked path for the states after each of the last
        ``recurrent_states_to_keep`` tokens (its own rollback); replay needs none, so it is set to 0.
        transformers >= 5.25 no longer refuses assisted decoding of SSM models itself, so the
        conventional step, which cannot roll back, refuses it here.
        """
        if not self.is_croppable:
            raise ValueError(CONVENTIONAL_CANNOT_RECORD)
        self._replay_base.activate_past_recording(self, **kwargs)
        self.recurrent_states_to_keep = 0

    def count_tokens(self, num_tokens: int) -> None:
        """Advance transformers' token count of the layer (>= 5.25) for columns added without ``update_conv_state``."""
        count = getattr(self, "cumulative_length_linear", None)
        if count is not None:
            count.add_(num_tokens)

    def update_conv_state(self, conv_states: Tensor, state_idx: int = 0, **kwargs) -> Tensor:
        if not self.captured:
            return self._replay_base.update_conv_state(self, conv_states, state_idx, **kwargs)
        # Captured verification: the window keeps its static address; the new columns wait for crop.
        if state_idx == 0:
            self.count_tokens(conv_states.shape[-1])
        if self._verify_cols is not None and self._verify_cols.shape == conv_states.shape:
            self._verify_cols.copy_(conv_states)
        else:  # a verification longer than the captured length (run eagerly)
            self._verify_cols = conv_states
        return torch.cat([self.conv_states[0], conv_states], dim=-1)

    def decode_conv_window(self) -> Tensor | None:
        """The conv window a one-token step may move on in place (``ops.causal_conv_step``), or None where
        transformers' ``update_conv_state`` must keep it: the prefill (it makes the window), past
        recording (the window grows until a crop) and captured verification (the columns wait for crop)."""
        if self.record_past or self.captured or not self.has_previous_state[0]:
            return None
        return self.conv_states[0]

    def enter_captured(self, columns: int) -> None:
        """Switch to captured verification (after the first crop): static conv window and column buffer."""
        conv = self.conv_states[0]
        window = conv[..., -self.conv_kernel_size[0] :].clone()
        self._verify_cols = conv.new_zeros(*conv.shape[:-1], columns)
        for t in (window, self._verify_cols):
            torch._dynamo.mark_static_address(t)
        self.conv_states[0] = window
        self.captured = True

    def crop(self, tokens_to_remove: int) -> None:
        tokens_to_remove = int(tokens_to_remove)  # transformers 5.17's assisted decoding passes a 0-d tensor
        if self.captured:
            n = -tokens_to_remove
            pending = self.speculation.pending
            if not 0 <= n <= pending:
                raise RuntimeError(f"replayssm: captured verification cannot crop({tokens_to_remove}) after {pending} tokens")
            self.count_tokens(-n)
            window = self.conv_states[0]
            window.copy_(torch.cat([window, self._verify_cols[..., : pending - n]], dim=-1)[..., -window.shape[-1] :])
            self._rollback(n)
            return
        if not self.is_croppable:
            raise RuntimeError("replayssm: a model patched with step='conventional' cannot roll back (crop)")
        if tokens_to_remove > 0:
            raise RuntimeError(
                "replayssm: a replay cache layer is cropped by a negative count (tokens to remove from the end), "
                f"got crop({tokens_to_remove})"
            )
        if self.replay is not None and self.record_past:
            self.speculation.check_rollback(-tokens_to_remove, self._rollable_after_prefill())  # a refused crop changes nothing
        self._replay_base.crop(self, tokens_to_remove)  # the conv window (and the attention part of hybrid layers)
        if self.replay is not None:
            self._rollback(-tokens_to_remove)

    def reset(self) -> None:
        self.captured = False
        self._replay_base.reset(self)
        if self.replay is not None:
            self.replay.reset()
            self.speculation.restart()
        self.seen_tokens = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._replay_base.reorder_cache(self, beam_idx)
        if self.replay is not None:
            self.replay.reorder(beam_idx.to(self.replay.device))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._select_rows(indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        slots = self.replay.slots if self.replay is not None else self.conv_states[0].shape[0]
        self._select_rows(torch.arange(slots).repeat_interleave(repeats))

    def offload(self) -> None:
        raise NotImplementedError("replayssm: replay cache layers cannot be offloaded (cache_implementation='offloaded')")

    # -- rows ------------------------------------------------------------------------

    def _select_rows(self, indices: Tensor) -> None:
        if isinstance(self, CacheLayerMixin):  # hybrid layers: the attention keys/values too
            self._replay_base.batch_select_indices(self, indices)
        for i, conv in self.conv_states.items():
            if conv is not None:
                self.conv_states[i] = conv.index_select(0, indices.to(conv.device))
        if self.replay is not None:
            self._set_state(self.replay.select(indices))

    def _set_state(self, state: ReplayState) -> None:
        """Make ``state`` the layer's (a new one, or the speculation's resized ring)."""
        self.replay = state
        if self.speculation is None:
            self.speculation = UniformSpeculation(state, on_replace=self._set_state)
        self.speculation.state = state
        self._replay_rows = torch.arange(state.slots, device=state.device)
        if not torch.compiler.is_compiling():
            # Like transformers' static cache tensors: a captured decode step (CUDA graphs) uses them in place.
            for t in (*state.tensors().values(), self._replay_rows):
                torch._dynamo.mark_static_address(t)

    @property
    def replay_rows(self) -> Tensor:
        """``arange(slots)`` on the state's device, made once (the ops take rows as a tensor)."""
        return self._replay_rows

    # -- steps -----------------------------------------------------------------------

    def begin_step(self, num_tokens: int) -> bool:
        """Bookkeeping before a replay step of ``num_tokens`` per row; returns the op's ``commit`` flag.

        Outside past recording this reads no device value (a decode step under
        torch.compile sees constants only) and the step commits at once. A
        captured verification did this before the step (``plan_step``).
        """
        return False if self.captured else self.plan_step(num_tokens)

    def plan_step(self, num_tokens: int) -> bool:
        return self.speculation.plan(num_tokens, self.record_past)

    def end_step(self, num_tokens: int, committed: bool) -> None:
        if not committed and not self.captured:
            self.speculation.pending = num_tokens

    def _rollable_after_prefill(self) -> int:
        return max(PREFILL_ROLLBACK, self.replay.window)

    def _rollback(self, n: int) -> None:
        """Take the last ``n`` tokens back (``crop(-n)``); afterwards nothing is speculative."""
        self.speculation.rollback(n, self._rollable_after_prefill())
        self.rolled_back += n
        self.seen_tokens -= n
        if self.shrink_after_crop:
            self.shrink_after_crop = False
            self.speculation.shrink(self.replay_adapter.config.window)

    def materialize_hf(self) -> Tensor:
        """The exact committed state in transformers' layout (for the chunked fallback)."""
        if self.speculation.pending:
            self.speculation.commit(self.speculation.pending, rollable=self.record_past)
        return self.replay_adapter.state_to_hf(self.replay.materialize())


class _InertLayerMixin(ABC):
    """For linear-attention layers no mixer writes (5.17 maps "moe"/"mlp" layers to them): crop is a no-op."""

    @property
    def is_croppable(self) -> bool:
        return True

    def crop(self, tokens_to_remove: int) -> None:
        if any(v is not None for v in self.conv_states.values()):
            self._replay_base.crop(self, tokens_to_remove)

    def batch_select_indices(self, indices) -> None:
        pass

    def batch_repeat_interleave(self, repeats: int) -> None:
        pass


class _AllSSMCacheMixin(ABC):
    """Swapped onto a cache whose layers are all SSM layers (mamba2), so it can serve as a draft model's cache.

    transformers continues a cache across ``generate`` calls (the draft
    model's rounds) only when some layer tracks a sequence length: with every
    layer linear, ``get_seq_length`` raises and the whole sequence is fed
    again. While recording (assisted decoding), this cache reports the replay
    layers' token count and presents them as sequence-tracking layers.
    """

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return next(layer.seen_tokens for layer in self.layers if isinstance(layer, ReplayLayerMixin))

    @property
    def is_linear(self) -> list[bool]:
        if any(getattr(layer, "record_past", False) for layer in self.layers):
            return [False] * len(self.layers)
        return super(type(self), self).is_linear  # (dynamo traces super(), not property.fget)


_CLASS_CACHE: dict[tuple[type, type], type] = {}
_NOT_COPIED = {"__dict__", "__weakref__", "__module__", "__doc__", "__slots__", "_abc_impl", "__abstractmethods__"}


def _swapped(mixin: type, base: type) -> type:
    """The subclass of a transformers layer class with ``mixin`` in front (made once per pair)."""
    key = (mixin, base)
    if key not in _CLASS_CACHE:
        prefix = {ReplayLayerMixin: "Replay", _InertLayerMixin: "Inert", _AllSSMCacheMixin: "ReplayAllSSM"}[mixin]
        methods = {k: v for k, v in vars(mixin).items() if k not in _NOT_COPIED}
        swapped = type(prefix + base.__name__, (base,), {**methods, "_replay_base": base, "__module__": __name__})
        mixin.register(swapped)
        _CLASS_CACHE[key] = swapped
    return _CLASS_CACHE[key]


def _cache_layers(cache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None and hasattr(cache, "self_attention_cache"):
        layers = cache.self_attention_cache.layers
    if layers is None:
        raise TypeError(f"replayssm: expected a transformers Cache (e.g. DynamicCache(config=...)), got {type(cache).__name__}")
    return layers


def adopt_cache(cache, context) -> None:
    """Make ``cache`` serve the patched model of ``context``: swap its linear layers to replay layers.

    Checks, before changing anything, that the cache was built for this model
    (layer count, layer kinds, conv shapes) and not adopted by another patched
    model. A layer that already holds a state computed without replay (the
    cache was used by the unpatched model) has that state loaded as its
    checkpoint.
    """
    owner = getattr(cache, "_replayssm_owner", None)
    if owner is not None and owner() is context:
        return
    if owner is not None and owner() is not None:
        raise ValueError(
            "replayssm: this cache is in use by another patched model; build one cache per model "
            "(DynamicCache(config=model.config)) or let generate() build it"
        )
    layers = _cache_layers(cache)
    n_expected = context.num_layers
    if n_expected is not None and len(layers) != n_expected:
        raise ValueError(
            f"replayssm: the cache has {len(layers)} layers but {context.model_name} has {n_expected}: "
            "it was built for another model; use DynamicCache(config=model.config)"
        )
    plan = []
    for idx, adapter in context.adapters.items():
        if idx >= len(layers):
            raise ValueError(
                f"replayssm: the cache has no layer {idx} (it has {len(layers)}); it was built for another model or "
                "without a config: use DynamicCache(config=model.config)"
            )
        layer = layers[idx]
        if not isinstance(layer, LinearAttentionCacheLayerMixin):
            raise ValueError(
                f"replayssm: cache layer {idx} is a {type(layer).__name__}, but {context.model_name} has a "
                f"{type(adapter.mixer).__name__} there; the cache was built for another model or without a config: "
                "use DynamicCache(config=model.config)"
            )
        if isinstance(layer, ReplayLayerMixin) and layer.replay_adapter is not adapter:
            if layer.replay_adapter.geometry != adapter.geometry:
                raise ValueError(f"replayssm: cache layer {idx} holds a replay state of another model")
        adapter.check_cache_layer(layer, idx)
        if getattr(layer, "record_past", False) and adapter.conventional:
            raise ValueError(CONVENTIONAL_CANNOT_RECORD)
        plan.append((idx, layer, adapter))
    # Everything checked: now change the layers.
    for idx, layer, adapter in plan:
        if isinstance(layer, ReplayLayerMixin):
            layer.replay_adapter = adapter
            continue
        existing = layer.recurrent_states.get(0) if layer.has_previous_state.get(0) else None
        layer.__class__ = _swapped(ReplayLayerMixin, type(layer))
        layer._replay_init(adapter)
        if layer.record_past:  # recording began before the prefill (transformers >= 5.25): no per-token states
            layer.recurrent_states_to_keep = 0
        if existing is not None:
            layer.recurrent_states[0] = None
            layer.is_recurrent_states_initialized[0] = False
            layer.update_recurrent_state(existing)
    for idx, layer in enumerate(layers):
        if idx in context.adapters or isinstance(layer, (ReplayLayerMixin, _InertLayerMixin)):
            continue
        if isinstance(layer, LinearAttentionCacheLayerMixin) and not isinstance(layer, CacheLayerMixin):
            layer.__class__ = _swapped(_InertLayerMixin, type(layer))
    all_ssm = not any(isinstance(layer, CacheLayerMixin) for layer in layers)  # hybrid layers track a length themselves
    if all_ssm and all(isinstance(layer, (ReplayLayerMixin, _InertLayerMixin)) or _is_dummy(layer) for layer in layers):
        if not isinstance(cache, _AllSSMCacheMixin) and hasattr(cache, "get_seq_length"):
            cache.__class__ = _swapped(_AllSSMCacheMixin, type(cache))
    cache._replayssm_owner = weakref.ref(context)


def _is_dummy(layer) -> bool:
    return type(layer).__name__ == "DummyLayer"
