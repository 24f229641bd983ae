"""Patched models on the GPU: the Triton kernels under generate(), eager and captured (issues 5 and 7).

The captured path is ``patch(model, compile=True)``: transformers' static
cache and its compiled decode step, inductor with mode "reduce-overhead", so
every decode step after the first is a CUDA-graph replay. What must hold:
bf16 greedy tokens equal to the eager patched path (same kernels, no graph),
no fallback to eager, and CUDA graphs actually used (inductor skipped none);
and a real capture failure (a host read inside the step) falls back to eager.
"""

import warnings

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402

pytestmark = [pytest.mark.hf, pytest.mark.cuda]

WINDOW = 4
NEW_TOKENS = 24  # six window cycles: folds happen inside captured steps


def _model(model_type: str, compile: bool, read_dtype=None):  # noqa: A002
    model = testing.tiny_model(model_type, dtype=torch.bfloat16).to("cuda")
    return replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW, read_dtype=read_dtype), compile=compile)


@pytest.mark.parametrize("read_dtype", [None, torch.bfloat16], ids=["fp32-reads", "bf16-read-copy"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_captured_greedy_equals_eager_patched_bf16(model_type, read_dtype):
    from torch._dynamo.utils import counters

    ids, mask = testing.left_padded_prompts()
    prompts = [(ids.cuda(), mask.cuda()), (ids[:1, -5:].cuda(), None)]
    eager = _model(model_type, compile=False, read_dtype=read_dtype)
    expected = [testing.generate_with_logits(eager, ids, mask, NEW_TOKENS, do_sample=False) for ids, mask in prompts]
    del eager

    model = _model(model_type, compile=True, read_dtype=read_dtype)
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager warns: fail instead
        for (ids, mask), (ref_tokens, ref_logits) in zip(prompts, expected):
            for _ in range(2):  # the second call replays graphs recorded by the first (new cache: re-recorded)
                tokens, logits = testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=False)
                assert torch.equal(tokens, ref_tokens), f"{model_type}: captured tokens differ from the eager patched path"
                # inductor fuses the bf16 projections differently from eager: logits agree to bf16 rounding
                torch.testing.assert_close(logits.float(), ref_logits.float(), atol=0.05, rtol=0.05)
    assert model._replayssm.compile_failure is None
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor ran the decode step without CUDA graphs"


@torch.library.custom_op("replayssm_test::host_read", mutates_args=())
def _host_read(x: torch.Tensor) -> torch.Tensor:
    x.sum().item()  # fine eagerly and in inductor's warmup run; not allowed while a stream is capturing
    return x.clone()


@_host_read.register_fake
def _(x):
    return torch.empty_like(x)


def test_capture_failure_falls_back_to_eager_patched(monkeypatch):
    """The second compiled call records: the host read fails the capture, nothing ran."""
    ids, mask = (t.cuda() for t in testing.left_padded_prompts())
    eager = _model("qwen3_5", compile=False)
    ref_tokens, _ = testing.generate_with_logits(eager, ids, mask, NEW_TOKENS, do_sample=False)
    del eager
    model = _model("qwen3_5", compile=True)
    adapter = next(iter(model._replayssm.adapters.values()))
    original = adapter.replay
    monkeypatch.setattr(adapter, "replay", lambda *args, **kwargs: _host_read(original(*args, **kwargs)))
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match="could not be recorded as a CUDA graph"):
        tokens, _ = testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=False)
    assert torch.equal(tokens, ref_tokens)
    assert "captur" in model._replayssm.compile_failure
    # The failed capture left torch's generator marked as capturing; the fallback releases it, so random ops
    # (sampling, inductor's benchmarking in a later compile) still work.
    torch.rand(4, device="cuda")
    sampled, _ = testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=True)
    assert sampled.shape == tokens.shape


def test_eager_patched_generate_uses_the_kernels_and_matches_fp32_reference():
    """fp32 on the GPU: patched greedy equals the unpatched model's greedy (the Triton kernels are exact to fp32)."""
    for model_type in ("nemotron_h", "qwen3_5"):
        model = testing.tiny_model(model_type).to("cuda")
        ids, mask = (t.cuda() for t in testing.left_padded_prompts())
        ref_tokens, ref_logits = testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=False)
        replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
        tokens, logits = testing.generate_with_logits(model, ids, mask, NEW_TOKENS, do_sample=False)
        assert torch.equal(tokens, ref_tokens), model_type
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)


