"""Gated DeltaNet Triton kernels against the PyTorch reference and a float64 recurrence.

On the CPU the launchers run under ``TRITON_INTERPRET=1`` at tiny sizes; on a
GPU (``cuda`` marker) the same cases run on CUDA tensors, plus a long run, a
CUDA-graph capture and the registered op.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _triton_devices import DEVICES, DEVICES_OVERLAP
from naive import NaiveGDN, rel_err

from replayssm.ops.commit import reference as commit_ref
from replayssm.ops.gdn import reference as gdn_ref
from replayssm.ops.launch import LaunchConfig

kernels = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
conventional = pytest.importorskip("replayssm.ops.gdn.conventional", reason="needs Triton")


# (batch, key_heads, value_heads, key_dim, value_dim, window), input dtype, checkpoint dtype, l2norm,
# tolerance (relative RMS) for outputs, and for the checkpoint vs the reference.
CASES = [
    pytest.param((3, 1, 2, 48, 80, 5), torch.float32, torch.float32, True, 1e-5, 1e-5, id="B3-HK1-HV2-K48-V80-L5-x_fp32-ck_fp32"),
    pytest.param((3, 1, 2, 32, 16, 4), torch.bfloat16, torch.float32, True, 1e-2, 1e-5, id="B3-HK1-HV2-K32-V16-L4-x_bf16-ck_fp32"),
    pytest.param((2, 2, 2, 16, 16, 5), torch.float32, torch.float16, False, 2e-3, 2e-3, id="B2-HK2-HV2-K16-V16-L5-x_fp32-ck_fp16"),
    pytest.param((2, 1, 4, 16, 16, 3), torch.bfloat16, torch.bfloat16, True, 1e-2, 1e-2, id="B2-HK1-HV4-K16-V16-L3-x_bf16-ck_bf16"),
]


def _inputs(batch, key_heads, value_heads, key_dim, value_dim, dtype, device, gen, l2norm=True, num_tokens=1):
    def rnd(*shape):
        return torch.randn(*shape, generator=gen)

    q, k = rnd(batch, num_tokens, key_heads, key_dim), rnd(batch, num_tokens, key_heads, key_dim)
    if not l2norm:  # the caller normalises; keep |k| = 1 so the recurrence stays contracting
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = rnd(batch, num_tokens, value_heads, value_dim)
    g = -torch.rand(batch, num_tokens, value_heads, generator=gen) * 0.5
    beta = torch.rand(batch, num_tokens, value_heads, generator=gen) * 0.9 + 0.05
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v, g, beta))


def _state(slots, key_heads, value_heads, key_dim, value_dim, window, ckpt_dtype, device, gen):
    """A non-trivial state: random checkpoint and ring, cursors staggered over 0..window."""
    return [
        (torch.randn(slots, value_heads, value_dim, key_dim, generator=gen) * 0.3).to(device=device, dtype=ckpt_dtype),
        F.normalize(torch.randn(slots, window, key_heads, key_dim, generator=gen), dim=-1).to(device),
        (torch.randn(slots, window, value_heads, value_dim, generator=gen) * 0.3).to(device),
        (-torch.rand(slots, window, value_heads, generator=gen) * 0.5).to(device),
        (torch.arange(slots, dtype=torch.int32) % (window + 1)).to(device),
        torch.zeros(slots, dtype=torch.int32, device=device),
    ]


def _gen():
    return torch.Generator().manual_seed(4321)


# How a T = 1 step runs: the single replay kernel, or verification's three launches.
LAUNCH_FORMS = [pytest.param(dict(decode_launches=1), id="single-kernel"), pytest.param(dict(decode_launches=3), id="three-launches")]


def _mixed(cursor, num_tokens, window):
    """Whether some of the rows fold in this launch and others do not (cursors of the launch's rows)."""
    folds = cursor + num_tokens > window
    return bool(folds.any()) and not bool(folds.all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("launches", LAUNCH_FORMS)
@pytest.mark.parametrize("dims, act_dtype, ckpt_dtype, l2norm, tol_out, tol_ckpt", CASES)
def test_replay_step_matches_reference(dims, act_dtype, ckpt_dtype, l2norm, tol_out, tol_ckpt, launches, device):
    """>= 3 window cycles, rows at different ring positions (launches where some rows fold and others
    do not), outputs poisoned before each kernel call; decoding through the single replay kernel and
    through verification's three launches."""
    batch, key_heads, value_heads, key_dim, value_dim, window = dims
    gen = _gen()
    slots = batch + 2
    rows = torch.randperm(slots, generator=gen)[:batch].to(device)
    ours = _state(slots, key_heads, value_heads, key_dim, value_dim, window, ckpt_dtype, device, gen)
    theirs = [t.clone() for t in ours]
    flushes = mixed = 0
    for _ in range(3 * window + 2):
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, act_dtype, device, gen, l2norm)
        flushes += int((ours[4][rows] == window).sum())
        mixed += _mixed(ours[4][rows], 1, window)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, True, l2norm, None)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, True, l2norm, None, o=o, **launches)
        assert rel_err(o, o_ref) < tol_out
        assert rel_err(ours[0], theirs[0]) < tol_ckpt
        for name, a, b in zip(("ring_k", "ring_d", "ring_g"), ours[1:4], theirs[1:4]):
            assert rel_err(a, b) < max(tol_ckpt, 1e-5), name
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])
    assert flushes >= 3 * batch - 1 and mixed >= 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("launches", LAUNCH_FORMS)
