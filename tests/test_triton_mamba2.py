"""Mamba-2 Triton kernels against the PyTorch reference and a float64 recurrence.

On the CPU the launchers run under ``TRITON_INTERPRET=1`` at tiny sizes; on a
GPU (``cuda`` marker) the same cases run on CUDA tensors, plus a long run, a
CUDA-graph capture and the registered op.
"""

from __future__ import annotations

import pytest
import torch
from _triton_devices import DEVICES, DEVICES_OVERLAP
from naive import NaiveMamba2, rel_err

from replayssm.ops import replay_math
from replayssm.ops.commit import reference as commit_ref
from replayssm.ops.mamba2 import reference as mamba2_ref
from replayssm.ops.launch import LaunchConfig

kernels = pytest.importorskip("replayssm.ops.mamba2.kernels", reason="needs Triton")
conventional = pytest.importorskip("replayssm.ops.mamba2.conventional", reason="needs Triton")
import triton  # noqa: E402 (after the skip: Triton is there)
import triton.language as tl  # noqa: E402

from replayssm.ops import triton_helpers  # noqa: E402


# (batch, heads, head_dim, state_size, groups, window), input dtype, checkpoint dtype,
# tolerance (relative RMS) for outputs, and for the checkpoint vs the reference.
CASES = [
    pytest.param((3, 2, 80, 48, 1, 5), torch.float32, torch.float32, 1e-5, 1e-5, id="B3-H2-P80-N48-G1-L5-x_fp32-ck_fp32"),
    pytest.param((3, 2, 16, 32, 1, 4), torch.bfloat16, torch.float32, 1e-2, 1e-5, id="B3-H2-P16-N32-G1-L4-x_bf16-ck_fp32"),
    pytest.param((2, 2, 16, 16, 2, 5), torch.float32, torch.float16, 1e-5, 2e-3, id="B2-H2-P16-N16-G2-L5-x_fp32-ck_fp16"),
    pytest.param((2, 4, 16, 16, 2, 3), torch.bfloat16, torch.bfloat16, 1e-2, 1e-2, id="B2-H4-P16-N16-G2-L3-x_bf16-ck_bf16"),
]


def _inputs(batch, heads, head_dim, state_size, groups, dtype, device, gen, optional=True, num_tokens=1):
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    x = rnd(batch, num_tokens, heads, head_dim)
    dt = rnd(batch, num_tokens, heads, scale=0.5)
    B, C = rnd(batch, num_tokens, groups, state_size), rnd(batch, num_tokens, groups, state_size)
    z = rnd(batch, num_tokens, heads, head_dim) if optional else None
    return x, dt, B, C, z


def _params(heads, device, gen, optional=True):
    A = -(torch.rand(heads, generator=gen) * 2 + 0.5)
    D = torch.randn(heads, generator=gen)
    dt_bias = torch.randn(heads, generator=gen) * 0.2 - 1.0
    if not optional:
        return A.to(device), None, None
    return A.to(device), D.to(device), dt_bias.to(device)


def _state(slots, heads, head_dim, state_size, groups, window, act_dtype, ckpt_dtype, device, gen):
    """A non-trivial state: random checkpoint and ring, cursors staggered over 0..window."""
    ring_dt = torch.rand(slots, window, heads, generator=gen) * 0.5
    return [
        (torch.randn(slots, heads, head_dim, state_size, generator=gen) * 0.3).to(device=device, dtype=ckpt_dtype),
        torch.randn(slots, window, heads, head_dim, generator=gen).to(device=device, dtype=act_dtype),
        torch.randn(slots, window, groups, state_size, generator=gen).to(device=device, dtype=act_dtype),
        ring_dt.to(device),
        (-ring_dt * 1.5).to(device),
        (torch.arange(slots, dtype=torch.int32) % (window + 1)).to(device),
        torch.zeros(slots, dtype=torch.int32, device=device),
    ]


