"""Assisted decoding on patched models is exact, and crop() rolls the recurrent state back.

Stock transformers refuses assisted decoding on these models; patched, it
must return exactly the tokens of unpatched greedy decoding, with a patched
SSM-hybrid assistant and with prompt lookup. The prompts repeat themselves so
that prompt lookup drafts correct tokens sometimes, and the assistant is a
perturbed copy of the target (right often, wrong sometimes), so verification
both accepts and rolls back. The regression tests check the rollback itself:
after a verify + partial crop, the next logits equal a no-cache forward of
the accepted prefix.
"""

import copy

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import ReplayLayerMixin, testing  # noqa: E402

pytestmark = pytest.mark.hf

NEW_TOKENS = 16
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]])
ATOL = 1e-4


def _rolled_back(cache) -> int:
    return sum(layer.rolled_back for layer in cache.layers if isinstance(layer, ReplayLayerMixin))


class _CountForwards:
    def __init__(self, model):
        self.calls = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *args):
        self.calls += 1


def _drafting(assistant, tokens=4):
    assistant.generation_config.num_assistant_tokens = tokens
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0  # always draft `tokens` (random models are unsure)
    return replayssm.patch(assistant, replayssm.ReplayConfig(window=4))


def _assistant_for(target):
    """A patched assistant: a perturbed copy of the target (right often, wrong sometimes)."""
    assistant = copy.deepcopy(target)
    with torch.no_grad():
        head = assistant.get_output_embeddings().weight
        head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(7)) * head.std() * 0.6)
    return _drafting(assistant)


@pytest.mark.parametrize("model_type", testing.MODEL_TYPES)
def test_assisted_decoding_is_exact(model_type):
    target = testing.tiny_model(model_type)
    if testing.cache_kwarg(target) == "cache_params":
        # transformers 5.17's Mamba2 takes its cache as `cache_params`, which the 5.17 assisted loop never
        # finds: it fails before any mixer runs, patched or not (documented in docs/hf.md).
        replayssm.patch(target)
        with pytest.raises(RuntimeError, match="requires a cache"):
            target.generate(PROMPT, max_new_tokens=4, prompt_lookup_num_tokens=3)
        return
    expected = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assistant = _assistant_for(target)
    replayssm.patch(target, replayssm.ReplayConfig(window=4))

    rolled_back, forwards = 0, 0
    for extra in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=assistant)):
        counter = _CountForwards(target)
        out = target.generate(
            PROMPT,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            return_dict_in_generate=True,
            **extra,
        )
        counter.handle.remove()
        assert torch.equal(out.sequences, expected), f"{model_type} {sorted(extra)}: tokens differ from greedy"
        cache = testing.output_cache(out)
        # the cache holds every token but the last one generated (transformers >= 5.25 counts them on the
        # linear layers too, and rollbacks must take them back there)
        assert int(cache.get_seq_length()) == out.sequences.shape[1] - 1
        rolled_back += _rolled_back(cache)
        forwards += counter.calls
    assert rolled_back > 0, "no draft was rejected: the rollback path was not exercised"
    assert forwards < 2 * NEW_TOKENS, "no draft was accepted: every token took its own forward"


def test_all_ssm_assistant_for_a_gdn_hybrid():
    """A pure Mamba-2 draft model (every cache layer an SSM layer) for a Gated DeltaNet hybrid target."""
    target = testing.tiny_model("qwen3_5")
    expected = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assistant = _drafting(testing.tiny_model("mamba2", seed=2))
    replayssm.patch(target, replayssm.ReplayConfig(window=4))
    if testing.cache_kwarg(assistant) == "cache_params":
        # transformers 5.17 hands a draft model its cache as `past_key_values`, which 5.17's Mamba2 does not take
        with pytest.raises(ValueError, match="past_key_values"):
            target.generate(PROMPT, max_new_tokens=4, assistant_model=assistant)
        return
    inputs = []
    hook = assistant.register_forward_pre_hook(lambda m, a, kw: inputs.append(kw["input_ids"].shape[1]), with_kwargs=True)
    out = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, assistant_model=assistant)
    hook.remove()
    assert torch.equal(out, expected)
    # the draft model continues its own cache: after its prefill it is fed the new tokens only
    assert inputs[0] == PROMPT.shape[1] and max(inputs[1:]) <= 2


def _forward(model, ids, cache=None):
    kwargs = {} if cache is None else {testing.cache_kwarg(model): cache, "use_cache": True}
    return model(input_ids=ids, **kwargs).logits


#: transformers' own cached decoding of these types differs from their no-cache forward by more than
#: ATOL, unpatched (bamba: ~2e-3 on 5.24); there the exact reference is the unpatched model's cached
#: decoding of the accepted prefix, which every type is also checked against.
UPSTREAM_CACHE_MISMATCH = {"bamba"}


