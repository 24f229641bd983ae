"""ReplayState as the one way to the state: tensors owned elsewhere, the ring layout, the row-operation
conventions, the baseline step, and the speculation bookkeeping the integrations share."""

import pytest
import torch

from _cases import GDNPair, Mamba2Pair, accept, gdn_inputs, mamba2_inputs, mamba2_params
from naive import rel_err
from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig
from replayssm.speculation import UniformSpeculation, commit_verified, resume
from replayssm.state import gdn_ring_layout, mamba2_ring_layout

M_GEOM = Mamba2Geometry(heads=4, head_dim=8, state_size=6, groups=2)
G_GEOM = GDNGeometry(key_heads=1, value_heads=2, key_dim=8, value_dim=6)


def _external_tensors(state):
    """Fresh tensors laid out as ``state``'s, filled with garbage first (a page vLLM hands over is not zeroed)."""
    rings = {name: torch.full_like(getattr(state, name), float("nan")) for name in state._ring_names}
    for name, t in rings.items():
        t.copy_(getattr(state, name))
    checkpoint = state.checkpoint.clone()
    return checkpoint, rings, state.cursor.clone(), state.pending.clone()


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_state_over_external_tensors_matches_an_owned_state(family):
    """A state made over tensors owned elsewhere steps exactly like one that owns its tensors, and writes
    only into the tensors it was given."""
    gen = torch.Generator().manual_seed(1)
    config = ReplayConfig(window=4)
    if family == "mamba2":
        owned = Mamba2ReplayState(M_GEOM, 3, config)
        p = mamba2_params(M_GEOM, gen)
        inputs = [mamba2_inputs(M_GEOM, 3, 1, gen) for _ in range(7)]
        run = lambda s, i: s.step(i[0], i[1], p.A, i[2], i[3], p.D, p.dt_bias, i[4])  # noqa: E731
    else:
        owned = GDNReplayState(G_GEOM, 3, config)
        inputs = [gdn_inputs(G_GEOM, 3, 1, gen) for _ in range(7)]
        run = lambda s, i: s.step(*i)  # noqa: E731
    checkpoint, rings, cursor, pending = _external_tensors(owned)
    cls = type(owned)
    wrapped = cls.from_tensors(owned.geometry, checkpoint, rings, cursor, pending, config)
    assert wrapped.checkpoint is checkpoint and wrapped.cursor is cursor
    assert all(getattr(wrapped, name) is rings[name] for name in rings)
    for i in inputs:  # past a flush: the fold writes the external checkpoint
        assert torch.equal(run(owned, i), run(wrapped, i))
    assert torch.equal(owned.materialize(), wrapped.materialize())
    assert torch.equal(checkpoint, owned.checkpoint) and torch.equal(cursor, owned.cursor)


def test_state_over_external_tensors_checks_every_tensor():
    state = GDNReplayState(G_GEOM, 2, ReplayConfig(window=4))
    checkpoint, rings, cursor, pending = _external_tensors(state)
    with pytest.raises(ValueError, match="ring_d must be"):
        GDNReplayState.from_tensors(G_GEOM, checkpoint, dict(rings, ring_d=rings["ring_d"][:, :3]), cursor, pending, state.config)
    with pytest.raises(ValueError, match="ring_k must be .* torch.float32"):
        GDNReplayState.from_tensors(G_GEOM, checkpoint, dict(rings, ring_k=rings["ring_k"].half()), cursor, pending, state.config)
    with pytest.raises(TypeError, match="ring_g must be a Tensor"):
        GDNReplayState.from_tensors(G_GEOM, checkpoint, {k: v for k, v in rings.items() if k != "ring_g"}, cursor, pending, state.config)
    with pytest.raises(ValueError, match="layout does not name"):
        GDNReplayState.from_tensors(G_GEOM, checkpoint, dict(rings, ring_x=rings["ring_d"]), cursor, pending, state.config)
    with pytest.raises(ValueError, match="cursor must be"):
        GDNReplayState.from_tensors(G_GEOM, checkpoint, rings, cursor.long(), pending, state.config)
    with pytest.raises(TypeError, match="geometry must be a GDNGeometry"):
        GDNReplayState.from_tensors(M_GEOM, checkpoint, rings, cursor, pending, state.config)


