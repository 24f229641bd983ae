"""``patch(model, config)`` and ``unpatch(model)``.

Patching is per instance: each recognised mixer gets an instance attribute
``forward`` (its adapter's routed forward) and ``_replayssm`` (the adapter);
the model gets ``_replayssm`` (the patch context) and, on transformers
< 5.25, ``_is_stateful = False`` (an instance attribute shadowing the class
flag that makes ``generate`` refuse assisted decoding; the replay cache layer
can roll back).
Configs set to transformers' ``"sdpa"`` attention switch to replayssm's
(``attention.py``: grouped-query heads packed for decode-length queries
instead of copying the KV cache per head), registered with transformers'
attention and mask registries under a new name. No class of transformers
and no existing registry entry is changed, no parameter or buffer is added,
so ``state_dict``/``save_pretrained`` are unaffected. The one change to
parameters: a Gated DeltaNet mixer's input projections share one stacked
storage while patched (``projections.py``; values unchanged, no memory
added), which ``unpatch`` separates again.
Every patch also sets ``get_compiled_call`` on the model (the compiled
decode step of a static-cache ``generate``, with a fallback to eager
decoding), and ``patch(model, compile=True)`` sets ``generate`` (a wrapper
asking for the static cache and compilation; ``compiled.py``).
``unpatch`` deletes exactly those attributes.

Every check runs, and every adapter is built, before the first attribute is
set: a failing patch leaves the model untouched.
"""

from __future__ import annotations

from torch import nn

from ...config import ReplayConfig
from . import attention, compiled
from .registry import SUPPORTED_MODEL_TYPES, handler_for, mixer_like

class PatchContext:
    """What one patch of one model shares: the config and the adapters by cache layer index."""

    def __init__(self, model: nn.Module, config: ReplayConfig, step: str = "replay", compile_config=None):
        self.config = config
        self.step = step
        #: the transformers CompileConfig generate() uses for the static-shape path (None: patch(compile=False))
        self.compile_config = compile_config
        #: why compiling or CUDA-graph recording of the decode step failed (then this patch decodes eagerly), or None
        self.compile_failure: str | None = None
        #: why inductor ran the compiled step without CUDA graphs (warned once; tokens unaffected), or None
        self.cudagraph_skip: str | None = None
        #: inside a verification forward of captured assisted decoding (verify.py), and how many ran compiled
        self.verifying = False
        self.captured_verifications = 0
        #: the configs whose attention patch switched from "sdpa" to attention.ATTENTION (unpatch switches them back)
        self.attention_configs: list = []
        #: instance attributes of the model set by patch (beyond _replayssm/_is_stateful) and what they shadowed
        self.model_attributes: dict[str, tuple[bool, object]] = {}
        self.model_name = type(model).__name__
        self.adapters: dict[int, object] = {}
        self.num_layers = _cache_layer_count(model)
        # an instance-level _is_stateful the user had set before patching (restored by unpatch)
        self.had_is_stateful = "_is_stateful" in model.__dict__
        self.saved_is_stateful = model.__dict__.get("_is_stateful")

    def __repr__(self) -> str:
        families = sorted({a.family for a in self.adapters.values()})
        compiled = ", compile=True" if self.compile_config is not None else ""
        return f"ReplayPatch({self.model_name}, {len(self.adapters)} mixers ({', '.join(families)}), {self.config}, step={self.step!r}{compiled})"


def _cache_layer_count(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    if config is None:
        return None
    try:
        from transformers.cache_utils import DynamicCache

        return len(DynamicCache(config=config.get_text_config(decoder=True)).layers) or None
    except Exception:  # noqa: BLE001 - a config the cache cannot read: skip the layer-count check
        return None


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "model_type", None) or type(model).__name__


STEPS = ("replay", "conventional")


