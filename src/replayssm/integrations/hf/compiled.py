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
  states and so is never compiled by transformers: a warning says so);
* ``get_compiled_call`` (installed by every patch): the compiled call with
  value checks off and a fallback: if compiling fails (a graph break under
  ``fullgraph=True``, a backend failure, an unsupported model), a warning
  says why and that step and the later ones of this patch run eagerly. A
  compile failure happens before the step runs anything, so nothing is
  half-applied: the eager step gives the same tokens.
"""

from __future__ import annotations

import copy
import warnings

import torch

from ... import ops

#: raised by torch.compile while tracing or compiling, before the compiled step runs
COMPILE_ERRORS: tuple[type[BaseException], ...] = (torch._dynamo.exc.TorchDynamoException,)

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

        def call(*args, **kwargs):
            if context.compile_failure is None:
                previous = ops.set_value_checks(False)
                try:
                    return compiled(*args, **kwargs)
                except COMPILE_ERRORS as exc:
                    context.compile_failure = f"{type(exc).__name__}: {_reason(exc)}"
                    warnings.warn(
                        f"replayssm: the captured decode step of {context.model_name} failed to compile "
                        f"({context.compile_failure}); decoding through the eager patched path from now on "
                        "(same tokens, without the speed of the captured step)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                finally:
                    ops.set_value_checks(previous)
            return model(*args, **kwargs)

        return call

    return get_compiled_call


def _reason(exc: BaseException) -> str:
    """The first lines of a compile error (dynamo's messages put the cause there; the rest is debug context)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = " ".join(lines[:3]) or type(exc).__name__
    return reason if len(reason) <= 400 else reason[:397] + "..."


def _generate_wrapper(model, context):
    original = type(model).generate.__get__(model)

    def generate(*args, **kwargs):
        assisted = [k for k in _ASSISTED_KWARGS if kwargs.get(k) is not None]
        user_cache = next((kwargs[k] for k in _CACHE_KWARGS if kwargs.get(k) is not None), None)
        generation_config = kwargs.get("generation_config")
        chosen = kwargs.get("cache_implementation") or getattr(generation_config, "cache_implementation", None)
        chosen = chosen or getattr(model.generation_config, "cache_implementation", None)
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
        return original(*args, **kwargs)

    return generate
