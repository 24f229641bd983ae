"""torch.library registration: opcheck on every op, torch.compile(fullgraph=True) on CPU."""

import pytest
import torch

from _cases import gdn_inputs, mamba2_inputs, mamba2_params
from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig, ops

M_GEOM = Mamba2Geometry(heads=4, head_dim=8, state_size=6, groups=2)
G_GEOM = GDNGeometry(key_heads=1, value_heads=2, key_dim=8, value_dim=6)


def _warm_mamba2(T_prefix=2, slots=3, window=4, read_dtype=None):
    gen = torch.Generator().manual_seed(0)
    state = Mamba2ReplayState(M_GEOM, slots, ReplayConfig(window=window, read_dtype=read_dtype))
    p = mamba2_params(M_GEOM, gen)
    for _ in range(T_prefix):
        x, dt, B, C, z = mamba2_inputs(M_GEOM, slots, 1, gen)
        state.step(x, dt, p.A, B, C, p.D, p.dt_bias, z)
    return state, p, gen


def _warm_gdn(T_prefix=2, slots=3, window=4, read_dtype=None):
    gen = torch.Generator().manual_seed(0)
    state = GDNReplayState(G_GEOM, slots, ReplayConfig(window=window, read_dtype=read_dtype))
    for _ in range(T_prefix):
        state.step(*gdn_inputs(G_GEOM, slots, 1, gen), use_qk_l2norm=True)
    return state, gen


def _mamba2_step_args(T, commit, prefix=2, read_dtype=None):
    state, p, gen = _warm_mamba2(prefix, read_dtype=read_dtype)
    x, dt, B, C, z = mamba2_inputs(M_GEOM, 3, T, gen)
    rows = torch.tensor([2, 0, 1])
    s = state
    return (x, dt, p.A, B, C, p.D, p.dt_bias, z, s.checkpoint, s.ring_x, s.ring_B, s.ring_dt, s.ring_logdecay, s.cursor, s.pending, rows, commit, True, s.read_checkpoint, s.read_scale)


def _gdn_step_args(T, commit, prefix=2, read_dtype=None):
    state, gen = _warm_gdn(prefix, read_dtype=read_dtype)
    s = state
    rows = torch.tensor([1, 2, 0])
    return gdn_inputs(G_GEOM, 3, T, gen) + (s.checkpoint, s.ring_k, s.ring_d, s.ring_g, s.cursor, s.pending, rows, commit, True, None, s.read_checkpoint, s.ring_beta)


STEP_CASES = [(1, True, 2), (1, True, 4), (3, False, 2)]
STEP_IDS = ["decode", "decode-flush", "verify-flush"]
READ = [pytest.param(None, id="fp32-reads"), pytest.param(torch.bfloat16, id="bf16-read-copy")]
MAMBA2_READ = READ + [pytest.param(torch.float8_e4m3fn, id="fp8-read-copy")]  # (Mamba-2 only)


@pytest.mark.parametrize("read_dtype", MAMBA2_READ)
@pytest.mark.parametrize("T, commit, prefix", STEP_CASES, ids=STEP_IDS)
def test_opcheck_mamba2_step(T, commit, prefix, read_dtype):
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if read_dtype == torch.float8_e4m3fn:
        utils = utils[1:]  # the schema check compares the mutated fp8 copy with ops torch has no fp8 CPU kernel for
    torch.library.opcheck(ops.mamba2_step, _mamba2_step_args(T, commit, prefix, read_dtype), test_utils=utils)


@pytest.mark.parametrize("read_dtype", READ)
@pytest.mark.parametrize("T, commit, prefix", STEP_CASES, ids=STEP_IDS)
def test_opcheck_gdn_step(T, commit, prefix, read_dtype):
    torch.library.opcheck(ops.gdn_step, _gdn_step_args(T, commit, prefix, read_dtype))


def test_opcheck_materialize_and_commit():
    state, _, _ = _warm_mamba2()
    s = state
    rows = torch.tensor([1, 2])
    torch.library.opcheck(ops.mamba2_materialize, (s.checkpoint, s.ring_x, s.ring_B, s.ring_dt, s.ring_logdecay, s.cursor, rows))
    g, _ = _warm_gdn()
    torch.library.opcheck(ops.gdn_materialize, (g.checkpoint, g.ring_k, g.ring_d, g.ring_g, g.cursor, rows))
    c, _ = _warm_gdn(read_dtype=torch.bfloat16)  # with a copy: its exact fold
    ring = (c.ring_k, c.ring_d, c.ring_g, c.cursor, rows, c.read_checkpoint, c.ring_beta)
    torch.library.opcheck(ops.gdn_materialize, (c.checkpoint, *ring))
    args = _gdn_step_args(3, False)
    ops.gdn_step(*args)
    cursor, pending = args[9], args[10]
    torch.library.opcheck(ops.commit, (cursor, pending, torch.tensor([0, 2]), torch.tensor([3, 1])))


