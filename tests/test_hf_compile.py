"""The static-shape decode path, patch(model, compile=...), on the CPU (issue 7).

The compile backend is "eager" (dynamo traces the whole decode step with
fullgraph=True, dynamic=False; no code generation, so the tests stay fast),
once inductor (the default of compile=True; C++ on the CPU):
what is checked is that every decode step is one graph without breaks, that
graphs are made once per batch size and not per step, that tokens equal the
uncaptured patched path exactly (fp32), and that a failed compile falls back
to eager decoding with a warning. CUDA-graph capture itself needs the GPU.
"""

import contextlib
import shutil
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import ReplayLayerMixin, testing  # noqa: E402

pytestmark = pytest.mark.hf

WINDOW = 4
NEW_TOKENS = 9  # > 2 windows: the ring folds inside the compiled step
PROMPT = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 7, 22]])


def _compile_config(**overrides):
    from transformers import CompileConfig

    return CompileConfig(**{"fullgraph": True, "dynamic": False, "backend": "eager", "mode": None, **overrides})


def _generate(model, ids, mask=None, **kwargs):
    return testing.generate_with_logits(model, ids, mask, NEW_TOKENS, **kwargs)


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _patched(model_type, compile):  # noqa: A002
    return replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=WINDOW), compile=compile)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5", "falcon_h1", "mamba2"])
def test_compiled_greedy_equals_eager_patched_one_graph_per_batch_size(model_type):
    eager = _patched(model_type, False)
    batch = testing.left_padded_prompts()
    expected = [_generate(eager, *prompt, do_sample=False) for prompt in ((PROMPT, None), batch, (PROMPT, None))]

    model = _patched(model_type, _compile_config())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        for prompt, (ref_tokens, ref_logits) in zip(((PROMPT, None), batch, (PROMPT, None)), expected):
            tokens, logits = _generate(model, *prompt, do_sample=False)
            assert torch.equal(tokens, ref_tokens), f"{model_type}: compiled tokens differ from the eager patched path"
            torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
            graphs.append(_graphs())
    # batch 1: one graph for all its decode steps; batch 3: one more; batch 1 again: none
    assert graphs == [1, 2, 2], graphs
    assert model._replayssm.compile_failure is None


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")), reason="inductor needs a C++ compiler on the CPU")
def test_compile_true_with_inductor_equals_eager_patched():
    """The default compile=True config (inductor; "reduce-overhead" is CUDA graphs on CUDA only): C++ code on the CPU."""
    eager = _patched("nemotron_h", False)
    ids, mask = testing.left_padded_prompts()
    ref_tokens, ref_logits = _generate(eager, ids, mask, do_sample=False)
    model = _patched("nemotron_h", True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback
        tokens, logits = _generate(model, ids, mask, do_sample=False)
    assert _graphs() == 1
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)


def test_compiled_conventional_step_equals_eager():
    """The benchmark baseline in the same captured path: step="conventional" compiles to one graph too."""
    config = replayssm.ReplayConfig(window=WINDOW)
    eager = replayssm.patch(testing.tiny_model("qwen3_5"), config, step="conventional")
    model = replayssm.patch(testing.tiny_model("qwen3_5"), config, step="conventional", compile=_compile_config())
    ref_tokens, ref_logits = _generate(eager, PROMPT, do_sample=False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    tokens, logits = _generate(model, PROMPT, do_sample=False)
    assert _graphs() == 1 and model._replayssm.compile_failure is None
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)


def test_compiled_sampling_equals_eager_patched():
    eager = _patched("qwen3_5", False)
    model = _patched("qwen3_5", _compile_config())
    torch.manual_seed(7)
    ref_tokens, ref_logits = _generate(eager, PROMPT, do_sample=True, top_k=20, temperature=1.3)
    torch.manual_seed(7)
    tokens, logits = _generate(model, PROMPT, do_sample=True, top_k=20, temperature=1.3)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)


