"""Captured verification for assisted decoding under ``patch(model, compile=True)``.

transformers never compiles assisted decoding (5.17 refuses static caches
there; 5.24 would, but a recording linear-attention layer is not
compileable), and its verification forwards change length every round. So
for an assisted ``generate`` whose drafts are bounded the patch gives
transformers a :class:`VerifyCache` (a ``StaticCache``: attention keys and
values in place) and, for that call, an instance ``forward`` that sends every
verification forward (after the prefill) through the compiled call at one
length, ``draft bound + 1``: shorter ones are padded (their replay entries
stay pending and the commit drops them; their attention entries lie beyond
the accepted position, masked, and are overwritten later), the logits are
sliced back. Host bookkeeping of the replay layers runs before and after the
compiled step; inside it they read no changing host value, and the conv
window stays in place (``ReplayLayerMixin.enter_captured``). A longer
verification (not expected) runs the same code eagerly.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from .cache import ReplayLayerMixin


class VerifyCache(StaticCache):
    """A ``StaticCache`` that assisted decoding may crop (a subclass: transformers 5.17 refuses ``StaticCache`` itself).

    Static attention layers (also the attention part of hybrid layers) need
    no data moved by a crop: their position goes back, and entries beyond it
    are masked and overwritten.
    """

    def crop(self, tokens_to_remove: int) -> None:
        n = abs(int(tokens_to_remove))  # 5.17 passes a 0-d tensor
        # Set the positions afterwards: a layer's own crop may or may not move them (hybrid layers' does not).
        positions = [(layer, layer.cumulative_length - n) for layer in _attention(self.layers)]
        for layer in self.layers:
            if hasattr(layer, "crop"):  # 5.17's StaticLayer has none
                layer.crop(-n)
        for layer, position in positions:
            layer.cumulative_length.copy_(position)

    @property
    def is_compileable(self) -> bool:
        return False  # transformers' own compiled call takes varying lengths; the patch's forward captures instead

    @property
    def capturable(self) -> bool:
        """Sliding-window and indexed attention overwrite entries a crop would need back: not captured."""
        return not any(isinstance(l, StaticSlidingWindowLayer) or hasattr(l, "indexer_cumulative_length") for l in self.layers)


def verify_len(kwargs: dict, model) -> int | None:
    """One more than the longest draft of this assisted call, or None where transformers does not bound it."""
    config = kwargs.get("generation_config") or model.generation_config

    def setting(name):
        return kwargs[name] if kwargs.get(name) is not None else getattr(config, name, None)

    others = ("assistant_early_exit", "candidate_generator", "use_mtp", "speculation_type", "assistant_tokenizer")
    if any(setting(name) for name in others):
        return None  # other candidate generators (early exit, different tokenizers: longer drafts in target tokens)
    if setting("prompt_lookup_num_tokens") is not None:
        return int(setting("prompt_lookup_num_tokens")) + 1
    assistant = kwargs.get("assistant_model")
    if assistant is None:
        return None
    # What transformers' AssistedCandidateGenerator reads: the assistant's own config, with the global defaults.
    config = assistant.generation_config
    defaults = getattr(config, "_get_default_generation_params", dict)()
    schedule = config.num_assistant_tokens_schedule or defaults.get("num_assistant_tokens_schedule")
    tokens = config.num_assistant_tokens or defaults.get("num_assistant_tokens")
    if schedule != "constant" or tokens is None:
        return None  # "heuristic" grows the draft without bound
    return int(tokens) + 1


def run_assisted(model, context, original_generate, args, kwargs, length: int):
    """``generate`` with a :class:`VerifyCache` and verification forwards captured at ``length`` tokens (None: not here)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    name = next((n for n in ("cache", "past_key_values") if n in inspect.signature(type(model).forward).parameters), None)
    if not isinstance(ids, torch.Tensor) or name is None:  # 5.17's Mamba2 takes `cache_params`, which assisted decoding never finds
        return None
    config = kwargs.get("generation_config") or model.generation_config
    new = kwargs.get("max_new_tokens", config.max_new_tokens)
    total = max(ids.shape[-1] + (new or 0), kwargs.get("max_length") or config.max_length or 0)
    cache = VerifyCache(config=model.config, max_cache_len=total + length)  # padding writes past the last token
    if not cache.capturable:
        return None
    compiled = model.get_compiled_call(context.compile_config)
    original = type(model).forward.__get__(model)

    @functools.wraps(original)  # generate inspects forward's signature
    def forward(*f_args, **f_kwargs):
        layers = [l for l in cache.layers if isinstance(l, ReplayLayerMixin)]
        if f_kwargs.get(name) is not cache or context.verifying or torch.compiler.is_compiling():
            return original(*f_args, **f_kwargs)  # not this cache's, or the compiled call's own (fallback) forward
        if not layers or any(l.replay is None or not l.record_past for l in layers):
            return original(*f_args, **f_kwargs)  # the prefill
        num_tokens = f_kwargs["input_ids"].shape[-1]
        padded = _pad(f_kwargs, length)
        run, width = (compiled, length) if padded is not None else (original, num_tokens)
        for layer in layers:
            if not layer.captured:
                layer.enter_captured(length)
            layer.plan_step(width)
        context.verifying = True
        try:
            out = run(*f_args, **(padded or f_kwargs))
        finally:
            context.verifying = False
        context.captured_verifications += run is compiled and context.compile_failure is None  # not a fallback
        for layer in layers:
            layer.speculation.pending = num_tokens  # the padding stays pending: the crop's commit drops it
        if width > num_tokens:
            for layer in _attention(cache.layers):
                layer.cumulative_length.sub_(width - num_tokens)
            out.logits = out.logits[:, :num_tokens]
        return out

    model.forward = forward
    try:
        return original_generate(*args, **{**kwargs, name: cache})
    finally:
        del model.forward


def _pad(kwargs: dict, length: int) -> dict | None:
    """The forward's inputs padded to ``length`` tokens, or None where an input is not one this knows to pad."""
    ids = kwargs.get("input_ids")
    if ids is None or ids.shape[-1] > length or kwargs.get("inputs_embeds") is not None:
        return None
    known = {"input_ids", "position_ids", "attention_mask", "logits_to_keep", "use_cache", "cache", "past_key_values", "return_dict"}
    if any(k not in known and isinstance(v, torch.Tensor) for k, v in kwargs.items()):
        return None
    extra = length - ids.shape[-1]
    padded = dict(kwargs)
    padded["input_ids"] = torch.cat([ids, ids[..., -1:].expand(*ids.shape[:-1], extra)], dim=-1)
    positions = kwargs.get("position_ids")
    if positions is not None:
        step = torch.arange(1, extra + 1, device=positions.device, dtype=positions.dtype)
        padded["position_ids"] = torch.cat([positions, positions[..., -1:] + step], dim=-1)
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and bool(mask.all()):
        padded["attention_mask"] = None  # 5.17 passes the 2-D mask, one column longer each round (a recompile): no mask is the same
    elif mask is not None:  # 5.24 passes None
        return None
    if kwargs.get("logits_to_keep"):
        padded["logits_to_keep"] = length
    return padded


def _attention(layers) -> list:
    """The initialised static attention layers (and hybrid layers' attention parts): position in ``cumulative_length``."""
    return [l for l in layers if isinstance(l, StaticLayer) and l.is_initialized]