def test_ring_layout_is_what_a_state_allocates():
    """The layout functions are the one definition: a state's ring tensors are exactly them, per slot."""
    m = Mamba2ReplayState(M_GEOM, 2, ReplayConfig(window=5), activation_dtype=torch.bfloat16)
    g = GDNReplayState(G_GEOM, 2, ReplayConfig(window=5, read_dtype=torch.bfloat16))
    for state, layout in ((m, mamba2_ring_layout(M_GEOM, 5, torch.bfloat16)), (g, gdn_ring_layout(G_GEOM, 5, torch.float32, True))):
        assert state._ring_names == tuple(name for name, _, _ in layout)
        for name, shape, dtype in layout:
            t = getattr(state, name)
            assert tuple(t.shape) == (2,) + shape and t.dtype == dtype, name


def test_rows_none_means_every_slot():
    gen = torch.Generator().manual_seed(2)
    state = GDNReplayState(G_GEOM, 3, ReplayConfig(window=4))
    with pytest.raises(ValueError, match="rows=None means all 3 slots"):
        state.step(*gdn_inputs(G_GEOM, 2, 1, gen))
    state.step(*gdn_inputs(G_GEOM, 3, 2, gen), commit=False)
    state.commit([1, 2, 0])  # rows=None: every slot, as for step
    assert state.cursor.tolist() == [1, 2, 0]
    state.rollback([1, 1, 0])
    assert state.cursor.tolist() == [0, 1, 0]


def test_load_takes_the_state_first_and_clear_ring_keeps_the_checkpoint():
    gen = torch.Generator().manual_seed(3)
    state = GDNReplayState(G_GEOM, 3, ReplayConfig(window=4))
    for _ in range(2):
        state.step(*gdn_inputs(G_GEOM, 3, 1, gen))
    loaded = torch.randn(2, *state.checkpoint.shape[1:], generator=gen)
    state.load(loaded, [0, 2])
    assert torch.equal(state.checkpoint[[0, 2]], loaded) and state.cursor.tolist() == [0, 2, 0]
    before = state.checkpoint.clone()
    state.clear_ring([1])
    assert state.cursor.tolist() == [0, 0, 0] and torch.equal(state.checkpoint, before)
    assert torch.equal(state.materialize([1]), before[[1]])


def test_gdn_step_normalises_keys_by_default():
    """The default is what every supported model does: q and k l2-normalised in the op."""
    gen = torch.Generator().manual_seed(4)
    pair = GDNPair(G_GEOM, 2, ReplayConfig(window=4), gen, l2norm=True)
    q, k, v, g, beta = gdn_inputs(G_GEOM, 2, 1, gen)
    o = pair.state.step(q, k, v, g, beta)  # no use_qk_l2norm: the default
    for b in range(2):
        expected, _ = pair.naive.token(b, q[b, 0], k[b, 0], v[b, 0], g[b, 0], beta[b, 0], l2norm=True)
        assert rel_err(o[b, 0], expected) < 1e-5


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_conventional_step_on_the_state_tracks_float64(family):
    gen = torch.Generator().manual_seed(5)
    config = ReplayConfig(window=4)
    pair = Mamba2Pair(M_GEOM, 2, config, gen) if family == "mamba2" else GDNPair(G_GEOM, 2, config, gen)
    for _ in range(6):
        if family == "mamba2":
            x, dt, B, C, z = mamba2_inputs(M_GEOM, 2, 1, gen)
            p = pair.params
            y = pair.state.conventional_step(x, dt, p.A, B, C, p.D, p.dt_bias, z)
            for b in range(2):
                expected, pair.naive.state[b] = pair.naive.token(b, x[b, 0], dt[b, 0], p.A, B[b, 0], C[b, 0], p.D, p.dt_bias, z[b, 0])
                assert rel_err(y[b, 0], expected) < 1e-5
        else:
            q, k, v, g, beta = gdn_inputs(G_GEOM, 2, 1, gen)
            o = pair.state.conventional_step(q, k, v, g, beta)
            for b in range(2):
                expected, pair.naive.state[b] = pair.naive.token(b, q[b, 0], k[b, 0], v[b, 0], g[b, 0], beta[b, 0], l2norm=True)
                assert rel_err(o[b, 0], expected) < 1e-5
    assert rel_err(pair.state.checkpoint.double(), pair.naive.state) < 1e-5
    assert pair.state.cursor.tolist() == [0, 0]  # the ring is not used


