"""The patched mixers' causal conv of a decode step: equal to the depthwise conv, and rounded the same eagerly
and under inductor (captured decode steps must give the eager path's bf16 tokens)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402

pytestmark = pytest.mark.hf


class _Window:
    """Stands in for the cache layer. ``in_place``: a decode step's window (moved on by
    ``ops.causal_conv_step``); otherwise ``update_conv_state`` returns the window followed by the new
    columns, as while recording past states."""

    def __init__(self, window, in_place):
        self.window = window
        self.in_place = in_place
        self.counted = 0  # tokens counted for transformers (>= 5.25 tracks a length on linear layers)

    def count_tokens(self, num_tokens):
        self.counted += num_tokens

    def decode_conv_window(self):
        return self.window if self.in_place else None

    def update_conv_state(self, columns, state_idx=0, conv_kernel_size=None):
        return torch.cat([self.window, columns], dim=-1)


WINDOW_KINDS = [pytest.param(True, id="in-place-window"), pytest.param(False, id="update_conv_state")]


def _adapter(model_type, dtype):
    model = replayssm.patch(testing.tiny_model(model_type, dtype=dtype))
    return next(iter(model._replayssm.adapters.values()))


@pytest.mark.parametrize("in_place", WINDOW_KINDS)
@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
def test_decode_conv_matches_depthwise_conv(model_type, in_place):
    adapter = _adapter(model_type, torch.float64)
    conv = adapter.mixer.conv1d
    gen = torch.Generator().manual_seed(5)
    channels, taps = conv.weight.shape[0], conv.weight.shape[-1]
    window = torch.randn(3, channels, taps, generator=gen, dtype=torch.float64)
    column = torch.randn(3, channels, 1, generator=gen, dtype=torch.float64)
    full = torch.cat([window, column], dim=-1)
    expected = adapter.act(F.conv1d(full, conv.weight, conv.bias, groups=channels)[..., -1:]).transpose(1, 2)
    got = adapter.conv(_Window(window, in_place), column)
    assert got.shape == (3, 1, channels)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    if in_place:
        assert torch.equal(window, full[..., 1:])


# On the GPU inductor keeps a fused bf16 intermediate in fp32 where the eager kernels round it (a form that
# rounded the sum to bf16 before the activation broke tests/test_hf_cuda.py's token equality);
# the CPU compiler rounded both alike, so the CPU case guards less than the GPU one.
@pytest.mark.parametrize("in_place", WINDOW_KINDS)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
def test_decode_conv_rounds_alike_eager_and_compiled_bf16(model_type, device, in_place):
    adapter = _adapter(model_type, torch.bfloat16)
    adapter.mixer.to(device)
    channels, taps = adapter.mixer.conv1d.weight.shape[0], adapter.mixer.conv1d.weight.shape[-1]
    gen = torch.Generator().manual_seed(6)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda window, column: adapter.conv(_Window(window, in_place), column), fullgraph=True, dynamic=False
    )
    with torch.no_grad():  # decoding runs without autograd (the ops have no backward)
        for _ in range(3):
            window = torch.randn(256, channels, taps, generator=gen).to(device, torch.bfloat16)
            column = torch.randn(256, channels, 1, generator=gen).to(device, torch.bfloat16)
            compiled_window = window.clone()
            assert torch.equal(compiled(compiled_window, column), adapter.conv(_Window(window, in_place), column))
            assert torch.equal(compiled_window, window)