def _gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("device, overlap", DEVICES_OVERLAP)
@pytest.mark.parametrize("fold_in_main", [False, True], ids=["fold-launch", "fold-in-main"])
@pytest.mark.parametrize("dims, act_dtype, ckpt_dtype, tol_out, tol_ckpt", CASES)
def test_replay_step_matches_reference(dims, act_dtype, ckpt_dtype, tol_out, tol_ckpt, fold_in_main, overlap, device):
    """>= 3 window cycles, rows at different ring positions, outputs poisoned before each kernel call.
    ``overlap``: the later launches with programmatic dependent launch where the GPU has it ("plain": all
    plain launches)."""
    batch, heads, head_dim, state_size, groups, window = dims
    gen = _gen()
    slots = batch + 2
    rows = torch.randperm(slots, generator=gen)[:batch].to(device)
    A, D, dt_bias = _params(heads, device, gen)
    ours = _state(slots, heads, head_dim, state_size, groups, window, act_dtype, ckpt_dtype, device, gen)
    theirs = [t.clone() for t in ours]
    flushes = 0
    for _ in range(3 * window + 2):
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, act_dtype, device, gen)
        flushes += int((ours[5][rows] == window).sum())
        y_ref = mamba2_ref.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *theirs, rows, True, True)
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(x, dt, A, B, C, D, dt_bias, z, *ours, rows, True, True, y=y, fold_in_main=fold_in_main, overlap=overlap)
        assert rel_err(y, y_ref) < tol_out
        assert rel_err(ours[0], theirs[0]) < tol_ckpt
        for name, a, b in zip(("ring_x", "ring_B", "ring_dt", "ring_logdecay"), ours[1:5], theirs[1:5]):
            assert rel_err(a, b) < 1e-6, name
        assert torch.equal(ours[5], theirs[5]) and torch.equal(ours[6], theirs[6])
    assert flushes >= 3 * batch - 1


@pytest.mark.parametrize("device", DEVICES)
def test_replay_step_without_optional_inputs_and_uncommitted(device):
    """D, dt_bias, z absent, no softplus; verification (commit=False) then a commit of 0 or 1."""
    batch, heads, head_dim, state_size, groups, window = 2, 2, 16, 16, 1, 3
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    A, D, dt_bias = _params(heads, device, gen, optional=False)
    ours = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(3 * window + 1):
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen, optional=False)
        dt = dt.abs() * 0.3  # no softplus: dt must be positive already
        y_ref = mamba2_ref.mamba2_step(x, dt, A, B, C, None, None, None, *theirs, rows, False, False)
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(x, dt, A, B, C, None, None, None, *ours, rows, False, False, y=y)
        assert rel_err(y, y_ref) < 1e-5
        assert torch.equal(ours[5], theirs[5]) and torch.equal(ours[6], theirs[6])
        accepted = torch.tensor([step % 2, 1], device=device)
        for state in (ours, theirs):
            commit_ref.commit(state[5], state[6], rows, accepted)
        assert rel_err(ours[0], theirs[0]) < 1e-5
        assert rel_err(ours[1], theirs[1]) < 1e-6 and rel_err(ours[4], theirs[4]) < 1e-6