@pytest.mark.parametrize("bad", ["list", "none", "scalar"])
def test_non_tensor_inputs_name_the_argument(bad):
    gen = torch.Generator().manual_seed(6)
    state = GDNReplayState(G_GEOM, 2, ReplayConfig(window=4))
    q, k, v, g, beta = gdn_inputs(G_GEOM, 2, 1, gen)
    before = {name: t.clone() for name, t in state.tensors().items()}
    value = {"list": q.tolist(), "none": None, "scalar": 1.0}[bad]
    with pytest.raises(TypeError, match="argument 'q' must be a Tensor"):
        state.step(value, k, v, g, beta)
    m = Mamba2ReplayState(M_GEOM, 2, ReplayConfig(window=4))
    p = mamba2_params(M_GEOM, gen)
    x, dt, B, C, z = mamba2_inputs(M_GEOM, 2, 1, gen)
    with pytest.raises(TypeError, match="argument 'x' must be a Tensor"):
        m.step(value, dt, p.A, B, C)
    with pytest.raises(TypeError, match="argument 'z' must be a Tensor"):
        m.step(x, dt, p.A, B, C, z=[1.0])
    assert all(torch.equal(t, before[name]) for name, t in state.tensors().items())


# -- speculation ---------------------------------------------------------------------------------------


def test_commit_verified_clamps_to_what_each_row_verified():
    gen = torch.Generator().manual_seed(7)
    pair = GDNPair(G_GEOM, 3, ReplayConfig(window=6), gen)
    _, _, candidates = pair.step([0, 1, 2], 3, commit=False)
    accepted = commit_verified(pair.state, torch.tensor([0, 1, 2]), torch.tensor([2, 5, 0]))  # 5 > 3 verified
    assert accepted.tolist() == [2, 3, 0] and pair.state.cursor.tolist() == [2, 3, 0]
    accept(pair, [0, 1, 2], candidates, [2, 3, 0])
    assert rel_err(pair.state.materialize().double(), pair.naive.state) < 1e-5
    # a row with nothing pending commits nothing
    assert commit_verified(pair.state, torch.tensor([1]), torch.tensor([3])).tolist() == [0]


def test_resume_folds_the_ring_and_refuses_unconfirmed_drafts():
    gen = torch.Generator().manual_seed(8)
    pair = GDNPair(G_GEOM, 2, ReplayConfig(window=6), gen)
    pair.step([0, 1], 2, commit=True)
    exact = pair.state.materialize()
    resume(pair.state, torch.tensor([0]))
    assert pair.state.cursor.tolist() == [0, 2] and torch.equal(pair.state.checkpoint[0], exact[0])
    pair.step([0, 1], 2, commit=False)
    with pytest.raises(RuntimeError, match="unconfirmed speculative verification"):
        resume(pair.state, torch.tensor([1]))


def test_uniform_speculation_rolls_back_across_folds_and_growth():
    """Drafts of 3 tokens on a window-4 ring, some rejected: the bookkeeping folds only tokens no rollback can
    reach, grows the ring when the rollable tokens and the next draft do not fit, and the state stays exact."""
    gen = torch.Generator().manual_seed(9)
    pair = GDNPair(G_GEOM, 2, ReplayConfig(window=4), gen)
    replaced = []
    spec = UniformSpeculation(pair.state, on_replace=replaced.append)
    history = []  # per step: the naive states after each token of the draft
    for draft, keep in ((3, 3), (3, 1), (3, 2), (3, 0), (3, 3)):
        commit = spec.plan(draft, recording=True)
        assert commit is False
        pair.state = spec.state
        _, _, candidates = pair.step([0, 1], draft, commit=False)
        spec.pending = draft
        spec.commit(keep)
        accept(pair, [0, 1], candidates, [keep, keep])
        history.append(keep)
        assert rel_err(spec.state.materialize().double(), pair.naive.state) < 1e-5
    assert replaced and replaced[-1] is spec.state and spec.state.window > 4  # grew for rollable + draft
    # take back the last two accepted tokens: a cursor move
    rollable = spec.rollable
    spec.rollback(2, kept=24)
    assert spec.rollable == 0 and rollable >= 2
    with pytest.raises(RuntimeError, match="roll back 1 committed tokens, but only 0"):
        spec.check_rollback(1, kept=24)
    spec.shrink(4)
    assert spec.state.window == 4 and spec.state.cursor.tolist() == [0, 0]


def test_uniform_speculation_refuses_drafts_past_the_largest_ring():
    from replayssm.config import MAX_WINDOW

    state = GDNReplayState(G_GEOM, 1, ReplayConfig(window=4))
    spec = UniformSpeculation(state)
    with pytest.raises(ValueError, match="exceeds the largest ring"):
        spec.plan(MAX_WINDOW + 1, recording=True)
    assert spec.state is state
