"""Shared benchmark helpers: streaming bandwidth, CUDA-graph timing, table printing."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
import triton
import triton.language as tl
from _profile import profiled_kernels


@triton.jit
def _axpb_kernel(p_x, p_y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(p_y + o, tl.load(p_x + o, mask=m) * 1.0001 + 0.5, mask=m)


def streaming_bandwidth(gib: float = 4.0, repeats: int = 20) -> tuple[float, dict]:
    """Bytes/s of an elementwise Triton kernel (``y = a x + b``) over ``gib`` GiB in and out.

    Read + write bytes are counted; the best of a few launch configurations is
    the ceiling (all are returned). NOTES-TRITON: ``Tensor.copy_`` is the wrong
    ceiling on the H200.
    """
    n = int(gib * 2**30) // 4
    x = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    rates = {}
    for block, warps in ((1024, 4), (2048, 8), (4096, 8), (8192, 16)):

        def run(block=block, warps=warps) -> None:
            _axpb_kernel[(triton.cdiv(n, block),)](p_x=x, p_y=y, n=n, BLOCK=block, num_warps=warps)

        ms = time_fn(run, repeats=repeats)
        rates[f"block{block}-warps{warps}"] = 2 * n * 4 / (ms * 1e-3)
    del x, y
    torch.cuda.empty_cache()
    return max(rates.values()), rates


def time_fn(fn: Callable[[], None], repeats: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()`` timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def kernel_times_per_step(steps: Sequence[Callable[[], object]], replays: int = 3) -> dict[str, float]:
    """Microseconds per step spent in each CUDA kernel (by name) when ``steps`` run as one CUDA graph.

    Where a launch's time goes, not a timing (``time_graph_per_step`` is the timing); empty when the
    profiler sees no kernel.
    """
    graph = capture(steps)
    graph.replay()
    torch.cuda.synchronize()

    def run() -> None:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()

    totals: dict[str, float] = {}
    for name, us in profiled_kernels(run):
        totals[name] = totals.get(name, 0.0) + us
    del graph
    return {name: us / (replays * len(steps)) for name, us in sorted(totals.items(), key=lambda kv: -kv[1])}


def capture(steps: Sequence[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """One CUDA graph holding ``steps`` in order (each run eagerly once first, so kernels are compiled)."""
    for step in steps:
        step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for step in steps:
                step()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return graph


def time_graph_per_step(steps: Sequence[Callable[[], object]], repeats: int = 15) -> float:
    """Median microseconds per step: capture ``steps`` in one graph, time replays, divide."""
    graph = capture(steps)
    ms = time_fn(graph.replay, repeats=repeats)
    del graph
    return ms * 1e3 / len(steps)


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: (key, header, format spec). Missing values print as '-'."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        line = []
        for key, _, spec in columns:
            v = r.get(key)
            line.append("-" if v is None else format(v, spec) if spec else str(v))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    out = []
    for i, c in enumerate(cells):
        out.append("| " + " | ".join(s.rjust(w) for s, w in zip(c, widths)) + " |")
        if i == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)
