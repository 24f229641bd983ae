"""The handler registry: mixer class -> adapter factory.

Keyed by the mixer's class name within ``transformers.models`` (the classes
live in per-model modules that may not all import on every transformers
version, so names are matched rather than imported). One adapter family per
mixer family; a variant records what a class does differently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from . import gdn, mamba2


@dataclass(frozen=True)
class Handler:
    model_type: str
    family: str
    build: Callable  # (mixer, config, context) -> MixerAdapter


def _mamba2(variant: mamba2.Mamba2Variant) -> Callable:
    return lambda mixer, config, context: mamba2.Mamba2Adapter(mixer, config, context, variant)


def _gdn(variant: gdn.GDNVariant) -> Callable:
    return lambda mixer, config, context: gdn.GDNAdapter(mixer, config, context, variant)


#: mixer class name -> handler
HANDLERS: dict[str, Handler] = {
    "Mamba2Mixer": Handler("mamba2", "mamba2", _mamba2(mamba2.PLAIN)),
    "BambaMixer": Handler("bamba", "mamba2", _mamba2(mamba2.PLAIN)),
    "FalconH1Mixer": Handler("falcon_h1", "mamba2", _mamba2(mamba2.FALCON_H1)),
    "GraniteMoeHybridMambaLayer": Handler("granitemoehybrid", "mamba2", _mamba2(mamba2.PLAIN)),
    "NemotronHMamba2Mixer": Handler("nemotron_h", "mamba2", _mamba2(mamba2.PLAIN)),
    "Zamba2MambaMixer": Handler("zamba2", "mamba2", _mamba2(mamba2.PLAIN)),
    "Qwen3NextGatedDeltaNet": Handler("qwen3_next", "gdn", _gdn(gdn.QWEN3_NEXT)),
    "Qwen3_5GatedDeltaNet": Handler("qwen3_5", "gdn", _gdn(gdn.QWEN3_5)),
    "Qwen3_5MoeGatedDeltaNet": Handler("qwen3_5_moe", "gdn", _gdn(gdn.QWEN3_5)),
    "OlmoHybridGatedDeltaNet": Handler("olmo_hybrid", "gdn", _gdn(gdn.OLMO_HYBRID)),
}

SUPPORTED_MODEL_TYPES = tuple(sorted({h.model_type for h in HANDLERS.values()}))


def handler_for(module: nn.Module) -> Handler | None:
    """The handler of a transformers mixer module, or None for any other module."""
    cls = type(module)
    handler = HANDLERS.get(cls.__name__)
    if handler is None or not cls.__module__.startswith("transformers.models."):
        return None
    return handler


def mixer_like(module: nn.Module) -> bool:
    """A module that looks like an SSM mixer but is not one we know (e.g. swapped by hub kernels)."""
    name = type(module).__name__
    return handler_for(module) is None and (
        name.endswith(("Mamba2Mixer", "MambaMixer", "GatedDeltaNet")) or name in HANDLERS
    )
