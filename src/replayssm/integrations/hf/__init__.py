"""Hugging Face transformers integration: ``patch(model)`` decodes its SSM mixers through replay state.

See docs/hf.md. Importing this module imports transformers; ``import
replayssm`` does not (``replayssm.patch`` loads this on first use).
"""

from .cache import ReplayLayerMixin
from .patch import PatchContext, is_patched, patch, unpatch
from .registry import HANDLERS, SUPPORTED_MODEL_TYPES

__all__ = ["patch", "unpatch", "is_patched", "PatchContext", "ReplayLayerMixin", "HANDLERS", "SUPPORTED_MODEL_TYPES"]
