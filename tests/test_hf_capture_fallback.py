"""patch(model, compile=True) when CUDA-graph recording fails or is skipped (issue 7), simulated on the CPU.

transformers' compiled step is replaced by a fake that runs the step eagerly
(inductor's warmup), then fails the way a failed capture does: from a frame
named like inductor's ``CUDAGraphNode._record`` under a frame whose ``self``
is a ``CompiledFxGraph``, the two things the fallback reads in the
traceback. A real capture failure needs the GPU (tests/test_hf_cuda.py).
"""

import types
import warnings

import pytest
import torch

pytest.importorskip("transformers")

import replayssm  # noqa: E402
from replayssm.integrations.hf import compiled as hf_compiled  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402

pytestmark = pytest.mark.hf

WINDOW = 4
NEW_TOKENS = 9  # 8 decode steps through the compiled call
PROMPT = torch.tensor([[5, 17, 33, 8, 61, 12, 40, 7, 22]])
CAPTURING = "CUDA error: operation not permitted when stream is capturing"
INVALIDATED = "CUDA error: operation failed due to a previous error during capture"

# Compiled under inductor's file name: the fallback checks the failure comes from its recording frame.
_FAKE_INDUCTOR = compile(
    '''
class CompiledFxGraph:
    def __init__(self, step, partition_maps):
        self.step, self.partition_maps = step, partition_maps

    def __call__(self, *args, **kwargs):
        return self.step(*args, **kwargs)


def _record(error, end_error):
    try:
        raise error  # the capture body: nothing ran
    finally:
        if end_error is not None:
            raise end_error  # capture_end after an invalidated capture
''',
    "fake/torch/_inductor/cudagraph_trees.py",
    "exec",
)
INDUCTOR = {}
exec(_FAKE_INDUCTOR, INDUCTOR)


class FakeCompiledStep:
    """The compiled decode step: call ``fail_on`` raises ``error`` (after running the step if ``ran_first``)."""

    def __init__(
        self, model, error, fail_on=2, end_error=None, partition_maps=None, ran_first=False, in_recording=True, on_call=None
    ):
        self.model, self.error, self.fail_on, self.end_error = model, error, fail_on, end_error
        self.ran_first, self.in_recording, self.on_call = ran_first, in_recording, on_call
        self.graph = INDUCTOR["CompiledFxGraph"](self._step, partition_maps)
        self.calls = 0

    def __call__(self, *args, **kwargs):
        return self.graph(*args, **kwargs)

    def _step(self, *args, **kwargs):
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        if self.calls != self.fail_on or self.error is None:
            return self.model(*args, **kwargs)
        if self.ran_first:
            self.model(*args, **kwargs)  # an earlier partition ran: the step is half-applied
        if self.in_recording:
            INDUCTOR["_record"](self.error, self.end_error)
        raise self.error


def _eager_reference(model_type="qwen3_5"):
    eager = replayssm.patch(testing.tiny_model(model_type), replayssm.ReplayConfig(window=WINDOW))
    return testing.generate_with_logits(eager, PROMPT, None, NEW_TOKENS, do_sample=False)


def _faked(monkeypatch, model_type="qwen3_5", compile=None, **fake):  # noqa: A002
    from transformers import CompileConfig

    model = testing.tiny_model(model_type)
    step = FakeCompiledStep(model, **fake)
    monkeypatch.setattr(type(model), "get_compiled_call", lambda self, config=None: step)
    compile = compile or CompileConfig(fullgraph=True, dynamic=False, backend="eager", mode=None)
    replayssm.patch(model, replayssm.ReplayConfig(window=WINDOW), compile=compile)
    return model, step


def _generate(model):
    return testing.generate_with_logits(model, PROMPT, None, NEW_TOKENS, do_sample=False)


@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
@pytest.mark.parametrize("end_error", [None, INVALIDATED])
def test_capture_failure_falls_back_to_eager_with_the_reason(model_type, end_error, monkeypatch):
    ref_tokens, ref_logits = _eager_reference(model_type)
    end = None if end_error is None else torch.AcceleratorError(end_error)
    model, step = _faked(monkeypatch, model_type, error=torch.AcceleratorError(CAPTURING), end_error=end)
    with pytest.warns(RuntimeWarning, match="could not be recorded as a CUDA graph .*stream is capturing") as record:
        tokens, logits = _generate(model)
    assert len([w for w in record if "CUDA graph" in str(w.message)]) == 1
    assert step.calls == 2  # warmup ran, recording failed, the other 6 steps eager
    assert torch.equal(tokens, ref_tokens)
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=0)
    assert "stream is capturing" in model._replayssm.compile_failure
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # fallen back already: no second warning
        again, _ = _generate(model)
    assert step.calls == 2 and torch.equal(again, ref_tokens)