# (main kernel config, flush kernel config or None: fold in the main launch at T = 1, the table's flush
# launch at T = 2); the flush kernel's fold is a tl.dot: block >= 16
VARIANTS = [
    pytest.param(LaunchConfig(32, 1, 4), LaunchConfig(16, 2, 2), id="block32-split1"),
    pytest.param(LaunchConfig(16, 2, 2), LaunchConfig(32, 1, 4), id="block16-split2"),
    pytest.param(LaunchConfig(8, 6, 1), LaunchConfig(16, 1, 4), id="block8-one-tile-per-program"),
    pytest.param(LaunchConfig(16, 3, 1), LaunchConfig(16, 1, 4), id="block16-1warp-one-tile-per-program"),
    pytest.param(LaunchConfig(8, 6, 1), None, id="block8-one-tile-per-program-fold-in-main"),
    pytest.param(LaunchConfig(16, 1, 2), None, id="block16-split1-fold-in-main"),
    pytest.param(LaunchConfig(4, 12, 1), None, id="block4-one-tile-per-program-fold-in-main"),
    # the main launch's forms (_mamba2_main_kernel): T outputs as one block
    pytest.param(LaunchConfig(8, 6, 1, 3, form="tokens_prefetched"), LaunchConfig(16, 1, 4), id="block8-tokens-prefetched2"),
    pytest.param(LaunchConfig(16, 3, 1, 2, form="tokens_prefetched"), None, id="block16-tokens-prefetched1-fold-in-main"),
    # chunks loaded 1 / 2 ahead (T = 2 here: one N chunk of 32 on 2 warps, so the loads ahead are masked off;
    # VERIFY_FORMS below has tiles of 2 and 4 chunks)
    pytest.param(LaunchConfig(16, 1, 2, 2, form="tokens_prefetched"), LaunchConfig(16, 1, 4), id="block16-split1-tokens-prefetched1"),
    pytest.param(LaunchConfig(16, 3, 2, 3, form="tokens_prefetched"), None, id="block16-tokens-prefetched2-fold-in-main"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config, flush_config", VARIANTS)
def test_replay_step_launch_variants(config, flush_config, device):
    """Launch variants the table may pick (tile height, heads split over programs), T = 1 and T = 2."""
    batch, heads, head_dim, state_size, groups, window = 2, 2, 48, 32, 1, 4
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    A, D, dt_bias = _params(heads, device, gen)
    ours = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(2 * window + 1):
        T = 1 + step % 2
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen, num_tokens=T)
        y_ref = mamba2_ref.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *theirs, rows, True, True)
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(
            x, dt, A, B, C, D, dt_bias, z, *ours, rows, True, True, y=y, config=config, flush_config=flush_config,
            fold_in_main=flush_config is None and T == 1,
        )
        assert rel_err(y, y_ref) < 1e-5
        for a, b in zip(ours, theirs):
            assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("warps", [1, 2])
@pytest.mark.parametrize("fold_in_main", [False, True], ids=["fold-launch", "fold-in-main"])
def test_weights_launch_warps(warps, fold_in_main, device):
    """The weights launch on fewer warps than its default (its table's choice): T = 1 and T = 3 steps,
    three heads per group, against the reference."""
    batch, heads, head_dim, state_size, groups, window = 3, 6, 16, 32, 2, 4
    gen = _gen()
    rows = torch.tensor([2, 0, 1], device=device)
    A, D, dt_bias = _params(heads, device, gen)
    ours = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(2 * window + 1):
        T = 1 + 2 * (step % 2)
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen, num_tokens=T)
        y_ref = mamba2_ref.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *theirs, rows, True, True)
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(
            x, dt, A, B, C, D, dt_bias, z, *ours, rows, True, True, y=y, fold_in_main=fold_in_main and T == 1,
            weights_config=LaunchConfig(1, 1, warps),
        )  # fmt: skip
        assert rel_err(y, y_ref) < 1e-5
        for a, b in zip(ours, theirs):
            assert rel_err(a, b) < 1e-5


