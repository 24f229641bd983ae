"""The CUDA kernels a piece of work launches, with their durations, from ``torch.profiler``.

Shared by the kernel benchmarks (time per kernel of a captured step) and
``generate.py`` (the state op's share of a decode step). Kernels replayed
inside a CUDA graph are traced one by one. Only imports torch.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path


def trace_events(run: Callable[[], object], cpu: bool = False, record_shapes: bool = False) -> list[dict]:
    """The chrome-trace events of ``run()`` under ``torch.profiler`` (CUDA; ``cpu``: host events too).

    Read from the exported trace: its event categories are the same on every torch version ("Kernel" on
    old ones)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cpu else [ProfilerActivity.CUDA]
    with profile(activities=activities, record_shapes=record_shapes) as profiler:
        run()
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        profiler.export_chrome_trace(str(trace))
        return json.loads(trace.read_text())["traceEvents"]


def profiled_kernels(run: Callable[[], object]) -> list[tuple[str, float]]:
    """(name, microseconds) of every CUDA kernel ``run()`` launches; empty, with a line saying why, when the
    profiler fails or records none (its figures are side figures: a profiler problem must not stop a run)."""
    try:
        events = trace_events(run)
        kernels = [(event["name"], float(event["dur"])) for event in events if str(event.get("cat")).lower() == "kernel"]
    except Exception as err:  # noqa: BLE001
        message = str(err).strip().splitlines()
        print(f"kernel times not measured: {type(err).__name__}: {message[0] if message else ''}", flush=True)
        return []
    if not kernels:
        print("kernel times not measured: the profiler recorded no CUDA kernel", flush=True)
    return kernels
