"""A patched GDN mixer's input projections as one GEMM (integrations/hf/projections.py).

While patched, the layers share one stacked weight (no memory duplicated), the decode step computes them
as one product, and unpatch gives each its own storage back. These tests check the sharing, the values,
the tokens, what happens when the weights are replaced behind the patch's back, and the refusals.
"""

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402
from replayssm.integrations.hf.gdn import OLMO_HYBRID, QWEN3_5, QWEN3_NEXT  # noqa: E402
from replayssm.integrations.hf.projections import StackedProjections  # noqa: E402

pytestmark = pytest.mark.hf

VARIANTS = {"qwen3_5": QWEN3_5, "qwen3_next": QWEN3_NEXT, "olmo_hybrid": OLMO_HYBRID}


def _prompt(model, batch=2, length=7, seed=3):
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(3, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def _greedy(model, ids, new_tokens=12):
    return model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)


def _storage(t):
    return t.untyped_storage().data_ptr()


def _gdn_adapters(model):
    return [a for a in model._replayssm.adapters.values() if hasattr(a, "projections")]


@pytest.mark.parametrize("model_type", list(VARIANTS))
def test_patch_stacks_the_projections_without_copying(model_type):
    model = testing.tiny_model(model_type)
    ids = _prompt(model)
    expected = _greedy(model, ids)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    bytes_before = sum({_storage(p): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    adapters = _gdn_adapters(model)
    assert adapters
    for adapter in adapters:
        stack = adapter.projections
        assert stack.bound
        layers = [getattr(adapter.mixer, n) for n in VARIANTS[model_type].projections]
        assert stack.weight.shape == (sum(lay.out_features for lay in layers), layers[0].in_features)
        assert all(_storage(lay.weight) == _storage(stack.weight) for lay in layers)
    # every parameter keeps its values, and the parameters take no more memory than before
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert sum({_storage(p): p.untyped_storage().nbytes() for p in model.parameters()}.values()) == bytes_before
    assert torch.equal(_greedy(model, ids), expected)
    replayssm.unpatch(model)
    for adapter in adapters:
        assert not adapter.projections.bound
    storages = [_storage(p) for p in model.parameters()]
    assert len(set(storages)) == len(storages)  # each parameter has its own storage again
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    assert torch.equal(_greedy(model, ids), expected)


@pytest.mark.parametrize("model_type", list(VARIANTS))
def test_stacked_outputs_equal_the_layers_outputs(model_type):
    model = testing.tiny_model(model_type).double()
    mixer = next(m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet"))
    names = VARIANTS[model_type].projections
    h = torch.randn(3, 2, model.config.get_text_config().hidden_size, dtype=torch.float64)
    expected = [getattr(mixer, n)(h) for n in names]
    stack = StackedProjections(mixer, names)
    assert stack.bind()
    got = [torch.full_like(e, float("nan")) for e in expected]  # poisoned: every element must be written
    for g, out in zip(got, stack(h)):
        g.copy_(out)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)
    stack.unbind()


def test_weights_moved_after_patch_are_stacked_again():
    model = testing.tiny_model("qwen3_5")
    ids = _prompt(model)
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    reference = testing.tiny_model("qwen3_5").double()  # same seed: same weights
    model.double()  # new storages for every parameter: the old stack is stale
    adapter = _gdn_adapters(model)[0]
    assert adapter.projections.weight.dtype == torch.float32
    assert torch.equal(_greedy(model, ids), _greedy(reference, ids))
    assert adapter.projections.weight.dtype == torch.float64
    layers = adapter.projections.layers()
    assert all(_storage(lay.weight) == _storage(adapter.projections.weight) for lay in layers)


@pytest.mark.parametrize("assign", [True, False], ids=["new-parameters", "in-place"])
def test_weights_loaded_after_patch_are_used(assign):
    model = testing.tiny_model("qwen3_5")
    other = testing.tiny_model("qwen3_5", seed=5)
    ids = _prompt(model)
    expected = _greedy(other, ids)
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    assert not torch.equal(_greedy(model, ids), expected)  # the two models differ: the test can fail
    stacks = [a.projections.weight for a in _gdn_adapters(model)]
    # assign=True: new Parameters, noticed by the next eager call and stacked again; in place: copied into the
    # existing parameters, the stacked rows, so the stacks stay
    model.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, assign=assign)
    assert torch.equal(_greedy(model, ids), expected)
    kept = [a.projections.weight is s for a, s in zip(_gdn_adapters(model), stacks)]
    assert kept == [not assign] * len(stacks)


def test_save_and_reload_of_a_patched_model(tmp_path):
    from transformers import AutoModelForCausalLM

    model = replayssm.patch(testing.tiny_model("qwen3_5"), replayssm.ReplayConfig(window=3))
    ids = _prompt(model)
    expected = _greedy(model, ids)
    model.save_pretrained(tmp_path)  # parameters that share the stack's storage are saved as themselves
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    assert torch.equal(_greedy(reloaded, ids), expected)


class _ScaledLinear(nn.Linear):  # a subclass computes something else: must not be stacked
    def forward(self, x):
        return 2 * super().forward(x)


@pytest.mark.parametrize("why", ["hook", "instance-forward", "subclass", "dtype"])
def test_projections_that_cannot_be_stacked_stay_apart(why):
    model = testing.tiny_model("qwen3_5")
    mixer = next(m for m in model.modules() if type(m).__name__ == "Qwen3_5GatedDeltaNet")
    if why == "hook":
        mixer.in_proj_b.register_forward_hook(lambda module, args, out: out * 0.5)
    elif why == "instance-forward":  # how accelerate's hooks wrap a module
        plain = mixer.in_proj_qkv.forward
        mixer.in_proj_qkv.forward = lambda x: plain(x) * 0.5
    elif why == "subclass":
        old = mixer.in_proj_z
        mixer.in_proj_z = _ScaledLinear(old.in_features, old.out_features, bias=False)
        mixer.in_proj_z.weight.data.copy_(old.weight)
    else:
        mixer.in_proj_a.double()
        mixer.in_proj_a.register_forward_pre_hook(lambda module, args: (args[0].double(),))
        mixer.in_proj_a.register_forward_hook(lambda module, args, out: out.float())
    ids = _prompt(model)
    expected = _greedy(model, ids)
    replayssm.patch(model, replayssm.ReplayConfig(window=3))
    adapter = next(a for a in _gdn_adapters(model) if a.mixer is mixer)
    assert not adapter.projections.bound
    assert torch.equal(_greedy(model, ids), expected)
    replayssm.unpatch(model)