# Decoding with either fold and the table's main launch, and the fold in the main launch on 16-row tiles.
DECODE_FOLDS = pytest.mark.parametrize(
    "fold_in_main, config",
    [pytest.param(False, None, id="fold-launch"), pytest.param(True, None, id="fold-in-main"),
     pytest.param(True, LaunchConfig(16, 5, 1), id="fold-in-main-block16")],
)  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@DECODE_FOLDS
def test_replay_checkpoint_tracks_float64_recurrence(fold_in_main, config, device):
    """fp32 checkpoint within 1e-5 of the float64 recurrence after every flush; outputs likewise."""
    batch, heads, head_dim, state_size, groups, window = 3, 2, 80, 48, 1, 5
    gen = _gen()
    rows = torch.arange(batch, device=device)
    A, D, dt_bias = _params(heads, device, gen)
    state = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, device, gen)
    # Staggered cursors over a history that adds nothing (zero checkpoint, dt = 0 entries).
    for t in (state[0], state[3], state[4]):
        t.zero_()
    state[5].copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
    naive = NaiveMamba2(batch, heads, head_dim, state_size, groups)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    checked = 0
    for _ in range(3 * window + 2):
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen)
        before = naive.state.clone()
        flushing = (state[5] == window).cpu()
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(x, dt, A, B, C, D, dt_bias, z, *state, rows, True, True, y=y, config=config, fold_in_main=fold_in_main)
        for r in range(batch):
            y_r, naive.state[r] = naive.token(r, cpu(x[r, 0]), cpu(dt[r, 0]), cpu(A), cpu(B[r, 0]), cpu(C[r, 0]), cpu(D), cpu(dt_bias), cpu(z[r, 0]))
            assert rel_err(y[r, 0].cpu(), y_r) < 1e-5
            if flushing[r]:
                assert rel_err(state[0][r].cpu(), before[r]) < 1e-5
                checked += 1
    assert checked >= 6


# Verification (the flush launch folds) with the table's main launch and the token block's forms (head_dim
# 16: one or two tiles); 16 rows on one warp with N chunks gives 2 chunks of 16 at T = 3, 4 (one at T = 2).
VERIFY_FORMS = pytest.mark.parametrize(
    "config",
    [
        pytest.param(None, id="table"),
        pytest.param(LaunchConfig(8, 2, 1, 2, form="tokens_prefetched"), id="tokens-prefetched1-block8"),
        pytest.param(LaunchConfig(16, 1, 2, 5, form="tokens_prefetched"), id="tokens-prefetched4-block16-2w"),
        # 32-row tiles on one warp: N chunks of 8, four of them at T = 3, 4 (two at T = 2), loaded 1 / 2 / 3 ahead
        pytest.param(LaunchConfig(32, 1, 1, 2, form="tokens_prefetched"), id="tokens-prefetched1-block32"),
        pytest.param(LaunchConfig(32, 1, 1, 3, form="tokens_prefetched"), id="tokens-prefetched2-block32"),
        pytest.param(LaunchConfig(32, 1, 1, 4, form="tokens_prefetched"), id="tokens-prefetched3-block32"),
        # 4 ahead: every chunk of the tile loaded before the first product (T = 3, 4), loads past the last masked
        # off (T = 2)
        pytest.param(LaunchConfig(32, 1, 1, 5, form="tokens_prefetched"), id="tokens-prefetched4-block32"),
        # 4-row tiles: one N chunk of 32 (T = 2 .. 4), so the loads ahead are masked off
        pytest.param(LaunchConfig(4, 4, 1, 3, form="tokens_prefetched"), id="tokens-prefetched2-block4"),
    ],
)