def patch(model: nn.Module, config: ReplayConfig | None = None, *, step: str = "replay", compile=False) -> nn.Module:  # noqa: A002
    """Decode ``model``'s Mamba-2 / Gated DeltaNet mixers through replay state; returns ``model`` (patched in place).

    Args:
        model: a transformers model (any head) whose mixers are among the
            supported families; see ``SUPPORTED_MODEL_TYPES``.
        config: window and dtypes of the replay state (``ReplayConfig()`` by
            default). Patching an already patched model re-patches it with
            the new config.
        step: ``"replay"``, or ``"conventional"`` to decode through the
            conventional replayssm op (read and write the whole state every
            token; the benchmarks' baseline; no rollback, so no assisted
            decoding).
        compile: ``True`` (or a ``transformers.CompileConfig``) for the
            static-shape decode path: ``generate()`` then uses a static cache
            and runs each decode step through ``torch.compile`` (default
            ``fullgraph=True, dynamic=False, mode="reduce-overhead"``: CUDA
            graphs on CUDA), on any device. If compiling fails, a warning
            says why and decoding continues eagerly. See docs/hf.md.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` or ``config`` not a ``ReplayConfig``.
        ValueError: no supported mixer, mixers replaced by hub kernels or
            another patch, or weights on the meta device. Nothing is changed.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"replayssm.patch: model must be a torch.nn.Module (a transformers model), got {type(model).__name__}")
    if config is None:
        config = ReplayConfig()
    if not isinstance(config, ReplayConfig):
        raise TypeError(f"replayssm.patch: config must be a replayssm.ReplayConfig, got {type(config).__name__}")
    if step not in STEPS:
        raise ValueError(f"replayssm.patch: step must be one of {STEPS}, got {step!r}")
    compile_config = compiled.compile_config_for(compile)
    compiled.check_model(model, compile_config)
    # use_kernels=True alone is no reason to refuse: transformers >= 5.25 loads every model with it, and hub kernels
    # that replace a mixer's forward are caught below (an unknown mixer class or a forward set on the instance).
    if isinstance(model.__dict__.get("_replayssm"), PatchContext):
        unpatch(model)

    mixers = []
    for name, module in model.named_modules():
        handler = handler_for(module)
        if handler is None:
            if mixer_like(module):
                raise ValueError(
                    f"replayssm.patch: {name} is a {type(module).__module__}.{type(module).__name__}, not a transformers "
                    "mixer replayssm knows (replaced by hub kernels?); nothing was patched"
                )
            continue
        if "forward" in module.__dict__:
            raise ValueError(
                f"replayssm.patch: {name} ({type(module).__name__}) already has its forward replaced on the instance "
                "(hub kernels or another patch); nothing was patched"
            )
        mixers.append((name, module, handler))
    if not mixers:
        raise ValueError(
            f"replayssm.patch: {type(model).__name__} (model_type {_model_type(model)!r}) has no supported "
            f"Mamba-2 or Gated DeltaNet mixer; supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.device.type == "meta":
            raise ValueError(
                f"replayssm.patch: {name} is on the meta device; load or materialise the weights "
                "(e.g. model.to_empty(...) and load a state dict) before patching"
            )

    context = PatchContext(model, config, step, compile_config)
    for name, module, handler in mixers:
        layer_idx = getattr(module, "layer_idx", None)
        if not isinstance(layer_idx, int):
            raise ValueError(f"replayssm.patch: {name} has no integer layer_idx; cannot find its cache layer")
        if layer_idx in context.adapters:
            raise ValueError(f"replayssm.patch: {name} shares cache layer {layer_idx} with another mixer")
        if context.num_layers is not None and layer_idx >= context.num_layers:
            raise ValueError(f"replayssm.patch: {name} has layer_idx {layer_idx}, beyond the {context.num_layers} cache layers")
        context.adapters[layer_idx] = handler.build(module, config, context)
    for adapter in context.adapters.values():  # what the states, made at the first forward, would refuse
        try:
            adapter.state_type.check_config(config)
        except ValueError as error:
            raise ValueError(f"replayssm.patch: {error}; nothing was patched") from None

    # All checked and built: apply.
    context.attention_configs = attention.sdpa_configs(model)
    if context.attention_configs:
        attention.register()
        attention.switch(context.attention_configs, attention.ATTENTION)
    for adapter in context.adapters.values():
        adapter.apply()
        adapter.mixer.forward = adapter.forward
        adapter.mixer._replayssm = adapter
    model._replayssm = context
    for name, value in compiled.install(model, context).items():
        context.model_attributes[name] = (name in model.__dict__, model.__dict__.get(name))
        setattr(model, name, value)
    if step == "replay" and getattr(type(model), "_is_stateful", False):
        # transformers < 5.25 refuses assisted decoding of SSM models; the replay layer can roll back. (The
        # conventional step cannot: its refusal stays, and on >= 5.25 the cache layer refuses, see cache.py.)
        model._is_stateful = False
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo :func:`patch`: remove every attribute it set; returns ``model``. A no-op on an unpatched model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"replayssm.unpatch: model must be a torch.nn.Module, got {type(model).__name__}")
    context = model.__dict__.get("_replayssm")
    if not isinstance(context, PatchContext):
        return model
    for adapter in context.adapters.values():
        mixer = adapter.mixer
        if mixer.__dict__.get("forward") == adapter.forward:
            del mixer.forward
        mixer.__dict__.pop("_replayssm", None)
        adapter.restore()
    del model._replayssm
    attention.switch([c for c in context.attention_configs if c._attn_implementation_internal == attention.ATTENTION], "sdpa")
    for name, (had, saved) in context.model_attributes.items():
        if had:
            setattr(model, name, saved)
        else:
            model.__dict__.pop(name, None)
    if context.had_is_stateful:
        model._is_stateful = context.saved_is_stateful
    else:
        model.__dict__.pop("_is_stateful", None)
    return model


def is_patched(model: nn.Module) -> bool:
    return isinstance(getattr(model, "__dict__", {}).get("_replayssm"), PatchContext)