def test_replay_step_uncommitted_and_scale(launches, device):
    """Verification (commit=False) followed by a commit of 0 or 1 entries; an explicit scale."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 16, 16, 3
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(3 * window + 1):
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, False, True, 0.3)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, False, True, 0.3, o=o, **launches)
        assert rel_err(o, o_ref) < 1e-5
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])
        accepted = torch.tensor([step % 2, 1], device=device)
        for state in (ours, theirs):
            commit_ref.commit(state[4], state[5], rows, accepted)
        assert rel_err(ours[0], theirs[0]) < 1e-5
        assert rel_err(ours[2], theirs[2]) < 1e-5


VARIANTS = [
    pytest.param(LaunchConfig(32, 1, 4), id="block32-split1"),
    pytest.param(LaunchConfig(16, 2, 2), id="block16-split2"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", VARIANTS)
def test_replay_step_launch_variants(config, device):
    """Launch variants the table may pick (tile height, heads split over programs), T = 1 and T = 2
    (three launches)."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 32, 48, 3
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(2 * window + 1):
        T = 1 + step % 2
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=T)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, True, True, None)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, True, True, None, o=o, config=config)
        assert rel_err(o, o_ref) < 1e-5
        for a, b in zip(ours, theirs):
            assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("launches", LAUNCH_FORMS)
