"""End-to-end decode throughput of patched transformers models (issue 5, item 7).

    PYTHONPATH=src python benchmarks/generate.py --captured --out results/   # the GPU run
    PYTHONPATH=src python benchmarks/generate.py --tiny --out /tmp/gen   # CPU smoke run, tiny sizes

Models (random weights, a few layers, real layer width, bf16 weights and
activations, fp32 recurrent state):

* ``nemotron_h-like``: hidden 3072, Mamba-2 layers of 96 heads x 64 x 128
  state, 8 groups, pattern mamba, mlp, mamba, attention (prefill chunk 16);
* ``qwen3_5-like``: hidden 2048, Gated DeltaNet layers of 16 key heads / 32
  value heads x 128 x 128, pattern linear, linear, linear, full attention.

For each model and batch (1, 16, 64, 256), these modes:

* ``transformers``: the unpatched model (whatever kernels transformers finds:
  mamba_ssm / causal_conv1d / fla when installed, its torch path otherwise);
* ``conventional``: patched with ``step="conventional"`` (the replayssm
  conventional op: read and write the whole state every token);
* ``replay``: patched with replay (window ``--window``).

With ``--captured``, also ``conventional-captured`` and ``replay-captured``:
the patched step in a static cache through ``torch.compile(fullgraph=True,
dynamic=False)``, mode "reduce-overhead" (CUDA graphs) with inductor; with
``--tiny`` on the CPU the backend is "eager" (a smoke test of the plumbing).
``replay-read`` and ``replay-read-captured`` (only when ``--modes`` names
them): replay with a bf16 read copy of the fp32 checkpoint
(``ReplayConfig.read_dtype``, SPEC §4).
Dynamo's caches (and CUDA graphs) are reset after each captured mode, so the
next one compiles from scratch. ``--modes`` picks a subset.

Decode is timed as ``--steps`` single-token forwards after a prefill of
``--prompt`` tokens and ``window // 2`` untimed lead steps, median of
``--repeats``. The lead steps are there because the prefill leaves every ring
empty, so a row's first fold comes on decode step ``window + 1``: timed from
the first decode step, 32 steps would hold one fold per row instead of two.
Started ``window // 2`` steps in, any multiple of the window holds exactly
``steps / window`` folds per row, the steady-state rate (``meta.timed_folds``
says how many the timed steps held). Per mode:

* ``tokens_per_s``: batch x steps / median time of the timed steps;
* ``ms_per_step``: that median time / steps, in ms (= 1000 x batch / tokens_per_s);
* ``peak_memory_gib``: ``torch.cuda.max_memory_allocated`` over the mode's
  whole run (prefill, warm-up or compilation, timed steps), model weights
  included, in GiB; None on the CPU;
* ``decode_peak_memory_gib``: the same over the timed decode steps only
  (peak counter reset after each prefill): what decoding itself needs, next
  to ``weights_gib`` (parameters), ``kv_cache_gib`` (attention keys/values
  the cache holds) and ``ssm_state_gib`` (the SSM layers' state: replay
  checkpoint + ring + cursors as allocated, also for ``conventional``, which
  reads only the checkpoint; transformers' recurrent states unpatched);
  conv windows and CUDA-graph pools are in the peak only;
* ``state_op_share``: kernel time of the recurrent-state op / all kernel time
  of a decode step, not a wall-clock share. Measured after the timing, over
  ``--profile-steps`` extra steps (default: one window, at most ``--steps``,
  after the same lead steps, so a replay row's checkpoint fold counts once
  per window, as in the timed steps; 0 turns the profiler off) under
  ``torch.profiler`` (CUDA activity), from a fresh prefill: the sum of the
  durations of the CUDA kernels whose name begins with ``_mamba2_``, ``_gdn_``
  or ``_commit`` (replayssm's Triton kernels; the op launches nothing else)
  over the sum of the durations of all CUDA kernels (memcpy / memset not
  counted). Idle GPU time between kernels (launch gaps, host work) is in
  neither sum, so the eager modes' share is of their kernel time, not of their
  step time. Patched modes on CUDA only; None for ``transformers`` (its kernels
  cannot be told apart by name), on the CPU, and when the profiler fails or
  records no kernel;
* ``kernel_ms_per_step``: the sum of all CUDA kernel durations of those
  profiled steps / their number: the GPU's busy time per step. Next to
  ``ms_per_step`` it says how much of a step is kernels and how much is host
  work and launch gaps; ``kernels_per_step``: how many kernels a step
  launches (each brings a gap of its own, even inside a CUDA graph);
* ``wall_seconds``: how long the mode took, compilation and profiling included;
* ``errors``: a mode that raises (an out-of-memory at batch 256, say) is
  recorded with NaN tokens/s and ms, its error (type and first line), and the
  run goes on.

One line is printed per mode as it finishes, and ``generate.json`` is
rewritten after every mode, so a run cut off by a time limit keeps what it
measured. Then (unless ``--no-assisted``) assisted decoding with prompt lookup
at batch 1 vs plain greedy (patched replay), tokens/s through ``generate``, on
a prompt that repeats itself, and whether both give the same tokens: in the
benchmark's dtype (bf16: verification computes T tokens in one launch and
decoding one, so near-tied logits of a random model can round to different
argmaxes; the first differing position is recorded) and again with the model
in fp32, where they must be equal.

With ``--through-generate`` (``--generate-only``: nothing else), each model
and batch is also timed as a user runs it, through ``model.generate()``
(greedy, a random prompt of ``--prompt`` tokens, ``min_new_tokens`` =
``max_new_tokens``), ``time_generate``: calls for ``2 steps + 1`` against
``steps + 1`` new tokens, the difference over ``steps``, median of
``--repeats`` (after a warm-up round), so the prefill and each call's fixed
costs cancel while each step's own host work in ``generate()`` (input
preparation, logits processors, stopping criteria and their read of a
device value) counts; and what a call's decode costs beyond its steps (its
first steps' one-off work, such as recording CUDA graphs for a new cache).
Modes (``GENERATE_MODES``): ``transformers`` (stock ``generate()``, its own
cache: what issue 7 measured at 40-65 ms per step) and the patched model
under ``patch(model, compile=...)`` with one ``StaticCache`` kept across
calls (docs/hf.md), conventional, replay, replay with a bf16 read copy;
and conventional and replay with the cache ``generate()`` makes per call
(``-new-cache``: CUDA graphs re-recorded per call, counted per call, the
stop flag read on the host every step: ``compiled.DEFER_STOP_CHECK`` off), and
the same with the stop flag read one step late on CUDA (``-deferred``:
``compiled.DEFER_STOP_CHECK`` on, the default; a returned cache such as a
kept one is never deferred), replay with the read copy included. A patched
mode whose compiled step fell back to eager is recorded as failed.
JSON: ``through_generate``.

Prints a markdown table; writes ``generate.json`` (NaN for a failed mode) and
``generate.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import torch

import replayssm
from replayssm.integrations.hf import compiled, testing

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _profile import profiled_kernels  # noqa: E402

MODELS = {
    "nemotron_h-like": dict(
        model_type="nemotron_h",
        vocab_size=32000,
        hidden_size=3072,
        intermediate_size=9216,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        mamba_num_heads=96,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
        conv_kernel=4,
        # Nemotron-H uses 128; transformers' torch prefill (no mamba_ssm on the GPU box) materialises a
        # (batch, chunk, chunk, heads, state) product: 256 GiB at batch 256 with 128. Only prefill changes.
        chunk_size=16,
        layers_block_type=["mamba", "mlp", "mamba", "attention"],
    ),
    "qwen3_5-like": dict(
        model_type="qwen3_5",
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    ),
}
TINY = {"nemotron_h-like": "nemotron_h", "qwen3_5-like": "qwen3_5"}
MODES = ("transformers", "conventional", "replay")
#: --captured adds these: the patched step in a static cache, through torch.compile (CUDA graphs on CUDA)
CAPTURED_MODES = ("conventional-captured", "replay-captured")
#: replay with a bf16 read copy of the checkpoint (SPEC §4); only when --modes names them
READ_COPY_MODES = ("replay-read", "replay-read-captured")


def model_config(name: str):
    """The text-decoder config of ``MODELS[name]``.

    Multimodal types (qwen3_5) keep the decoder's settings in a sub-config: built from the top-level
    type, the keywords would land on the wrapper and the decoder would get its defaults (a 9B model).
    """
    from transformers import AutoConfig

    spec = dict(MODELS[name])
    model_type = spec.pop("model_type")
    spec.update(tie_word_embeddings=False, pad_token_id=0)
    text = AutoConfig.for_model(model_type).get_text_config(decoder=True)
    return type(text)(**spec)


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype):
    if tiny:
        return testing.tiny_model(TINY[name], dtype=dtype).to(device)
    from transformers import AutoModelForCausalLM

    config = model_config(name)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # distinct decays (the default init is near identity)
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.uniform_(-1.0, 1.0)
                module.dt_bias.uniform_(-2.0, 0.5)
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_decode(
    model,
    batch: int,
    prompt: int,
    steps: int,
    repeats: int,
    device: torch.device,
    compile_kwargs: dict | None = None,
    profile_steps: int = 0,
    lead: int = 0,
) -> tuple[float, float | None]:
    """Median seconds per decode step at ``batch`` rows (``steps`` single-token forwards after an untimed prefill
    and ``lead`` untimed steps), and the state-op share of ``profile_steps`` further steps after a prefill and the
    same lead (None when not profiled).

    With ``compile_kwargs``: a static cache, and each step through
    ``torch.compile(model, **compile_kwargs)`` with the ops' value checks off
    (what ``patch(model, compile=True)`` makes ``generate`` do); the first
    (untimed) repeat compiles and captures.
    """
    vocab = model.config.get_text_config(decoder=True).vocab_size
    kw = testing.cache_kwarg(model)
    forward = model
    if compile_kwargs is not None:
        from transformers import StaticCache

        forward = torch.compile(model, **compile_kwargs)
        text_config = model.config.get_text_config(decoder=True)
        previous_checks = replayssm.ops.set_value_checks(False)
    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, prompt + lead + steps + 1), generator=gen).to(device)

    # Captured: one static cache for every repeat, reset in place (what a serving loop holds): a new cache
    # would move the tensors the CUDA graphs read, and each repeat would time a re-recording.
    static_cache = StaticCache(config=text_config, max_cache_len=prompt + lead + steps) if compile_kwargs is not None else None

    def prefill():
        if static_cache is None:
            cache = testing.new_cache(model)
        else:
            cache = static_cache
            cache.reset()
        model(input_ids=ids[:, :prompt], **{kw: cache}, use_cache=True, logits_to_keep=1)
        _sync(device)
        return cache

    def decode(cache, count: int, start: int = 0) -> None:
        for pos in range(prompt + start, prompt + start + count):
            position = torch.full((batch, 1), pos, device=device)
            forward(input_ids=ids[:, pos : pos + 1], position_ids=position, **{kw: cache}, use_cache=True, logits_to_keep=1)
        _sync(device)

    cuda = device.type == "cuda"
    times, decode_peak, run_peak = [], None, 0
    with torch.no_grad():
        try:
            for repeat in range(repeats + 1):  # the first run warms up (and compiles)
                cache = prefill()
                decode(cache, lead)
                if cuda:  # the decode steps' own peak, without the prefill's transients (the run's peak kept)
                    run_peak = max(run_peak, torch.cuda.max_memory_allocated(device))
                    torch.cuda.reset_peak_memory_stats(device)
                start = time.perf_counter()
                decode(cache, steps, lead)
                times.append(time.perf_counter() - start)
                if cuda and repeat:
                    decode_peak = max(decode_peak or 0, torch.cuda.max_memory_allocated(device))
            held = cache_bytes(cache)
            share = kernel_ms = top = launches = None
            if profile_steps:  # after the timing, from a fresh prefill: the profiler never runs during a timed step
                cache = prefill()
                decode(cache, lead)
                kernels = profiled_kernels(lambda: decode(cache, profile_steps, lead))
                share = state_op_share(kernels)
                if kernels:
                    kernel_ms = sum(duration for _, duration in kernels) / 1000 / profile_steps
                    top = top_kernels(kernels, profile_steps)
                    launches = len(kernels) / profile_steps
            if cuda:
                run_peak = max(run_peak, torch.cuda.max_memory_allocated(device))
        finally:
            if compile_kwargs is not None:
                replayssm.ops.set_value_checks(previous_checks)
    return {
        "seconds_per_step": statistics.median(times[1:]) / steps, "share": share, "kernel_ms": kernel_ms, "top": top, "launches": launches,
        "run_peak": run_peak if cuda else None, "decode_peak": decode_peak, **held,
    }  # fmt: skip


def time_generate(model, batch: int, prompt: int, steps: int, repeats: int, device: torch.device, cache=None) -> tuple[float, float]:
    """Seconds per decode step of ``model.generate()`` at ``batch`` rows, as a user calls it (greedy from a random
    ``prompt``-token prompt), and the fixed decode cost of a call, medians over ``repeats`` after a warm-up round.

    Each round makes three calls: 1 new token (the prefill and its token), ``steps + 1`` and ``2 steps + 1``. Per
    step: (third - second) / ``steps``, so each call's fixed costs (the prefill, building the cache, whatever the
    first decode steps of a call do once, such as recording a CUDA graph for new cache addresses) cancel, and each
    step's own host work (input preparation, logits processors, stopping criteria and their device read) stays in.
    Per call: (second - first) - ``steps`` x per step, what a call's decode costs beyond its steps.

    ``cache``: a cache to pass (``testing.cache_kwarg``), reset before each call (a patched compiled model: one
    ``StaticCache`` kept, docs/hf.md); None: ``generate()`` builds its own."""
    vocab = model.config.get_text_config(decoder=True).vocab_size
    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, prompt), generator=gen).to(device)
    mask = torch.ones_like(ids)

    def call(new_tokens: int) -> float:
        extra = {}
        if cache is not None:
            cache.reset()
            extra[testing.cache_kwarg(model)] = cache
        _sync(device)
        start = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, **extra)
        _sync(device)
        assert out.shape == (batch, prompt + new_tokens), out.shape
        return time.perf_counter() - start

    per_step, per_call = [], []
    with torch.no_grad():
        for _ in range(repeats + 1):
            short, mid, long = call(1), call(steps + 1), call(2 * steps + 1)
            per_step.append((long - mid) / steps)
            per_call.append(mid - short - steps * per_step[-1])
    return statistics.median(per_step[1:]), statistics.median(per_call[1:])


#: --through-generate's modes: stock generate() (its own cache), and the patched model's generate() under
#: patch(compile=...), the step captured: with one StaticCache kept across calls (which generate() returns, so
#: transformers reads its stop flag on the host every step); ``-new-cache``: with the StaticCache generate() makes
#: per call (CUDA graphs re-recorded per call), compiled.DEFER_STOP_CHECK off; ``-deferred``: the same with it on
#: (the default: on CUDA the stop flag read one step late)
GENERATE_MODES = (
    "transformers", "conventional-captured", "replay-captured", "replay-read-captured",
    "conventional-captured-new-cache", "replay-captured-new-cache", "conventional-captured-deferred", "replay-captured-deferred",
    "replay-read-captured-deferred",
)  # fmt: skip


def measure_generate_mode(
    model, mode: str, config: replayssm.ReplayConfig, batch: int, prompt: int, steps: int, repeats: int, device: torch.device, compile_kwargs: dict
) -> tuple[float, float]:
    """Seconds per decode step of ``model.generate()`` in ``mode`` (``GENERATE_MODES``), and per call: ``time_generate``."""
    from transformers import CompileConfig, StaticCache

    replayssm.unpatch(model)
    if device.type == "cuda":  # what the last mode's prefill left reserved (Nemotron-H's takes 48 GiB at batch 256)
        gc.collect()
        torch.cuda.empty_cache()
    if mode == "transformers":
        return time_generate(model, batch, prompt, steps, repeats, device)
    step, _, variant = mode.partition("-")
    if variant.startswith("read"):
        config = dataclasses.replace(config, read_dtype=torch.bfloat16)
    replayssm.patch(model, config, step=step, compile=CompileConfig(**{"mode": None, **compile_kwargs}))
    defer = compiled.DEFER_STOP_CHECK
    try:
        cache = None
        compiled.DEFER_STOP_CHECK = mode.endswith("-deferred")  # a kept (returned) cache is never deferred anyway
        if not mode.endswith(("-new-cache", "-deferred")):
            text_config = model.config.get_text_config(decoder=True)
            cache = StaticCache(config=text_config, max_cache_len=prompt + 2 * steps + 1)  # time_generate's longest call
        timed = time_generate(model, batch, prompt, steps, repeats, device, cache)
        if model._replayssm.compile_failure is not None:  # the eager patched path ran: not a captured figure
            raise RuntimeError(f"compiled step fell back to eager: {model._replayssm.compile_failure}")
        return timed
    finally:
        compiled.DEFER_STOP_CHECK = defer
        replayssm.unpatch(model)
        torch._dynamo.reset()


def format_generate_table(rows: list[dict]) -> str:
    """--through-generate's markdown table: ms per step per mode, and each patched mode's speed-up over stock."""
    modes = list(rows[0]["ms_per_step"]) if rows else []
    patched = [m for m in modes if m != "transformers"]
    header = (
        ["model", "batch"] + [f"{m} ms" for m in modes] + [f"{m}/transformers" for m in patched if "transformers" in modes]
        + [f"{m} ms more per call" for m in modes]
    )  # fmt: skip
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        ms = r["ms_per_step"]
        cells = [r["model"], str(r["batch"])] + [_cell(ms[m], "{:.3f}", "failed") for m in modes]
        if "transformers" in modes:
            cells += [_cell(ms["transformers"] / ms[m], "{:.2f}x") for m in patched]
        cells += [_cell(r["ms_per_call"][m], "{:.1f}", "failed") for m in modes]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cache_bytes(cache) -> dict:
    """Bytes the cache holds after a prefill: attention keys/values, and the SSM layers' state (replay:
    checkpoint + ring + cursors as allocated, also under ``step="conventional"``, which reads only the
    checkpoint; unpatched: transformers' recurrent states). Conv windows are not counted (small)."""
    kv = state = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            kv += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
        replay = getattr(layer, "replay", None)
        if replay is not None:
            state += replay.nbytes
        else:
            states = getattr(layer, "recurrent_states", None) or {}  # {index: tensor} in transformers' layers
            for t in states.values() if isinstance(states, dict) else states:
                state += t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
    return {"kv_bytes": kv, "state_bytes": state}


