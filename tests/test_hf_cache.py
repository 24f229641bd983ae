"""The replay cache layer on its own: chunks longer than the window, row selection, reorder, reset, adoption."""

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import ReplayLayerMixin, testing  # noqa: E402

pytestmark = pytest.mark.hf

ATOL = 1e-4
TYPES = ["nemotron_h", "qwen3_next"]


def _forward(model, ids, cache=None):
    kwargs = {} if cache is None else {testing.cache_kwarg(model): cache, "use_cache": True}
    with torch.no_grad():
        return model(input_ids=ids, **kwargs).logits[:, -1]


def _ids(batch=1, length=24, seed=9):
    return torch.randint(3, testing.VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _replay_layers(cache):
    return [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin)]


@pytest.mark.parametrize("model_type", TYPES)
def test_chunks_shorter_and_longer_than_the_window(model_type):
    """A multi-token forward on a cache with state: up to the window it is one replay step, beyond it the model's chunked path."""
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=4))
    ids = _ids()
    cache = testing.new_cache(model)
    _forward(model, ids[:, :6], cache)
    _forward(model, ids[:, 6:9], cache)  # 3 tokens <= window: replay, committed at once
    got = _forward(model, ids[:, 9:16], cache)  # 7 tokens > window: chunked path from the materialised state
    torch.testing.assert_close(got, _forward(model, ids[:, :16]), atol=ATOL, rtol=0)
    for layer in _replay_layers(cache):
        assert int(layer.replay.cursor[0]) == 0 and int(layer.replay.pending[0]) == 0  # reloaded checkpoint
    got = _forward(model, ids[:, 16:17], cache)
    torch.testing.assert_close(got, _forward(model, ids[:, :17]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", TYPES)
def test_batch_select_reorder_and_repeat(model_type):
    model = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=3))
    ids = _ids(batch=3)
    cache = testing.new_cache(model)
    _forward(model, ids[:, :8], cache)
    for pos in range(8, 12):
        _forward(model, ids[:, pos : pos + 1], cache)
    # rows (2, 0): select keeps the row order given
    cache.batch_select_indices(torch.tensor([2, 0]))
    picked = ids[[2, 0]]
    got = _forward(model, picked[:, 12:13], cache)
    torch.testing.assert_close(got, _forward(model, picked[:, :13]), atol=ATOL, rtol=0)
    # reorder (beam search): row 0 <- old row 1, row 1 <- old row 1
    cache.reorder_cache(torch.tensor([1, 1]))
    reordered = picked[[1, 1]]
    got = _forward(model, reordered[:, 13:14], cache)
    torch.testing.assert_close(got, _forward(model, reordered[:, :14]), atol=ATOL, rtol=0)
    # repeat_interleave: each row twice
    cache.batch_repeat_interleave(2)
    repeated = reordered.repeat_interleave(2, dim=0)
    for layer in _replay_layers(cache):
        assert layer.replay.slots == 4
    if not all(hasattr(layer, "batch_repeat_interleave") for layer in cache.layers):
        return  # attention layers of this transformers version cannot repeat: nothing more to check
    got = _forward(model, repeated[:, 14:15], cache)
    torch.testing.assert_close(got, _forward(model, repeated[:, :15]), atol=ATOL, rtol=0)


def test_reset_and_reuse_for_a_new_prompt():
    """Same as the unpatched model doing the same (transformers 5.17's DynamicLayer.reset keeps the attention length)."""
    model = testing.tiny_model("qwen3_5")
    ids, other = _ids(seed=3), _ids(seed=4)

    def run():
        cache = testing.new_cache(model)
        _forward(model, ids[:, :7], cache)
        _forward(model, ids[:, 7:8], cache)
        cache.reset()
        _forward(model, other[:, :7], cache)
        return _forward(model, other[:, 7:8], cache)

    expected = run()
    replayssm.patch(model, replayssm.ReplayConfig(window=4))
    torch.testing.assert_close(run(), expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", TYPES)
def test_adopts_a_cache_filled_by_the_unpatched_model(model_type):
    model = testing.tiny_model(model_type)
    ids = _ids(seed=6)
    cache = testing.new_cache(model)
    _forward(model, ids[:, :9], cache)  # unpatched prefill: state in transformers' layout
    replayssm.patch(model, replayssm.ReplayConfig(window=4))
    for pos in range(9, 14):
        got = _forward(model, ids[:, pos : pos + 1], cache)
    assert _replay_layers(cache)
    torch.testing.assert_close(got, _forward(model, ids[:, :14]), atol=ATOL, rtol=0)


@pytest.mark.parametrize("model_type", TYPES)
def test_bf16_model_runs_and_stays_close(model_type):
    model = testing.tiny_model(model_type, dtype=torch.bfloat16)
    ids = _ids(seed=8)
    expected = model.generate(ids[:, :9], max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    replayssm.patch(model, replayssm.ReplayConfig(window=4))
    got = model.generate(ids[:, :9], max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    # bf16 activations: the first logits come from the same prefill; later ones may drift by bf16 rounding
    torch.testing.assert_close(got.logits[0], expected.logits[0], atol=0, rtol=0)
    torch.testing.assert_close(got.logits[1], expected.logits[1], atol=5e-2, rtol=5e-2)


def test_crop_beyond_the_speculative_run_is_a_clear_error():
    model = replayssm.patch(testing.tiny_model("nemotron_h"), replayssm.ReplayConfig(window=4))
    ids = _ids(seed=2)
    cache = testing.new_cache(model)
    _forward(model, ids[:, :8], cache)
    cache.activate_past_recording()
    _forward(model, ids[:, 8:10], cache)
    cache.crop(0)
    _forward(model, ids[:, 10:11], cache)
    # the last token is pending, the one before was committed at crop(0): only the pending one can go
    layer = _replay_layers(cache)[0]
    before = {name: t.clone() for name, t in layer.replay.tensors().items()}
    with pytest.raises(RuntimeError, match="roll back 1 committed tokens, but only 0"):
        layer.crop(-2)
    for name, t in layer.replay.tensors().items():
        assert torch.equal(t, before[name]), name


def test_prefill_tail_growth_is_undone_at_the_first_crop():
    """While recording, a prefill keeps up to 24 tokens rollable (the ring grows); the first crop restores the window."""
    model = replayssm.patch(testing.tiny_model("qwen3_5"), replayssm.ReplayConfig(window=4))
    ids = _ids(length=30, seed=12)
    cache = testing.new_cache(model)
    cache.activate_past_recording()
    _forward(model, ids[:, :20], cache)  # prompt + drafted tokens, as assisted decoding's first verification
    layer = _replay_layers(cache)[0]
    assert layer.replay.window == 19
    cache.crop(-7)  # 7 drafted tokens rejected
    assert layer.replay.window == 4 and int(layer.replay.cursor[0]) == 0
    got = _forward(model, ids[:, 13:14], cache)
    torch.testing.assert_close(got, _forward(model, ids[:, :14]), atol=ATOL, rtol=0)