def test_opcheck_conventional():
    gen = torch.Generator().manual_seed(5)
    p = mamba2_params(M_GEOM, gen)
    x, dt, B, C, z = mamba2_inputs(M_GEOM, 2, 3, gen)
    state = torch.randn(4, 4, 8, 6, generator=gen)
    torch.library.opcheck(ops.mamba2_conventional_step, (x, dt, p.A, B, C, p.D, p.dt_bias, z, state, torch.tensor([3, 1]), True))
    q, k, v, g, beta = gdn_inputs(G_GEOM, 2, 3, gen)
    gstate = 0.1 * torch.randn(3, 2, 6, 8, generator=gen)
    torch.library.opcheck(ops.gdn_conventional_step, (q, k, v, g, beta, gstate, torch.tensor([0, 2]), True, None))


def test_compile_fullgraph_matches_eager():
    """A decode step (with a flush on some rows) under torch.compile(fullgraph=True) equals eager, state included."""

    def step(m_state, g_state, m_in, g_in, p):
        x, dt, B, C, z = m_in
        y = ops.mamba2_step(x, dt, p.A, B, C, p.D, p.dt_bias, z, m_state.checkpoint, m_state.ring_x, m_state.ring_B,
                            m_state.ring_dt, m_state.ring_logdecay, m_state.cursor, m_state.pending, rows, True, True, None, None)  # fmt: skip
        o = ops.gdn_step(*g_in, g_state.checkpoint, g_state.ring_k, g_state.ring_d, g_state.ring_g, g_state.cursor,
                         g_state.pending, rows, True, True, None, None, None)  # fmt: skip
        return y * 2, o + 1

    rows = torch.tensor([0, 1, 2])
    m_eager, p, gen = _warm_mamba2(T_prefix=3)
    g_eager, _ = _warm_gdn(T_prefix=3)
    # Stagger: row 0 is one token ahead, so rows flush on different steps.
    x, dt, B, C, z = mamba2_inputs(M_GEOM, 1, 1, gen)
    m_eager.step(x, dt, p.A, B, C, p.D, p.dt_bias, z, rows=[0])
    g_eager.step(*gdn_inputs(G_GEOM, 1, 1, gen), rows=[0], use_qk_l2norm=True)
    assert m_eager.cursor.tolist() == [4, 3, 3] and g_eager.cursor.tolist() == [4, 3, 3]
    m_comp = m_eager.select([0, 1, 2])
    g_comp = g_eager.select([0, 1, 2])
    compiled = torch.compile(step, fullgraph=True, backend="inductor")
    for i in range(6):
        m_in = mamba2_inputs(M_GEOM, 3, 1, gen)
        g_in = gdn_inputs(G_GEOM, 3, 1, gen)
        ye, oe = step(m_eager, g_eager, m_in, g_in, p)
        yc, oc = compiled(m_comp, g_comp, m_in, g_in, p)
        torch.testing.assert_close(yc, ye, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(oc, oe, rtol=1e-6, atol=1e-6)
        for a, b in zip(m_comp.tensors().values(), m_eager.tensors().values()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        for a, b in zip(g_comp.tensors().values(), g_eager.tensors().values()):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def _strided(t):
    """Same values, same shape, not contiguous (heads outermost): what a compiled graph may pass."""
    return t.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("T, commit", [(1, True), (3, False)], ids=["decode", "verify"])
def test_triton_outputs_are_contiguous_for_strided_inputs(family, T, commit):
    """The fake kernels promise contiguous outputs; the Triton launchers must give them for strided inputs too
    (inductor asserts the strides: found on the GPU with a strided v under captured verification)."""
    from replayssm.ops.gdn import step as gdn
    from replayssm.ops.mamba2 import kernels as mamba2

    args = _mamba2_step_args(T, commit) if family == "mamba2" else _gdn_step_args(T, commit)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (CPU: under the interpreter)
    args = tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)
    step = mamba2.mamba2_step if family == "mamba2" else gdn.gdn_step
    activation = 0 if family == "mamba2" else 2  # x or v
    states = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    strided = list(args)
    strided[activation] = _strided(args[activation])
    assert not strided[activation].is_contiguous()
    out = step(*strided)
    expected = step(*states)
    assert out.is_contiguous() and out.shape == expected.shape
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
