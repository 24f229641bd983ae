"""Experiment: where a captured Hugging Face decode step spends its time, on the GPU and on the host.

The models of ``benchmarks/generate.py`` (random bf16 weights), patched with the replay or the
conventional op, each decode step through ``torch.compile(fullgraph=True, mode="reduce-overhead")`` in a
static cache, as ``generate.py --captured`` times it. Per (model, mode, batch), after a 64-token prefill:

* wall ms per step (``--steps`` steps, synchronised once at the end, median of 3), and the host's ms per
  call (the same steps timed call by call without synchronising);
* the same steps queued behind a GPU sleep, so that the host has enqueued them all before the GPU
  starts: the GPU's own time per step, with no host gap (``queued``; ``host_outran_sleep`` false means
  the sleep did not cover the enqueueing and the figure is not clean);
* inductor's CUDA-graph skips (``counters["inductor"]["cudagraph_skips"]``) and dynamo's graph breaks;
* one ``torch.profiler`` trace (CPU and CUDA) of 8 steps: GPU busy and idle time per step, the largest
  gaps between kernels (with the kernels either side), one step's kernels in order (``timeline``:
  start offset, duration, gap before, name, in us), the host events with the most time (durations nest)
  and the host's copy ops by shape;
* a cProfile of 8 steps (the host's Python by own time).

Prints each result as JSON and a table last; ``--out`` writes ``{"meta", "results"}``.
``--tiny`` runs tiny models on the CPU (no CUDA graphs, no queued figure): a smoke run of the script.

    PYTHONPATH=src python3 benchmarks/experiments/step_host.py --out $OUT/step_host.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import generate  # noqa: E402
from _profile import trace_events  # noqa: E402

import replayssm  # noqa: E402
from replayssm.integrations.hf import testing  # noqa: E402


def _gaps(events: list[dict], steps: int, count: int = 12) -> dict:
    kernels = sorted(
        ((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"]) for e in events if str(e.get("cat")).lower() == "kernel"),
    )
    if not kernels:
        return {}
    busy, gaps, end = 0.0, [], kernels[0][0]
    previous = ""
    for start, stop, name in kernels:
        if start > end:
            gaps.append((start - end, previous[:60], name[:60]))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
        previous = name
    span = end - kernels[0][0]
    # one step in the middle of the trace, kernel by kernel: (start offset, duration, gap before, name)
    per_step = len(kernels) // steps
    middle = kernels[(steps // 2) * per_step : (steps // 2 + 1) * per_step]
    timeline = [
        (round(start - middle[0][0], 1), round(stop - start, 1), round(start - (middle[i - 1][1] if i else start), 1), name[:70])
        for i, (start, stop, name) in enumerate(middle)
    ]
    gaps.sort(reverse=True)
    return {
        "span_us_per_step": span / steps,
        "busy_us_per_step": busy / steps,
        "idle_us_per_step": (span - busy) / steps,
        "kernels_per_step": len(kernels) / steps,
        "largest_gaps_us": [(round(g, 1), a, b) for g, a, b in gaps[:count]],
        "timeline": timeline,
    }


def _host_self_time(events: list[dict], steps: int, count: int = 20) -> list[tuple[str, float]]:
    """Host events (CPU ops and runtime calls) by summed duration, per step (durations nest: a parent
    counts its children too)."""
    totals: Counter = Counter()
    for e in events:
        cat = str(e.get("cat")).lower()
        if cat in ("cpu_op", "cuda_runtime", "python_function", "user_annotation", "cuda_driver") and "dur" in e:
            totals[f"{cat}:{e['name'][:70]}"] += float(e["dur"])
    return [(name, round(us / steps, 1)) for name, us in totals.most_common(count)]


def _python_profile(run, count: int = 25) -> list[str]:
    """cProfile of ``run()``: the functions with the most own time (lines of pstats' table)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(count)
    return [line for line in text.getvalue().splitlines() if line.strip()][-count - 1 :]


def _copies(events: list[dict], steps: int) -> list[tuple[str, float]]:
    """The host's copy ops per step by their argument shapes (what the compiled step copies around its graph)."""
    found: Counter = Counter()
    for e in events:
        if str(e.get("cat")).lower() == "cpu_op" and e["name"] in ("aten::copy_", "aten::_foreach_copy_"):
            found[f"{e['name']} {str(e.get('args', {}).get('Input Dims'))[:160]}"] += 1
    return [(k, v / steps) for k, v in found.most_common(20)]


def measure(model, name: str, mode: str, batch: int, prompt: int, steps: int, config, device: torch.device) -> dict:
    """Patch ``model`` for ``mode`` (conventional-captured / replay-captured), compile its step and measure it."""
    replayssm.unpatch(model)
    step = mode.partition("-")[0]
    replayssm.patch(model, config, step=step)
    from transformers import StaticCache

    torch._dynamo.utils.counters.clear()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend="inductor", mode="reduce-overhead")
    text = model.config.get_text_config(decoder=True)
    previous_checks = replayssm.ops.set_value_checks(False)
    kw = testing.cache_kwarg(model)
    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(3, text.vocab_size, (batch, prompt + 3 * steps + 8), generator=gen).to(device)
    cache = StaticCache(config=text, max_cache_len=prompt + 3 * steps + 8)
    positions = [torch.full((batch, 1), p, device=device) for p in range(ids.shape[1])]

    def sync():
        generate._sync(device)

    def prefill():
        cache.reset()
        model(input_ids=ids[:, :prompt], **{kw: cache}, use_cache=True, logits_to_keep=1)
        sync()

    def call(pos):
        forward(input_ids=ids[:, pos : pos + 1], position_ids=positions[pos], **{kw: cache}, use_cache=True, logits_to_keep=1)

    try:
        with torch.no_grad():
            prefill()
            for pos in range(prompt, prompt + 3):  # compile, warm up, record
                call(pos)
            sync()
            walls, hosts = [], []
            for _ in range(3):
                prefill()
                per_call = []
                start = time.perf_counter()
                for pos in range(prompt, prompt + steps):
                    t0 = time.perf_counter()
                    call(pos)
                    per_call.append(time.perf_counter() - t0)
                sync()
                walls.append((time.perf_counter() - start) / steps)
                hosts.append(statistics.median(per_call))
            queued = None
            if device.type == "cuda":  # the steps queued behind a GPU sleep: their GPU time without the host in the way
                prefill()
                cycles = int(4 * steps * statistics.median(hosts) * 2e9)  # ~4x the host's enqueue time at ~2 GHz
                torch.cuda._sleep(cycles)
                first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                first.record()
                start = time.perf_counter()
                for pos in range(prompt, prompt + steps):
                    call(pos)
                enqueue = time.perf_counter() - start
                last.record()
                sync()
                sleep_ms = cycles / 2e6  # nominal: the SM clock taken as 2 GHz
                queued = {
                    "gpu_ms_per_step": first.elapsed_time(last) / steps,
                    "enqueue_ms_per_step": 1000 * enqueue / steps,
                    "sleep_ms": sleep_ms,
                    "host_outran_sleep": 1000 * enqueue < sleep_ms,
                }
            prefill()
            profiled = 8
            stats = _python_profile(lambda: ([call(pos) for pos in range(prompt, prompt + profiled)], sync()))
            prefill()
            events = trace_events(lambda: ([call(pos) for pos in range(prompt, prompt + profiled)], sync()), cpu=True, record_shapes=True)
    finally:
        replayssm.ops.set_value_checks(previous_checks)
    counters = torch._dynamo.utils.counters
    out = {
        "model": name,
        "mode": mode,
        "batch": batch,
        "wall_ms_per_step": 1000 * statistics.median(walls),
        "host_ms_per_call": 1000 * statistics.median(hosts),
        "queued": queued,
        "cudagraph_skips": counters["inductor"].get("cudagraph_skips", 0),
        "graph_breaks": sum(counters["graph_break"].values()),
        **_gaps(events, profiled),
        "host_top": _host_self_time(events, profiled),
        "python_top": stats,
        "copies": _copies(events, profiled),
    }
    torch._dynamo.reset()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", nargs="+", default=["qwen3_5-like", "nemotron_h-like"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    ap.add_argument("--modes", nargs="+", default=["conventional-captured", "replay-captured"])
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--tiny", action="store_true", help="tiny models on the CPU (a smoke run of this script)")
    args = ap.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, graph_partition "
          f"{getattr(torch._inductor.config, 'graph_partition', None)}", flush=True)  # fmt: skip
    config = replayssm.ReplayConfig(window=16)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if not args.tiny else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "command": " ".join(sys.argv),
    }
    results = []
    for name in args.models:
        device = torch.device("cpu" if args.tiny else "cuda")
        model = generate.build(name, args.tiny, device, torch.float32 if args.tiny else torch.bfloat16)
        for batch in args.batches:
            for mode in args.modes:
                r = measure(model, name, mode, batch, args.prompt, args.steps, config, device)
                results.append(r)
                print(json.dumps(r, indent=1), flush=True)
                if args.out:
                    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
        replayssm.unpatch(model)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print()
    print(f"{'model':<16} {'mode':<22} {'batch':>5} {'wall ms':>8} {'host ms':>8} {'queued ms':>9} {'enqueue ms':>10} {'busy us':>8} {'idle us':>8} {'kernels':>7} skips")
    for r in results:
        print(f"{r['model']:<16} {r['mode']:<22} {r['batch']:>5} {r['wall_ms_per_step']:>8.3f} {r['host_ms_per_call']:>8.3f} "
              f"{(r['queued'] or {}).get('gpu_ms_per_step', float('nan')):>9.3f} {(r['queued'] or {}).get('enqueue_ms_per_step', float('nan')):>10.3f} "
              f"{r.get('busy_us_per_step', float('nan')):>8.1f} {r.get('idle_us_per_step', float('nan')):>8.1f} "
              f"{r.get('kernels_per_step', float('nan')):>7.1f} {r['cudagraph_skips']}")  # fmt: skip


if __name__ == "__main__":
    main()
