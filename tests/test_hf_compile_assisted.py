"""Captured verification of assisted decoding under patch(model, compile=...) (issue 7 item 3), on the CPU.

Backend "eager" (dynamo traces the verification forward with fullgraph=True,
dynamic=False; CUDA graphs exist only on CUDA: tests/test_hf_cuda.py). The
prompt repeats the model's own greedy continuation (prompt lookup drafts it
again) and the assistant is a perturbed copy of the target, so drafts are
both accepted and rolled back; every verification forward after the prefill
must go through the compiled call, padded to one length. The attention mask
is passed (all ones): otherwise transformers infers one from pad tokens in
the prompt, and a verification with a padding mask runs eagerly.
"""

import warnings

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import ReplayLayerMixin, testing, verify  # noqa: E402

from test_hf_assisted import PROMPT as START, _assistant_for  # noqa: E402
from test_hf_compile import _compile_config, _failing_backend, _graphs  # noqa: E402

pytestmark = pytest.mark.hf

NEW_TOKENS = 16


def _greedy(model_type, prompt):
    model = testing.tiny_model(model_type)
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)


def _prompt(model_type):
    """START, its greedy continuation, START again: after it, prompt lookup finds drafts the model accepts."""
    return torch.cat([_greedy(model_type, START), START], -1)


def _assisted(model, prompt, mode, assistant=None):
    extra = dict(prompt_lookup_num_tokens=3) if mode == "prompt_lookup" else dict(assistant_model=assistant)
    return model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, **extra
    )


class _Recorder:
    """Counts the target's forwards (each verification once: the hook is traced, not run, inside the compiled call)."""

    def __init__(self, model):
        self.calls, self.cache = 0, None
        model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if torch.compiler.is_compiling():  # traced into the compiled call: not run by it
            return
        self.calls += 1
        self.cache = kwargs.get("cache", kwargs.get("past_key_values"))


@pytest.mark.parametrize("mode", ["prompt_lookup", "assistant"])
@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5", "zamba2"])  # zamba2: hybrid (linear + attention) layers
def test_captured_verification_is_exact(model_type, mode):
    prompt = _prompt(model_type)
    expected = _greedy(model_type, prompt)
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=4), compile=_compile_config())
    assistant = _assistant_for(testing.tiny_model(model_type)) if mode == "assistant" else None
    recorder = _Recorder(model)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the graph count is global (the assistant is not compiled)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback, no "decoding eagerly"
        tokens = _assisted(model, prompt, mode, assistant)
    assert torch.equal(tokens, expected), f"{model_type}/{mode}: captured assisted tokens differ from greedy"
    context = model._replayssm
    rounds = context.captured_verifications
    assert isinstance(recorder.cache, verify.VerifyCache) and context.compile_failure is None
    assert recorder.calls == rounds + 1, "a verification forward after the prefill ran outside the compiled call"
    assert rounds < NEW_TOKENS - 1, "no draft was accepted (every round gave one token)"
    assert sum(l.rolled_back for l in recorder.cache.layers if isinstance(l, ReplayLayerMixin)) > 0, "nothing rolled back"
    assert _graphs() == 1, "one graph for every verification length"
    # Again with a new cache: same graph (one verification length), same tokens.
    assert torch.equal(_assisted(model, prompt, mode, assistant), expected) and _graphs() == 1


def test_verification_longer_than_the_bound_runs_eagerly(monkeypatch):
    """A verification over the captured length (not expected from transformers) runs the same code eagerly."""
    monkeypatch.setattr(verify, "verify_len", lambda kwargs, model: 2)  # prompt lookup drafts up to 3 tokens
    prompt = _prompt("qwen3_5")
    model = replayssm.patch(testing.tiny_model("qwen3_5"), replayssm.ReplayConfig(window=4), compile=_compile_config())
    recorder = _Recorder(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert torch.equal(_assisted(model, prompt, "prompt_lookup"), _greedy("qwen3_5", prompt))
    assert 0 < model._replayssm.captured_verifications < recorder.calls - 1, "no mix of captured and eager verifications"


def test_captured_verification_compile_failure_falls_back():
    prompt = _prompt("qwen3_5")
    expected = _greedy("qwen3_5", prompt)
    model = replayssm.patch(testing.tiny_model("qwen3_5"), compile=_compile_config(backend=_failing_backend))
    with pytest.warns(RuntimeWarning, match="backend refused"):
        tokens = _assisted(model, prompt, "prompt_lookup")
    assert torch.equal(tokens, expected) and model._replayssm.captured_verifications == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # warned once per patch
        assert torch.equal(_assisted(model, prompt, "prompt_lookup"), expected)


def test_unbounded_drafts_decode_eagerly():
    """A "heuristic" schedule grows the draft without bound: no captured length, eager (exact) with a warning."""
    expected = _greedy("nemotron_h", START)
    model = replayssm.patch(testing.tiny_model("nemotron_h"), compile=_compile_config())
    assistant = _assistant_for(testing.tiny_model("nemotron_h"))
    assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
    with pytest.warns(RuntimeWarning, match="assisted decoding"):
        tokens = _assisted(model, START, "assistant", assistant)
    assert torch.equal(tokens, expected) and model._replayssm.captured_verifications == 0
