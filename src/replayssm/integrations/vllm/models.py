"""Model classes whose cache sizing counts the replay ring.

vLLM sizes each state slot's page from the model class's
``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config``
before any layer exists, and a layer whose state is larger than that page
fails at start-up. These subclasses report the ring tensors the replay layers
add (``_common.ring_layout``), so the ring is inside vLLM's pages and in its
memory accounting. ``register`` installs them for ``_common.ARCHITECTURES`` (lazily,
by module path); other architectures that build the same layers are refused
with a clear message at layer construction.
"""

from __future__ import annotations

from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM

from . import _common as C

class _RingSizedMixin:
    _replay_family: str

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        base = tuple(super().get_mamba_state_shape_from_config(vllm_config))
        layout = C.ring_layout(cls._replay_family, base, vllm_config.model_config.dtype, C.window_from_env())
        return base + tuple(shape for _, shape, _ in layout)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        base = tuple(super().get_mamba_state_dtype_from_config(vllm_config))
        shapes = tuple(super().get_mamba_state_shape_from_config(vllm_config))
        layout = C.ring_layout(cls._replay_family, shapes, vllm_config.model_config.dtype, C.window_from_env())
        return base + tuple(dtype for _, _, dtype in layout)


class ReplayNemotronHForCausalLM(_RingSizedMixin, NemotronHForCausalLM):
    _replay_family = "mamba2"


class ReplayQwen3NextForCausalLM(_RingSizedMixin, Qwen3NextForCausalLM):
    _replay_family = "gdn"
