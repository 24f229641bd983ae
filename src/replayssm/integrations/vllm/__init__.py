"""vLLM plugin: decode Mamba-2 and Gated DeltaNet layers through replayssm.

Entry point (group ``vllm.general_plugins``): ``register``. vLLM calls it
in every process; it does nothing unless ``REPLAYSSM_VLLM=1``, and is
idempotent. When on, it checks the vLLM version and the private interfaces
the adapter needs (``_interfaces``), then registers out-of-tree subclasses
of vLLM's ``MambaMixer2`` and ``QwenGatedDeltaNetAttention``: every model
that builds those layers gets the replay decode. See docs/vllm.md.

Importing this module imports nothing from vLLM.
"""

from __future__ import annotations

from ._common import ARCHITECTURES, COUNTS, ENABLE_ENV, WINDOW_ENV, ReplayConfigError, enabled
from ._interfaces import SUPPORTED_VERSIONS, UnsupportedVLLMError

__all__ = [
    "register",
    "unregister",
    "is_registered",
    "stats",
    "ENABLE_ENV",
    "WINDOW_ENV",
    "SUPPORTED_VERSIONS",
    "ARCHITECTURES",
    "ReplayConfigError",
    "UnsupportedVLLMError",
]

#: vLLM layer class name -> (module, class) of the replayssm subclass.
LAYERS = {
    "MambaMixer2": ("replayssm.integrations.vllm.mamba2", "ReplayMambaMixer2"),
    "QwenGatedDeltaNetAttention": ("replayssm.integrations.vllm.gdn", "ReplayQwenGatedDeltaNet"),
}


def _registry() -> dict:
    from vllm.model_executor.custom_op import op_registry_oot

    return op_registry_oot


def is_registered() -> bool:
    """True when replayssm's layers are the ones vLLM will build."""
    registry = _registry()
    return any(getattr(registry.get(name), "__module__", "").startswith("replayssm.") for name in LAYERS)


def register(force: bool = False) -> bool:
    """The ``vllm.general_plugins`` entry point. Returns True when the replay layers are active.

    Off unless ``REPLAYSSM_VLLM=1`` (or ``force=True``). Safe to call any
    number of times in any process. Raises ``UnsupportedVLLMError`` on an
    unsupported vLLM and ``RuntimeError`` when another plugin already
    replaced one of these layers.
    """
    if not (force or enabled()):
        return False
    import importlib

    from . import _interfaces

    _interfaces.check_version()
    _interfaces.check_interfaces()
    registry = _registry()
    for name, (module, cls_name) in LAYERS.items():
        current = registry.get(name)
        if current is not None:
            if getattr(current, "__module__", "").startswith("replayssm."):
                continue  # already registered in this process
            raise RuntimeError(f"replayssm vLLM adapter: {name} is already replaced by {current.__module__}.{current.__qualname__}")
        cls = getattr(importlib.import_module(module), cls_name)
        base = _interfaces.resolve(*_base_of(name))
        base.register_oot(cls, name=name)
    _register_models()
    return True


_saved_models: dict = {}


def _register_models() -> None:
    from vllm import ModelRegistry

    for arch, (cls_name, _) in ARCHITECTURES.items():
        current = ModelRegistry.models.get(arch)
        if getattr(current, "module_name", "") == "replayssm.integrations.vllm.models":
            continue
        _saved_models[arch] = current
        ModelRegistry.register_model(arch, f"replayssm.integrations.vllm.models:{cls_name}")


def _base_of(name: str) -> tuple[str, str]:
    return {
        "MambaMixer2": ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2"),
        "QwenGatedDeltaNetAttention": ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention"),
    }[name]


def unregister() -> None:
    """Undo ``register`` in this process: models built afterwards use vLLM's stock layers."""
    registry = _registry()
    for name in LAYERS:
        if getattr(registry.get(name), "__module__", "").startswith("replayssm."):
            del registry[name]
    if _saved_models:
        from vllm import ModelRegistry

        for arch, model in _saved_models.items():
            if model is None:
                ModelRegistry.models.pop(arch, None)
            else:
                ModelRegistry.models[arch] = model
        _saved_models.clear()


def stats() -> dict[str, int]:
    """Counters of this process: layers built, decode/verify/prefill calls, ring bytes allocated."""
    return dict(COUNTS)
