"""Shared benchmark helpers: streaming bandwidth, CUDA-graph timing, checks against the reference, table
printing, plots."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

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
    the ceiling (all are returned). ``Tensor.copy_`` is the wrong
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


#: the check of a step against the reference (relative RMS): state tensors (fp32 state and arithmetic on both
#: sides) and outputs (rounded to the bf16 activations: a rounding apart at most)
CHECK_TOL = {"state": 1e-4, "output": 1e-2}


def rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def check_failure(errors: dict) -> str | None:
    """Why a check's errors fail it, or None."""
    bad = [f"{k} {v:.2e}" for k, v in errors.items() if not v <= CHECK_TOL[k]]
    return "differs from the reference (relative error: " + ", ".join(bad) + ")" if bad else None


@contextlib.contextmanager
def patched(table: dict, key, value):
    """``table[key] = value`` for the block (a module's namespace works as a table: ``vars(module)``)."""
    missing = object()
    before = table.get(key, missing)
    table[key] = value
    try:
        yield
    finally:
        if before is missing:
            table.pop(key, None)
        else:
            table[key] = before


def plot(rows: list[dict], series: list[str], path: Path, title: str) -> str | None:
    """One log-log panel per geometry: ``series`` (row keys) against the batch; returns why not, if it cannot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install replayssm[bench])"
    names = list(dict.fromkeys(r["geometry"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        pts = sorted((r for r in rows if r["geometry"] == name), key=lambda r: r["batch"])
        for key in (s for s in series if any(r.get(s) is not None for r in pts)):
            style = "--" if "floor" in key else "o-"
            ax.loglog([r["batch"] for r in pts], [r.get(key) for r in pts], style, label=key.replace("_us", ""), alpha=0.6 if "floor" in key else 1)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("batch")
        ax.set_ylabel("us per step")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return None
