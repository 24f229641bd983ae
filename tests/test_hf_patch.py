"""patch()/unpatch(): exact restore, idempotence, save/reload, torch.compile, and clear errors on bad input."""

import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import PatchContext, is_patched, testing  # noqa: E402

pytestmark = pytest.mark.hf

PROMPT = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 7, 22]])


def _greedy(model, new_tokens=9):
    return model.generate(PROMPT, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def _patch_attributes(model) -> list[str]:
    """Every attribute patch() may leave behind, as names found on the instances."""
    found = [name for name in ("_replayssm", "_is_stateful", "get_compiled_call", "generate") if name in model.__dict__]
    for name, module in model.named_modules():
        found += [f"{name}.{attr}" for attr in ("forward", "_replayssm") if attr in module.__dict__]
    return found


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_next"])
def test_unpatch_restores_identical_behaviour(model_type):
    model = testing.tiny_model(model_type)
    before = _greedy(model)
    class_forwards = {name: type(m).forward for name, m in model.named_modules()}
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    assert is_patched(model)
    if testing.stock_refuses_assisted():  # transformers < 5.25: patch lifts the refusal on the instance
        assert model._is_stateful is False
    assert _patch_attributes(model)
    replayssm.unpatch(model)
    assert not is_patched(model)
    assert _patch_attributes(model) == []
    assert {name: type(m).forward for name, m in model.named_modules()} == class_forwards
    assert torch.equal(_greedy(model), before)
    # stock behaviour is back: the refusal (< 5.25), or transformers' own rollback with stock cache layers
    if testing.stock_refuses_assisted():
        assert type(model)._is_stateful is True and model._is_stateful is True
        with pytest.raises(ValueError, match="stateful"):
            model.generate(PROMPT, max_new_tokens=3, prompt_lookup_num_tokens=2)
    else:
        out = model.generate(PROMPT, max_new_tokens=3, prompt_lookup_num_tokens=2, return_dict_in_generate=True)
        layers = testing.output_cache(out).layers
        assert not any(type(layer).__module__.startswith("replayssm") for layer in layers)
    assert replayssm.unpatch(model) is model  # unpatching an unpatched model is a no-op


def test_patch_twice_is_harmless():
    model = testing.tiny_model("qwen3_5")
    expected = _greedy(model)
    assert replayssm.patch(model) is model
    replayssm.patch(model)
    assert torch.equal(_greedy(model), expected)
    replayssm.patch(model, replayssm.ReplayConfig(window=2))  # re-patch with another config
    assert model._replayssm.config.window == 2
    assert torch.equal(_greedy(model), expected)
    replayssm.unpatch(model)
    assert _patch_attributes(model) == []


def test_patch_save_reload(tmp_path):
    from transformers import AutoModelForCausalLM

    model = replayssm.patch(testing.tiny_model("nemotron_h"), replayssm.ReplayConfig(window=4))
    expected = _greedy(model)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not is_patched(reloaded)
    original = model.state_dict()
    assert sorted(reloaded.state_dict()) == sorted(original)  # the patch adds no parameter or buffer
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name
    replayssm.patch(reloaded, replayssm.ReplayConfig(window=4))
    assert torch.equal(_greedy(reloaded), expected)


@pytest.mark.parametrize("model_type", ["nemotron_h", "qwen3_5"])
def test_decode_step_compiles_without_graph_breaks(model_type):
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=4))
    ids = torch.randint(3, testing.VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    kw = testing.cache_kwarg(model)
    eager_cache, compiled_cache = testing.new_cache(model), testing.new_cache(model)
    adapter = next(iter(model._replayssm.adapters.values()))
    # fullgraph: the patched mixer's decode step, replay op included, is one graph
    step = torch.compile(adapter.mixer, fullgraph=True, backend="aot_eager")
    torch._dynamo.reset()
    with torch.no_grad():
        model(input_ids=ids[:, :8], **{kw: eager_cache}, use_cache=True)
        model(input_ids=ids[:, :8], **{kw: compiled_cache}, use_cache=True)
        for pos in range(8, 12):  # crosses a fold (window 4)
            h = model.get_input_embeddings()(ids[:, pos : pos + 1])
            expected = adapter.mixer(h, **{adapter.cache_kwarg: eager_cache})
            got = step(h, **{adapter.cache_kwarg: compiled_cache})
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        # and the whole model's decode step has no graph break
        explanation = torch._dynamo.explain(model)(input_ids=ids[:, 11:12], **{kw: compiled_cache}, use_cache=True)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


# -- bad input ----------------------------------------------------------------------------------


def test_unsupported_model_is_refused_and_untouched():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    )
    with pytest.raises(ValueError, match="supported model types: .*nemotron_h.*qwen3_5"):
        replayssm.patch(model)
    assert _patch_attributes(model) == []
    with pytest.raises(TypeError, match="torch.nn.Module"):
        replayssm.patch("nemotron_h")