def test_compile_is_used_and_user_choices_win():
    from transformers import DynamicCache, StaticCache

    model = _patched("nemotron_h", _compile_config())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out = model.generate(PROMPT, max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert _graphs() == 1  # static cache + compile without asking generate for them
    cache = testing.output_cache(out)
    assert type(cache).__name__ == "StaticCache"
    replay_layers = [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin)]
    assert replay_layers and all(layer.replay is not None for layer in replay_layers)
    cache = StaticCache(config=model.config, max_cache_len=32)
    addresses = []
    for _ in range(2):  # a user's static cache of another length: one more graph, then none; reset keeps the state
        tokens = model.generate(PROMPT, max_new_tokens=3, do_sample=False, **{testing.cache_kwarg(model): cache})
        assert torch.equal(tokens, out.sequences)
        assert _graphs() == 2
        layers = [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin)]
        addresses.append([t.data_ptr() for layer in layers for t in layer.replay.tensors().values()])
        cache.reset()
    assert addresses[0] == addresses[1]
    with pytest.warns(RuntimeWarning, match="DynamicCache"):
        model.generate(PROMPT, max_new_tokens=3, do_sample=False, **{testing.cache_kwarg(model): DynamicCache(config=model.config)})
    with pytest.warns(RuntimeWarning, match="assisted decoding"):  # a cache of the caller's: not captured
        tokens = model.generate(
            PROMPT, max_new_tokens=6, do_sample=False, prompt_lookup_num_tokens=2,
            **{testing.cache_kwarg(model): DynamicCache(config=model.config)},
        )  # fmt: skip
    eager = _patched("nemotron_h", False)
    assert torch.equal(tokens, eager.generate(PROMPT, max_new_tokens=6, do_sample=False))


def test_beam_search_under_compile_is_exact():
    """transformers compiles greedy and sampling loops only; beam search stays eager (and exact) under compile=True."""
    eager = _patched("nemotron_h", False)
    model = _patched("nemotron_h", _compile_config())
    expected = eager.generate(PROMPT, max_new_tokens=NEW_TOKENS, num_beams=3, do_sample=False)
    assert torch.equal(model.generate(PROMPT, max_new_tokens=NEW_TOKENS, num_beams=3, do_sample=False), expected)


def _failing_backend(gm, example_inputs):
    raise RuntimeError("backend refused this graph")


@pytest.mark.parametrize("cause", ["backend", "graph_break", "recompile_limit"])
def test_compile_failure_falls_back_to_eager_with_a_warning(cause, monkeypatch):
    with contextlib.ExitStack() as stack:
        _check_compile_failure_falls_back(cause, monkeypatch, stack)


def _check_compile_failure_falls_back(cause, monkeypatch, stack):
    eager = _patched("qwen3_5", False)
    ref_tokens, ref_logits = _generate(eager, PROMPT, do_sample=False)
    if cause == "recompile_limit":
        # one graph per batch size: a second batch size needs a recompile, over a limit of one
        model = _patched("qwen3_5", _compile_config())
        torch._dynamo.reset()
        _generate(model, torch.cat([PROMPT, PROMPT]), do_sample=False)
        stack.enter_context(torch._dynamo.config.patch(recompile_limit=1))  # (monkeypatch's undo deletes it)
        match = "RecompileLimit"
    elif cause == "backend":
        model = _patched("qwen3_5", _compile_config(backend=_failing_backend))
        match = "backend refused"
    else:
        model = _patched("qwen3_5", _compile_config())
        adapter = next(iter(model._replayssm.adapters.values()))
        original = adapter.replay

        def breaking(*args, **kwargs):
            torch._dynamo.graph_break()
            return original(*args, **kwargs)

        monkeypatch.setattr(adapter, "replay", breaking)
        match = "graph break|Unsupported"
    if cause != "recompile_limit":
        torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match=match):
        tokens, logits = _generate(model, PROMPT, do_sample=False)
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    assert model._replayssm.compile_failure is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # already fallen back: no second warning
        again, _ = _generate(model, PROMPT, do_sample=False)
    assert torch.equal(again, ref_tokens)


