"""replayssm: checkpoint + ring-buffer decoding for state-space-model layers.

Importing the package registers the ``replayssm::*`` ops; it initialises no
CUDA context and imports no integration (transformers, vLLM): those load on
first use.
"""

from . import ops
from .config import ReplayConfig
from .state import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayState
from .traffic import Traffic, decode_traffic

__version__ = "0.1.0.dev0"


def __getattr__(name: str):
    # patch/unpatch live in the Hugging Face integration, which imports
    # transformers: load it on first use, never at package import.
    if name in ("patch", "unpatch"):
        from .integrations import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'replayssm' has no attribute {name!r}")

__all__ = [
    "ReplayConfig",
    "ReplayState",
    "Mamba2Geometry",
    "Mamba2ReplayState",
    "GDNGeometry",
    "GDNReplayState",
    "Traffic",
    "decode_traffic",
    "ops",
]
