"""When replay steps overlap their launches (programmatic dependent launch): the gating in
``replayssm.ops.triton_helpers.overlap_launches``. The kernels' waits themselves are checked by
the kernel tests, which run every launch form with overlap on and off on a GPU."""

from __future__ import annotations

import pytest
import torch

common = pytest.importorskip("replayssm.ops.triton_helpers", reason="needs Triton")

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def hopper(monkeypatch):
    """A pretend sm_90 device whose Triton knows ``launch_pdl`` (no GPU needed: nothing is launched)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("REPLAYSSM_PDL", raising=False)
    monkeypatch.setattr(common, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(common, "_triton_knows_pdl", lambda: True)
    return monkeypatch


def test_overlap_on_sm90_when_requested(hopper):
    assert common.overlap_launches(CUDA0, True)
    assert common.pdl_launch_options(True) == {"launch_pdl": True}


@pytest.mark.parametrize(
    "case",
    ["not requested", "cpu tensors", "older gpu", "triton without the option", "interpreter", "turned off"],
)
def test_overlap_off(hopper, case):
    device, requested = CUDA0, True
    if case == "not requested":
        requested = False
    elif case == "cpu tensors":
        device = torch.device("cpu")
    elif case == "older gpu":
        hopper.setattr(common, "_capability", lambda index: (8, 0))
    elif case == "triton without the option":
        hopper.setattr(common, "_triton_knows_pdl", lambda: False)
    elif case == "interpreter":
        hopper.setenv("TRITON_INTERPRET", "1")
    elif case == "turned off":
        hopper.setenv("REPLAYSSM_PDL", "0")
    assert not common.overlap_launches(device, requested)
    assert common.pdl_launch_options(False) == {}


def test_installed_triton_check_does_not_raise():
    """The real check (no patching) answers with a bool whatever Triton is installed."""
    assert isinstance(common._triton_knows_pdl(), bool)
