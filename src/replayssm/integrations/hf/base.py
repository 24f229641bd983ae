"""What every mixer adapter shares: the forward that routes between the model's path and replay, and the conv step.

An adapter wraps one mixer instance. It owns no weights: it calls the
mixer's own projections, conv weights, norms and output projection, and only
replaces the recurrence by the replay op. The model's own ``forward`` still
runs every prefill (its chunked scan produces the state the replay
checkpoint is loaded from) and every forward without a cache.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.activations import ACT2FN

from ... import ops
from ...config import ReplayConfig
from ...ops.conv import reference as conv_reference
from ...state import ReplayState
from .cache import PREFILL_ROLLBACK, ReplayLayerMixin, adopt_cache


def mask_padding(x: Tensor, attention_mask: Tensor | None) -> Tensor:
    """Zero left-padding positions, as the mixers do (a 2-D mask aligned with the tokens of this forward)."""
    if attention_mask is None or attention_mask.dim() != 2:
        return x
    return (x * attention_mask[:, -x.shape[1] :, None]).to(x.dtype)


class MixerAdapter:
    """Base class of the per-family adapters (``Mamba2Adapter``, ``GDNAdapter``).

    Subclasses set ``geometry`` and implement ``new_state``,
    ``state_from_hf``/``state_to_hf`` (layout conversion) and ``replay`` (the
    decode/verify path).
    """

    family: str = ""
    #: whether the mixer masks padding again after the conv (the Mamba-2 mixers do, the GDN ones do not)
    mask_after_conv: bool = False

    def __init__(self, mixer: nn.Module, config: ReplayConfig, context):
        self.mixer = mixer
        self.config = config
        self.context = context
        self.layer_idx = mixer.layer_idx
        self.original_forward = type(mixer).forward.__get__(mixer)
        params = inspect.signature(type(mixer).forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "cache_params"
        self.activation_dtype = next(mixer.parameters()).dtype
        self.conv_kernel = mixer.conv1d.kernel_size[0]
        self.act = ACT2FN[mixer.activation]
        #: the conv activation as ``ops.causal_conv_step`` takes it (True: SiLU, False: none); None for any
        #: other (the mixers here all use SiLU), which takes the generic conv
        self.conv_silu = {"silu": True, "swish": True, "identity": False, "linear": False}.get(mixer.activation)
        #: decode through the conventional op (the benchmark baseline) instead of replay
        self.conventional = context.step == "conventional"

    # -- patch lifecycle ------------------------------------------------------------------

    def apply(self) -> None:
        """Run by ``patch`` once every check passed and every adapter is built (changes to the mixer go here)."""

    def restore(self) -> None:
        """Run by ``unpatch``: undo ``apply``."""

    # -- layout -------------------------------------------------------------------------

    geometry: object
    #: The ReplayState class the layer's states are (its ``check_config`` runs at patch time).
    state_type: type[ReplayState]

    def new_state(self, slots: int, config: ReplayConfig, device: torch.device) -> ReplayState:
        raise NotImplementedError

    def state_from_hf(self, state: Tensor) -> Tensor:
        return state

    def state_to_hf(self, state: Tensor) -> Tensor:
        return state

    def check_cache_layer(self, layer, idx: int) -> None:
        """Raise if ``layer`` already holds states of a different shape than this mixer makes."""
        conv = layer.conv_states.get(0)
        if conv is not None and conv.dim() == 3 and conv.shape[1] != self.mixer.conv_dim:
            raise ValueError(
                f"replayssm: cache layer {idx} holds a conv state with {conv.shape[1]} channels, but "
                f"{type(self.mixer).__name__} has {self.mixer.conv_dim}: the cache was built for another model"
            )

    # -- the routed forward --------------------------------------------------------------

    def forward(self, hidden_states: Tensor, *args, **kwargs) -> Tensor:
        cache = kwargs.pop("cache", None)
        cache_params = kwargs.pop("cache_params", None)
        if args:  # the mixers take (hidden_states, cache, attention_mask) positionally too
            cache = args[0]
            if len(args) > 1:
                kwargs["attention_mask"] = args[1]
        cache = cache if cache is not None else cache_params
        attention_mask = kwargs.pop("attention_mask", None)
        if cache is None:
            return self.original_forward(hidden_states, attention_mask=attention_mask, **kwargs)
        adopt_cache(cache, self.context)
        layer = cache.layers[self.layer_idx]
        num_tokens = hidden_states.shape[1]
        if not layer.has_previous_state[0] or layer.replay is None:
            out = self._prefill(hidden_states, cache, layer, attention_mask, kwargs)
            layer.seen_tokens = num_tokens
            return out
        if not torch.compiler.is_compiling():  # a host counter read under torch.compile would be guarded on: one graph per step
            layer.seen_tokens += num_tokens  # only all-SSM caches read it, and only while recording (never compiled)
        if num_tokens > layer.replay.window and not layer.record_past:
            return self._chunk(hidden_states, cache, layer, attention_mask, kwargs)
        commit = layer.begin_step(num_tokens)
        out = self.replay(hidden_states, layer, attention_mask, commit)
        layer.end_step(num_tokens, commit)
        return out

    def _call_original(self, hidden_states, cache, attention_mask, kwargs) -> Tensor:
        return self.original_forward(hidden_states, attention_mask=attention_mask, **{self.cache_kwarg: cache}, **kwargs)

    def _prefill(self, hidden_states, cache, layer: ReplayLayerMixin, attention_mask, kwargs) -> Tensor:
        """The model's chunked path loads the checkpoint; while recording, the last tokens stay pending."""
        num_tokens = hidden_states.shape[1]
        if not layer.record_past or num_tokens < 2:
            return self._call_original(hidden_states, cache, attention_mask, kwargs)
        window = self.config.window
        tail = min(num_tokens - 1, max(PREFILL_ROLLBACK, window))
        head = num_tokens - tail
        mask = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
        out_head = self._call_original(
            hidden_states[:, :head], cache, mask[:, -num_tokens:][:, :head] if mask is not None else None, kwargs
        )
        commit = layer.begin_step(tail)
        layer.shrink_after_crop = layer.replay.window > window
        out_tail = self.replay(hidden_states[:, head:], layer, mask[:, -tail:] if mask is not None else None, commit)
        layer.end_step(tail, commit)
        return torch.cat([out_head, out_tail], dim=1)

    def _chunk(self, hidden_states, cache, layer: ReplayLayerMixin, attention_mask, kwargs) -> Tensor:
        """More tokens than the window, not recording: the model's chunked path from the materialised state."""
        layer.recurrent_states[0] = layer.materialize_hf()
        try:
            return self._call_original(hidden_states, cache, attention_mask, kwargs)
        finally:
            layer.recurrent_states[0] = None

    # -- pieces the family adapters use ----------------------------------------------------

    def conv(self, layer: ReplayLayerMixin, columns: Tensor) -> Tensor:
        """Causal conv of ``columns`` ``(batch, channels, T)`` after the layer's conv window; returns ``(batch, T, channels)``.

        A decode step (one column) moves the window on in place through ``ops.causal_conv_step``: one
        pass over the window where transformers' ``update_conv_state`` and a conv over its result make
        three (a captured Qwen3.5-like step at batch 256 on the H200, three layers: 40 us against 84).
        Otherwise the window is kept (and, while recording, rolled back) by the
        transformers layer: ``update_conv_state`` returns the window followed by the new columns.

        One-column outputs are computed in fp64 and rounded to the model's dtype at the end on every path
        (the op and ``conv_reference.causal_conv_columns``): eager and captured steps must round alike, and
        inductor, fusing a conv's ops, drops intermediate roundings that eager kernels keep. (Rounding to
        bf16 before the activation broke the captured == eager token test for Nemotron-H,
        and an fp32 activation differed at fp32's few-ulp differences between eager and inductor silu.)
        """
        mixer = self.mixer
        num_tokens = columns.shape[-1]
        weight, bias = mixer.conv1d.weight, mixer.conv1d.bias
        if num_tokens == 1 and self.conv_silu is not None:
            window = layer.decode_conv_window()
            if window is not None and window.dtype == columns.dtype:
                layer.count_tokens(1)
                return ops.causal_conv_step(columns[..., 0], weight[:, 0, :], bias, window, self.conv_silu).unsqueeze(1)
        full = layer.update_conv_state(columns, 0, conv_kernel_size=self.conv_kernel)
        if full.shape[-1] < num_tokens + self.conv_kernel - 1:  # a recorded history shorter than the kernel
            full = F.pad(full, (num_tokens + self.conv_kernel - 1 - full.shape[-1], 0))
        if num_tokens == 1 and self.conv_silu is not None:
            return conv_reference.causal_conv_columns(full[..., -self.conv_kernel :], weight[:, 0, :], bias, self.conv_silu).unsqueeze(1)
        out = F.conv1d(full.to(weight.dtype), weight, bias, groups=weight.shape[0])[..., -num_tokens:]
        return self.act(out).to(columns.dtype).transpose(1, 2)

    def replay(self, hidden_states: Tensor, layer: ReplayLayerMixin, attention_mask, commit: bool) -> Tensor:
        raise NotImplementedError