def test_compile_patch_is_undone_and_checked():
    model = testing.tiny_model("qwen3_5")
    replayssm.patch(model, compile=True)
    assert {"generate", "get_compiled_call"} <= set(model.__dict__)
    assert model._replayssm.compile_config.fullgraph and model._replayssm.compile_config.dynamic is False
    replayssm.unpatch(model)
    assert not {"generate", "get_compiled_call"} & set(model.__dict__)
    with pytest.raises(TypeError, match="compile must be"):
        replayssm.patch(model, compile="yes")
    assert not replayssm.integrations.hf.is_patched(model)


def test_deferred_stop_check_is_enabled_on_cuda_only_inside_the_block():
    """compiled.deferred_stop_check_on_cuda: transformers' own conditions for mps applied to CUDA devices while
    the block runs (nested blocks too), the original restored after, nothing changed when disabled."""
    gu = pytest.importorskip("transformers.generation.utils")
    if not hasattr(gu, "DeferredStopCheck"):
        pytest.skip("this transformers has no DeferredStopCheck")
    from replayssm.integrations.hf import compiled

    original = gu.DeferredStopCheck.__dict__["is_supported"]
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    supported = gu.DeferredStopCheck.is_supported
    assert not supported(cuda, None, False, False)  # transformers: mps only
    with compiled.deferred_stop_check_on_cuda(enabled=False):
        assert not gu.DeferredStopCheck.is_supported(cuda, None, False, False)
    with compiled.deferred_stop_check_on_cuda():
        with compiled.deferred_stop_check_on_cuda():
            assert gu.DeferredStopCheck.is_supported(cuda, None, False, False)
        supported = gu.DeferredStopCheck.is_supported
        assert supported(cuda, None, False, False)  # still inside the outer block
        assert not supported(cuda, None, False, True)  # never for an assistant
        assert not supported(cpu, None, False, False)
        # a cache generate() returns is never deferred (replayssm's rule: it would be cropped every step), croppable
        # or not; one it drops is, croppable or not (transformers' rule)
        for croppable in (False, True):
            cache = type("C", (), {"is_croppable": croppable})()
            assert not supported(cuda, cache, True, False) and supported(cuda, cache, False, False)
    assert gu.DeferredStopCheck.__dict__["is_supported"] is original


def test_generate_asks_for_the_deferred_stop_check_only_on_cuda_when_switched_on(monkeypatch):
    """The patched generate() wraps transformers' in deferred_stop_check_on_cuda, enabled only with
    compiled.DEFER_STOP_CHECK on (the default), the model on CUDA, and no assisted decoding; the tokens are unchanged."""
    import contextlib

    from replayssm.integrations.hf import compiled

    asked = []

    @contextlib.contextmanager
    def record(enabled=True):
        asked.append(enabled)
        yield

    monkeypatch.setattr(compiled, "deferred_stop_check_on_cuda", record)
    model = _patched("qwen3_5", _compile_config())
    ids = torch.randint(3, testing.VOCAB, (2, 6), generator=torch.Generator().manual_seed(0))
    assert compiled.DEFER_STOP_CHECK is True  # the default
    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", False)
    first = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", True)
    second = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)  # on the CPU: still off
    monkeypatch.setattr(compiled, "_on_cuda", lambda model: True)
    third = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", False)
    fourth = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)  # on "CUDA", switched off
    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", True)
    model.generate(input_ids=ids[:1], max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=2)
    assert asked[:4] == [False, False, True, False]
    assert not any(asked[4:])  # assisted decoding (captured verification here): never deferred
    assert torch.equal(first, second) and torch.equal(first, third) and torch.equal(first, fourth)