def test_replay_checkpoint_tracks_float64_recurrence(launches, device):
    """fp32 checkpoint within 1e-5 of the float64 recurrence after every flush; outputs likewise."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 3, 1, 2, 48, 80, 5
    gen = _gen()
    rows = torch.arange(batch, device=device)
    state = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    # Staggered cursors over a history that adds nothing (zero checkpoint, d = 0 entries).
    for t in (state[0], state[2]):
        t.zero_()
    state[4].copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
    naive = NaiveGDN(batch, key_heads, value_heads, key_dim, value_dim)
    checked = 0
    for _ in range(3 * window + 2):
        q, k, v, g, beta = (t.cpu() for t in _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen))
        before = naive.state.clone()
        flushing = (state[4] == window).cpu()
        o = torch.full_like(v, float("nan")).to(device)
        kernels.gdn_step_out(
            *(t.to(device) for t in (q, k, v, g, beta)), *state, rows, True, True, None, o=o, **launches
        )
        for r in range(batch):
            o_r, naive.state[r] = naive.token(r, q[r, 0], k[r, 0], v[r, 0], g[r, 0], beta[r, 0], l2norm=True)
            assert rel_err(o[r, 0].cpu(), o_r) < 1e-5
            if flushing[r]:
                assert rel_err(state[0][r].cpu(), before[r]) < 1e-5
                checked += 1
    assert checked >= 6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "launch",
    [
        pytest.param({}, id="tables"),
        pytest.param(
            dict(config=LaunchConfig(16, 1, 1, num_stages=2, form="mma"), flush_config=LaunchConfig(16, 1, 4, form="worklist", programs_per_sm=1)),
            id="mma-worklist-fold",
        ),
    ],
)
def test_verify_commit_tracks_float64_recurrence(launch, device):
    """T = 2..4 tokens per launch, two value heads per key head, each row with its own number of real
    drafts (1..T; the rest is padding, never accepted), random accepted counts: outputs and
    materialize() vs the float64 recurrence over accepted tokens only; ring, checkpoint and cursors vs
    the reference, across flushes (launches where some rows fold and others do not). With the tables'
    launches, and with a work-list fold launch under the "mma" form."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 3, 2, 4, 32, 16, 6
    gen = _gen()
    rows = torch.tensor([2, 0, 1], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    for t in (ours[0], ours[2]):
        t.zero_()  # empty history; staggered cursors
    ours[4].copy_(torch.tensor([0, 3, 5], dtype=torch.int32))
    theirs = [t.clone() for t in ours]
    naive = NaiveGDN(batch, key_heads, value_heads, key_dim, value_dim)
    flushes = mixed = 0
    for step in range(12):
        T = 2 + step % 3
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=T)
        flushes += int((ours[4][rows] + T > window).sum())
        mixed += _mixed(ours[4][rows], T, window)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, False, True, None)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, False, True, None, o=o, **launch)
        assert rel_err(o, o_ref) < 1e-5
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])  # T entries pending
        drafts = torch.randint(1, T + 1, (batch,), generator=gen)  # real tokens per row; padding beyond
        accepted = (torch.rand(batch, generator=gen) * (drafts + 1)).long().clamp(max=drafts).to(device)
        for state in (ours, theirs):
            commit_ref.commit(state[4], state[5], rows, accepted)
        for name, a, b in zip(("checkpoint", "ring_k", "ring_d", "ring_g"), ours[:4], theirs[:4]):
            assert rel_err(a, b) < 1e-5, name
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])
        for b in range(batch):
            r = int(rows[b])
            s = naive.state[r]
            for t in range(int(drafts[b])):
                o_t, s = naive.token(r, q[b, t].cpu(), k[b, t].cpu(), v[b, t].cpu(), g[b, t].cpu(), beta[b, t].cpu(), l2norm=True, state=s)
                assert rel_err(o[b, t].cpu(), o_t) < 1e-5
                if t + 1 == int(accepted[b]):
                    naive.state[r] = s
        state_now = gdn_ref.gdn_materialize(*ours[:5], rows)
        assert rel_err(state_now.cpu(), naive.state[rows.cpu()]) < 1e-5
    assert flushes >= 6 and mixed >= 3


# (main launch, flush launch, weights launch): a program looping over tiles, the last one partly masked
# (48 = 32 + 16 rows), and one tile per program; the weights launch on 1, 4 and 8 warps.
VERIFY_VARIANTS = [
    pytest.param(LaunchConfig(16, 2, 4), LaunchConfig(16, 1, 4), LaunchConfig(1, 1, 1), id="block16-split2-loop-weights1w"),
    pytest.param(LaunchConfig(32, 1, 8), LaunchConfig(32, 2, 4), LaunchConfig(1, 1, 8), id="block32-split1-weights8w"),
    pytest.param(LaunchConfig(8, 6, 1), LaunchConfig(16, 3, 2), None, id="block8-split6"),
    # the fold launch as a work list: 2 programs (on the CPU) loop over the folding (row, head, tile group) items
    pytest.param(LaunchConfig(8, 6, 1), LaunchConfig(16, 1, 4, form="worklist", programs_per_sm=1), None, id="block8-worklist-fold"),
    pytest.param(LaunchConfig(16, 3, 1), LaunchConfig(32, 2, 4, form="worklist", programs_per_sm=1), None, id="block16-worklist-fold-split2"),
    # the tables' verification shapes: mma main launch, whole heads on two-warp work-list fold programs
    pytest.param(
        LaunchConfig(32, 2, 1, num_stages=4, form="mma"), LaunchConfig(16, 1, 2, form="worklist", programs_per_sm=1), None,
        id="block32-mma-worklist-fold-2w",
    ),
    pytest.param(LaunchConfig(16, 3, 2), LaunchConfig(16, 2, 2, form="worklist", programs_per_sm=3), None, id="block16-worklist-fold-split2-3p"),
    # the token products as tensor-core dots (tf32x3), a program looping over two tiles and one per program
    pytest.param(LaunchConfig(16, 2, 1, form="mma"), None, None, id="block16-mma-loop"),
    pytest.param(LaunchConfig(32, 2, 2, form="mma"), None, None, id="block32-mma-2w"),
    pytest.param(LaunchConfig(16, 3, 1, num_stages=3, form="mma"), None, None, id="block16-mma-3stages"),
    pytest.param(LaunchConfig(32, 2, 1, num_stages=4, form="mma"), None, None, id="block32-mma-1w-4stages"),
    # the weights launch's ring products as one tl.dot (the ring padded to 16 entries)
    pytest.param(LaunchConfig(16, 3, 1), None, LaunchConfig(1, 1, 1, form="dot"), id="weights-dot-1w"),
    pytest.param(LaunchConfig(16, 3, 1, form="mma"), None, LaunchConfig(1, 1, 4, form="dot"), id="mma-weights-dot-4w"),
]


