"""``ops.causal_conv_step``: the decode step of the causal conv, against a float64 depthwise conv.

The reference against ``F.conv1d`` in float64; the Triton kernel (CPU under
``TRITON_INTERPRET=1``, and a GPU) against the reference, output poisoned
first; the window moved on exactly; bad input raising before the window moves.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _triton_devices import DEVICES

from replayssm import ops
from replayssm.ops.conv import reference as conv_ref

# (batch, channels, width, taps): transformers' window (width = taps), vLLM's (taps - 1), a wider one,
# a one-tap conv (no window), odd channel counts across program blocks
SHAPES = [
    pytest.param((3, 37, 4, 4), id="B3-C37-W4-K4"),
    pytest.param((2, 1100, 3, 4), id="B2-C1100-W3-K4"),
    pytest.param((2, 19, 6, 4), id="B2-C19-W6-K4"),
    pytest.param((2, 5, 0, 1), id="B2-C5-W0-K1"),
    pytest.param((1, 24, 2, 2), id="B1-C24-W2-K2"),
    pytest.param((2, 33, 4, 5), id="B2-C33-W4-K5"),
    pytest.param((2, 300, 4, 2), id="B2-C300-W4-K2"),
]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _ulp(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _inputs(batch, channels, width, taps, dtype, device, gen, bias=True, strided=False):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    x = rnd(batch, channels + 7)[:, 3 : 3 + channels] if strided else rnd(batch, channels)  # like a split projection
    return x, rnd(channels, taps), rnd(channels) if bias else None, rnd(batch, channels, width)


def _float64_conv(x, weight, bias, window, silu):
    """The depthwise conv over (window, x) in float64, last column; and the window after the step."""
    full = torch.cat([window, x[..., None]], dim=-1).double()
    out = F.conv1d(full, weight.double()[:, None, :], None if bias is None else bias.double(), groups=x.shape[1])[..., -1]
    return (F.silu(out) if silu else out), full[..., 1:]


@pytest.mark.parametrize("silu", [True, False], ids=["silu", "no-act"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_matches_float64_conv(shape, dtype, bias, silu):
    gen = torch.Generator().manual_seed(11)
    x, weight, b, window = _inputs(*shape, dtype, "cpu", gen, bias=bias)
    expected, expected_window = _float64_conv(x, weight, b, window, silu)
    out = conv_ref.causal_conv_step(x, weight, b, window, silu)
    assert out.dtype == dtype and out.shape == x.shape
    # rounded to the dtype from an exact-to-fp64 value: within half an ulp of it (plus fp32's double rounding)
    torch.testing.assert_close(out.double(), expected, rtol=_ulp(dtype), atol=1e-6 if dtype == torch.float32 else 1e-3)
    assert torch.equal(window, expected_window.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["w4", "tile"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous-x", "strided-x"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_reference(shape, dtype, strided, form, device):
    """Both kernel forms (w4: windows of 4 columns), three steps in a row (the window moves on each time),
    bias and SiLU (what the mixers use) and neither; output poisoned before each launch."""
    kernels = pytest.importorskip("replayssm.ops.conv.kernels", reason="needs Triton")
    if form == "w4" and not kernels._fits_w4(torch.empty(1, shape[3]), torch.empty(1, 1, shape[2])):
        pytest.skip("the w4 form takes windows of 4 columns")
    gen = torch.Generator().manual_seed(12)
    window = None
    for bias, silu in [(True, True), (False, False), (True, True)]:
        x, weight, b, fresh_window = _inputs(*shape, dtype, device, gen, bias=bias, strided=strided)
        window = fresh_window if window is None else window  # later steps move on the window the last one left
        ref_window = window.clone()
        expected = conv_ref.causal_conv_step(x, weight, b, ref_window, silu)
        out = torch.full_like(x, float("nan")).contiguous()
        kernels.causal_conv_step_out(x, weight, b, window, silu, out, form=form)
        assert torch.equal(window, ref_window), "the window must move on exactly"
        # the same fp64 sum (in another order), rounded alike, to one ulp: the interpreter truncates fp32 -> bf16
        rtol = _ulp(dtype)
        torch.testing.assert_close(out, expected, rtol=rtol, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_float64_keeps_float64(device):
    """fp64 calls keep fp64 outputs on every device (the kernels round through fp32: CUDA sends fp64 to the
    reference)."""
    gen = torch.Generator().manual_seed(17)
    x, weight, b, window = _inputs(2, 9, 4, 4, torch.float64, device, gen)
    expected, expected_window = _float64_conv(x, weight, b, window, True)
    out = ops.causal_conv_step(x, weight, b, window, True)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, expected, rtol=1e-14, atol=1e-14)
    assert torch.equal(window, expected_window)


@pytest.mark.parametrize("device", DEVICES)
def test_registered_op_dispatches_and_compiles(device):
    """The op runs the kernel on CUDA and the reference on the CPU; under torch.compile (fullgraph) it
    mutates the window like an eager call and gives the same output."""
    gen = torch.Generator().manual_seed(13)
    x, weight, b, window = _inputs(4, 40, 4, 4, torch.bfloat16, device, gen)
    eager_window, compiled_window = window.clone(), window.clone()
    eager = ops.causal_conv_step(x, weight, b, eager_window, True)
    torch._dynamo.reset()
    compiled = torch.compile(ops.causal_conv_step, fullgraph=True, dynamic=False)(x, weight, b, compiled_window, True)
    assert torch.equal(eager, compiled) and torch.equal(eager_window, compiled_window)
    expected, expected_window = _float64_conv(x, weight, b, window, True)
    assert torch.equal(eager_window, expected_window.to(torch.bfloat16))
    torch.testing.assert_close(eager.double(), expected, rtol=_ulp(torch.bfloat16), atol=1e-3)


def test_opcheck():
    gen = torch.Generator().manual_seed(14)
    x, weight, b, window = _inputs(3, 10, 4, 4, torch.float32, "cpu", gen)
    torch.library.opcheck(ops.causal_conv_step, (x, weight, b, window, True))
    torch.library.opcheck(ops.causal_conv_step, (x, weight, None, window, False))


@pytest.mark.cuda
def test_captured_steps_match_eager():
    """A CUDA graph of several steps moves a static window as eager calls do."""
    gen = torch.Generator().manual_seed(15)
    x, weight, b, window = _inputs(8, 300, 4, 4, torch.bfloat16, "cuda", gen)
    columns = [torch.randn(8, 300, generator=gen).to("cuda", torch.bfloat16) for _ in range(3)]
    eager_window, start = window.clone(), window.clone()
    eager = [ops.causal_conv_step(c, weight, b, eager_window, True) for c in columns]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.causal_conv_step(columns[0], weight, b, window.clone(), True)  # warm up (compile) off the graph
        with torch.cuda.graph(graph, stream=stream):
            captured = [ops.causal_conv_step(c, weight, b, window, True) for c in columns]
    window.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(window, eager_window)
    for got, want in zip(captured, eager):
        assert torch.equal(got, want)


def _valid_args():
    gen = torch.Generator().manual_seed(16)
    x, weight, b, window = _inputs(2, 6, 4, 4, torch.float32, "cpu", gen)
    return {"x": x, "weight": weight, "bias": b, "window": window}


@pytest.mark.parametrize(
    "arg, change, message",
    [
        ("window", lambda a: a["window"].to(torch.bfloat16), "dtype"),
        ("window", lambda a: a["window"][:, :5], "shape"),
        ("window", lambda a: a["window"][..., :2], "taps - 1"),
        ("weight", lambda a: a["weight"][:5], "shape"),
        ("bias", lambda a: a["bias"][:3], "shape"),
        ("x", lambda a: a["x"][None], "shape"),
        ("weight", lambda a: a["weight"][:, :0], "at least one tap"),
    ],
)
def test_bad_input_names_the_argument_and_leaves_the_window(arg, change, message):
    args = _valid_args()
    args[arg] = change(args)
    before = args["window"].clone()
    with pytest.raises((ValueError, TypeError), match=rf"causal_conv_step: argument '{arg}'.*{message}"):
        ops.causal_conv_step(args["x"], args["weight"], args["bias"], args["window"], True)
    assert torch.equal(args["window"], before)