def _unpatched_cached_logits(model, ids, prefill, end):
    """Unpatched: prefill ``ids[:, :prefill]``, then one token at a time up to ``end``; last logits."""
    replayssm.unpatch(model)
    cache = testing.new_cache(model)
    with torch.no_grad():
        logits = _forward(model, ids[:, :prefill], cache)
        for pos in range(prefill, end):
            logits = _forward(model, ids[:, pos : pos + 1], cache)
    return logits[:, -1]


@pytest.mark.parametrize("model_type", testing.MODEL_TYPES)
def test_verify_then_partial_crop_matches_no_cache_forward(model_type):
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=4))
    ids = torch.randint(3, testing.VOCAB, (1, 20), generator=torch.Generator().manual_seed(4))
    cache = testing.new_cache(model)
    with torch.no_grad():
        _forward(model, ids[:, :9], cache)
        cache.activate_past_recording()
        # assistant-like: two single-token steps (committed), then verify 4 tokens, then crop 3 of them
        _forward(model, ids[:, 9:10], cache)
        _forward(model, ids[:, 10:11], cache)
        _forward(model, ids[:, 11:15], cache)
        cache.crop(-3)  # keep ids[:, 11:12]
        # a second round that also takes back committed single-token steps
        _forward(model, ids[:, 12:13], cache)
        _forward(model, ids[:, 13:14], cache)
        _forward(model, ids[:, 14:15], cache)
        cache.crop(-2)  # keep ids[:, 12:13]
        got = _forward(model, ids[:, 13:14], cache)[:, -1]
        no_cache = _forward(model, ids[:, :14])[:, -1]
    if model_type not in UPSTREAM_CACHE_MISMATCH:
        torch.testing.assert_close(got, no_cache, atol=ATOL, rtol=0)
    torch.testing.assert_close(got, _unpatched_cached_logits(model, ids, 9, 14), atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_rollback_survives_folds_and_ring_growth(model_type):
    """Speculative runs longer than the window, crossing fold points: the ring grows, nothing is lost."""
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=3))
    ids = torch.randint(3, testing.VOCAB, (1, 40), generator=torch.Generator().manual_seed(5))
    cache = testing.new_cache(model)
    with torch.no_grad():
        _forward(model, ids[:, :6], cache)
        cache.activate_past_recording()
        pos = 6
        for steps, back in ((5, 4), (2, 1), (7, 3), (1, 0), (6, 6)):
            for _ in range(steps):
                _forward(model, ids[:, pos : pos + 1], cache)
                pos += 1
            cache.crop(-back)
            pos -= back
        got = _forward(model, ids[:, pos : pos + 1], cache)[:, -1]
        no_cache = _forward(model, ids[:, : pos + 1])[:, -1]
    torch.testing.assert_close(got, no_cache, atol=ATOL, rtol=0)
    torch.testing.assert_close(got, _unpatched_cached_logits(model, ids, 6, pos + 1), atol=ATOL, rtol=0)


def test_stock_transformers_assisted_decoding_of_an_unpatched_model():
    """transformers < 5.25 refuses assisted decoding of SSM models; from 5.25 it runs it (keeping a state per
    draft token, the snapshot scheme replay avoids) and its tokens are greedy's."""
    model = testing.tiny_model("nemotron_h")
    if testing.stock_refuses_assisted():
        with pytest.raises(ValueError, match="stateful"):
            model.generate(PROMPT, max_new_tokens=4, prompt_lookup_num_tokens=3)
        return
    expected = model.generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    out = model.generate(
        PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, prompt_lookup_num_tokens=3
    )
    assert torch.equal(out, expected)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_assisted_decoding_with_a_read_copy(model_type):
    """With ``ReplayConfig(read_dtype=bf16)`` verification and rollback work as with fp32 reads: prompt lookup
    drafts, some are rejected, the tokens are greedy's (these tiny models' top tokens lie further apart than a
    bf16 copy's rounding moves them), and afterwards every layer's copy is its checkpoint rounded."""
    target = testing.tiny_model(model_type)
    expected = target.generate(PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    replayssm.patch(target, replayssm.ReplayConfig(window=4, read_dtype=torch.bfloat16))
    out = target.generate(
        PROMPT, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
        return_dict_in_generate=True, prompt_lookup_num_tokens=3,
    )  # fmt: skip
    assert torch.equal(out.sequences, expected)
    cache = testing.output_cache(out)
    assert _rolled_back(cache) > 0, "no draft was rejected: the rollback path was not exercised"
    layers = [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin) and getattr(layer, "replay", None) is not None]
    assert layers
    for layer in layers:
        read = layer.replay.read_checkpoint
        assert read is not None and read.dtype == torch.bfloat16
        assert torch.equal(read, layer.replay.checkpoint.to(torch.bfloat16))