#: replayssm's Triton kernels (``_mamba2_main_kernel``, ``_gdn_replay_kernel``, ``_commit_kernel``, ...):
#: one of these names at the start of an identifier in the kernel name
STATE_OP_KERNEL = re.compile(r"(?<!\w)(_mamba2_|_gdn_|_commit)")


def state_op_share(kernels: list[tuple[str, float]]) -> float | None:
    """Duration of the state-op kernels over the duration of all ``kernels`` (name, duration); None without kernels."""
    total = sum(duration for _, duration in kernels)
    if not total:
        return None
    return sum(duration for name, duration in kernels if STATE_OP_KERNEL.search(name)) / total


def top_kernels(kernels: list[tuple[str, float]], steps: int, count: int = 24) -> list[tuple[str, float, float]]:
    """The ``count`` kernel names with the most time, as (name, microseconds per step, launches per step), most
    first: where a captured step's time goes (names cut to 120 characters; inductor's fused kernels are named
    by their ops)."""
    totals: dict[str, list[float]] = {}
    for name, duration in kernels:
        total = totals.setdefault(name[:120], [0.0, 0])
        total[0] += duration
        total[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [(name, total / steps, launches / steps) for name, (total, launches) in ranked]


def assisted_tokens_per_second(model, new_tokens: int, repeats: int, device: torch.device, lookup: int | None) -> tuple[float, torch.Tensor]:
    """Tokens/s of greedy ``generate`` at batch 1 (``lookup``: prompt-lookup draft length, None for plain greedy)."""
    vocab = model.config.get_text_config(decoder=True).vocab_size
    phrase = torch.arange(5, 5 + 24) % vocab
    prompt = torch.cat([phrase] * 4).unsqueeze(0).to(device)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    times, out = [], None
    for _ in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        out = model.generate(prompt, **kwargs)
        _sync(device)
        times.append(time.perf_counter() - start)
    return new_tokens / statistics.median(times[1:] or times), out  # the first run warms up


def captured_assisted(
    model, name: str, config, compile_kwargs: dict, new_tokens: int, repeats: int, device, lookup: int, eager_lookup_out
) -> list[dict]:
    """Greedy and prompt lookup at batch 1 under ``patch(model, compile=...)`` with ``compile_kwargs`` (on CUDA
    what ``compile=True`` does: inductor, CUDA graphs): decode steps and verification forwards (padded to
    ``lookup + 1``) through the compiled call; the tokens are compared with captured greedy and with eager
    patched prompt lookup, and the count of verifications that ran captured is recorded."""
    from transformers import CompileConfig

    replayssm.patch(model, config, compile=CompileConfig(**{"mode": None, **compile_kwargs}))
    try:
        greedy_tps, greedy_out = assisted_tokens_per_second(model, new_tokens, repeats, device, None)
        lookup_tps, lookup_out = assisted_tokens_per_second(model, new_tokens, repeats, device, lookup)
        context = model._replayssm
        return [
            {"model": name, "method": "greedy, captured", "tokens_per_s": greedy_tps},
            {
                "model": name, "method": f"prompt lookup {lookup}, captured", "tokens_per_s": lookup_tps,
                "identical_to_greedy": bool(torch.equal(greedy_out, lookup_out)),
                "first_difference": _first_difference(greedy_out, lookup_out),
                "identical_to_eager_lookup": bool(torch.equal(lookup_out, eager_lookup_out)),
                "captured_verifications": context.captured_verifications, "compile_failure": context.compile_failure,
            },
        ]  # fmt: skip
    finally:
        replayssm.unpatch(model)
        torch._dynamo.reset()


def measure_mode(
    model,
    mode: str,
    config: replayssm.ReplayConfig,
    batch: int,
    prompt: int,
    steps: int,
    repeats: int,
    device: torch.device,
    compile_kwargs: dict,
    profile_steps: int,
    lead: int = 0,
    separate_projections: bool = False,
) -> dict:
    """Patch ``model`` for ``mode`` and measure its decode: tokens/s, ms per step, peak GiB, state-op share."""
    replayssm.unpatch(model)
    step, _, variant = mode.partition("-")
    captured = variant.endswith("captured")
    if variant.startswith("read"):
        config = dataclasses.replace(config, read_dtype=torch.bfloat16)
    if step != "transformers":
        replayssm.patch(model, config, step=step)
        if separate_projections:  # the GDN input projections as the model built them, not one GEMM
            for adapter in model._replayssm.adapters.values():
                if hasattr(adapter, "projections"):
                    adapter.projections.unbind()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    profiled = step != "transformers" and device.type == "cuda"  # stock kernels have no names to attribute
    try:
        timed = time_decode(
            model, batch, prompt, steps, repeats, device, compile_kwargs if captured else None, profile_steps if profiled else 0, lead
        )
    finally:
        if captured:  # frees this mode's CUDA graphs and keeps dynamo's recompile limit out of the next mode
            torch._dynamo.reset()
    gib = lambda b: None if b is None else b / 2**30  # noqa: E731
    return {
        "tokens_per_s": batch / timed["seconds_per_step"],
        "ms_per_step": 1000 * timed["seconds_per_step"],
        "peak_memory_gib": gib(timed["run_peak"]),
        "decode_peak_memory_gib": gib(timed["decode_peak"]),
        "state_op_share": timed["share"],
        "kernel_ms_per_step": timed["kernel_ms"],
        "kernels_per_step": timed["launches"],
        "top_kernels": timed["top"],
        "weights_gib": gib(sum(p.numel() * p.element_size() for p in model.parameters())),
        "kv_cache_gib": gib(timed["kv_bytes"]),
        "ssm_state_gib": gib(timed["state_bytes"]),
    }


#: the per-mode figures of a row, as measure_mode returns them
FIGURES = (
    "tokens_per_s", "ms_per_step", "peak_memory_gib", "decode_peak_memory_gib", "state_op_share", "kernel_ms_per_step",
    "weights_gib", "kv_cache_gib", "ssm_state_gib", "kernels_per_step", "top_kernels",
)  # fmt: skip
#: the figures of a mode that raised
FAILED = dict(zip(FIGURES, (float("nan"), float("nan")) + (None,) * (len(FIGURES) - 2)))


def _error_line(err: BaseException) -> str:
    message = str(err).strip()
    return f"{type(err).__name__}: {message.splitlines()[0]}" if message else type(err).__name__


def _cell(value: float | None, template: str, missing: str = "-") -> str:
    return missing if value is None or math.isnan(value) else template.format(value)


def format_mode(figures: dict) -> str:
    """One mode's figures on one line (the progress lines)."""
    return (
        f"{_cell(figures['tokens_per_s'], '{:.1f}')} tok/s, {_cell(figures['ms_per_step'], '{:.3f}')} ms/step, "
        f"peak {_cell(figures['peak_memory_gib'], '{:.2f}')} GiB (decode {_cell(figures['decode_peak_memory_gib'], '{:.2f}')}; "
        f"weights {_cell(figures['weights_gib'], '{:.2f}')}, KV {_cell(figures['kv_cache_gib'], '{:.2f}')}, "
        f"SSM state {_cell(figures['ssm_state_gib'], '{:.2f}')}), state ops {_cell(figures['state_op_share'], '{:.1%}')} of kernel time, "
        f"kernels {_cell(figures['kernel_ms_per_step'], '{:.3f}')} ms/step ({_cell(figures['kernels_per_step'], '{:.1f}')} per step)"
    )


def format_table(rows: list[dict]) -> str:
    """A markdown table: per mode tok/s and ms per step, per mode peak GiB, the state-op share of the replay and
    conventional modes (captured ones when measured), replay's speed-up over transformers and over conventional."""
    modes = list(rows[0]["tokens_per_s"]) if rows else list(MODES)
    captured = [m for m in ("replay-captured", "conventional-captured") if m in modes]
    share_modes = captured or [m for m in ("replay", "conventional") if m in modes]
    best = "replay-captured" if "replay-captured" in modes else "replay"
    baseline = "conventional-captured" if best == "replay-captured" else "conventional"
    ratios = [(best, other) for other in ("transformers", baseline) if best in modes and other in modes]
    header = (
        ["model", "batch"]
        + [f"{m} {unit}" for m in modes for unit in ("tok/s", "ms")]
        + [f"{m} GiB (decode)" for m in modes]
        + [f"{m} state-op share" for m in share_modes]
        + [f"{m} kernel ms" for m in share_modes]
        + [f"{a}/{b}" for a, b in ratios]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        t = r["tokens_per_s"]
        cells = [r["model"], str(r["batch"])]
        for m in modes:
            cells += [_cell(t[m], "{:.1f}", "failed"), _cell(r["ms_per_step"][m], "{:.3f}", "failed")]
        cells += [f"{_cell(r['peak_memory_gib'][m], '{:.2f}')} ({_cell(r['decode_peak_memory_gib'][m], '{:.2f}')})" for m in modes]
        cells += [_cell(r["state_op_share"][m], "{:.1%}") for m in share_modes]
        cells += [_cell(r["kernel_ms_per_step"][m], "{:.3f}") for m in share_modes]
        cells += [_cell(t[a] / t[b], "{:.2f}x") for a, b in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], assisted: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return
    names = sorted({r["model"] for r in rows})
    panels = len(names) + bool(assisted)
    fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        sub = [r for r in rows if r["model"] == name]
        for mode in sub[0]["tokens_per_s"]:
            ax.plot([r["batch"] for r in sub], [r["tokens_per_s"][mode] for r in sub], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(name)
        ax.legend()
    if assisted:
        ax = axes[0][-1]
        labels = [f"{a['model']}\n{a['method']}" for a in assisted]
        ax.bar(range(len(assisted)), [a["tokens_per_s"] for a in assisted])
        ax.set_xticks(range(len(assisted)), labels, fontsize=7)
        ax.set_ylabel("tokens/s (batch 1, generate)")
        ax.set_title("prompt lookup vs greedy (replay)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def folds_per_row(window: int, lead: int, steps: int) -> int:
    """Folds per replay row in decode steps ``lead + 1 .. lead + steps`` after a prefill (rings empty): a step
    folds when it finds its row's ring full, on steps ``window + 1``, ``2 window + 1``, ..."""
    return sum(1 for step in range(lead + 1, lead + steps + 1) if step > window and (step - 1) % window == 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument(
        "--modes", nargs="+", default=None, choices=MODES + CAPTURED_MODES + READ_COPY_MODES,
        help="default: all but the read-copy ones (the captured ones with --captured)",
    )
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=None, help="prefill tokens (default 64; 8 with --tiny)")
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (default 64; 4 with --tiny)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--profile-steps", type=int, default=None, help="profiled steps for the state-op share (default: the window, at most --steps; 0: none)"
    )
    parser.add_argument("--lookup", type=int, default=8, help="prompt-lookup draft length")
    parser.add_argument("--new-tokens", type=int, default=None, help="generate length for the assisted runs")
    parser.add_argument("--no-assisted", action="store_true", help="skip the batch-1 assisted-decoding runs")
    parser.add_argument(
        "--separate-projections",
        action="store_true",
        help="patched modes compute a GDN layer's input projections one by one, as the model built them (default: one GEMM)",
    )
    parser.add_argument("--captured", action="store_true", help="also time the patched steps in a static cache through torch.compile")
    parser.add_argument(
        "--through-generate",
        action="store_true",
        help="also time decode steps through model.generate() (stock, and patched with compile=...; see GENERATE_MODES)",
    )
    parser.add_argument("--generate-only", action="store_true", help="with --through-generate: only those timings (no single-forward modes)")
    parser.add_argument(
        "--generate-modes", nargs="+", default=list(GENERATE_MODES), choices=GENERATE_MODES, help="with --through-generate: these modes"
    )
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend for --captured (default: inductor, mode reduce-overhead = CUDA graphs; "
        "'eager' with --tiny: traces the step without code generation, a CPU smoke test)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    tiny = args.tiny
    batches = args.batches or ([1, 2] if tiny else [1, 16, 64, 256])
    prompt = args.prompt or (8 if tiny else 64)
    steps = args.steps or (4 if tiny else 64)
    repeats = args.repeats or (1 if tiny else 5)
    # the static cache holds prompt + lead + steps tokens, so the profiled steps fit in it
    profile_steps = min(args.window if args.profile_steps is None else args.profile_steps, steps)
    lead = args.window // 2  # untimed: the prefill leaves the rings empty (module docstring)
    timed_folds = folds_per_row(args.window, lead, steps)
    if steps % args.window:
        print(f"note: {steps} timed steps are not a multiple of the window ({args.window}): they hold {timed_folds} folds per row", flush=True)
    new_tokens = args.new_tokens or (8 if tiny else 128)
    dtype = torch.float32 if tiny else torch.bfloat16
    modes = tuple(args.modes) if args.modes else MODES + (CAPTURED_MODES if args.captured else ())
    if args.generate_only:
        if not args.through_generate:
            parser.error("--generate-only needs --through-generate")
        modes = ()
    backend = args.compile_backend or ("eager" if tiny and device.type != "cuda" else "inductor")
    compile_kwargs = dict(fullgraph=True, dynamic=False, backend=backend)
    if backend == "inductor":
        compile_kwargs["mode"] = "reduce-overhead"

    import transformers

    transformers.logging.set_verbosity_error()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tiny": tiny,
        "dtype": str(dtype),
        "window": args.window,
        "prompt": prompt,
        "steps": steps,
        "lead_steps": lead,
        "timed_folds": timed_folds,
        "repeats": repeats,
        "profile_steps": profile_steps if device.type == "cuda" else 0,
        "modes": list(modes),
        "separate_projections": args.separate_projections,
        "captured": compile_kwargs if args.through_generate or any(m.endswith("captured") for m in modes) else None,
        "through_generate": list(args.generate_modes) if args.through_generate else [],
        "kernels": {mod: _importable(mod) for mod in ("mamba_ssm", "causal_conv1d", "fla")},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.out / "generate.json"
    config = replayssm.ReplayConfig(window=args.window)
    rows, assisted, generate_rows = [], [], []

    def save() -> None:  # after every mode: a run cut off by a time limit keeps what it measured
        doc = {"meta": meta, "decode": rows, "assisted": assisted}
        if args.through_generate:
            doc["through_generate"] = generate_rows
        json_path.write_text(json.dumps(doc, indent=2))

    for name in args.models:
        model = build(name, tiny, device, dtype)
        for batch in batches if modes else ():
            row = {"model": name, "batch": batch, **{figure: {} for figure in FIGURES}, "wall_seconds": {}, "errors": {}}
            rows.append(row)
            for mode in modes:
                started = time.perf_counter()
                try:
                    figures = measure_mode(model, mode, config, batch, prompt, steps, repeats, device, compile_kwargs, profile_steps, lead, args.separate_projections)
                except Exception as err:  # one failed mode (the stock model's OOM at batch 256) must not end the run
                    figures = FAILED
                    row["errors"][mode] = _error_line(err)
                for figure in FIGURES:
                    row[figure][mode] = figures[figure]
                row["wall_seconds"][mode] = time.perf_counter() - started
                if mode in row["errors"]:
                    print(f"WARNING {name} batch {batch} {mode} failed after {row['wall_seconds'][mode]:.1f} s: {row['errors'][mode]}", flush=True)
                    if device.type == "cuda":  # the exception is gone by now, and with it what its frames held
                        gc.collect()
                        torch.cuda.empty_cache()
                else:
                    print(f"{name} batch {batch} {mode}: {format_mode(figures)}, {row['wall_seconds'][mode]:.1f} s", flush=True)
                    for kernel, us, launches in figures["top_kernels"] or ():
                        print(f"    {us:9.1f} us/step {launches:5.1f}x  {kernel}", flush=True)
                save()
        replayssm.unpatch(model)
        for batch in batches if args.through_generate else ():
            row = {"model": name, "batch": batch, "ms_per_step": {}, "tokens_per_s": {}, "ms_per_call": {}, "errors": {}}
            generate_rows.append(row)
            for mode in args.generate_modes:
                try:
                    seconds, call_seconds = measure_generate_mode(model, mode, config, batch, prompt, steps, repeats, device, compile_kwargs)
                except Exception as err:  # noqa: BLE001 (as above: one failed mode must not end the run)
                    seconds = call_seconds = float("nan")
                    row["errors"][mode] = _error_line(err)
                    print(f"WARNING {name} batch {batch} {mode} through generate() failed: {row['errors'][mode]}", flush=True)
                row["ms_per_step"][mode] = 1000 * seconds
                row["tokens_per_s"][mode] = batch / seconds
                row["ms_per_call"][mode] = 1000 * call_seconds
                if mode not in row["errors"]:
                    print(
                        f"{name} batch {batch} {mode} through generate(): {1000 * seconds:.3f} ms/step, {batch / seconds:.1f} tok/s, "
                        f"{1000 * call_seconds:.1f} ms more per call",
                        flush=True,
                    )
                save()
        if not args.no_assisted:
            replayssm.patch(model, config)
            greedy_tps, greedy_out = assisted_tokens_per_second(model, new_tokens, repeats, device, None)
            lookup_tps, lookup_out = assisted_tokens_per_second(model, new_tokens, repeats, device, args.lookup)
            identical = bool(torch.equal(greedy_out, lookup_out))
            replayssm.unpatch(model)
            if args.captured:  # the same runs through patch(compile=...): captured verification
                assisted += captured_assisted(model, name, config, compile_kwargs, new_tokens, repeats, device, args.lookup, lookup_out)
            # The same comparison in fp32, where verification and decoding agree to fp32 rounding.
            replayssm.patch(model.float(), config)
            _, greedy32 = assisted_tokens_per_second(model, new_tokens, 0, device, None)
            _, lookup32 = assisted_tokens_per_second(model, new_tokens, 0, device, args.lookup)
            replayssm.unpatch(model)
            assisted.append({"model": name, "method": "greedy", "tokens_per_s": greedy_tps})
            assisted.append({
                "model": name, "method": f"prompt lookup {args.lookup}", "tokens_per_s": lookup_tps,
                "identical_to_greedy": identical, "first_difference": _first_difference(greedy_out, lookup_out),
                "identical_to_greedy_fp32": bool(torch.equal(greedy32, lookup32)),
            })  # fmt: skip
            save()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print()
    if rows:
        print(format_table(rows))
    if generate_rows:
        print()
        print("Through model.generate():")
        print(format_generate_table(generate_rows))
    for r in rows:
        for mode, error in r["errors"].items():
            print(f"failed: {r['model']} batch {r['batch']} {mode}: {error}")
    print()
    for a in assisted:
        extra = ""
        if "identical_to_greedy" in a:
            extra = f" (identical to greedy: {a['identical_to_greedy']}, first difference at {a['first_difference']}"
            if "identical_to_greedy_fp32" in a:
                extra += f"; in fp32: {a['identical_to_greedy_fp32']})"
            else:
                extra += f"; to eager lookup: {a['identical_to_eager_lookup']}; captured verifications {a['captured_verifications']})"
        print(f"{a['model']:<16} batch 1 {a['method']:<18} {a['tokens_per_s']:>10.1f} tok/s{extra}")

    if rows or assisted:
        plot(rows, assisted, args.out / "generate.png")
        print(f"wrote {json_path} and {args.out / 'generate.png'}")
    else:
        print(f"wrote {json_path}")


def _first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first position where two generated sequences differ (None if equal)."""
    n = min(a.shape[-1], b.shape[-1])
    differ = (a[..., :n] != b[..., :n]).flatten().nonzero()
    if len(differ):
        return int(differ[0])
    return None if a.shape == b.shape else n


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