@pytest.mark.parametrize("device", DEVICES)
@VERIFY_FORMS
def test_verify_commit_tracks_float64_recurrence(config, device):
    """T = 2..4 tokens per launch, each row with its own number of real drafts (1..T; the rest is
    padding, never accepted), random accepted counts: outputs and materialize() vs the float64
    recurrence over accepted tokens only; ring, checkpoint and cursors vs the reference, across flushes."""
    batch, heads, head_dim, state_size, groups, window = 3, 4, 16, 32, 2, 6
    gen = _gen()
    rows = torch.tensor([2, 0, 1], device=device)
    A, D, dt_bias = _params(heads, device, gen)
    ours = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, device, gen)
    for t in (ours[0], ours[3], ours[4]):
        t.zero_()  # empty history; staggered cursors
    ours[5].copy_(torch.tensor([0, 3, 5], dtype=torch.int32))
    theirs = [t.clone() for t in ours]
    naive = NaiveMamba2(batch, heads, head_dim, state_size, groups)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    flushes = 0
    for step in range(12):
        T = 2 + step % 3
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen, num_tokens=T)
        flushes += int((ours[5][rows] + T > window).sum())
        y_ref = mamba2_ref.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *theirs, rows, False, True)
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(x, dt, A, B, C, D, dt_bias, z, *ours, rows, False, True, y=y, config=config)
        assert rel_err(y, y_ref) < 1e-5
        drafts = torch.randint(1, T + 1, (batch,), generator=gen)  # real tokens per row; padding beyond
        accepted = (torch.rand(batch, generator=gen) * (drafts + 1)).long().clamp(max=drafts).to(device)
        for state in (ours, theirs):
            commit_ref.commit(state[5], state[6], rows, accepted)
        for name, a, b in zip(("checkpoint", "ring_x", "ring_B", "ring_dt", "ring_logdecay"), ours[:5], theirs[:5]):
            assert rel_err(a, b) < 1e-5, name
        assert torch.equal(ours[5], theirs[5]) and torch.equal(ours[6], theirs[6])
        for b in range(batch):
            r = int(rows[b])
            s = naive.state[r]
            for t in range(int(drafts[b])):
                y_t, s = naive.token(r, cpu(x[b, t]), cpu(dt[b, t]), cpu(A), cpu(B[b, t]), cpu(C[b, t]), cpu(D), cpu(dt_bias), cpu(z[b, t]), state=s)
                assert rel_err(y[b, t].cpu(), y_t) < 1e-5
                if t + 1 == int(accepted[b]):
                    naive.state[r] = s
        state_now = mamba2_ref.mamba2_materialize(*ours[:6], rows)
        assert rel_err(state_now.cpu(), naive.state[rows.cpu()]) < 1e-5
    assert flushes >= 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dims, act_dtype, state_dtype, tol_out, tol_state",
    [
        pytest.param((3, 4, 80, 48, 2, 3), torch.float32, torch.float32, 1e-5, 1e-5, id="B3-H4-P80-N48-G2-T3-x_fp32-st_fp32"),
        pytest.param((2, 2, 16, 32, 1, 1), torch.bfloat16, torch.bfloat16, 1e-2, 1e-2, id="B2-H2-P16-N32-G1-T1-x_bf16-st_bf16"),
    ],
)
def test_conventional_step_matches_reference(dims, act_dtype, state_dtype, tol_out, tol_state, device):
    batch, heads, head_dim, state_size, groups, num_tokens = dims
    gen = _gen()
    rows = torch.tensor(list(range(batch))[::-1], device=device)
    A, D, dt_bias = _params(heads, device, gen)
    state = (torch.randn(batch + 1, heads, head_dim, state_size, generator=gen) * 0.3).to(device=device, dtype=state_dtype)
    theirs = state.clone()
    for _ in range(2):
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, act_dtype, device, gen, num_tokens=num_tokens)
        y_ref = mamba2_ref.mamba2_conventional_step(x, dt, A, B, C, D, dt_bias, z, theirs, rows, True)
        y = torch.full_like(x, float("nan"))
        conventional.mamba2_conventional_step_out(x, dt, A, B, C, D, dt_bias, z, state, rows, True, y=y)
        assert rel_err(y, y_ref) < tol_out
        assert rel_err(state, theirs) < tol_state


@pytest.mark.parametrize("device", DEVICES)
def test_snapshot_baseline_writes_every_state(device):
    """The speculative baseline: T states written to T snapshot slots, the input state untouched."""
    batch, heads, head_dim, state_size, groups, num_tokens = 2, 2, 16, 32, 1, 3
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    A, D, dt_bias = _params(heads, device, gen)
    state = (torch.randn(batch, heads, head_dim, state_size, generator=gen) * 0.3).to(device)
    before = state.clone()
    snapshots = torch.full((batch, num_tokens, heads, head_dim, state_size), float("nan"), device=device)
    x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, device, gen, num_tokens=num_tokens)
    y = torch.full_like(x, float("nan"))
    conventional.mamba2_conventional_step_out(x, dt, A, B, C, D, dt_bias, z, state, rows, True, y=y, snapshots=snapshots)
    assert torch.equal(state, before)
    walk = before.clone()
    for t in range(num_tokens):
        y_t = mamba2_ref.mamba2_conventional_step(x[:, t : t + 1], dt[:, t : t + 1], A, B[:, t : t + 1], C[:, t : t + 1], D, dt_bias, z[:, t : t + 1], walk, rows, True)
        assert rel_err(y[:, t : t + 1], y_t) < 1e-5
        assert rel_err(snapshots[:, t], walk) < 1e-5


