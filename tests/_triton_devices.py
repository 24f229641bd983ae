"""Devices the Triton kernel tests run on: the CPU under ``TRITON_INTERPRET=1`` (tiny sizes, CI) and a GPU
(``cuda`` marker, skipped without one)."""

from __future__ import annotations

import os

import pytest

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_CPU_MARKS = [pytest.mark.interpreter, pytest.mark.skipif(not INTERPRETED, reason="CPU kernels need TRITON_INTERPRET=1")]

DEVICES = [
    pytest.param("cpu", marks=_CPU_MARKS),
    pytest.param("cuda", marks=pytest.mark.cuda),
]

# (device, overlap): a step's later launches with programmatic dependent launch where the GPU has it, and on
# a GPU also all plain launches. The interpreter has no such launches, so the CPU runs one of the two.
DEVICES_OVERLAP = [
    pytest.param("cpu", True, marks=_CPU_MARKS, id="cpu"),
    pytest.param("cuda", True, marks=pytest.mark.cuda, id="cuda-overlap"),
    pytest.param("cuda", False, marks=pytest.mark.cuda, id="cuda-plain"),
]