@pytest.mark.parametrize(
    "case, fake, match",
    [
        ("partitioned", dict(partition_maps=[types.SimpleNamespace(id=0), types.SimpleNamespace(id=2)]), "2 CUDA-graph"),
        ("eager part first", dict(partition_maps=[types.SimpleNamespace(id=1)]), "1 CUDA-graph"),
        ("not in recording", dict(in_recording=False), "not raised by inductor's CUDA-graph recording"),
    ],
)
def test_capture_failure_after_part_of_the_step_may_have_run_raises(case, fake, match, monkeypatch):
    ref_tokens, _ = _eager_reference()
    model, step = _faked(monkeypatch, error=torch.AcceleratorError(CAPTURING), ran_first=True, **fake)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback warning: the step must not be redone
        with pytest.raises(RuntimeError, match=f"part of the step may have run before .*{match}") as info:
            _generate(model)
    assert isinstance(info.value.__cause__, torch.AcceleratorError)
    tokens, _ = _generate(model)  # a new cache: later calls decode eagerly
    assert step.calls == 2 and torch.equal(tokens, ref_tokens)


@pytest.mark.parametrize(
    "error, end_error",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), None),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), torch.AcceleratorError(INVALIDATED)),
        (RuntimeError("The size of tensor a (4) must match the size of tensor b (3) at non-singleton dimension 1"), None),
        (torch.AcceleratorError("CUDA error: an illegal memory access was encountered"), None),
    ],
)
def test_other_errors_in_recording_propagate(error, end_error, monkeypatch):
    model, step = _faked(monkeypatch, error=error, end_error=end_error)
    raised = end_error or error
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(type(raised)) as info:
            _generate(model)
    assert info.value is raised  # unchanged, not wrapped
    assert model._replayssm.compile_failure is None


def _skip_on(*calls):
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    def on_call(n):
        if n in calls:  # as inductor does when it compiles or runs a graph without CUDA graphs
            log_cudagraph_skip_and_bump_counter(f"skipping cudagraphs due to mutated inputs ({n} instances)")

    return on_call


def test_cudagraph_skip_warns_once_per_patch_with_the_reason(monkeypatch):
    from transformers import CompileConfig

    ref_tokens, _ = _eager_reference()
    monkeypatch.setattr(hf_compiled, "_on_cuda", lambda model: True)  # CUDA graphs are only expected on CUDA
    config = CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
    model, step = _faked(monkeypatch, compile=config, error=None, on_call=_skip_on(1, 3, 12))
    reason = r"without CUDA graphs \(skipping cudagraphs due to mutated inputs \(1 instances\)\)"
    with pytest.warns(RuntimeWarning, match=reason) as record:
        tokens, _ = _generate(model)
        again, _ = _generate(model)  # skips on its calls too: no second warning
    assert len([w for w in record if "without CUDA graphs" in str(w.message)]) == 1
    assert step.calls == 16 and torch.equal(tokens, ref_tokens) and torch.equal(again, ref_tokens)
    assert model._replayssm.compile_failure is None and "mutated inputs" in model._replayssm.cudagraph_skip


@pytest.mark.parametrize("where", ["cpu", "no CUDA graphs asked"])
def test_cudagraph_skip_is_not_reported_where_no_graphs_are_expected(where, monkeypatch):
    """inductor counts a skip for every CPU graph under "reduce-overhead": that is no reason to warn."""
    from transformers import CompileConfig

    mode = "reduce-overhead"
    if where != "cpu":
        monkeypatch.setattr(hf_compiled, "_on_cuda", lambda model: True)
        mode = "max-autotune-no-cudagraphs"
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
    model, step = _faked(monkeypatch, compile=config, error=None, on_call=_skip_on(1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _generate(model)
    assert step.calls == 8 and model._replayssm.cudagraph_skip is None