def test_wrong_config_is_refused_and_nothing_patched():
    model = testing.tiny_model("nemotron_h")
    with pytest.raises(TypeError, match="ReplayConfig"):
        replayssm.patch(model, {"window": 4})
    with pytest.raises(ValueError, match="window"):
        replayssm.patch(model, replayssm.ReplayConfig(window=0))
    with pytest.raises(ValueError, match="state_dtype"):
        replayssm.patch(model, replayssm.ReplayConfig(state_dtype=torch.int8))
    assert _patch_attributes(model) == []


def test_fp8_read_copy_is_refused_for_gdn_models_at_patch():
    """fp8 read copies are Mamba-2-only: a model with GDN mixers is refused by patch() itself, unpatched."""
    model = testing.tiny_model("qwen3_5")
    with pytest.raises(ValueError, match=r"read_dtype.*Mamba-2-only.*nothing was patched"):
        replayssm.patch(model, replayssm.ReplayConfig(read_dtype=torch.float8_e4m3fn))
    assert _patch_attributes(model) == []
    assert not is_patched(model)


def test_meta_device_model_is_refused():
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(testing.tiny_config("qwen3_5"))
    with pytest.raises(ValueError, match="meta device"):
        replayssm.patch(model)
    assert _patch_attributes(model) == []


def test_replaced_mixer_forward_is_detected_and_nothing_patched():
    """What hub kernels (or another patch) leave: a mixer whose forward is no longer the transformers one."""
    model = testing.tiny_model("nemotron_h")
    mixer = model.model.layers[2].mixer
    mixer.forward = lambda *args, **kwargs: None
    with pytest.raises(ValueError, match="forward replaced"):
        replayssm.patch(model)
    del mixer.forward
    assert _patch_attributes(model) == []
    # use_kernels=True with the mixers' forwards untouched (what transformers >= 5.25's from_pretrained gives on
    # every model) patches, and decodes through replay
    expected = _greedy(model)
    object.__setattr__(model, "_use_kernels", True)
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    assert torch.equal(_greedy(model), expected)
    assert model.model.layers[2].mixer.forward == model.model.layers[2].mixer._replayssm.forward


def test_cache_from_another_model_is_refused():
    model = replayssm.patch(testing.tiny_model("nemotron_h"))
    other = testing.tiny_model("qwen3_5")
    with pytest.raises(ValueError, match="another model"):
        model.generate(PROMPT, max_new_tokens=3, **{testing.cache_kwarg(model): testing.new_cache(other)})
    # a cache already serving another patched model of the same type
    twin = replayssm.patch(testing.tiny_model("nemotron_h", seed=1))
    cache = testing.new_cache(model)
    model.generate(PROMPT, max_new_tokens=3, **{testing.cache_kwarg(model): cache})
    with pytest.raises(ValueError, match="another patched model"):
        twin.generate(PROMPT, max_new_tokens=3, **{testing.cache_kwarg(twin): cache})


def test_context_repr_names_families():
    model = replayssm.patch(testing.tiny_model("nemotron_h"), replayssm.ReplayConfig(window=8))
    assert isinstance(model._replayssm, PatchContext)
    assert "mamba2" in repr(model._replayssm) and "window=8" in repr(model._replayssm)


def test_import_replayssm_does_not_import_transformers():
    code = "import sys, replayssm; assert 'transformers' not in sys.modules; replayssm.patch; assert 'transformers' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_deepcopy_of_a_patched_model_is_patched_and_unpatchable():
    import copy

    model = replayssm.patch(testing.tiny_model("qwen3_5"), replayssm.ReplayConfig(window=3))
    expected = _greedy(model)
    twin = copy.deepcopy(model)
    assert is_patched(twin) and twin._replayssm is not model._replayssm
    assert all(a.mixer is not b.mixer for a, b in zip(twin._replayssm.adapters.values(), model._replayssm.adapters.values()))
    assert torch.equal(_greedy(twin), expected)
    replayssm.unpatch(twin)
    assert _patch_attributes(twin) == [] and is_patched(model)