@pytest.mark.parametrize("device, overlap", DEVICES_OVERLAP)
@pytest.mark.parametrize("config, flush_config, weights_config", VERIFY_VARIANTS)
def test_verify_launch_variants(config, flush_config, weights_config, overlap, device):
    """Launch variants of the three launches (tile height, tiles per program, warps, fold forms), T = 1, 2 and 3;
    ``overlap``: launches 2 and 3 with programmatic dependent launch where the GPU has it ("plain": all
    plain launches)."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 32, 48, 4
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(3 * window):
        T = 1 + step % 3
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=T)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, True, True, None)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(
            q, k, v, g, beta, *ours, rows, True, True, None, o=o, config=config, flush_config=flush_config,
            weights_config=weights_config, decode_launches=3, overlap=overlap,
        )
        assert rel_err(o, o_ref) < 1e-5
        for a, b in zip(ours, theirs):
            assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize(
    "config, flush_config, weights_config, decode_launches",
    [
        (LaunchConfig(16, 1, 1, form="tokens"), None, None, 3),
        (None, LaunchConfig(16, 1, 4, form="alongside"), None, 3),
        (None, None, LaunchConfig(1, 1, 1, form="x"), 3),
        (LaunchConfig(16, 1, 2, form="tokens"), None, None, 1),
    ],
    ids=["main", "flush", "weights", "single-kernel"],
)
def test_bad_form_raises_before_any_launch(config, flush_config, weights_config, decode_launches):
    """A launch table naming a form the kernels do not have is an error raised before the first launch:
    the state is left as it was (CPU tensors: on a GPU machine they could not even be launched)."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 16, 16, 4
    gen = _gen()
    state = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, "cpu", gen)
    q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, "cpu", gen)
    before = [t.clone() for t in state]
    with pytest.raises(ValueError, match="has no form"):
        kernels.gdn_step_out(
            q, k, v, g, beta, *state, torch.arange(batch), True, True, None, o=torch.empty_like(v),
            config=config, flush_config=flush_config, weights_config=weights_config, decode_launches=decode_launches,
        )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(state, before))


