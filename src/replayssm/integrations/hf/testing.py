"""Tiny random models of every supported type, built offline from configs (tests, demo, examples).

Sizes are small enough for a CPU test suite but keep the structure that
matters: several heads and groups, key heads shared by value heads, hybrid
layer patterns with attention, and a conv window of 4.
"""

from __future__ import annotations

import copy

import torch

VOCAB = 96

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)

_MAMBA2_SSM = dict(mamba_n_heads=4, mamba_d_head=32, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8)
_GDN = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    head_dim=16,
)

_GDN_HYBRID = dict(num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], **_GDN)
_MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32)

#: model_type -> config overrides (on top of _COMMON)
TINY_CONFIGS: dict[str, dict] = {
    "mamba2": dict(
        num_hidden_layers=2, num_heads=4, head_dim=32, expand=2, state_size=16, n_groups=2, conv_kernel=4, chunk_size=8
    ),
    "nemotron_h": dict(
        layers_block_type=["mamba", "attention", "mamba", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=8,
        head_dim=16,
    ),
    "bamba": dict(num_hidden_layers=3, attn_layer_indices=[1], **_MAMBA2_SSM),
    "granitemoehybrid": dict(
        num_hidden_layers=3,
        layer_types=["mamba", "attention", "mamba"],
        num_local_experts=2,
        num_experts_per_tok=1,
        shared_intermediate_size=64,
        **_MAMBA2_SSM,
    ),
    "falcon_h1": dict(num_hidden_layers=2, head_dim=16, mamba_d_ssm=128, **_MAMBA2_SSM),
    "zamba2": dict(
        num_hidden_layers=3,
        layers_block_type=["mamba", "hybrid", "mamba"],
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_ngroups=2,
        mamba_headdim=32,
        n_mamba_heads=4,
        attention_head_dim=16,
        num_mem_blocks=1,
        use_mem_rope=True,
        chunk_size=8,
    ),
    "qwen3_next": dict(decoder_sparse_step=1, **_GDN_HYBRID, **_MOE),
    "qwen3_5": dict(**_GDN_HYBRID),
    "qwen3_5_moe": dict(**_GDN_HYBRID, **_MOE),
    "olmo_hybrid": dict(**_GDN_HYBRID),
}

MODEL_TYPES = tuple(TINY_CONFIGS)


def stock_refuses_assisted() -> bool:
    """transformers < 5.25 refuses assisted decoding of SSM models (their classes set ``_is_stateful``); from
    5.25 it runs it, keeping a state per draft token for rollback."""
    from transformers import PreTrainedModel

    return hasattr(PreTrainedModel, "_is_stateful")


def tiny_config(model_type: str, **overrides):
    """A tiny config of ``model_type`` (text decoder config for multimodal types)."""
    from transformers import AutoConfig

    if model_type not in TINY_CONFIGS:
        raise ValueError(f"no tiny config for {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    kwargs = copy.deepcopy({**_COMMON, **TINY_CONFIGS[model_type], **overrides})  # configs may edit lists in place
    config = AutoConfig.for_model(model_type, **kwargs)
    text = config.get_text_config(decoder=True)
    if text is not config:  # multimodal wrappers (qwen3_5): the settings belong to the text model
        for key, value in kwargs.items():
            if hasattr(text, key):
                setattr(text, key, value)
        return text
    return config


def tiny_model(model_type: str, seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    """A tiny random causal LM of ``model_type`` in eval mode (weights from ``seed``)."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # Random init gives near-identity decays and tiny logits; make the dynamics and the logits more distinct.
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "A_log") and isinstance(module.A_log, torch.nn.Parameter):
                module.A_log.uniform_(-1.0, 1.0)
            if hasattr(module, "dt_bias") and isinstance(module.dt_bias, torch.nn.Parameter):
                module.dt_bias.uniform_(-2.0, 0.5)
    return model.eval()


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its cache by (``cache`` on 5.24; ``past_key_values`` or ``cache_params`` on 5.17)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in params:
            return name
    raise TypeError(f"{type(model).__name__}.forward takes no cache argument")


def output_cache(output):
    """The cache a model output or a generate output carries (``.cache`` on 5.24, ``.past_key_values``/``.cache_params`` before)."""
    for name in ("cache", "past_key_values", "cache_params"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


def new_cache(model):
    """An empty ``DynamicCache`` for ``model`` (what generate builds)."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config.get_text_config(decoder=True))


def left_padded_prompts(lengths=(9, 6, 4), seed: int = 1, pad_token_id: int = 0):
    """``(input_ids, attention_mask)`` of a left-padded batch with the given prompt lengths."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=g)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        mask[row, width - n :] = 1
    ids[mask == 0] = pad_token_id
    return ids, mask


def generate_with_logits(model, ids, mask=None, new_tokens: int = 10, **kwargs):
    """``(sequences, logits (batch, new_tokens, vocab))`` of ``generate`` for exactly ``new_tokens`` tokens."""
    out = model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        output_logits=True,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, torch.stack(out.logits, dim=1)
