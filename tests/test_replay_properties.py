"""Property tests: random op sequences against the naive recurrence of accepted tokens.

Each example draws a window and a sequence of actions (decode, verify +
commit with random accepted counts including 0 and T, verify left
uncommitted, reset, load, reorder) and checks every output and the
materialised state of every row against float64 naive recurrences that
replay only the accepted tokens.
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _cases import GDNPair, Mamba2Pair, accept
from naive import rel_err
from replayssm import GDNGeometry, Mamba2Geometry, ReplayConfig

TOL = 1e-5
SLOTS = 4
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _make(family: str, window: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    config = ReplayConfig(window=window)
    if family == "mamba2":
        return Mamba2Pair(Mamba2Geometry(heads=4, head_dim=6, state_size=5, groups=2), SLOTS, config, gen)
    return GDNPair(GDNGeometry(key_heads=1, value_heads=2, key_dim=7, value_dim=5), SLOTS, config, gen)


def _run(family: str, data) -> None:
    window = data.draw(st.integers(1, 8), label="window")
    pair = _make(family, window, data.draw(st.integers(0, 2**16), label="seed"))
    rows_strategy = st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=SLOTS, unique=True)
    for _ in range(data.draw(st.integers(5, 30), label="length")):
        action = data.draw(st.sampled_from(["decode", "verify", "verify_uncommitted", "reset", "load", "reorder"]))
        if action in ("decode", "verify", "verify_uncommitted"):
            rows = data.draw(rows_strategy, label="rows")
            T = 1 if action == "decode" else data.draw(st.integers(1, min(8, window)), label="T")
            y, expected, candidates = pair.step(rows, T, commit=action == "decode")
            # Relative to the output, except where the output is itself a cancellation (GDN: q nearly
            # orthogonal to every k, an output ~1e-5 of its terms), whose fp32 rounding is relative to the
            # terms: there an absolute RMS floor of 1e-7 (fp32 rounding of O(1) terms) applies instead.
            err_abs = float((y.double() - expected).norm()) / expected.numel() ** 0.5
            assert rel_err(y, expected) < TOL or err_abs < 1e-7, (action, rows, T, rel_err(y, expected), err_abs)
            if action == "decode":
                accept(pair, rows, candidates, [1] * len(rows))
            elif action == "verify":
                accepted = [data.draw(st.integers(0, T), label="accepted") for _ in rows]
                pair.state.commit(accepted, rows=rows)
                accept(pair, rows, candidates, accepted)
        elif action == "reset":
            rows = data.draw(rows_strategy, label="rows")
            pair.state.reset(rows)
            pair.naive.state[rows] = 0
        elif action == "load":
            rows = data.draw(rows_strategy, label="rows")
            loaded = 0.5 * torch.randn((len(rows),) + tuple(pair.state.checkpoint.shape[1:]), generator=pair.gen)
            pair.state.load(loaded, rows)
            pair.naive.state[rows] = loaded.double()
        else:
            index = data.draw(st.lists(st.integers(0, SLOTS - 1), min_size=SLOTS, max_size=SLOTS), label="index")
            pair.state.reorder(index)
            pair.naive.state = pair.naive.state[index].clone()
        mat = pair.state.materialize()
        for r in range(SLOTS):
            # Rows never touched are exactly zero in both.
            if pair.naive.state[r].abs().max() == 0:
                assert mat[r].abs().max() == 0
            else:
                assert rel_err(mat[r], pair.naive.state[r]) < TOL, (action, r)
        assert bool(((pair.state.cursor >= 0) & (pair.state.cursor + pair.state.pending <= window)).all())


@SETTINGS
@given(data=st.data())
def test_mamba2_random_sequences(data):
    _run("mamba2", data)


@SETTINGS
@given(data=st.data())
def test_gdn_random_sequences(data):
    _run("gdn", data)
