"""ReplayState row operations, bytes accounting, the traffic model and lean import."""

import subprocess
import sys

import pytest
import torch

from _cases import GDNPair, Mamba2Pair, accept
from naive import rel_err
from replayssm import GDNGeometry, Mamba2Geometry, ReplayConfig, decode_traffic

M_GEOM = Mamba2Geometry(heads=4, head_dim=8, state_size=6, groups=2)
G_GEOM = GDNGeometry(key_heads=1, value_heads=2, key_dim=8, value_dim=6)


def _pair(family, slots=4, window=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    if family == "mamba2":
        return Mamba2Pair(M_GEOM, slots, ReplayConfig(window=window), gen)
    return GDNPair(G_GEOM, slots, ReplayConfig(window=window), gen)


def _advance(pair, rows, steps):
    for _ in range(steps):
        _, _, c = pair.step(rows, 1, commit=True)
        accept(pair, rows, c, [1] * len(rows))


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_reset_load_select_reorder(family):
    pair = _pair(family)
    _advance(pair, [0, 1, 2, 3], 2)
    _advance(pair, [1, 3], 3)  # rows at different cursors
    # select: a new, smaller state with copies of rows 3 and 1, in that order.
    sub = pair.state.select([3, 1])
    assert sub.slots == 2
    assert torch.equal(sub.cursor, pair.state.cursor[[3, 1]])
    torch.testing.assert_close(sub.materialize(), pair.state.materialize([3, 1]), rtol=0, atol=0)
    # reorder in place with repeats (beam search): storage stays the same.
    ptr = pair.state.checkpoint.data_ptr()
    index = [2, 2, 0, 3]
    pair.state.reorder(index)
    pair.naive.state = pair.naive.state[index].clone()
    assert pair.state.checkpoint.data_ptr() == ptr
    assert rel_err(pair.state.materialize(), pair.naive.state) < 1e-5
    # the reordered rows keep decoding exactly
    _advance(pair, [0, 1, 2, 3], 4)
    assert rel_err(pair.state.materialize(), pair.naive.state) < 1e-5
    # load a prefill state into rows 1 and 2: rings emptied
    loaded = torch.randn((2,) + tuple(pair.state.checkpoint.shape[1:]), generator=pair.gen)
    pair.state.load(loaded, [1, 2])
    pair.naive.state[[1, 2]] = loaded.double()
    assert pair.state.cursor[[1, 2]].tolist() == [0, 0]
    _advance(pair, [0, 1, 2, 3], 2)
    assert rel_err(pair.state.materialize(), pair.naive.state) < 1e-5
    # reset: zero state, empty ring
    pair.state.reset([0])
    pair.naive.state[0] = 0
    assert pair.state.materialize([0]).abs().max() == 0
    _advance(pair, [0], 4)
    assert rel_err(pair.state.materialize(), pair.naive.state) < 1e-5


@pytest.mark.parametrize("state_dtype, tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)], ids=["fp16", "bf16"])
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_low_precision_checkpoints(family, state_dtype, tol):
    gen = torch.Generator().manual_seed(7)
    cfg = ReplayConfig(window=4, state_dtype=state_dtype)
    pair = Mamba2Pair(M_GEOM, 2, cfg, gen) if family == "mamba2" else GDNPair(G_GEOM, 2, cfg, gen)
    assert pair.state.checkpoint.dtype == state_dtype
    worst = 0.0
    for _ in range(13):
        y, expected, c = pair.step([0, 1], 1, commit=True)
        accept(pair, [0, 1], c, [1, 1])
        worst = max(worst, rel_err(y, expected))
    assert 0 < worst < tol


def test_nbytes_and_dtypes():
    m = _pair("mamba2", slots=5, window=3).state
    g = _pair("gdn", slots=5, window=3).state
    expect_m = 5 * (4 * 8 * 6 * 4 + 3 * (4 * 8 * 4 + 2 * 6 * 4 + 2 * 4 * 4) + 2 * 4)
    expect_g = 5 * (2 * 6 * 8 * 4 + 3 * (1 * 8 * 4 + 2 * 6 * 4 + 2 * 4) + 2 * 4)
    assert m.nbytes == expect_m and g.nbytes == expect_g
    bf = _pair("mamba2").state.__class__(M_GEOM, 2, ReplayConfig(ring_dtype=torch.bfloat16))
    assert bf.ring_x.dtype == torch.bfloat16 and bf.ring_dt.dtype == torch.float32
    assert "Mamba2ReplayState(slots=2" in repr(bf)


def test_traffic_model():
    geometry = Mamba2Geometry(heads=128, head_dim=64, state_size=128, groups=8)
    t = decode_traffic(geometry, batch=256, window=16)
    state = 256 * 128 * 64 * 128 * 4
    assert t.checkpoint_bytes == state == 2**30  # SPEC §6: 1 GiB of fp32 state at batch 256
    assert t.conventional_state == 2 * state
    assert state * (1 + 1 / 16) < t.replay_state < state * 1.15
    assert 1.7 < t.ratio < 1.9
    # a longer window saves more checkpoint writes but reads more ring entries
    ratios = [decode_traffic(geometry, 256, w).ratio for w in (4, 8, 16)]
    assert ratios == sorted(ratios)
    g = decode_traffic(GDNGeometry(16, 32, 128, 128), 256, 16)
    assert g.state_bytes_written_per_token_replay < g.state_bytes_written_per_token_conventional / 8
    with pytest.raises(ValueError, match="batch"):
        decode_traffic(geometry, 0)


def test_traffic_model_with_a_read_copy():
    """The L - 1 steps that do not flush read a bf16 copy; the flush reads the checkpoint and writes both.
    GDN's exact fold also reads the copy at the flush, and its ring entries carry beta."""
    L, state = 16, 256 * 128 * 64 * 128 * 4
    m_geometry = Mamba2Geometry(heads=128, head_dim=64, state_size=128, groups=8)
    m, m_copy = decode_traffic(m_geometry, 256, L), decode_traffic(m_geometry, 256, L, read_dtype=torch.bfloat16)
    ring = m.replay_state - state - state / L  # ring reads and the appended entry, the same with a copy
    assert m_copy.replay_state == pytest.approx(state / 2 * (L - 1) / L + (2 * state + state / 2) / L + ring)
    g_geometry = GDNGeometry(16, 32, 128, 128)
    g, g_copy = decode_traffic(g_geometry, 256, L), decode_traffic(g_geometry, 256, L, read_dtype=torch.bfloat16)
    g_state, beta_entry = g.checkpoint_bytes, 256 * 32 * 4
    g_ring = g.replay_state - g_state - g_state / L + (L + 1) / 2 * beta_entry + beta_entry
    assert g_copy.ring_entry_bytes == g.ring_entry_bytes + beta_entry
    assert g_copy.replay_state == pytest.approx(g_state / 2 * (L - 1) / L + (2 * g_state + g_state) / L + g_ring)


def test_import_is_lean():
    """import replayssm initialises no CUDA and imports no integration."""
    code = (
        "import sys, torch, replayssm\n"
        "assert not torch.cuda.is_initialized(), 'CUDA initialised'\n"
        "bad = [m for m in ('transformers', 'vllm', 'replayssm.integrations.hf', 'replayssm.integrations.vllm') if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_layer_demo_runs(capsys):
    from replayssm.demo import run_layer_demo

    run_layer_demo(device="cpu", tokens=9, window=4, batch=2)
    out = capsys.readouterr().out
    assert out.count("checkpoint writes: conventional 9, replay 2 (one per 4 tokens)") == 2
    diffs = [float(line.split("difference ")[1].split(";")[0]) for line in out.splitlines() if "max relative difference" in line]
    assert len(diffs) == 2 and max(diffs) < 1e-5


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_fold_rollback_resized(family):
    """Partial folds keep the state; rollback returns to earlier states; resizing keeps entries."""
    pair = _pair(family, slots=3, window=6, seed=3)
    history = [pair.naive.state.clone()]
    for step in range(5):
        rows = [0, 1, 2] if step else [0]  # row 0 one token ahead
        _advance(pair, rows, 1)
        history.append(pair.naive.state.clone())
    assert pair.state.cursor.tolist() == [5, 4, 4]
    before = pair.state.materialize()
    pair.state.fold([2, 0, 3])
    assert pair.state.cursor.tolist() == [3, 4, 1]
    assert rel_err(pair.state.materialize(), before.double()) < 1e-6
    # Roll back one token on rows 0 and 1 (row 2 keeps its single entry): earlier states again.
    pair.state.rollback([1, 1], rows=[0, 1])
    assert rel_err(pair.state.materialize([0]), history[4][0]) < 1e-5
    assert rel_err(pair.state.materialize([1]), history[4][1]) < 1e-5
    with pytest.raises(ValueError, match="count"):
        pair.state.rollback([2], rows=[2])  # folded tokens are final
    pair.naive.state[[0, 1]] = history[4][[0, 1]]
    grown = pair.state.resized(10)
    assert grown.window == 10 and torch.equal(grown.cursor, pair.state.cursor)
    assert rel_err(grown.materialize(), pair.state.materialize().double()) < 1e-7
    pair.state = grown
    _advance(pair, [0, 1, 2], 9)  # past the old window: a flush in the new one
    assert rel_err(pair.state.materialize(), pair.naive.state) < 1e-5
    with pytest.raises(ValueError, match="cannot hold"):
        pair.state.resized(2)
