"""The patched model's SDPA attention: grouped-query heads packed for short queries, equal to transformers' path."""

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import attention, testing  # noqa: E402

pytestmark = pytest.mark.hf


class _Module(torch.nn.Module):
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _record_sdpa(monkeypatch) -> list:
    """The query shapes of every scaled_dot_product_attention call from now on."""
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def recording(query, *args, **kwargs):
        calls.append(tuple(query.shape))
        return original(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_packed_heads_equal_transformers_sdpa(q_len, mask_kind, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(3)
    batch, kv_heads, groups, kv_len, dim = 3, 2, 4, 7, 16
    query = torch.randn(batch, kv_heads * groups, q_len, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    keep = torch.rand(batch, 1, q_len, kv_len, generator=gen) < 0.7
    keep[..., 0] = True  # every query row attends somewhere
    mask = keep if mask_kind == "bool" else torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -1e9)
    module = _Module(groups)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    calls = _record_sdpa(monkeypatch)
    got, weights = attention.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.3)
    assert calls == [(batch, kv_heads, groups * q_len, dim)]  # the packed form ran (no repeated KV heads)
    assert weights is None and got.shape == expected.shape == (batch, q_len, kv_heads * groups, dim)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_other_cases_go_to_transformers():
    """No mask, a per-head mask, or a long query: transformers' own SDPA function, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(4)
    module = _Module(2)
    key = torch.randn(2, 2, 5, 8, generator=gen)
    value = torch.randn(2, 2, 5, 8, generator=gen)
    long_q = attention.MAX_PACKED_QUERY + 1
    cases = [
        (torch.randn(2, 4, 1, 8, generator=gen), None),
        (torch.randn(2, 4, 1, 8, generator=gen), torch.rand(2, 4, 1, 5, generator=gen) < 0.8),
        (torch.randn(2, 4, long_q, 8, generator=gen), torch.ones(2, 1, long_q, 5, dtype=torch.bool)),
    ]
    for query, mask in cases:
        expected, _ = sdpa_attention_forward(module, query, key, value, mask)
        got, _ = attention.packed_gqa_sdpa(module, query, key, value, mask)
        torch.testing.assert_close(got, expected)


def test_patch_switches_sdpa_configs_and_unpatch_restores(monkeypatch):
    model = testing.tiny_model("qwen3_5")
    assert model.config._attn_implementation == "sdpa"
    ids, mask = testing.left_padded_prompts()  # padding: the decode steps' attention has a mask
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    replayssm.patch(model, replayssm.ReplayConfig(window=4))
    assert model.config._attn_implementation == attention.ATTENTION
    calls = _record_sdpa(monkeypatch)
    patched = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    assert (ids.shape[0], kv_heads, heads // kv_heads, model.config.head_dim) in calls  # decode steps ran packed
    assert torch.equal(patched, stock)
    replayssm.unpatch(model)
    assert model.config._attn_implementation == "sdpa"


def test_patch_leaves_other_attention_implementations():
    model = testing.tiny_model("nemotron_h")
    model.set_attn_implementation("eager")
    replayssm.patch(model)
    assert model.config._attn_implementation == "eager"
    replayssm.unpatch(model)
    assert model.config._attn_implementation == "eager"