# ---------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------


@pytest.mark.cuda
def test_long_run_tracks_float64_recurrence():
    """4096 steps (819 flushes per row): the fp32 checkpoint stays within 1e-5 of a float64 recurrence."""
    batch, heads, head_dim, state_size, groups, window = 4, 8, 64, 128, 2, 5
    gen = _gen()
    dev = "cuda"
    rows = torch.arange(batch, device=dev)
    A, D, dt_bias = _params(heads, dev, gen)
    state = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, dev, gen)
    for t in (state[0], state[3], state[4]):
        t.zero_()
    state[5].copy_(torch.arange(batch, dtype=torch.int32) % window)
    exact = torch.zeros(batch, heads, head_dim, state_size, dtype=torch.float64, device=dev)
    rep = heads // groups
    worst = 0.0
    for _ in range(4096):
        x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, dev, gen)
        before = exact.clone()
        flushing = state[5] == window
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(x, dt, A, B, C, D, dt_bias, z, *state, rows, True, True, y=y)
        d = torch.nn.functional.softplus(dt[:, 0].double() + dt_bias.double())  # (batch, heads)
        Bh = B[:, 0].double().repeat_interleave(rep, dim=1)
        exact = torch.exp(d * A.double())[..., None, None] * exact + d[..., None, None] * x[:, 0].double()[..., None] * Bh[:, :, None, :]
        if bool(flushing.any()):
            f = flushing.nonzero()[:, 0]
            err = float((state[0][f].double() - before[f]).norm() / before[f].norm())
            worst = max(worst, err)
    assert worst < 1e-5, worst


