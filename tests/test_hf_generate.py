"""Patched generate() against unpatched generate(), for every supported model type (tiny random fp32 models).

Greedy decoding must give the same tokens and logits within 1e-4, for one
prompt and for a left-padded batch of three, over more new tokens than two
ring windows (window 4, 10 new tokens: every row folds its ring twice).
Sampling (same seed) and beam search are checked on one model per family.
"""

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402

pytestmark = pytest.mark.hf

WINDOW = 4
NEW_TOKENS = 10  # > 2 windows
ATOL = 1e-4


def _greedy(model, ids, mask):
    return testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("model_type", testing.MODEL_TYPES)
def test_greedy_matches_unpatched(model_type):
    model = testing.tiny_model(model_type)
    single = (torch.tensor([[5, 17, 33, 8, 61, 12, 40, 7, 22]]), None)
    batch = testing.left_padded_prompts()
    expected = [_greedy(model, *prompt) for prompt in (single, batch)]

    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
    for (ids, mask), (ref_tokens, ref_logits) in zip((single, batch), expected):
        tokens, logits = _greedy(model, ids, mask)
        assert tokens.shape == ref_tokens.shape
        assert torch.equal(tokens, ref_tokens), f"{model_type}: batch {ids.shape[0]} tokens differ"
        torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)


def _replay_layers(cache):
    from replayssm.integrations.hf import ReplayLayerMixin

    return [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin)]


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_generate_uses_replay_state(model_type):
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=WINDOW))
    ids = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 7, 22]])
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
    layers = _replay_layers(testing.output_cache(out))
    assert layers, "no replay layer in the generate cache"
    for layer in layers:
        assert layer.replay.window == WINDOW
        # prefill loads the checkpoint; NEW_TOKENS - 1 decode steps follow, each committed
        assert int(layer.replay.cursor[0]) == (NEW_TOKENS - 1 - 1) % WINDOW + 1
        assert int(layer.replay.pending[0]) == 0


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5", "falcon_h1"])
def test_sampling_matches_unpatched(model_type):
    model = testing.tiny_model(model_type)
    ids, mask = testing.left_padded_prompts()
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=True, top_k=0, temperature=1.3)
    torch.manual_seed(123)
    expected = model.generate(ids, **kwargs)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
    torch.manual_seed(123)
    got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5", "zamba2"])
def test_beam_search_matches_unpatched(model_type):
    model = testing.tiny_model(model_type)
    ids, mask = testing.left_padded_prompts(lengths=(7, 5))
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, num_beams=3, do_sample=False, num_return_sequences=2)
    expected = model.generate(ids, **kwargs)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
    got = model.generate(ids, **kwargs)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5", "falcon_h1", "olmo_hybrid"])
def test_conventional_step_matches_unpatched(model_type):
    """step='conventional' (the benchmarks' baseline) decodes through the conventional replayssm op."""
    model = testing.tiny_model(model_type)
    batch = testing.left_padded_prompts()
    ref_tokens, ref_logits = _greedy(model, *batch)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW), step="conventional")
    tokens, logits = _greedy(model, *batch)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)
    # no rollback: transformers' refusal stays (< 5.25); from 5.25, which would run it, the cache layer refuses
    refusal = "stateful" if testing.stock_refuses_assisted() else "step='conventional' cannot roll back"
    with pytest.raises(ValueError, match=refusal):
        model.generate(batch[0][:1], max_new_tokens=3, prompt_lookup_num_tokens=2)
    with pytest.raises(ValueError, match="step must be one of"):
        replayssm.patch(model, step="fast")


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("falcon_h1", dict(mamba_rms_norm=True)),  # gate in the norm instead of the recurrence
        ("olmo_hybrid", dict(linear_allow_neg_eigval=False)),  # beta in (0, 1) instead of (0, 2)
        ("mamba2", dict(n_groups=1)),
    ],
    ids=["falcon_h1-rmsnorm", "olmo_hybrid-posbeta", "mamba2-1group"],
)
def test_greedy_matches_unpatched_config_variants(model_type, overrides):
    model = testing.tiny_model(model_type, **overrides)
    # unpadded batch: transformers 5.17's falcon_h1 with mamba_rms_norm=True fails on left padding, unpatched
    batch = testing.left_padded_prompts(lengths=(9, 9, 9))
    ref_tokens, ref_logits = _greedy(model, *batch)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
    tokens, logits = _greedy(model, *batch)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "model_type, read_dtype",
    [("nemotron_h", torch.bfloat16), ("qwen3_5", torch.bfloat16), ("nemotron_h", torch.float8_e4m3fn)],
)
def test_read_copy_generates_close_to_unpatched(model_type, read_dtype):
    """``ReplayConfig(read_dtype=...)`` (SPEC §4): generate() runs with the copy in every replay layer, the
    copy is the checkpoint rounded (fp8: with a scale per row, docs/ops.md; Mamba-2 only), and the logits
    stay within the copy's rounding of the unpatched ones (they differ from the fp32-read patched ones, so
    the copy is what the steps read)."""
    from replayssm.ops.replay_math import quantize_rows_e4m3

    model = testing.tiny_model(model_type)
    batch = testing.left_padded_prompts()
    ref_tokens, ref_logits = _greedy(model, *batch)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
    _, fp32_logits = _greedy(model, *batch)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW, read_dtype=read_dtype))
    tokens, logits = _greedy(model, *batch)
    assert tokens.shape == ref_tokens.shape
    steps = min(logits.shape[1], ref_logits.shape[1])
    gap = (logits[:, :steps] - ref_logits[:, :steps]).abs().max().item()
    scale = ref_logits.abs().max().item()
    assert 0 < gap < (1e-3 if read_dtype == torch.bfloat16 else 2e-2) * scale
    assert not torch.equal(logits, fp32_logits)
    ids, mask = batch
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
    layers = _replay_layers(testing.output_cache(out))
    assert layers
    for layer in layers:
        read = layer.replay.read_checkpoint
        assert read is not None and read.dtype == read_dtype
        if read_dtype == torch.float8_e4m3fn:
            values, row_scale = quantize_rows_e4m3(layer.replay.checkpoint)
            assert torch.equal(read.view(torch.uint8), values.view(torch.uint8))
            assert torch.equal(layer.replay.read_scale, row_scale)
        else:
            assert torch.equal(read, layer.replay.checkpoint.to(read_dtype))