class _HostEvent:
    """Stands in for ``torch.Event`` on the CPU, which has no events: CPU work is done when it is issued."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
def test_deferred_stop_check_runs_the_captured_step_to_the_same_tokens(model_type, monkeypatch):
    """transformers' DeferredStopCheck run for real through the compiled generate() (on the CPU, as if on CUDA).

    Greedy tokens equal the eager patched path with a length limit, with an end-of-sequence token that some rows
    emit, and with one that stops every row early (the check learns it a step late: the extra step is decoded and
    dropped); sampled tokens equal the per-step read's from the same seed; nothing falls back. A cache that
    generate() returns (passed by the caller) is not deferred: the recording and crops that would bring make the
    captured step recompile. A compile failure's eager fallback, deferred too, keeps the tokens."""
    gu = pytest.importorskip("transformers.generation.utils")
    if not hasattr(gu, "DeferredStopCheck"):
        pytest.skip("this transformers has no DeferredStopCheck")
    from transformers import StaticCache

    from replayssm.integrations.hf import compiled

    monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", True)
    monkeypatch.setattr(compiled, "_on_cuda", lambda model: True)
    monkeypatch.setattr(compiled, "_DEFER_DEVICE_TYPES", ("cuda", "cpu"))
    monkeypatch.setattr(torch, "Event", _HostEvent)
    used = []
    init = gu.DeferredStopCheck.__init__

    def spy(self, *args, **kwargs):
        used.append(True)
        init(self, *args, **kwargs)

    monkeypatch.setattr(gu.DeferredStopCheck, "__init__", spy)
    undone = []  # steps each call decoded past its stop and dropped
    finish = gu.DeferredStopCheck.finish
    monkeypatch.setattr(gu.DeferredStopCheck, "finish", lambda self: undone.append(finish(self)) or undone[-1])
    ids, mask = testing.left_padded_prompts()
    eager = _patched(model_type, False)
    expected = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    # a token that row 0 emits part-way as end-of-sequence: rows stop at different steps
    eos = int(expected[0, ids.shape[1] + NEW_TOKENS // 2])
    by_eos = dict(eos_token_id=eos, pad_token_id=0)
    expected_eos = eager.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, **by_eos)
    # row 0 alone stops at that token: the loop ends on the eos, before the length limit
    expected_stop = eager.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=NEW_TOKENS, do_sample=False, **by_eos)
    assert expected_stop.shape[1] < ids.shape[1] + NEW_TOKENS
    assert not used  # the eager patched path keeps transformers' own choice

    model = _patched(model_type, _compile_config())
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a fallback to eager would warn
        for _ in range(2):
            tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert torch.equal(tokens, expected)
        tokens = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, **by_eos)
        assert torch.equal(tokens, expected_eos)
        tokens = model.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=NEW_TOKENS, do_sample=False, **by_eos)
        assert torch.equal(tokens, expected_stop)
        assert len(used) == 4 and undone == [0, 0, 0, 1]
        # sampling: the deferred loop draws the same tokens as the per-step stop read, from the same seed
        sampled = []
        for defer in (True, False):
            monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", defer)
            torch.manual_seed(7)
            sampled.append(model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=True, top_k=0))
        monkeypatch.setattr(compiled, "DEFER_STOP_CHECK", True)
        assert torch.equal(sampled[0], sampled[1]) and len(used) == 5 and undone[-1] == 0
        cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=ids.shape[1] + NEW_TOKENS)
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True,
            **{testing.cache_kwarg(model): cache},
        )  # fmt: skip
        assert torch.equal(out.sequences, expected)
    assert len(used) == 5 and model._replayssm.compile_failure is None
    # a compile failure: the eager patched step runs inside the deferred loop, to the same tokens
    failing = _patched(model_type, _compile_config(backend=_failing_backend))
    torch._dynamo.reset()
    with pytest.warns(RuntimeWarning, match="backend refused"):
        tokens = failing.generate(input_ids=ids[:1], attention_mask=mask[:1], max_new_tokens=NEW_TOKENS, do_sample=False, **by_eos)
    assert torch.equal(tokens, expected_stop) and failing._replayssm.compile_failure is not None
    tokens = failing.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert torch.equal(tokens, expected)
    assert len(used) == 7 and undone[-2:] == [1, 0]
    assert not gu.DeferredStopCheck.is_supported(torch.device("cpu"), None, False, False)  # restored after the calls
