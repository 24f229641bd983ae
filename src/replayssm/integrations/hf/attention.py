"""Attention for the patched model's attention layers: grouped-query heads packed for short queries.

A hybrid's attention layers decode with a mask (a static cache always has one),
and transformers' SDPA path then repeats every key/value head for each of its
query heads before calling ``scaled_dot_product_attention`` (``repeat_kv``):
at batch 256 that copies the whole KV cache ``num_key_value_groups`` times per
step. On a captured Qwen3.5-like decode step (one attention layer, 16 query /
2 key-value heads; H200) the copy and the attention on the
repeated heads took 0.44 ms of a 1.71 ms step, while the KV cache is 50 MB.

For queries of at most ``MAX_PACKED_QUERY`` tokens (decoding, verification)
this implementation instead folds each group's query heads into the query
length, ``(batch, kv_heads, groups * q, dim)``, and attends to the key/value
heads as they are: the same products and softmax rows, no copy. The mask must
be shared by the heads (``(batch, 1, q, kv)``, what transformers' SDPA mask
function builds). Anything else goes to transformers' own SDPA function
unchanged.

On CUDA the packed query is computed as two batched products around an fp32
softmax (``grouped_products_attention``), not through SDPA: SDPA's fused
kernels (cuDNN on sm_90, the efficient kernel) run one program per (row,
key-value head) and a packed decode query fills a small part of their tiles,
so with few rows they leave the GPU idle and their time grows with the cache
length (batch 1, 2 key-value heads, 1,024 cached positions: 56 us against 8 us
for the products, H100; at batch 256 and 104 positions 56 against 36 us;
``benchmarks/hf_parts.py attention``, BENCHMARKS.md). The
scores are kept in fp32, as the fused kernels keep them; they are materialised,
so a query whose scores would pass ``MAX_PRODUCT_SCORES`` goes to SDPA. On the
CPU the packed query goes through SDPA.

``patch`` switches a model's configs from ``"sdpa"`` to this implementation
(``ATTENTION``, registered with transformers' attention and mask registries
under a new name; existing entries are not changed) and ``unpatch`` switches
them back. Models set to another implementation (eager, flash, flex) are left
alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: the name under which the attention and its mask function are registered with transformers
ATTENTION = "replayssm_sdpa"
#: the longest query (tokens) whose grouped heads are packed; longer ones (prefill) go to transformers' path
MAX_PACKED_QUERY = 16
#: device types on which a packed query takes the two-product form (elsewhere SDPA's, which suits the CPU)
PRODUCTS_DEVICE_TYPES = ("cuda",)
#: the most fp32 scores (batch x heads x query x cache positions) the two-product form materialises (256 MiB);
#: a larger short query (many rows of a multi-token call over a long cache) goes to SDPA, which keeps none
MAX_PRODUCT_SCORES = 2**26


def packed_gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-function signature: ``query`` ``(batch, heads, q, dim)``, ``key``/``value``
    ``(batch, kv_heads, kv, dim)``; returns ``((batch, q, heads, dim), None)``."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_len, _ = query.shape
    if (
        groups > 1
        and q_len <= MAX_PACKED_QUERY
        and key.shape[1] * groups == heads
        and attention_mask is not None
        and attention_mask.dim() == 4
        and attention_mask.shape[1] == 1
        and not (dropout and module.training)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
        and not kwargs.get("output_attentions", False)
    ):
        if query.device.type in PRODUCTS_DEVICE_TYPES and batch * heads * q_len * key.shape[2] <= MAX_PRODUCT_SCORES:
            out = grouped_products_attention(query, key, value, attention_mask, scaling)
        else:
            packed = query.reshape(batch, key.shape[1], groups * q_len, query.shape[-1])
            mask = attention_mask if q_len == 1 else attention_mask.repeat(1, 1, groups, 1)
            out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling)
        return out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)


def grouped_products_attention(query, key, value, attention_mask, scaling=None):
    """Attention of a short query as two batched products around an fp32 softmax, each group's query heads
    packed into rows against their key/value head.

    ``query`` ``(batch, heads, q, dim)``; ``key``/``value`` ``(batch, kv_heads, kv, dim)`` with ``heads`` a
    multiple of ``kv_heads``; ``attention_mask`` ``(batch, 1, q, kv)``, boolean (True: attend) or additive.
    Returns ``(batch, heads, q, dim)`` in ``value``'s dtype. The scores and the softmax are fp32 (for fp16 /
    bf16 inputs on CUDA the first product writes fp32 directly; elsewhere its operands are upcast); the
    probabilities are rounded to ``value``'s dtype for the second product, as SDPA's fused kernels do. A row
    whose mask hides every position gets a uniform average instead of NaN.
    """
    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    packed = query.reshape(batch * kv_heads, groups * q_len, dim)  # row g * q + t: head g of the group, token t
    keys_t = key.reshape(batch * kv_heads, kv_len, dim).transpose(1, 2)
    if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16):
        scores = torch.bmm(packed, keys_t, out_dtype=torch.float32)
    else:
        acc = torch.promote_types(query.dtype, torch.float32)
        scores = torch.bmm(packed.to(acc), keys_t.to(acc))
    scores = scores.view(batch, kv_heads, groups, q_len, kv_len) * scale
    mask = attention_mask[:, :, None]  # (batch, 1, 1, q, kv): the same for every head of every group
    if mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.bmm(probs.view(batch * kv_heads, groups * q_len, kv_len), value.reshape(batch * kv_heads, kv_len, dim))
    return out.view(batch, heads, q_len, dim)


def register() -> None:
    """Register ``ATTENTION`` with transformers' attention and mask registries (idempotent)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ATTENTION not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        ALL_ATTENTION_FUNCTIONS.register(ATTENTION, packed_gqa_sdpa)
    if ATTENTION not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping["sdpa"])


def sdpa_configs(model: torch.nn.Module) -> list:
    """The distinct configs of ``model`` and its submodules that are set to transformers' ``"sdpa"``."""
    found: dict[int, object] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        for c in [config] + [getattr(config, key, None) for key in getattr(config, "sub_configs", None) or {}]:
            if getattr(c, "_attn_implementation_internal", None) == "sdpa":
                found.setdefault(id(c), c)
    return list(found.values())


def switch(configs: list, implementation: str) -> None:
    """Set each config's attention implementation (the internal field: no sub-config dispatch, no checks)."""
    for config in configs:
        config._attn_implementation_internal = implementation
