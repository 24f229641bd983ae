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


def _attention_inputs(seed: int, batch: int, kv_heads: int, groups: int, q_len: int, kv_len: int, dim: int):
    """float64 query / key / value and a boolean mask (batch, 1, q, kv) in which every query row attends somewhere."""
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, kv_heads * groups, q_len, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(batch, kv_heads, kv_len, dim, generator=gen, dtype=torch.float64)
    keep = torch.rand(batch, 1, q_len, kv_len, generator=gen) < 0.7
    keep[..., 0] = True
    return query, key, value, keep


def _additive(keep: torch.Tensor) -> torch.Tensor:
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, -1e9)


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
def test_packed_heads_equal_transformers_sdpa(q_len, mask_kind, monkeypatch):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, kv_heads, groups, dim = 3, 2, 4, 16
    query, key, value, keep = _attention_inputs(3, batch, kv_heads, groups, q_len, kv_len=7, dim=dim)
    mask = keep if mask_kind == "bool" else _additive(keep)
    module = _Module(groups)
    expected, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    calls = _record_sdpa(monkeypatch)
    got, weights = attention.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.3)
    assert calls == [(batch, kv_heads, groups * q_len, dim)]  # the packed form ran (no repeated KV heads)
    assert weights is None and got.shape == expected.shape == (batch, q_len, kv_heads * groups, dim)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("mask_kind", ["bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_grouped_products_equal_transformers_sdpa(q_len, mask_kind, dtype):
    """The CUDA form (two batched products around an fp32 softmax), run here with upcast operands."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, kv_heads, groups, dim = 3, 2, 4, 16
    query, key, value, keep = _attention_inputs(5, batch, kv_heads, groups, q_len, kv_len=11, dim=dim)
    additive = _additive(keep)
    expected, _ = sdpa_attention_forward(_Module(groups), query, key, value, additive, scaling=0.3)  # float64
    mask = keep if mask_kind == "bool" else additive.to(dtype)
    got = attention.grouped_products_attention(query.to(dtype), key.to(dtype), value.to(dtype), mask, scaling=0.3)
    assert got.dtype == dtype and got.shape == (batch, kv_heads * groups, q_len, dim)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(got.double().transpose(1, 2), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("cap", [None, 100], ids=["products", "over-the-score-cap"])
def test_packed_query_takes_the_products_where_asked(cap, monkeypatch):
    """The dispatch of the CUDA path, run on the CPU: the products unless their scores pass the cap, then SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, kv_heads, groups, q_len, kv_len, dim = 2, 2, 4, 3, 9, 8
    query, key, value, keep = _attention_inputs(8, batch, kv_heads, groups, q_len, kv_len, dim)
    monkeypatch.setattr(attention, "PRODUCTS_DEVICE_TYPES", ("cpu",))
    if cap is not None:
        monkeypatch.setattr(attention, "MAX_PRODUCT_SCORES", cap)  # 2 x 8 x 3 x 9 = 432 scores: over it
    module = _Module(groups)
    expected, _ = sdpa_attention_forward(module, query, key, value, keep)
    calls = _record_sdpa(monkeypatch)
    got, _ = attention.packed_gqa_sdpa(module, query, key, value, keep)
    assert calls == ([] if cap is None else [(batch, kv_heads, groups * q_len, dim)])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_grouped_products_fully_masked_row_is_finite():
    gen = torch.Generator().manual_seed(6)
    query = torch.randn(2, 4, 1, 8, generator=gen)
    key, value = torch.randn(2, 2, 5, 8, generator=gen), torch.randn(2, 2, 5, 8, generator=gen)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = False  # row 1 sees nothing (a padding row): the mean of its values, as transformers' eager path gives
    got = attention.grouped_products_attention(query, key, value, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[1], value[1].mean(dim=1, keepdim=True).repeat_interleave(2, dim=0).expand(4, 1, 8))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("q_len", [1, 5])
def test_packed_attention_on_cuda_takes_the_products(q_len, monkeypatch):
    """On CUDA a short bf16 query skips SDPA: fp32 scores from ``bmm(out_dtype=float32)``, equal to float64."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(7)
    batch, kv_heads, groups, kv_len, dim = 5, 2, 8, 300, 256
    query = torch.randn(batch, kv_heads * groups, q_len, dim, device="cuda", dtype=torch.bfloat16)
    key = torch.randn(batch, kv_heads, kv_len, dim, device="cuda", dtype=torch.bfloat16)
    value = torch.randn(batch, kv_heads, kv_len, dim, device="cuda", dtype=torch.bfloat16)
    keep = torch.rand(batch, 1, q_len, kv_len, device="cuda") < 0.8
    keep[..., 0] = True
    module = _Module(groups)
    expected, _ = sdpa_attention_forward(module, *(t.double() for t in (query, key, value)), keep, scaling=dim**-0.5)
    calls = _record_sdpa(monkeypatch)
    got, _ = attention.packed_gqa_sdpa(module, query, key, value, keep)
    assert calls == []
    err = ((got.double() - expected).norm() / expected.norm()).item()
    assert err < 5e-3, err  # bf16 probabilities and output (SDPA's fused kernels: about 2e-3)


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