@pytest.mark.cuda
def test_registered_op_and_cuda_graph():
    """The op dispatches to the kernels on CUDA; a captured window of steps replays exactly like eager steps."""
    import replayssm

    dims = (5, 8, 64, 128, 2, 4)
    batch, heads, head_dim, state_size, groups, window = dims
    gen = _gen()
    dev = "cuda"
    rows = torch.arange(batch, device=dev)
    A, D, dt_bias = _params(heads, dev, gen)
    ours = _state(batch, heads, head_dim, state_size, groups, window, torch.bfloat16, torch.float32, dev, gen)
    eager = [t.clone() for t in ours]
    steps = [_inputs(batch, heads, head_dim, state_size, groups, torch.bfloat16, dev, gen) for _ in range(window)]
    # eager op calls (dispatch through torch.library) once, as warm-up and as the expected result
    expected = [replayssm.ops.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *eager, rows, True, True, None, None) for x, dt, B, C, z in steps]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            outs = [replayssm.ops.mamba2_step(x, dt, A, B, C, D, dt_bias, z, *ours, rows, True, True, None, None) for x, dt, B, C, z in steps]
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    for y, y_ref in zip(outs, expected):
        assert torch.equal(y, y_ref)
    for a, b in zip(ours, eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_commit_kernel_matches_reference(device):
    from replayssm.ops.commit.kernels import commit

    cursor = torch.tensor([3, 0, 5, 2], dtype=torch.int32, device=device)
    pending = torch.tensor([2, 4, 0, 3], dtype=torch.int32, device=device)
    rows = torch.tensor([3, 1], device=device)
    accepted = torch.tensor([1, 4], device=device)
    theirs = (cursor.clone(), pending.clone())
    commit(cursor, pending, rows, accepted)
    commit_ref.commit(*theirs, rows, accepted)
    assert torch.equal(cursor, theirs[0]) and torch.equal(pending, theirs[1])


@pytest.mark.parametrize("form", ["token", "tokens", "tokens_chunked", "fold_dot"])
def test_unknown_main_form_is_rejected(form):
    with pytest.raises(ValueError, match="no form"):
        kernels._main_form(LaunchConfig(16, 1, 1, form=form), 4, 4, 128)


@pytest.mark.parametrize(
    "config, flush_config, fold_in_main, num_tokens, message",
    [(LaunchConfig(16, 1, 1, form="token"), None, True, 1, "no form"), (LaunchConfig(8, 1, 1, form="fold_unrolled"), None, True, 1, "no form"),
     (None, LaunchConfig(16, 1, 4, form="rows4"), False, 1, "no form"),
     (None, LaunchConfig(16, 1, 4, form="beside"), False, 1, "no form"),
     (None, LaunchConfig(8, 1, 4), False, 1, "tiles of >= 16 rows"),
     (None, None, True, 2, "fold_in_main is for decoding")],
    ids=["main-unknown", "main-removed-form", "flush-form", "flush-removed-form", "flush-tile-too-small", "verify-fold-in-main"],
)  # fmt: skip
def test_bad_form_raises_before_any_launch(config, flush_config, fold_in_main, num_tokens, message):
    """The step's launch configurations are checked before its first launch: the state is left as it was
    (CPU tensors: on a GPU machine they could not even be launched)."""
    gen = _gen()
    heads, head_dim, state_size, groups, window, batch = 2, 16, 16, 1, 4, 2
    state = _state(batch, heads, head_dim, state_size, groups, window, torch.float32, torch.float32, "cpu", gen)
    x, dt, B, C, z = _inputs(batch, heads, head_dim, state_size, groups, torch.float32, "cpu", gen, num_tokens=num_tokens)
    A, D, dt_bias = _params(heads, "cpu", gen)
    before = [t.clone() for t in state]
    with pytest.raises(ValueError, match=message):
        kernels.mamba2_step_out(
            x, dt, A, B, C, D, dt_bias, z, *state, torch.arange(batch), True, True, y=torch.empty_like(x),
            config=config, flush_config=flush_config, fold_in_main=fold_in_main,
        )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(state, before))


def test_token_block_chunks():
    """"tokens_prefetched" sizes its N chunks to 32 accumulators per thread."""
    chunk = lambda block, warps, block_t: kernels._main_form(LaunchConfig(block, 1, warps, 2, form="tokens_prefetched"), 4, block_t, 128)["N_CHUNK"]  # noqa: E731
    assert [chunk(8, 1, 4), chunk(16, 1, 4), chunk(16, 2, 8)] == [32, 16, 16]


def test_token_block_prefetch_depth():
    """"tokens_prefetched" loads 1 to 4 chunks ahead (num_stages 2 to 5); the per-token form none."""
    form = lambda name, stages: kernels._main_form(LaunchConfig(16, 1, 1, stages, form=name), 4, 4, 128)  # noqa: E731
    prefetch = [form("tokens_prefetched", stages)["PREFETCH"] for stages in (2, 3, 4, 5)]
    assert prefetch + [form("", 1)["PREFETCH"]] == [1, 2, 3, 4, 0]
    for stages in (1, 6):
        with pytest.raises(ValueError, match="'tokens_prefetched' form takes num_stages 2 to 5"):
            form("tokens_prefetched", stages)


# --- the fp8 e4m3 read copy's quantisation (the flush launch's; tests/test_read_copy.py has the steps) ---

FP8 = torch.float8_e4m3fn


def _bits(t):
    return t.view(torch.uint8)  # (torch.equal has no fp8 kernel on the CPU)