@pytest.mark.parametrize(
    "config, flush_config, message",
    [
        pytest.param(LaunchConfig(8, 2, 1, form="mma"), None, "'mma' form needs tiles of >= 16 rows", id="mma-main"),
        pytest.param(None, LaunchConfig(8, 2, 4, form="worklist"), "fold needs tiles of >= 16 rows", id="fold"),
    ],
)
def test_dot_forms_need_tiles_of_16_rows(config, flush_config, message):
    """The main launch's "mma" form and the fold (tl.dot) on 8-row tiles are refused before the first
    launch, state intact."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 16, 16, 8
    gen = _gen()
    state = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, "cpu", gen)
    q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, "cpu", gen, num_tokens=4)
    before = [t.clone() for t in state]
    with pytest.raises(ValueError, match=message):
        kernels.gdn_step_out(
            q, k, v, g, beta, *state, torch.arange(batch), True, True, None, o=torch.empty_like(v),
            config=config, flush_config=flush_config,
        )  # fmt: skip
    assert all(torch.equal(a, b) for a, b in zip(state, before))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "ckpt_dtype, l2norm, tol", [(torch.float32, True, 1e-5), (torch.float16, False, 2e-3)], ids=["ck_fp32", "ck_fp16-no_l2norm"]
)
@pytest.mark.parametrize(
    "config, weights_config",
    [(None, None), (LaunchConfig(16, 1, 1, form="mma"), None), (LaunchConfig(16, 1, 1, form="mma"), LaunchConfig(1, 1, 1, form="dot"))],
    ids=["table", "mma", "mma-weights-dot"],
)
def test_verify_up_to_the_window(ckpt_dtype, l2norm, tol, config, weights_config, device):
    """T = 5..8 with a window of 8 (T = L folds every row that holds an entry), explicit scale,
    random accepted counts; a checkpoint in a narrower dtype: outputs from the checkpoint as stored.
    The main launch as its table says and in its "mma" form (the table's from T = 4 at real sizes), and
    with the weights launch's ring products as a dot (its table's form from T = 4; 2T = 10..16 token rows)."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 2, 1, 2, 16, 16, 8
    gen = _gen()
    rows = torch.tensor([0, 1], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, ckpt_dtype, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(4):
        T = 5 + step
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, l2norm, num_tokens=T)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, False, l2norm, 0.2)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, False, l2norm, 0.2, o=o, config=config, weights_config=weights_config)
        assert rel_err(o, o_ref) < tol
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])
        accepted = torch.randint(0, T + 1, (batch,), generator=gen).to(device)
        for state in (ours, theirs):
            commit_ref.commit(state[4], state[5], rows, accepted)
        for name, a, b in zip(("checkpoint", "ring_k", "ring_d", "ring_g"), ours[:4], theirs[:4]):
            assert rel_err(a, b) < tol, name
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stages", [1, 4])
def test_mma_form_over_key_chunks(stages, device):
    """The "mma" form sums its token products over key chunks of 32 columns: a key dimension of 80 gives
    chunks 0-31 and 32-63 full, 64-95 partly masked and 96-127 empty (a power-of-two block of 128), on
    value rows in a partial last tile (48 = 32 + 16), T = 4 and 6 with random accepted counts, over
    several folds; with 1 and 4 pipeline stages."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 3, 1, 2, 80, 48, 8
    config = LaunchConfig(32, 1, 1, num_stages=stages, form="mma")
    gen = _gen()
    rows = torch.tensor([2, 0, 1], device=device)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, device, gen)
    theirs = [t.clone() for t in ours]
    for step in range(6):
        T = 4 + 2 * (step % 2)
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=T)
        o_ref = gdn_ref.gdn_step(q, k, v, g, beta, *theirs, rows, False, True, None)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *ours, rows, False, True, None, o=o, config=config)
        assert rel_err(o, o_ref) < 1e-5
        accepted = torch.randint(0, T + 1, (batch,), generator=gen).to(device)
        for state in (ours, theirs):
            commit_ref.commit(state[4], state[5], rows, accepted)
        for name, a, b in zip(("checkpoint", "ring_k", "ring_d", "ring_g"), ours[:4], theirs[:4]):
            assert rel_err(a, b) < 1e-5, name
        assert torch.equal(ours[4], theirs[4]) and torch.equal(ours[5], theirs[5])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dims, act_dtype, state_dtype, tol_out, tol_state",
    [
        pytest.param((3, 2, 4, 48, 80, 3), torch.float32, torch.float32, 1e-5, 1e-5, id="B3-HK2-HV4-K48-V80-T3-x_fp32-st_fp32"),
        pytest.param((2, 1, 2, 32, 16, 1), torch.bfloat16, torch.bfloat16, 1e-2, 1e-2, id="B2-HK1-HV2-K32-V16-T1-x_bf16-st_bf16"),
        # sizes that are multiples of the tile (32 x 32 by default here): the kernel's unmasked loads and stores
        pytest.param((2, 1, 2, 32, 64, 2), torch.float32, torch.float32, 1e-5, 1e-5, id="B2-HK1-HV2-K32-V64-T2-unmasked"),
    ],
)
def test_conventional_step_matches_reference(dims, act_dtype, state_dtype, tol_out, tol_state, device):
    batch, key_heads, value_heads, key_dim, value_dim, num_tokens = dims
    gen = _gen()
    rows = torch.tensor(list(range(batch))[::-1], device=device)
    state = (torch.randn(batch + 1, value_heads, value_dim, key_dim, generator=gen) * 0.3).to(device=device, dtype=state_dtype)
    theirs = state.clone()
    for _ in range(2):
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, act_dtype, device, gen, num_tokens=num_tokens)
        o_ref = gdn_ref.gdn_conventional_step(q, k, v, g, beta, theirs, rows, True, None)
        o = torch.full_like(v, float("nan"))
        conventional.gdn_conventional_step_out(q, k, v, g, beta, state, rows, True, None, o=o)
        assert rel_err(o, o_ref) < tol_out
        assert rel_err(state, theirs) < tol_state


@pytest.mark.parametrize("device", DEVICES)
def test_snapshot_baseline_writes_every_state(device):
    """The speculative baseline: T states written to T snapshot slots, the input state untouched."""
    batch, key_heads, value_heads, key_dim, value_dim, num_tokens = 2, 1, 2, 32, 16, 3
    gen = _gen()
    rows = torch.tensor([1, 0], device=device)
    state = (torch.randn(batch, value_heads, value_dim, key_dim, generator=gen) * 0.3).to(device)
    before = state.clone()
    snapshots = torch.full((batch, num_tokens, value_heads, value_dim, key_dim), float("nan"), device=device)
    q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=num_tokens)
    o = torch.full_like(v, float("nan"))
    conventional.gdn_conventional_step_out(q, k, v, g, beta, state, rows, True, None, o=o, snapshots=snapshots)
    assert torch.equal(state, before)
    walk = before.clone()
    for t in range(num_tokens):
        sl = slice(t, t + 1)
        o_t = gdn_ref.gdn_conventional_step(q[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], walk, rows, True, None)
        assert rel_err(o[:, sl], o_t) < 1e-5
        assert rel_err(snapshots[:, t], walk) < 1e-5


# The fused gates (ops.gdn_step(A_log=, dt_bias=)): every kernel that reads g or beta forms them from the raw a
# and b. Forms: (id, T, launch options, read copy).
FUSED_GATE_FORMS = [
    pytest.param(1, dict(decode_launches=1), None, id="single-kernel"),
    pytest.param(1, dict(decode_launches=3), None, id="three-launches"),
    pytest.param(2, {}, None, id="verify"),
    pytest.param(3, dict(config=LaunchConfig(16, 1, 1, form="mma"), weights_config=LaunchConfig(1, 1, 1, form="dot")), None, id="verify-mma-dot"),
    pytest.param(1, {}, torch.bfloat16, id="read-copy-decode"),
    pytest.param(2, {}, torch.bfloat16, id="read-copy-verify"),
]


def _raw_gate_inputs(batch, num_tokens, value_heads, gen, dtype=torch.bfloat16):
    """The model's raw a and b in its activation dtype, a spread over both sides of softplus' threshold (20)."""
    a = torch.randn(batch, num_tokens, value_heads, generator=gen) * 2
    a[0, 0, 0], a[-1, -1, -1] = 24.0, -30.0
    b = torch.randn(batch, num_tokens, value_heads, generator=gen) * 1.5
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_tokens, launch, read_dtype", FUSED_GATE_FORMS)
def test_fused_gates_match_reference(num_tokens, launch, read_dtype, device):
    """Raw a, b (bf16) with A_log and dt_bias through the kernels and through the reference, which forms the
    gates as the models do (``test_fused_gates_are_the_models_gates``): outputs and every state tensor after
    each step, over rows that fold and rows that do not."""
    from replayssm import GDNGeometry, GDNReplayState, ReplayConfig

    geometry, window, slots = GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16), 4, 4
    gen = _gen()
    config = ReplayConfig(window=window, read_dtype=read_dtype)
    ours, theirs = GDNReplayState(geometry, slots, config, device=device), GDNReplayState(geometry, slots, config)
    ours.load(torch.randn(slots, 2, 16, 16, generator=gen) * 0.3)
    ours.cursor.copy_(torch.arange(slots, dtype=torch.int32) % (window + 1))
    for name, t in ours.tensors().items():
        getattr(theirs, name).copy_(t.cpu())
    A_log, dt_bias = torch.randn(2, generator=gen) * 0.5, torch.randn(2, generator=gen)
    rows = torch.tensor([2, 3, 0])
    folds = 0
    for step in range(3 * window):
        q, k, v, _, _ = _inputs(3, 1, 2, 16, 16, torch.float32, "cpu", gen, num_tokens=num_tokens)
        a, b = _raw_gate_inputs(3, num_tokens, 2, gen)
        folds += int((theirs.cursor[rows] + num_tokens > window).sum())
        commit = num_tokens == 1
        o_ref = theirs.step(q, k, v, a, b, rows, commit, A_log=A_log, dt_bias=dt_bias)
        o = torch.full_like(v, float("nan"), device=device)
        args = [t.to(device) for t in (q, k, v, a, b)]
        state = [ours.checkpoint, ours.ring_k, ours.ring_d, ours.ring_g, ours.cursor, ours.pending]
        kernels.gdn_step_out(
            *args, *state, rows.to(device), commit, True, None, o=o, read_checkpoint=ours.read_checkpoint, ring_beta=ours.ring_beta,
            A_log=A_log.to(device), dt_bias=dt_bias.to(device), **launch,
        )  # fmt: skip
        # With a copy, a row that folds reads the copy each side rounded from its own fp32 fold: a few entries
        # land on neighbouring bf16 values: test_read_copy.py's bounds.
        tol, checkpoint_tol = (1e-5, 1e-5) if read_dtype is None else (1e-4, 5e-6)
        assert rel_err(o.cpu(), o_ref) < tol
        if not commit:
            accepted = torch.tensor([num_tokens, 1, 0])
            ours.commit(accepted.to(device), rows.to(device))
            theirs.commit(accepted, rows)
        if read_dtype is not None:  # two fp32 folds may round to neighbouring copy values: compare from the same copy
            theirs.read_checkpoint.copy_(ours.read_checkpoint.cpu())
        for name, t in ours.tensors().items():
            if t.is_floating_point():
                assert rel_err(t.cpu(), getattr(theirs, name)) < (checkpoint_tol if name == "checkpoint" else tol), name
            else:
                assert torch.equal(t.cpu(), getattr(theirs, name)), name
    assert folds >= 3


@pytest.mark.parametrize("device", DEVICES)
def test_conventional_fused_gates_match_reference(device):
    batch, key_heads, value_heads, key_dim, value_dim, num_tokens = 3, 1, 2, 16, 16, 2
    gen = _gen()
    rows = torch.tensor([2, 0, 1], device=device)
    state = (torch.randn(batch, value_heads, value_dim, key_dim, generator=gen) * 0.3).to(device)
    theirs = state.clone()
    A_log, dt_bias = (torch.randn(value_heads, generator=gen).to(device) for _ in range(2))
    for _ in range(2):
        q, k, v, _, _ = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, device, gen, num_tokens=num_tokens)
        a, b = (t.to(device) for t in _raw_gate_inputs(batch, num_tokens, value_heads, gen))
        o_ref = gdn_ref.gdn_conventional_step(q, k, v, a, b, theirs, rows, True, None, A_log, dt_bias)
        o = torch.full_like(v, float("nan"))
        conventional.gdn_conventional_step_out(q, k, v, a, b, state, rows, True, None, o=o, A_log=A_log, dt_bias=dt_bias)
        assert rel_err(o, o_ref) < 1e-5
        assert rel_err(state, theirs) < 1e-5


@pytest.mark.parametrize("b_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_gates_are_the_models_gates(b_dtype):
    """The reference's fused gates equal what the models compute before the op: Hugging Face's
    ``-A_log.float().exp() * softplus(a.float() + dt_bias)`` and ``b.sigmoid()`` (beta in b's dtype)."""
    gen = _gen()
    a, b = _raw_gate_inputs(4, 3, 5, gen, b_dtype)
    A_log, dt_bias = torch.randn(5, generator=gen), torch.randn(5, generator=gen)
    g, beta = gdn_ref.gates(a, b, A_log, dt_bias, torch.float32)
    assert torch.equal(g, -A_log.float().exp() * F.softplus(a.float() + dt_bias))
    assert torch.equal(beta, b.sigmoid().float())
    assert torch.equal(gdn_ref.gates(a, b, None, None, torch.float32)[1], b.float())  # precomputed: as given


# ---------------------------------------------------------------------------
# GPU only
# ---------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("launches", LAUNCH_FORMS)
def test_long_run_tracks_float64_recurrence(launches):
    """4096 steps (819 flushes per row): the fp32 checkpoint stays within 1e-5 of a float64 recurrence."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 4, 2, 4, 128, 128, 5
    gen = _gen()
    dev = "cuda"
    rows = torch.arange(batch, device=dev)
    state = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, dev, gen)
    for t in (state[0], state[2]):
        t.zero_()
    state[4].copy_(torch.arange(batch, dtype=torch.int32) % window)
    exact = torch.zeros(batch, value_heads, value_dim, key_dim, dtype=torch.float64, device=dev)
    rep = value_heads // key_heads
    worst = 0.0
    for _ in range(4096):
        q, k, v, g, beta = _inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.float32, dev, gen)
        before = exact.clone()
        flushing = state[4] == window
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(q, k, v, g, beta, *state, rows, True, True, None, o=o, **launches)
        kn = k[:, 0].double() * torch.rsqrt((k[:, 0].double() ** 2).sum(-1, keepdim=True) + 1e-6)
        kh = kn.repeat_interleave(rep, dim=1)  # (batch, value_heads, K)
        prev = torch.exp(g[:, 0].double())[..., None, None] * exact
        d = beta[:, 0].double()[..., None] * (v[:, 0].double() - torch.einsum("bhvk,bhk->bhv", prev, kh))
        exact = prev + d[..., None] * kh[:, :, None, :]
        if bool(flushing.any()):
            f = flushing.nonzero()[:, 0]
            err = float((state[0][f].double() - before[f]).norm() / before[f].norm())
            worst = max(worst, err)
    assert worst < 1e-5, worst


def _assert_graph_replays_eager(step, token_counts):
    """``step(inputs, state, rows) -> output`` over steps of the given token counts: run eagerly on one
    copy of a state (warm-up and expected result), then captured on another in one CUDA graph and
    replayed: outputs and state equal exactly."""
    batch, key_heads, value_heads, key_dim, value_dim, window = 5, 2, 4, 128, 128, 4
    gen = _gen()
    dev = "cuda"
    rows = torch.arange(batch, device=dev)
    ours = _state(batch, key_heads, value_heads, key_dim, value_dim, window, torch.float32, dev, gen)
    eager = [t.clone() for t in ours]
    steps = [_inputs(batch, key_heads, value_heads, key_dim, value_dim, torch.bfloat16, dev, gen, num_tokens=n) for n in token_counts]
    expected = [step(inp, eager, rows) for inp in steps]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            outs = [step(inp, ours, rows) for inp in steps]
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    for o, o_ref in zip(outs, expected):
        assert torch.equal(o, o_ref)
    for a, b in zip(ours, eager):
        assert torch.equal(a, b)


@pytest.mark.cuda
def test_registered_op_and_cuda_graph():
    """The op dispatches to the kernels on CUDA; a captured window of steps replays exactly like eager steps."""
    import replayssm

    _assert_graph_replays_eager(lambda inp, state, rows: replayssm.ops.gdn_step(*inp, *state, rows, True, True, None, None, None), [1] * 4)


@pytest.mark.cuda
def test_three_launches_cuda_graph():
    """The three-launch form (T = 1, 2, 3), captured over two
    windows of steps (rows fold): the replay equals eager steps exactly."""

    def step(inp, state, rows):
        o = torch.empty_like(inp[2])
        kernels.gdn_step_out(*inp, *state, rows, True, True, None, o=o, decode_launches=3)
        return o

    _assert_graph_replays_eager(step, [1 + i % 3 for i in range(8)])
