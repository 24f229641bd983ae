"""Bad input raises a clear error naming the argument and leaves the state bit-identical."""

import pytest
import torch

from _cases import gdn_inputs, mamba2_inputs, mamba2_params
from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig, ops

M_GEOM = Mamba2Geometry(heads=4, head_dim=8, state_size=6, groups=2)
G_GEOM = GDNGeometry(key_heads=1, value_heads=2, key_dim=8, value_dim=6)


def _snapshot(state):
    return {k: v.clone() for k, v in state.tensors().items()}


def _assert_unchanged(state, snap):
    for name, t in state.tensors().items():
        assert torch.equal(t, snap[name]), f"{name} was modified by a failed call"


@pytest.fixture
def mamba():
    gen = torch.Generator().manual_seed(0)
    state = Mamba2ReplayState(M_GEOM, 3, ReplayConfig(window=4))
    p = mamba2_params(M_GEOM, gen)
    for _ in range(6):  # rings part-full, a flush behind them
        state.step(*mamba2_inputs(M_GEOM, 3, 1, gen)[:1], dt=mamba2_inputs(M_GEOM, 3, 1, gen)[1], A=p.A,
                   B=mamba2_inputs(M_GEOM, 3, 1, gen)[2], C=mamba2_inputs(M_GEOM, 3, 1, gen)[3], D=p.D)  # fmt: skip
    return state, p, gen


@pytest.fixture
def gdn():
    gen = torch.Generator().manual_seed(0)
    state = GDNReplayState(G_GEOM, 3, ReplayConfig(window=4))
    for _ in range(6):
        state.step(*gdn_inputs(G_GEOM, 3, 1, gen), use_qk_l2norm=True)
    return state, gen


def _mamba_kwargs(p, gen, batch=3, T=1):
    x, dt, B, C, z = mamba2_inputs(M_GEOM, batch, T, gen)
    return dict(x=x, dt=dt, A=p.A, B=B, C=C, D=p.D, dt_bias=p.dt_bias, z=z)


MAMBA_BAD = [
    ("x", lambda kw: kw.update(x=kw["x"][..., :-1]), ValueError),
    ("x", lambda kw: kw.update(x=kw["x"].to(torch.int32)), TypeError),
    ("dt", lambda kw: kw.update(dt=kw["dt"][:, :, :2]), ValueError),
    ("A", lambda kw: kw.update(A=kw["A"][:3]), ValueError),
    ("B", lambda kw: kw.update(B=kw["B"][:, :, :, :5]), ValueError),
    ("C", lambda kw: kw.update(C=kw["C"].double().to(torch.int64)), TypeError),
    ("D", lambda kw: kw.update(D=torch.ones(5)), ValueError),
    ("z", lambda kw: kw.update(z=kw["z"][:2]), ValueError),
    ("x", lambda kw: kw.update(x=kw["x"].to("meta")), ValueError),  # device mismatch
]


@pytest.mark.parametrize("arg, corrupt, exc", MAMBA_BAD, ids=[f"{a}-{i}" for i, (a, _, _) in enumerate(MAMBA_BAD)])
def test_mamba2_bad_inputs(mamba, arg, corrupt, exc):
    state, p, gen = mamba
    kw = _mamba_kwargs(p, gen)
    corrupt(kw)
    snap = _snapshot(state)
    with pytest.raises(exc, match=f"'{arg}'"):
        state.step(**kw)
    _assert_unchanged(state, snap)


def test_mamba2_too_many_tokens_for_window(mamba):
    state, p, gen = mamba
    snap = _snapshot(state)
    with pytest.raises(ValueError, match=r"'x' carries T = 5 tokens per row, more than the ring window 4"):
        state.step(**_mamba_kwargs(p, gen, T=5), commit=False)
    _assert_unchanged(state, snap)


@pytest.mark.parametrize("rows, exc, match", [([0, 3, 1], IndexError, "rows"), ([0, 0, 1], ValueError, "repeat"), ([-1, 0, 1], IndexError, "rows")])
def test_unknown_or_repeated_rows(mamba, gdn, rows, exc, match):
    for state, kwargs in ((mamba[0], _mamba_kwargs(mamba[1], mamba[2])), (gdn[0], None)):
        snap = _snapshot(state)
        with pytest.raises(exc, match=match):
            if kwargs is not None:
                state.step(**kwargs, rows=rows)
            else:
                state.step(*gdn_inputs(G_GEOM, 3, 1, gdn[1]), rows=rows)
        _assert_unchanged(state, snap)