def test_assisted_prompt_lookup_is_exact_fp32():
    """Verification on the GPU (the T > 1 Triton launches) under generate(): prompt lookup on patched fp32
    models returns the unpatched model's greedy tokens, with drafts both accepted and rolled back."""
    from replayssm.integrations.hf import ReplayLayerMixin

    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]], device="cuda")
    for model_type in ("nemotron_h", "qwen3_5"):
        model = testing.tiny_model(model_type).to("cuda")
        kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
        expected = model.generate(prompt, **kwargs)
        replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW))
        out = model.generate(prompt, prompt_lookup_num_tokens=3, return_dict_in_generate=True, **kwargs)
        assert torch.equal(out.sequences, expected), f"{model_type}: prompt lookup differs from greedy"
        cache = testing.output_cache(out)
        assert sum(layer.rolled_back for layer in cache.layers if isinstance(layer, ReplayLayerMixin)) > 0, model_type


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_captured_assisted_equals_eager_patched_bf16(model_type):
    """Captured verification (verify.py) under the default compile=True config (inductor,
    CUDA graphs): prompt lookup and a perturbed-copy assistant give the eager patched assisted tokens, every
    verification through the compiled call, no fallback, no step without CUDA graphs."""
    from torch._dynamo.utils import counters
    from test_hf_assisted import _assistant_for

    prompt = torch.tensor([[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]], device="cuda")
    kwargs = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    assistant = _assistant_for(testing.tiny_model(model_type, dtype=torch.bfloat16)).to("cuda")
    modes = (dict(prompt_lookup_num_tokens=3), dict(assistant_model=assistant))
    eager = _model(model_type, compile=False)
    expected = [eager.generate(prompt, **mode, **kwargs) for mode in modes]
    del eager

    model = _model(model_type, compile=True)
    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback or "decoding eagerly" warns: fail instead
        for mode, ref_tokens in zip(modes, expected):
            for _ in range(2):  # a new cache per call: the graphs are re-recorded
                assert torch.equal(model.generate(prompt, **mode, **kwargs), ref_tokens), f"{model_type} {sorted(mode)}"
    assert model._replayssm.compile_failure is None and model._replayssm.captured_verifications > 0
    assert counters["inductor"]["cudagraph_skips"] == 0, "inductor ran a verification without CUDA graphs"


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_captured_generate_defers_its_stop_check_and_keeps_the_tokens(model_type, monkeypatch):
    """With compiled.DEFER_STOP_CHECK on, a patched compiled generate() on CUDA reads its stop flag one step late
    (compiled.deferred_stop_check_on_cuda: no host wait per step) when it returns no cache: the tokens stay those of
    the eager patched path, for a length limit, for an end-of-sequence token that some rows emit and for one that
    stops the call early (the step decoded past it is dropped), and transformers' per-step read is back after."""
    from transformers.generation import utils as generation_utils

    from replayssm.integrations.hf import compiled

    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", True)  # the default: the test holds whatever it is set to
    used = []
    init = generation_utils.DeferredStopCheck.__init__

    def spy(self, *args, **kwargs):
        used.append(True)
        init(self, *args, **kwargs)

    monkeypatch.setattr(generation_utils.DeferredStopCheck, "__init__", spy)
    ids, mask = testing.left_padded_prompts()
    ids, mask = ids.cuda(), mask.cuda()
    eager = _model(model_type, compile=False)
    expected = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    # an end-of-sequence token that one row emits part-way: the rows stop at different steps
    eos = int(expected[0, ids.shape[1] + NEW_TOKENS // 2])
    expected_eos = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
    # row 0 alone stops at that token, before the length limit: the deferred check decodes one step past it and drops it
    expected_stop = eager.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert expected_stop.shape[1] < ids.shape[1] + NEW_TOKENS
    assert not used  # eager: transformers' own choice (mps only)
    del eager

    model = _model(model_type, compile=True)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert torch.equal(tokens, expected), f"{model_type}: tokens differ with the deferred stop check"
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(tokens, expected_eos), f"{model_type}: tokens differ with the deferred stop check and an eos"
        tokens = model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=eos, pad_token_id=0)
        assert torch.equal(tokens, expected_stop), f"{model_type}: tokens differ when the deferred check stops on the eos"
    assert len(used) == 4 and model._replayssm.compile_failure is None
    assert not generation_utils.DeferredStopCheck.is_supported(torch.device("cuda"), None, False, False)