def _e4m3_cases():
    """fp32 values at every kind of e4m3 rounding decision: each finite e4m3 value, the midpoints between
    neighbours (ties: to even) and their fp32 neighbours, the subnormal range (grid 2^-9), zeros of both
    signs, values past 448 (saturated), and random draws of many magnitudes."""
    grid = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = grid[torch.isfinite(grid)].sort().values
    mid = (grid[1:] + grid[:-1]) / 2
    up, down = torch.full_like(mid, 1e9), torch.full_like(mid, -1e9)
    gen = torch.Generator().manual_seed(41)
    special = torch.tensor([0.0, -0.0, 448.0, -448.0, 464.0, -464.0, 470.0, 479.9, 480.0, 1e4, -1e30, 2.0**-9, 2.0**-10, -(2.0**-10), 1e-40])
    random = torch.randn(2048, generator=gen) * torch.exp2(torch.randint(-14, 10, (2048,), generator=gen).float())
    return torch.cat([grid, mid, torch.nextafter(mid, up), torch.nextafter(mid, down), special, random])


def _state_rows(gen):
    """Rows of state_size 48 to quantise: zeros (with a -0), random, decayed (magnitudes over six decades),
    amax 448 exactly (scale 1: the rounding cases as they are), and amax so small that amax / 448 is 0."""
    n = 48
    cases = _e4m3_cases()
    exact = torch.cat([cases[: 47 * 8].view(8, 47).clamp(-448, 448), torch.full((8, 1), 448.0)], dim=1)
    rows = [
        torch.zeros(1, n).index_fill_(1, torch.tensor([3]), -0.0),
        torch.randn(4, n, generator=gen),
        torch.randn(4, n, generator=gen) * torch.exp(-torch.linspace(0, 14, n))[None, :],
        exact,
        torch.full((1, n), 1e-43),
    ]
    return torch.cat(rows)


@triton.jit
def _round_e4m3_kernel(p_x, p_q, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(p_q + o, triton_helpers.round_e4m3(tl.load(p_x + o, mask=o < n, other=0.0)).to(p_q.dtype.element_ty), mask=o < n)


@triton.jit
def _quantize_rows_kernel(p_S, p_q, p_scale, R, N, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    o_r, o_n = tl.arange(0, BLOCK_R), tl.arange(0, BLOCK_N)
    m = (o_r[:, None] < R) & (o_n[None, :] < N)
    b_q, b_scale = triton_helpers.quantize_rows_e4m3(tl.load(p_S + o_r[:, None] * N + o_n[None, :], mask=m, other=0.0))
    tl.store(p_q + o_r[:, None] * N + o_n[None, :], b_q.to(p_q.dtype.element_ty), mask=m)
    tl.store(p_scale + o_r, b_scale, mask=o_r < R)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_quantisation_in_the_kernels_is_torchs(device):
    """``triton_helpers.round_e4m3`` and ``quantize_rows_e4m3`` (what the flush launch runs) give torch's
    bits: round to nearest even (ties, subnormals, signed zeros), saturation at 448, scales amax / 448, and
    a zero row (or one whose scale underflows) with scale 0 and zero values, never NaN."""
    x = _e4m3_cases().to(device)
    q = torch.empty(x.shape, dtype=FP8, device=device)
    _round_e4m3_kernel[(1,)](x, q, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    assert torch.equal(_bits(q.cpu()), _bits(x.cpu().clamp(-448, 448).to(FP8)))

    S = _state_rows(torch.Generator().manual_seed(42))
    values, scale = torch.empty(S.shape, dtype=FP8, device=device), torch.full(S.shape[:1], float("nan"), device=device)
    _quantize_rows_kernel[(1,)](S.to(device), values, scale, S.shape[0], S.shape[1], BLOCK_R=32, BLOCK_N=64)
    expected_values, expected_scale = replay_math.quantize_rows_e4m3(S)
    assert torch.equal(_bits(values.cpu()), _bits(expected_values)) and torch.equal(scale.cpu(), expected_scale)
    assert float(scale[0]) == 0.0 and float(scale[-1]) == 0.0 and not bool(values.cpu().float()[[0, -1]].any())
    assert not bool(values.cpu().float().isnan().any())
    assert torch.equal(scale.cpu()[9:17], torch.ones(8))  # the rows of amax 448