def test_op_level_rows_checked(mamba):
    """Calling the op directly (not through ReplayState) checks rows too."""
    state, p, gen = mamba
    kw = _mamba_kwargs(p, gen)
    s = state
    snap = _snapshot(state)
    with pytest.raises(IndexError, match="'rows'"):
        ops.mamba2_step(kw["x"], kw["dt"], p.A, kw["B"], kw["C"], p.D, p.dt_bias, kw["z"], s.checkpoint, s.ring_x,
                        s.ring_B, s.ring_dt, s.ring_logdecay, s.cursor, s.pending, torch.tensor([0, 1, 7]), True, True, None, None)  # fmt: skip
    with pytest.raises(TypeError, match="'cursor'"):
        ops.mamba2_step(kw["x"], kw["dt"], p.A, kw["B"], kw["C"], p.D, p.dt_bias, kw["z"], s.checkpoint, s.ring_x,
                        s.ring_B, s.ring_dt, s.ring_logdecay, s.cursor.long(), s.pending, torch.tensor([0, 1, 2]), True, True, None, None)  # fmt: skip
    with pytest.raises(ValueError, match="'ring_B'"):
        ops.mamba2_step(kw["x"], kw["dt"], p.A, kw["B"], kw["C"], p.D, p.dt_bias, kw["z"], s.checkpoint, s.ring_x,
                        s.ring_B[:, :3], s.ring_dt, s.ring_logdecay, s.cursor, s.pending, torch.tensor([0, 1, 2]), True, True, None, None)  # fmt: skip
    _assert_unchanged(state, snap)


GDN_BAD = [
    ("q", lambda a: a.__setitem__(0, a[0][..., :-1]), ValueError),
    ("k", lambda a: a.__setitem__(1, a[1][:, :, :, :3]), ValueError),
    ("v", lambda a: a.__setitem__(2, a[2].to(torch.int16)), TypeError),
    ("g", lambda a: a.__setitem__(3, a[3][:, :, :1]), ValueError),
    ("beta", lambda a: a.__setitem__(4, a[4][:2]), ValueError),
]


@pytest.mark.parametrize("arg, corrupt, exc", GDN_BAD, ids=[a for a, _, _ in GDN_BAD])
def test_gdn_bad_inputs(gdn, arg, corrupt, exc):
    state, gen = gdn
    args = list(gdn_inputs(G_GEOM, 3, 1, gen))
    corrupt(args)
    snap = _snapshot(state)
    with pytest.raises(exc, match=f"'{arg}'"):
        state.step(*args)
    _assert_unchanged(state, snap)


def test_gdn_bad_scale(gdn):
    state, gen = gdn
    snap = _snapshot(state)
    with pytest.raises(ValueError, match="'scale'"):
        state.step(*gdn_inputs(G_GEOM, 3, 1, gen), scale=-1.0)
    _assert_unchanged(state, snap)


@pytest.mark.parametrize("accepted, exc", [([4, 0, 0], ValueError), ([-1, 0, 0], ValueError), ([1, 1], ValueError)])
def test_commit_bad_accepted(gdn, accepted, exc):
    state, gen = gdn
    state.step(*gdn_inputs(G_GEOM, 3, 3, gen), commit=False)
    snap = _snapshot(state)
    with pytest.raises(exc, match="'accepted'"):
        state.commit(accepted, rows=[0, 1, 2])
    _assert_unchanged(state, snap)


def test_commit_without_pending_rejects_nonzero(gdn):
    state, _ = gdn
    snap = _snapshot(state)
    with pytest.raises(ValueError, match="'accepted'"):
        state.commit([1, 0, 0])
    _assert_unchanged(state, snap)


def test_load_and_reorder_bad_input(mamba):
    state, _, _ = mamba
    snap = _snapshot(state)
    with pytest.raises(ValueError, match="state must have shape"):
        state.load(torch.randn(2, 4, 8, 5), [0, 1])
    with pytest.raises(ValueError, match="one entry per slot"):
        state.reorder([0, 1])
    with pytest.raises(IndexError, match="index"):
        state.reorder([0, 1, 3])
    with pytest.raises(IndexError, match="rows"):
        state.reset([5])
    _assert_unchanged(state, snap)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(window=0), ValueError, "window"),
        (dict(window=1000), ValueError, "window"),
        (dict(window=4.0), TypeError, "window"),
        (dict(state_dtype=torch.int8), ValueError, "state_dtype"),
        (dict(state_dtype=torch.float64), ValueError, "state_dtype"),
        (dict(ring_dtype=torch.int32), ValueError, "ring_dtype"),
    ],
)
def test_config_validation(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ReplayConfig(**kwargs)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: Mamba2Geometry(heads=6, head_dim=8, state_size=4, groups=4), "groups"),
        (lambda: Mamba2Geometry(heads=0, head_dim=8, state_size=4, groups=1), "heads"),
        (lambda: GDNGeometry(key_heads=3, value_heads=4, key_dim=8, value_dim=8), "key_heads"),
        (lambda: Mamba2ReplayState(M_GEOM, 0), "slots"),
        (lambda: GDNReplayState(M_GEOM, 2), "GDNGeometry"),
    ],
)
def test_geometry_and_state_validation(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


def test_value_checks_can_be_turned_off(gdn):
    """Trusted callers may skip the host reads; shape checks still run."""
    state, gen = gdn
    previous = ops.set_value_checks(False)
    try:
        state.step(*gdn_inputs(G_GEOM, 3, 2, gen), commit=False)
        state.commit([2, 2, 5])  # unchecked: accepted > pending goes through
        assert state.cursor.tolist()[2] > state.window - 1
        q, k, v, g, beta = gdn_inputs(G_GEOM, 3, 1, gen)
        with pytest.raises(ValueError, match="'q'"):
            state.step(q[..., :-1], k, v, g, beta)
    finally:
        ops.set_value_checks(previous)
    with pytest.raises(RuntimeError, match="corrupt"):
        state.step(*gdn_inputs(G_GEOM, 3, 1, gen))
