"""Replay ops against the float64 naive recurrence (SPEC §2-3).

Odd sizes (head_dim 80, state 48, batch 3, window 5), rows at different ring
positions, several window cycles; outputs and materialize() within 1e-5
relative in fp32.
"""

import pytest
import torch

from _cases import GDNPair, Mamba2Pair, accept
from naive import rel_err
from replayssm import GDNGeometry, Mamba2Geometry, ReplayConfig

TOL_FP32 = 1e-5

MAMBA2_CASES = [
    pytest.param(Mamba2Geometry(heads=6, head_dim=80, state_size=48, groups=3), 5, id="H6-P80-N48-G3-L5"),
    pytest.param(Mamba2Geometry(heads=4, head_dim=16, state_size=32, groups=1), 1, id="H4-P16-N32-G1-L1"),
    pytest.param(Mamba2Geometry(heads=2, head_dim=8, state_size=16, groups=2), 8, id="H2-P8-N16-G2-L8"),
]
GDN_CASES = [
    pytest.param(GDNGeometry(key_heads=2, value_heads=4, key_dim=48, value_dim=80), 5, id="HK2-HV4-K48-V80-L5"),
    pytest.param(GDNGeometry(key_heads=3, value_heads=3, key_dim=16, value_dim=8), 1, id="HK3-HV3-K16-V8-L1"),
    pytest.param(GDNGeometry(key_heads=1, value_heads=2, key_dim=32, value_dim=16), 8, id="HK1-HV2-K32-V16-L8"),
]


def _staggered_decode(pair, slots: int, window: int, cycles: int = 3):
    """Rows join one step apart, so they flush on different steps; returns the worst errors."""
    worst_out = worst_state = 0.0
    flushes = torch.zeros(slots, dtype=torch.long)
    for step in range(cycles * window + slots):
        rows = [r for r in range(slots) if r <= step]
        before = pair.state.checkpoint.clone()
        y, expected, candidates = pair.step(rows, T=1, commit=True)
        accept(pair, rows, candidates, [1] * len(rows))
        written = (pair.state.checkpoint != before).flatten(1).any(1)
        flushes += written.long()
        worst_out = max(worst_out, rel_err(y, expected))
        worst_state = max(worst_state, rel_err(pair.state.materialize(), pair.naive.state))
    return worst_out, worst_state, flushes


@pytest.mark.parametrize("geometry, window", MAMBA2_CASES)
@pytest.mark.parametrize("with_z", [True, False], ids=["z", "noz"])
def test_mamba2_decode_matches_naive(geometry, window, with_z):
    gen = torch.Generator().manual_seed(1)
    pair = Mamba2Pair(geometry, slots=3, config=ReplayConfig(window=window), gen=gen, with_D=with_z, with_bias=with_z)
    out, state, flushes = _staggered_decode(pair, 3, window)
    assert out < TOL_FP32 and state < TOL_FP32, (out, state)
    # Each row wrote its checkpoint only when its own ring was full.
    assert flushes.tolist() == [(3 * window + 3 - r - 1) // window for r in range(3)], flushes


@pytest.mark.parametrize("geometry, window", GDN_CASES)
@pytest.mark.parametrize("l2norm", [True, False], ids=["l2norm", "raw"])
def test_gdn_decode_matches_naive(geometry, window, l2norm):
    gen = torch.Generator().manual_seed(2)
    pair = GDNPair(geometry, slots=3, config=ReplayConfig(window=window), gen=gen, l2norm=l2norm)
    out, state, flushes = _staggered_decode(pair, 3, window)
    assert out < TOL_FP32 and state < TOL_FP32, (out, state)
    assert flushes.tolist() == [(3 * window + 3 - r - 1) // window for r in range(3)], flushes


@pytest.mark.parametrize(
    "family, T, accepted",
    [("mamba2", 4, [0, 2, 4]), ("gdn", 4, [0, 2, 4]), ("mamba2", 5, [5, 1, 3]), ("gdn", 5, [5, 1, 3])],
    ids=lambda v: str(v),
)
def test_verify_then_commit(family, T, accepted):
    """Verification outputs equal the naive recurrence; commit keeps exactly the accepted prefix."""
    gen = torch.Generator().manual_seed(3)
    if family == "mamba2":
        pair = Mamba2Pair(MAMBA2_CASES[0].values[0], 3, ReplayConfig(window=5), gen)
    else:
        pair = GDNPair(GDN_CASES[0].values[0], 3, ReplayConfig(window=5), gen)
    rows = [0, 1, 2]
    for _ in range(3):  # leave rows at cursor 3: a verification of T > 2 must pre-flush
        _, _, c = pair.step(rows, 1, commit=True)
        accept(pair, rows, c, [1, 1, 1])
    for _ in range(4):
        y, expected, candidates = pair.step(rows, T, commit=False)
        assert rel_err(y, expected) < TOL_FP32
        pair.state.commit(accepted, rows=rows)
        accept(pair, rows, candidates, accepted)
        assert rel_err(pair.state.materialize(), pair.naive.state) < TOL_FP32
        y, expected, c = pair.step(rows, 1, commit=True)
        assert rel_err(y, expected) < TOL_FP32
        accept(pair, rows, c, [1, 1, 1])
