"""The static-shape decode path: ``patch(model, compile=True)``.

transformers already has a captured decode path: with a static cache
(``cache_implementation="static"``) ``generate()`` runs the prefill eagerly
and every decode step through ``torch.compile(model.__call__,
**compile_config)`` (mode "reduce-overhead": CUDA graphs on CUDA), on CUDA
by default, on other devices when the compile config asks for it. Both
5.17 and 5.24 build a ``StaticCache`` for the hybrids replay supports: its
attention layers preallocate keys/values, its linear-attention layers keep
their conv window in place (static address). A patched model fits in that
path as it is:

* the replay state is made at a cache's first prefill (one per batch
  size; a cache ``reset()`` keeps its tensors) and its tensors are marked
  static addresses, like transformers marks its own cache tensors, so CUDA
  graphs take them as they are (transformers 5.17 and 5.24 make a new
  ``StaticCache`` per ``generate`` call: same shapes, so no recompilation,
  but CUDA graphs re-record for the new addresses, as for the keys and
  values; a user-held static cache avoids that);
* a decode step reads no device value on the host and keeps no per-step
  host counter that the compiler would guard on (one graph per batch size);
  the replay op decides the fold on the device;
* the compiled call runs with the ops' value checks off (a host
  synchronisation per op otherwise): the integration passes rows it made
  itself.

What ``patch(model, compile=...)`` adds, as instance attributes removed by
``unpatch``:

* ``generate``: a wrapper that asks for the static cache and the compile
  config unless the call says otherwise (a cache, ``cache_implementation``
  or ``compile_config`` of its own; assisted decoding, which records past
  states and so is never compiled by transformers: verify.py captures its
  verifications where the draft length is bounded, otherwise a warning says
  it decodes eagerly);
* ``get_compiled_call`` (installed by every patch): the compiled call with
  value checks off and a fallback: if compiling fails (a graph break under
  ``fullgraph=True``, a backend failure, an unsupported model, more graphs
  than dynamo's recompile limit), a warning
  says why and that step and the later ones of this patch run eagerly. A
  compile failure happens before the step runs anything, so nothing is
  half-applied: the eager step gives the same tokens.

CUDA-graph recording failures (read in torch 2.13's
``torch/_inductor/cudagraph_trees.py``; no such failure seen on a GPU yet). Under mode
"reduce-overhead" inductor wraps the compiled graph in a cudagraph tree
(``CUDAGraphTreeManager.run``): the first call of a graph is a warmup
(``run_eager`` -> ``CUDAWarmupNode.run``, an ordinary run in the graph pool,
no capture); the next call records (``record_function`` ->
``CUDAGraphNode.__init__`` -> ``_record``, the step under
``torch.cuda.graph(...)``), then replays the recording once, which runs the
step; later calls replay, or record again when an input address changed (a
new cache: the first step of every later ``generate``). Nothing in the tree
catches errors: a capture failure reaches the caller as a ``RuntimeError``
(``torch.AcceleratorError`` for CUDA errors: "operation not permitted when
stream is capturing", and from ``capture_end`` "operation failed due to a
previous error during capture"; torch's own checks: "... during CUDA graph
capture"). Captured kernels are recorded, not run, and the node is added to
the tree only after ``_record`` succeeds; dynamo's side effects and AOT's
epilogue run after the compiled graph returns. So when a capture error is
raised inside ``_record`` and the graph is one CUDA graph, nothing of the
step ran: the call warns and runs that step, and the later ones, eagerly.
With graph partitions (``CompiledFxGraph.partition_maps``; inductor splits
off ops it cannot capture, default on in torch 2.13) the partitions record
and run one after the other, so an earlier one may have updated the cache:
then the error is re-raised with that explanation (this ``generate`` call
stops; later ones decode eagerly). Other errors (out of memory, a failure
in the warmup run, a bug) propagate unchanged. A failed ``capture_end``
also skips torch's reset of the current stream; the fallback resets it.

Steps compiled without CUDA graphs: inductor may compile the step but not
capture it (a CPU tensor, a mutated input that is not a static address, too
many re-recordings); it counts that in
``torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`` and logs
"skipping cudagraphs due to ..." (torch 2.13: the "cudagraphs" log at
warning level; older releases: perf hints, hidden by default). Tokens are
right, only slower: on CUDA with an inductor config that asks for CUDA
graphs, the first compiled call that grows the count gives one warning per
patch, with the logged reason.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
import threading
import warnings

import torch

from ... import ops
from . import verify

#: raised by torch.compile while tracing or compiling, before the compiled step runs; with fullgraph=True a
#: step that needs more graphs than dynamo's recompile limit (many batch sizes) raises FailOnRecompileLimitHit,
#: which is not a TorchDynamoException
COMPILE_ERRORS: tuple[type[BaseException], ...] = (
    torch._dynamo.exc.TorchDynamoException,
    getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", torch._dynamo.exc.TorchDynamoException),
)

_CACHE_KWARGS = ("cache", "past_key_values", "cache_params")
_ASSISTED_KWARGS = ("assistant_model", "prompt_lookup_num_tokens", "assistant_early_exit", "candidate_generator")


def compile_config_for(compile):  # noqa: A002 - the patch() keyword
    """The transformers ``CompileConfig`` that ``patch(model, compile=...)`` asks for (None: not compiled)."""
    if compile is None or compile is False:
        return None
    from transformers import CompileConfig

    if compile is True:
        config = CompileConfig(fullgraph=True, dynamic=False, mode="reduce-overhead")
    elif isinstance(compile, CompileConfig):
        config = copy.deepcopy(compile)
    else:
        raise TypeError(
            f"replayssm.patch: compile must be a bool or a transformers.CompileConfig, got {type(compile).__name__}"
        )
    # Asked for explicitly: compile on every device (transformers otherwise compiles on accelerators only).
    config._compile_all_devices = True
    return config


def check_model(model, compile_config) -> None:
    """Raise (before patch changes anything) if ``compile=True`` cannot act on ``model``."""
    if compile_config is not None and not callable(getattr(type(model), "generate", None)):
        raise ValueError(
            f"replayssm.patch: compile=True acts through generate(), which {type(model).__name__} does not have; "
            "patch the model with a generation head (AutoModelForCausalLM) or compile its forward yourself"
        )


def install(model, context) -> dict:
    """The instance attributes that route ``generate`` through the static path (applied by ``patch``)."""
    attributes = {}
    if callable(getattr(type(model), "get_compiled_call", None)):
        attributes["get_compiled_call"] = _compiled_call_factory(model, context)
    if context.compile_config is not None:
        attributes["generate"] = _generate_wrapper(model, context)
    return attributes


def _compiled_call_factory(model, context):
    original = type(model).get_compiled_call.__get__(model)

    def get_compiled_call(compile_config=None):
        compiled = original(compile_config)
        watch_skips = _expects_cuda_graphs(model, compile_config or getattr(model, "_last_compile_config", None))

        def call(*args, **kwargs):
            if context.compile_failure is None:
                previous = ops.set_value_checks(False)
                skips = _watch_skips() if watch_skips and context.cudagraph_skip is None else None
                try:
                    out = compiled(*args, **kwargs)
                except COMPILE_ERRORS as exc:
                    _fall_back(context, "failed to compile", f"{type(exc).__name__}: {_reason(exc)}")
                except RuntimeError as exc:
                    capture = _capture_failure(exc)
                    if capture is None:
                        raise  # not a capture failure (out of memory, a bug): the caller sees it as it is
                    reason, partly_run = capture
                    if partly_run:
                        context.compile_failure = reason
                        raise RuntimeError(
                            f"replayssm: recording the CUDA graph of the captured decode step of {context.model_name} "
                            f"failed ({reason}), and part of the step may have run before ({partly_run}): this "
                            "generate() call cannot go on exactly and its cache is inconsistent (make a new one or "
                            "reset() it). Later steps of this patch decode through the eager patched path"
                        ) from exc
                    _fall_back(context, "could not be recorded as a CUDA graph (nothing of the step ran)", reason)
                else:
                    if skips is not None and _skip_count() > skips:
                        _warn_skip(context)
                    return out
                finally:
                    ops.set_value_checks(previous)
            return model(*args, **kwargs)

        return call

    return get_compiled_call


def _fall_back(context, what: str, reason: str) -> None:
    context.compile_failure = reason
    warnings.warn(
        f"replayssm: the captured decode step of {context.model_name} {what} ({reason}); decoding through the "
        "eager patched path from now on (same tokens, without the speed of the captured step)",
        RuntimeWarning,
        stacklevel=3,
    )


def _reason(exc: BaseException) -> str:
    """The first lines of a compile error (dynamo's messages put the cause there; the rest is debug context)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = " ".join(lines[:3]) or type(exc).__name__
    return reason if len(reason) <= 400 else reason[:397] + "..."


# --- CUDA-graph recording failures -----------------------------------------------------------------

#: what the CUDA runtime (cudaErrorStreamCapture*, cudaErrorCapturedEvent) and torch ("... during CUDA graph
#: capture") say when work is not allowed while a stream is capturing, or when a capture was invalidated by it
_CAPTURE_MESSAGE = re.compile(
    r"stream is capturing|capturing stream|during (cuda graph )?capture|graph capture|capture sequence"
    r"|uncaptured work|capture was not",
    re.IGNORECASE,
)


def _capture_failure(exc: BaseException) -> tuple[str, str | None] | None:
    """``(reason, why part of the step may have run or None)`` if ``exc`` is a failed CUDA-graph capture, else None.

    inductor's only capture is ``CUDAGraphNode._record`` (torch/_inductor/cudagraph_trees.py), which records the
    kernels without running them; its graph runs once recorded. So nothing of the step ran if the error comes from
    there and the compiled graph (``CompiledFxGraph``) is one CUDA graph: not partitioned, or one partition with no
    eager partition before it (graph partitions run in order: an earlier one would have run).
    """
    chain = []
    while exc is not None and len(chain) < 8 and all(exc is not e for e in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    if any(isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower() for e in chain):
        return None
    captures = [e for e in chain if isinstance(e, RuntimeError) and _CAPTURE_MESSAGE.search(str(e))]
    if not captures:
        return None
    reason = f"{type(captures[-1]).__name__}: {_reason(captures[-1])}"  # the root cause is the last in the chain
    frames = [tb.tb_frame for e in chain for tb in _traceback(e)]
    _restore_stream(frames)
    _release_generator()
    if not any(f.f_code.co_name == "_record" and "cudagraph_trees" in f.f_code.co_filename for f in frames):
        return reason, "not raised by inductor's CUDA-graph recording, so what ran is unknown"
    owners = [f.f_locals.get("self") for f in frames]
    graph = next((owner for owner in owners if type(owner).__name__ == "CompiledFxGraph"), None)
    if graph is None:
        return reason, "inductor's compiled graph is not in the traceback, so what ran is unknown"
    partitions = getattr(graph, "partition_maps", ())
    if partitions is not None and [getattr(p, "id", None) for p in partitions] != [0]:
        return reason, f"the step is split into {len(partitions)} CUDA-graph partition(s) and eager parts, run in turn"
    return reason, None


def _traceback(exc: BaseException):
    tb = exc.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _restore_stream(frames) -> None:
    """Reset the stream a failed ``torch.cuda.graph`` exit leaves current (capture_end raised before resetting it)."""
    for frame in frames:
        graph = frame.f_locals.get("self") if frame.f_code.co_name == "__exit__" else None
        if isinstance(graph, torch.cuda.graph):
            graph.stream_ctx.__exit__(None, None, None)


def _release_generator() -> None:
    """Unmark the device's default RNG as capturing. ``capture_end`` raised before its generator epilogue ran, so
    torch still counts the generator as inside a capture, and every random op after (sampling in ``generate``,
    inductor's own benchmarking) would fail with "Offset increment outside graph capture". If so, swap in a copy
    of its state: same seed and offset, not capturing. (Graphs recorded earlier keep the old state object; after a
    fallback this model's graphs are not replayed.)"""
    if not torch.cuda.is_initialized():
        return  # no capture ran (the CPU tests' simulated failures)
    try:
        torch.empty(1, device="cuda").uniform_()  # only a generator left capturing raises here (else: one draw used)
    except RuntimeError as err:
        if "outside graph capture" not in str(err):
            raise
        generator = torch.cuda.default_generators[torch.cuda.current_device()]
        generator.graphsafe_set_state(generator.clone_state())


# --- steps compiled without CUDA graphs --------------------------------------------------------------


class _LastSkipMessage(logging.Handler):
    """Keeps the last message of inductor's cudagraph-skip log ("skipping cudagraphs due to ...")."""

    message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.message = record.getMessage()


_SKIP_LOG = _LastSkipMessage()


def _expects_cuda_graphs(model, compile_config) -> bool:
    """Whether inductor is asked to run the step as CUDA graphs (on CUDA, mode "reduce-overhead" or an option)."""
    options = getattr(compile_config, "options", None) or {}
    wanted = options.get("triton.cudagraphs", getattr(compile_config, "mode", None) in ("reduce-overhead", "max-autotune"))
    if not (wanted and _on_cuda(model) and getattr(compile_config, "backend", None) == "inductor"):
        return False
    try:  # the reason of a skip is only logged (torch 2.13: cudagraphs_log; older: perf_hint_log)
        from torch._inductor import cudagraph_utils
    except ImportError:
        return True
    log = getattr(cudagraph_utils, "cudagraphs_log", None) or getattr(cudagraph_utils, "perf_hint_log", None)
    if isinstance(log, logging.Logger) and _SKIP_LOG not in log.handlers:
        log.addHandler(_SKIP_LOG)
    return True


def _on_cuda(model) -> bool:
    return getattr(getattr(model, "device", None), "type", None) == "cuda"


def _skip_count() -> int:
    """inductor's count of graphs it compiled or ran without CUDA graphs (0 where a torch keeps no such count)."""
    inductor = getattr(torch._dynamo.utils, "counters", {}).get("inductor", {})
    return inductor.get("cudagraph_skips", 0)


def _watch_skips() -> int:
    """Start watching one compiled call for a skip: forget the last skip message, return the count so far."""
    _SKIP_LOG.message = None
    return _skip_count()


def _warn_skip(context) -> None:
    context.cudagraph_skip = _SKIP_LOG.message or "inductor logged the reason as 'skipping cudagraphs due to ...'"
    warnings.warn(
        f"replayssm: inductor compiled the captured decode step of {context.model_name} but runs it without CUDA "
        f"graphs ({context.cudagraph_skip}); tokens are unaffected, but every step pays the launch overhead the "
        "captured path is meant to remove",
        RuntimeWarning,
        stacklevel=3,
    )


def _generate_wrapper(model, context):
    original = type(model).generate.__get__(model)

    def generate(*args, **kwargs):
        assisted = [k for k in _ASSISTED_KWARGS if kwargs.get(k) is not None]
        user_cache = next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
        generation_config = kwargs.get("generation_config")
        chosen = kwargs.get("cache_implementation") or getattr(generation_config, "cache_implementation", None)
        chosen = chosen or getattr(model.generation_config, "cache_implementation", None)
        length = verify.verify_len(kwargs, model) if assisted else None
        if length is not None and user_cache is None and chosen is None:
            out = verify.run_assisted(model, context, original, args, kwargs, length)
            if out is not None:
                return out
        if assisted:
            warnings.warn(
                f"replayssm: compile=True does not capture assisted decoding ({assisted[0]}=...): its steps record past "
                "states for rollback, which transformers never compiles; decoding eagerly",
                RuntimeWarning,
                stacklevel=2,
            )
        elif user_cache is not None:
            if type(user_cache).__name__ == "DynamicCache" or not getattr(user_cache, "is_compileable", False):
                warnings.warn(
                    f"replayssm: compile=True, but generate() was given a {type(user_cache).__name__}, which transformers "
                    "does not compile (dynamic shapes); decoding eagerly. Pass StaticCache(config=..., max_cache_len=...) "
                    "or no cache",
                    RuntimeWarning,
                    stacklevel=2,
                )
        elif chosen is None:
            kwargs["cache_implementation"] = "static"
        if not assisted and "compile_config" not in kwargs and getattr(generation_config, "compile_config", None) is None:
            if getattr(model.generation_config, "compile_config", None) is None:
                kwargs["compile_config"] = context.compile_config
        with deferred_stop_check_on_cuda(DEFER_STOP_CHECK and not assisted and _on_cuda(model)):
            return original(*args, **kwargs)

    return generate


#: Whether a patched compiled model's ``generate()`` on CUDA reads its stop decision one step late (below).
#: On: tested on an H200 (tests/test_hf_cuda.py); Qwen3.5-like at batch 256 through ``generate()``, 1.86 -> 1.18 ms
#: per step (BENCHMARKS.md). False leaves the choice to transformers (mps only).
DEFER_STOP_CHECK = True
#: The device types the deferred check is enabled for (the CPU tests add "cpu", with a stand-in for CUDA events).
_DEFER_DEVICE_TYPES = ("cuda",)
_DEFER_LOCK = threading.Lock()
_defer_depth = 0
_defer_original = None


@contextlib.contextmanager
def deferred_stop_check_on_cuda(enabled: bool = True):
    """Let transformers' ``DeferredStopCheck`` run on CUDA devices while the block runs.

    transformers' decode loop (5.17 to 5.25) asks after every step whether all rows have stopped, by reading
    ``unfinished_sequences.max() == 0`` on the host: the host waits for the step to finish before it prepares the
    next, so its per-step work (input preparation, the compiled call's CUDA-graph bookkeeping, logits processing)
    adds to the GPU time instead of overlapping it. Its ``DeferredStopCheck`` copies that flag to pinned memory
    asynchronously and reads it one step later (one extra forward at the end, which it undoes), so the host stays a
    step ahead; transformers enables it only on Apple's ``mps`` devices. Here it is enabled for CUDA devices under
    transformers' own conditions for ``mps`` (never for an assistant) and one more: never when ``generate()``
    returns its cache (a cache the caller passed, or ``return_dict_in_generate``). Such a cache is switched to
    recording (what assisted decoding uses), cropped by ``crop(0)`` after every step and by one token at the end;
    transformers 5.17 refuses it anyway (its hybrid layers with recurrent states are not croppable), but from 5.25
    a replay cache is croppable, and recording and crops change the host-side state the captured step's graph is
    specialised on: it recompiled until dynamo's limit and fell back to eager decoding (tests/test_hf_compile.py).
    A user-held cache therefore keeps the per-step read.
    The switch is process-wide while any such block runs (a counted, locked swap); a transformers without the class
    is left as it is."""
    global _defer_depth, _defer_original
    try:
        from transformers.generation.utils import DeferredStopCheck
    except ImportError:
        DeferredStopCheck = None
    if not enabled or not isinstance(getattr(DeferredStopCheck, "__dict__", {}).get("is_supported"), staticmethod):
        yield
        return
    with _DEFER_LOCK:
        if _defer_depth == 0:  # read under the lock: outside it, another thread's swap could be taken for the original
            _defer_original = DeferredStopCheck.__dict__["is_supported"]
            check = _defer_original.__func__

            def is_supported(device, cache, cache_is_returned, is_assistant):
                if torch.device(device).type not in _DEFER_DEVICE_TYPES:
                    return check(device, cache, cache_is_returned, is_assistant)
                if cache is not None and cache_is_returned:
                    return False  # would be cropped every step: see above
                return check(torch.device("mps"), cache, cache_is_returned, is_assistant)  # transformers' mps conditions

            DeferredStopCheck.is_supported = staticmethod(is_supported)
        _defer_depth += 1
    try:
        yield
    finally:
        with _DEFER_LOCK:
            _defer_depth -= 1
            if _defer_depth == 0:
                DeferredStopCheck.is_supported = _defer_original
                _defer_original = None
