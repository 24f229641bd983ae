"""The checkpoint's low-precision read copy (SPEC §4, ``ReplayConfig.read_dtype``).

What must hold: every output reads the copy, never the checkpoint; a flush writes both copies from the
fp32 fold (an fp8 e4m3 copy, Mamba-2 only: values and a scale per state row, bitwise torch's quantisation
of the fp32 checkpoint, kernels included); Mamba-2's recurrence (``materialize``) stays within 1e-5 of the float64 one, since its reads
never feed it, and GDN's stays there too, its fold correcting the ring's d, formed against the copy
(``ring_beta``); the Triton kernels (interpreter on the CPU, and CUDA) match the reference with a copy,
for decoding and for verification with rollback; bad copies are refused before anything is written.
"""

from __future__ import annotations

import pytest
import torch
from _cases import GDNPair, Mamba2Pair, accept, gdn_inputs, mamba2_inputs, mamba2_params
from _triton_devices import DEVICES
from naive import rel_err

from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig
from replayssm.ops.gdn import reference as gdn_ref
from replayssm.ops.mamba2 import reference as mamba2_ref
from replayssm.ops.replay_math import quantize_rows_e4m3, read_copy

FP8 = torch.float8_e4m3fn
READ_DTYPES = [pytest.param(torch.bfloat16, id="read_bf16"), pytest.param(torch.float16, id="read_fp16")]
MAMBA2_READ_DTYPES = READ_DTYPES + [pytest.param(FP8, id="read_fp8")]
MAMBA2 = Mamba2Geometry(heads=4, head_dim=8, state_size=16, groups=2)
GDN = GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16)


def _bits(t):
    """``t`` for ``torch.equal``, which has no fp8 kernel on the CPU: fp8 as its bytes."""
    return t.view(torch.uint8) if t.dtype == FP8 else t


def _read_values(state):
    """The read copy as the steps read it, in fp32 (an fp8 copy times its row scales)."""
    return read_copy(state.read_checkpoint, state.read_scale, torch.arange(state.slots, device=state.device), torch.float32)


def _assert_copy_of_checkpoint(state):
    """The copy is the checkpoint rounded to its dtype (an fp8 copy: quantised by rows, scales included), bit for bit."""
    if state.read_scale is None:
        assert torch.equal(state.read_checkpoint, state.checkpoint.to(state.read_checkpoint.dtype))
        return
    values, scale = quantize_rows_e4m3(state.checkpoint)
    assert torch.equal(_bits(state.read_checkpoint), _bits(values)) and torch.equal(state.read_scale, scale)


def _twin(state, reads="copy"):
    """A state without a read copy whose checkpoint is the read copy's values (in fp32; ``reads="checkpoint"``:
    the checkpoint's), rings and cursors copied: its outputs are what reading that copy must give, for rows
    that do not fold."""
    config = ReplayConfig(window=state.window)
    twin = type(state)(state.geometry, state.slots, config) if isinstance(state, GDNReplayState) else type(state)(
        state.geometry, state.slots, config, activation_dtype=state.activation_dtype
    )
    for name, t in state.tensors().items():
        if name not in ("read_checkpoint", "read_scale", "ring_beta"):
            getattr(twin, name).copy_(t)
    twin.checkpoint.copy_(_read_values(state) if reads == "copy" else state.checkpoint.float())
    return twin


def _loaded_pair(cls, geometry, slots, window, read_dtype, seed, scale):
    """A replay state with a copy and its float64 twin, both starting from the same random checkpoint."""
    gen = torch.Generator().manual_seed(seed)
    pair = cls(geometry, slots, ReplayConfig(window=window, read_dtype=read_dtype), gen)
    pair.state.load(torch.randn((slots,) + tuple(pair.state.checkpoint.shape[1:]), generator=gen) * scale)
    pair.naive.state.copy_(pair.state.checkpoint.double())
    return pair, pair.state


@pytest.mark.parametrize("read_dtype", MAMBA2_READ_DTYPES)
def test_mamba2_outputs_read_the_copy_and_the_recurrence_stays_exact(read_dtype):
    window, slots = 4, 3
    pair, state = _loaded_pair(Mamba2Pair, MAMBA2, slots, window, read_dtype, seed=11, scale=0.5)
    flushes = 0
    for step in range(5 * window):
        T = 1 if step % 3 else 2
        rows = [2, 0, 1]
        folding = [int(state.cursor[r]) + T > window for r in rows]
        flushes += sum(folding)
        twin = _twin(state)
        x, dt, B, C, z = mamba2_inputs(MAMBA2, 3, T, torch.Generator().manual_seed(step))
        p = pair.params
        y_twin = twin.step(x, dt, p.A, B, C, p.D, p.dt_bias, z, rows=rows, commit=False)
        pair.gen.manual_seed(step)  # the pair draws the same inputs
        y, expected, candidates = pair.step(rows, T, commit=False)
        for b, folds in enumerate(folding):
            if not folds:
                assert torch.equal(y[b], y_twin[b])
        assert rel_err(y, expected) < (4e-2 if read_dtype == FP8 else 2e-2)  # fp8: 2^-4 per value at worst
        accepted = [T, T - 1 if T > 1 else 1, 0]
        state.commit(accepted, rows)
        accept(pair, rows, candidates, accepted)
        # The copy is the checkpoint rounded (both from the same fp32 fold), and the recurrence is exact.
        _assert_copy_of_checkpoint(state)
        assert rel_err(state.materialize(), pair.naive.state) < 1e-5
    assert flushes >= 4


@pytest.mark.parametrize("read_dtype", READ_DTYPES)
def test_gdn_reads_the_copy_for_both_products_and_the_recurrence_stays_exact(read_dtype):
    """Decoding's outputs and corrected updates come from the copy (S q and S k), so each ring d is the update
    of the state the steps read; the fold (and ``materialize``) corrects them with the ring's betas, so the
    recurrence stays within 1e-5 of the float64 one (SPEC §4), across flushes and verification.

    Verification (T > 1) reads the checkpoint: its d are exact and stored with beta +0. A row whose ring
    ends in decode steps' entries folds first (their corrections need the fold)."""
    window, slots = 4, 3
    pair, state = _loaded_pair(GDNPair, GDN, slots, window, read_dtype, seed=12, scale=0.3)
    flushes, transition_folds, drift, reads = 0, 0, 0.0, {"copy": 0, "checkpoint": 0}
    for step in range(8 * window):
        T = (1, 3, 3, 1, 2, 3)[step % 6]
        rows = [1, 2, 0]
        ends_with_copy = [int(state.cursor[r]) > 0 and bool(state.ring_beta[r, int(state.cursor[r]) - 1].any()) for r in rows]
        full = [int(state.cursor[r]) + T > window for r in rows]
        folding = [f or (T > 1 and e) for f, e in zip(full, ends_with_copy)]
        flushes += sum(folding)
        transition_folds += sum(fo and not f for fo, f in zip(folding, full))
        twins = {"copy": _twin(state), "checkpoint": _twin(state, reads="checkpoint")}
        q, k, v, g, beta = gdn_inputs(GDN, 3, T, torch.Generator().manual_seed(step))
        o_twin = {name: twin.step(q, k, v, g, beta, rows=rows, commit=False, use_qk_l2norm=True) for name, twin in twins.items()}
        pair.gen.manual_seed(step)
        o, expected, candidates = pair.step(rows, T, commit=False)
        for b, folds in enumerate(folding):
            c = int(state.cursor[rows[b]])
            assert int(c == 0) >= int(folds)  # a folding row's entries start at 0
            # beta +0 exactly where the step read the checkpoint (verification)
            assert bool(state.ring_beta[rows[b], c : c + T].any()) == (T == 1)
            if not folds:
                read = "copy" if T == 1 else "checkpoint"
                reads[read] += 1
                assert torch.equal(o[b], o_twin[read][b])
                # the pending d entries too: S k came from the state read
                assert torch.equal(state.ring_d[rows[b], c : c + T], twins[read].ring_d[rows[b], c : c + T])
        assert rel_err(o, expected) < 3e-2
        accepted = [T, 1, 0]
        state.commit(accepted, rows)
        accept(pair, rows, candidates, accepted)
        assert torch.equal(state.read_checkpoint, state.checkpoint.to(read_dtype))
        drift = max(drift, rel_err(state.materialize(), pair.naive.state))
    assert flushes >= 4 and transition_folds >= 2, (flushes, transition_folds)
    assert min(reads.values()) >= 3, reads
    assert drift < 1e-5, drift


@pytest.mark.parametrize("read_dtype", READ_DTYPES)
def test_gdn_partial_folds_with_a_copy_stay_exact(read_dtype):
    """What the Hugging Face cache does between verifications: partial folds (``fold(m)``, with pending
    entries beyond the folded ones), and verifications whose drafts are partly rejected. A partial fold
    settles the entries it keeps (their d made exact, their beta zeroed: the copy they were formed against
    is replaced), so the recurrence stays within 1e-5 of the float64 one, and the fold of settled entries
    is the plain one."""
    window = 8
    pair, state = _loaded_pair(GDNPair, GDN, 2, window, read_dtype, seed=15, scale=0.3)
    rows, drift, settled = [0, 1], 0.0, 0
    for step in range(24):
        T = 3
        o, expected, candidates = pair.step(rows, T, commit=False)
        assert rel_err(o, expected) < 3e-2
        if step % 3 == 1:  # fold the first committed entries while the T entries are pending
            count = [min(2, int(c)) for c in state.cursor.tolist()]
            state.fold(count, rows)
            kept = [int(c) + T for c in state.cursor.tolist()]
            for r in rows:
                assert not bool(state.ring_beta[r, : kept[r]].any())  # every kept entry settled
                settled += kept[r]
            assert torch.equal(state.read_checkpoint, state.checkpoint.to(read_dtype))
        accepted = [T, 1] if step % 2 else [2, 0]
        state.commit(accepted, rows)
        accept(pair, rows, candidates, accepted)
        drift = max(drift, rel_err(state.materialize(), pair.naive.state))
    assert settled > 0
    assert drift < 1e-5, drift


@pytest.mark.parametrize("read_dtype", [pytest.param(torch.bfloat16, id="read_bf16"), pytest.param(FP8, id="read_fp8")])
def test_row_operations_keep_the_copy(read_dtype):
    """load, reset, fold, reorder, select and resized carry the copy (and an fp8 copy's scales) along with the
    checkpoint."""
    gen = torch.Generator().manual_seed(13)
    state = Mamba2ReplayState(MAMBA2, 3, ReplayConfig(window=4, read_dtype=read_dtype))
    initial = torch.randn(3, 4, 8, 16, generator=gen, dtype=torch.float64)
    state.load(initial)
    if read_dtype == FP8:
        _assert_copy_of_checkpoint(state)  # quantised from the fp32 checkpoint
    else:
        assert torch.equal(state.read_checkpoint, initial.to(read_dtype))  # rounded from the given state
    p = mamba2_params(MAMBA2, gen)
    for _ in range(3):
        x, dt, B, C, z = mamba2_inputs(MAMBA2, 3, 1, gen)
        state.step(x, dt, p.A, B, C, p.D, p.dt_bias, z)

    before = _read_values(state)
    state.fold([2, 1, 0], rows=[0, 1, 2])
    _assert_copy_of_checkpoint(state)
    assert not torch.equal(_read_values(state)[0], before[0]) and torch.equal(_read_values(state)[2], before[2])
    state.reorder([2, 2, 0])
    _assert_copy_of_checkpoint(state)
    assert torch.equal(_read_values(state)[0], _read_values(state)[1])
    _assert_copy_of_checkpoint(state.select([1]))
    _assert_copy_of_checkpoint(state.resized(8))
    assert state.select([1]).read_checkpoint.dtype == read_dtype
    state.reset([1])
    _assert_copy_of_checkpoint(state)
    assert not bool(_read_values(state)[1].any())
    copy_bytes = state.read_checkpoint.numel() * read_dtype.itemsize + (state.read_scale.numel() * 4 if read_dtype == FP8 else 0)
    assert state.nbytes - Mamba2ReplayState(MAMBA2, 3, ReplayConfig(window=4)).nbytes == copy_bytes


def _gdn_args(state):
    return (state.checkpoint, state.ring_k, state.ring_d, state.ring_g, state.cursor, state.pending)


def _mamba2_args(state):
    return (state.checkpoint, state.ring_x, state.ring_B, state.ring_dt, state.ring_logdecay, state.cursor, state.pending)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda ck: ck.float(), "dtype"),
        (lambda ck: ck[:, :1].to(torch.bfloat16), "shape"),
        (lambda ck: ck.to(torch.bfloat16).transpose(2, 3).contiguous().transpose(2, 3), "strides"),
    ],
    ids=["fp32", "shape", "strides"],
)
def test_bad_read_copy_is_refused_before_any_write(bad, message):
    gen = torch.Generator().manual_seed(14)
    state = GDNReplayState(GDN, 2, ReplayConfig(window=3))
    state.load(torch.randn(2, 2, 16, 16, generator=gen))
    state.cursor.fill_(3)  # the step would fold
    before = {name: t.clone() for name, t in state.tensors().items()}
    q, k, v, g, beta = gdn_inputs(GDN, 2, 1, gen)
    from replayssm import ops

    with pytest.raises((ValueError, TypeError), match=f"read_checkpoint.*{message}"):
        ops.gdn_step(q, k, v, g, beta, *_gdn_args(state), torch.arange(2), True, True, None, bad(state.checkpoint), state.ring_beta)
    for name, t in state.tensors().items():
        assert torch.equal(t, before[name]), name


def test_gdn_ring_beta_is_checked_before_any_write():
    """The ring of betas goes with the read copy: missing, misshapen or strided differently from ring_g it
    is refused, as is one passed without a copy; the state is left as it was."""
    gen = torch.Generator().manual_seed(16)
    state = GDNReplayState(GDN, 2, ReplayConfig(window=3, read_dtype=torch.bfloat16))
    state.load(torch.randn(2, 2, 16, 16, generator=gen))
    state.cursor.fill_(3)  # the step would fold
    before = {name: t.clone() for name, t in state.tensors().items()}
    q, k, v, g, beta = gdn_inputs(GDN, 2, 1, gen)
    from replayssm import ops

    strided = torch.zeros(2, 2, 3, dtype=torch.float32).transpose(1, 2)  # ring_g's shape, other strides
    cases = [
        (None, "ring_beta.*required"),
        (state.ring_beta[:, :2], "ring_beta.*shape"),
        (strided, "ring_beta.*strides"),
    ]
    for ring_beta, message in cases:
        with pytest.raises(ValueError, match=message):
            ops.gdn_step(q, k, v, g, beta, *_gdn_args(state), torch.arange(2), True, True, None, state.read_checkpoint, ring_beta)
    with pytest.raises(ValueError, match="ring_beta.*only used with a read_checkpoint"):
        ops.gdn_step(q, k, v, g, beta, *_gdn_args(state), torch.arange(2), True, True, None, None, state.ring_beta)
    for name, t in state.tensors().items():
        assert torch.equal(t, before[name]), name


def test_config_refuses_other_read_dtypes():
    with pytest.raises(ValueError, match="read_dtype"):
        ReplayConfig(read_dtype=torch.float32)


# --- Triton kernels against the reference, both with a copy -------------------------------------------


def _pair_of_states(cls, geometry, slots, window, read_dtype, device, gen, **kw):
    ours = cls(geometry, slots, ReplayConfig(window=window, read_dtype=read_dtype), device=device, **kw)
    scale = 0.3 if cls is GDNReplayState else 0.5
    ours.load(torch.randn((slots,) + tuple(ours.checkpoint.shape[1:]), generator=gen) * scale)
    ours.cursor.copy_(torch.arange(slots, dtype=torch.int32) % (window + 1))  # staggered; the rings hold zeros
    theirs = cls(geometry, slots, ReplayConfig(window=window, read_dtype=read_dtype), device="cpu", **kw)
    for name, t in ours.tensors().items():
        getattr(theirs, name).copy_(t.cpu())
    return ours, theirs


def _check_copy_and_share_it(ours, theirs):
    """The kernels store both copies from one fp32 fold (the checkpoint is fp32), so the copy is exactly
    the checkpoint rounded to nearest (under the interpreter too: tests/conftest.py; an fp8 copy's values
    and scales are torch's quantisation of it). The reference then takes the kernels' copy, so that the
    next steps compare arithmetic on the same values (a few entries of two fp32 folds summed in different
    orders may round to neighbouring 16-bit values, or change a row's scale by an ulp)."""
    _assert_copy_of_checkpoint(ours)
    theirs.read_checkpoint.copy_(ours.read_checkpoint.cpu())
    if ours.read_scale is not None:
        theirs.read_scale.copy_(ours.read_scale.cpu())


def _compare_states(ours, theirs, tol, checkpoint_tol=None):
    """Every state tensor within ``tol`` (the checkpoint within ``checkpoint_tol`` if given), cursors equal."""
    _check_copy_and_share_it(ours, theirs)
    for name, t in ours.tensors().items():
        if name in ("read_checkpoint", "read_scale"):
            continue
        elif t.is_floating_point():
            bound = checkpoint_tol if name == "checkpoint" and checkpoint_tol is not None else tol
            assert rel_err(t.cpu(), getattr(theirs, name)) < bound, name
        else:
            assert torch.equal(t.cpu(), getattr(theirs, name)), name


def _gdn_forms():
    from replayssm.ops.launch import LaunchConfig

    return {
        "tables": {},
        "worklist-fold": dict(flush_config=LaunchConfig(16, 2, 4, form="worklist", programs_per_sm=1)),  # half heads
        "grid-fold": dict(flush_config=LaunchConfig(16, 1, 4)),  # a program per (value head, row)
        "mma": dict(config=LaunchConfig(16, 1, 1, form="mma")),
    }


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "read_dtype, form",
    [
        *(pytest.param(*p.values, None, id=p.id) for p in MAMBA2_READ_DTYPES),
        # the main launch's token block (T > 1) reading an fp8 copy: each row's scale after the N chunks' sum
        pytest.param(FP8, "tokens_prefetched", id="read_fp8-tokens-prefetched"),
    ],
)  # fmt: skip
def test_mamba2_kernels_match_reference_with_read_copy(read_dtype, form, device):
    """Decode and verify steps through the kernels and the reference; with an fp8 copy the fold's
    quantisation (flush launch) is bitwise torch's, and the outputs read it dequantised (flush launch for
    T = 1 folding rows, main launch otherwise)."""
    kernels = pytest.importorskip("replayssm.ops.mamba2.kernels", reason="needs Triton")
    from replayssm.ops.launch import LaunchConfig

    config = LaunchConfig(8, 2, 1, 3, form=form) if form else None
    gen = torch.Generator().manual_seed(21)
    geometry, window, slots = Mamba2Geometry(heads=4, head_dim=16, state_size=16, groups=2), 4, 4
    ours, theirs = _pair_of_states(Mamba2ReplayState, geometry, slots, window, read_dtype, device, gen)
    p = mamba2_params(geometry, gen)
    A, D, dt_bias = (t.to(device) for t in (p.A, p.D, p.dt_bias))
    rows = torch.tensor([3, 1, 0], device=device)
    flushes = 0
    for step in range(4 * window):
        T = (1, 1, 2, 3)[step % 4]
        commit = T == 1
        x, dt, B, C, z = (t.to(device) for t in mamba2_inputs(geometry, 3, T, gen, dtype=torch.bfloat16))
        flushes += int((ours.cursor[rows] + T > window).sum())
        y_ref = mamba2_ref.mamba2_step(
            x.cpu(), dt.cpu(), p.A, B.cpu(), C.cpu(), p.D, p.dt_bias, z.cpu(), *_mamba2_args(theirs), rows.cpu(), commit, True,
            theirs.read_checkpoint, theirs.read_scale,
        )  # fmt: skip
        y = torch.full_like(x, float("nan"))
        kernels.mamba2_step_out(
            x, dt, A, B, C, D, dt_bias, z, *_mamba2_args(ours), rows, commit, True, y=y, config=config if T > 1 else None,
            read_checkpoint=ours.read_checkpoint, read_scale=ours.read_scale,
        )  # fmt: skip
        assert rel_err(y.cpu(), y_ref) < 1e-2  # bf16 outputs
        if not commit:
            accepted = torch.tensor([T, 1, 0])
            ours.commit(accepted.to(device), rows)
            theirs.commit(accepted, rows.cpu())
        _compare_states(ours, theirs, 1e-5)
    assert flushes >= 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "form",
    ["tables", "worklist-fold", "grid-fold", "mma"],
)  # fmt: skip
@pytest.mark.parametrize("read_dtype", READ_DTYPES)
def test_gdn_kernels_match_reference_with_read_copy(read_dtype, form, device):
    geometry = GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=32)
    _gdn_kernels_against_reference_with_read_copy(geometry, read_dtype, device, _gdn_forms()[form])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("key_dim", [48, 64])
def test_gdn_read_copy_fold_at_wider_key_dims(key_dim, device):
    """The tables' fold at key dims past the other tests' 16: 48 (a partly masked 64-wide key block) and 64."""
    geometry = GDNGeometry(key_heads=1, value_heads=2, key_dim=key_dim, value_dim=32)
    _gdn_kernels_against_reference_with_read_copy(geometry, torch.bfloat16, device, {})


def _gdn_kernels_against_reference_with_read_copy(geometry, read_dtype, device, launch_kwargs):
    """Decode and verify steps (T = 1, 1, 2, 3, window 4, rows at different ring positions) through the kernels
    with ``launch_kwargs`` and through the reference, against states that read a copy: outputs and every state
    tensor compared after each step."""
    kernels = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
    gen = torch.Generator().manual_seed(22)
    window, slots = 4, 4
    ours, theirs = _pair_of_states(GDNReplayState, geometry, slots, window, read_dtype, device, gen)
    rows = torch.tensor([2, 3, 0], device=device)
    flushes = 0
    for step in range(4 * window):
        T = (1, 1, 2, 3)[step % 4]
        commit = T == 1
        q, k, v, g, beta = (t.to(device) for t in gdn_inputs(geometry, 3, T, gen))
        flushes += int((ours.cursor[rows] + T > window).sum())
        inputs = (q, k, v, g, beta)
        o_ref = gdn_ref.gdn_step(*(t.cpu() for t in inputs), *_gdn_args(theirs), rows.cpu(), commit, True, None, theirs.read_checkpoint, theirs.ring_beta)
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(
            *inputs, *_gdn_args(ours), rows, commit, True, None, o=o, read_checkpoint=ours.read_checkpoint, ring_beta=ours.ring_beta,
            **launch_kwargs,
        )
        assert rel_err(o.cpu(), o_ref) < 1e-4
        if not commit:
            accepted = torch.tensor([T, 1, 0])
            ours.commit(accepted.to(device), rows)
            theirs.commit(accepted, rows.cpu())
        # The checkpoint to 5e-6: the exact fold's corrections are of the copy's rounding, so a fold without
        # them still lands within 1e-4 (3.5e-5 with an fp16 copy); the kernels' own differences are 5e-7.
        _compare_states(ours, theirs, 1e-4, checkpoint_tol=5e-6)
    assert flushes >= 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["tables", "grid-fold", "mma"])
def test_gdn_verification_with_a_copy_reads_the_checkpoint_and_folds_plainly(form, device):
    """Verification with a copy reads the checkpoint. After decode steps (entries formed against the copy;
    one row's value head 0 with beta exactly 0, stored as -0), the first verify step folds every row whose
    ring ends in such entries, exactly; from then on every entry is exact (beta +0) and every fold plain.
    The kernels match the reference with the copy throughout, and from the first verify step on their
    outputs and state match the same kernels without a copy (T = 2..4, random accepted counts, window 8)."""
    kernels = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
    gen = torch.Generator().manual_seed(24)
    geometry, window, slots = GDNGeometry(key_heads=2, value_heads=4, key_dim=16, value_dim=32), 8, 3
    ours, theirs = _pair_of_states(GDNReplayState, geometry, slots, window, torch.bfloat16, device, gen)
    rows = torch.tensor([2, 0, 1], device=device)
    launch = _gdn_forms()[form]

    def step(inputs, commit):
        o_ref = gdn_ref.gdn_step(*(t.cpu() for t in inputs), *_gdn_args(theirs), rows.cpu(), commit, True, None, theirs.read_checkpoint, theirs.ring_beta)
        o = torch.full_like(inputs[2], float("nan"))
        kernels.gdn_step_out(
            *inputs, *_gdn_args(ours), rows, commit, True, None, o=o, read_checkpoint=ours.read_checkpoint, ring_beta=ours.ring_beta, **launch
        )
        assert rel_err(o.cpu(), o_ref) < 1e-4
        _compare_states(ours, theirs, 1e-4, checkpoint_tol=5e-6)
        return o

    for _ in range(2):  # decode steps: entries formed against the copy
        q, k, v, g, beta = gdn_inputs(geometry, 3, 1, gen)
        beta[0, :, 0] = 0.0  # row 2, value head 0: a beta of 0, stored as -0 (the mark)
        step(tuple(t.to(device) for t in (q, k, v, g, beta)), True)
    assert torch.signbit(ours.ring_beta[2, int(ours.cursor[2]) - 1, 0]).item()
    ends_with_copy = (ours.cursor[rows] > 0).cpu()
    assert bool(ends_with_copy.all())
    plain = GDNReplayState(geometry, slots, ReplayConfig(window=window), device=device)  # the same kernels, no copy
    for i in range(6 * window):
        T = 2 + i % 3
        inputs = tuple(t.to(device) for t in gdn_inputs(geometry, 3, T, gen))
        o = step(inputs, False)
        if i == 0:
            # Every row ended in decode entries, so every row folded (exactly) first; the twin starts here.
            assert bool((ours.cursor[rows] == 0).all())
            for name, t in ours.tensors().items():
                if name not in ("read_checkpoint", "ring_beta"):
                    getattr(plain, name).copy_(t)
        else:
            o_plain = torch.full_like(inputs[2], float("nan"))
            kernels.gdn_step_out(*inputs, *_gdn_args(plain), rows, False, True, None, o=o_plain, **launch)
            assert rel_err(o, o_plain) < 1e-6
        # every committed and pending entry is exact now: beta +0 (no -0 marks)
        for r in rows.tolist():
            live = ours.ring_beta[r, : int(ours.cursor[r]) + int(ours.pending[r])]
            assert not bool(live.any()) and not bool(torch.signbit(live).any())
        accepted = torch.randint(0, T + 1, (3,), generator=gen)
        ours.commit(accepted.to(device), rows)
        theirs.commit(accepted, rows.cpu())
        plain.commit(accepted.to(device), rows)
        assert rel_err(ours.checkpoint, plain.checkpoint) < 1e-6
        assert rel_err(ours.materialize(), plain.materialize()) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["tables", "grid-fold"])
def test_gdn_read_copy_fold_of_a_full_ring_of_aligned_keys(form, device):
    """The exact fold over a full window-16 ring whose keys nearly align and whose betas are near 1: there
    the coupling between entries is strong, so every power of the blocked form's ``A`` (up to ``A^15``)
    shapes the corrections; the small-window test above never reaches past ``A^3``."""
    kernels = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
    gen = torch.Generator().manual_seed(23)
    geometry, window, slots = GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16), 16, 3
    ours, theirs = _pair_of_states(GDNReplayState, geometry, slots, window, torch.bfloat16, device, gen)
    ours.cursor.copy_(torch.tensor([0, 5, 11], dtype=torch.int32))
    theirs.cursor.copy_(ours.cursor.cpu())
    rows = torch.tensor([0, 1, 2], device=device)
    direction = torch.randn(geometry.key_dim, generator=gen)
    flushes = 0
    for _ in range(2 * window + 2):
        q, _, v, _, _ = gdn_inputs(geometry, slots, 1, gen)
        k = direction + 0.1 * torch.randn(slots, 1, geometry.key_heads, geometry.key_dim, generator=gen)
        g = -0.02 * torch.rand(slots, 1, geometry.value_heads, generator=gen)
        beta = 0.9 + 0.09 * torch.rand(slots, 1, geometry.value_heads, generator=gen)
        inputs = (q, k, v, g, beta)
        flushes += int((ours.cursor[rows] + 1 > window).sum())
        o_ref = gdn_ref.gdn_step(*inputs, *_gdn_args(theirs), rows.cpu(), True, True, None, theirs.read_checkpoint, theirs.ring_beta)
        o = torch.full_like(v, float("nan"), device=device)
        kernels.gdn_step_out(
            *(t.to(device) for t in inputs), *_gdn_args(ours), rows, True, True, None, o=o,
            read_checkpoint=ours.read_checkpoint, ring_beta=ours.ring_beta, **_gdn_forms()[form],
        )  # fmt: skip
        assert rel_err(o.cpu(), o_ref) < 1e-4
        _compare_states(ours, theirs, 1e-4, checkpoint_tol=5e-6)
    assert flushes >= 6


def test_kernel_forms_a_read_copy_cannot_use_are_refused():
    kernels_m = pytest.importorskip("replayssm.ops.mamba2.kernels", reason="needs Triton")
    kernels_g = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
    gen = torch.Generator().manual_seed(23)
    m = Mamba2ReplayState(MAMBA2, 2, ReplayConfig(window=4, read_dtype=torch.bfloat16))
    p = mamba2_params(MAMBA2, gen)
    x, dt, B, C, z = mamba2_inputs(MAMBA2, 2, 1, gen)
    with pytest.raises(ValueError, match="fold_in_main"):
        kernels_m.mamba2_step_out(
            x, dt, p.A, B, C, p.D, p.dt_bias, z, *_mamba2_args(m), torch.arange(2), True, True, y=torch.empty_like(x),
            fold_in_main=True, read_checkpoint=m.read_checkpoint,
        )  # fmt: skip
    s = GDNReplayState(GDN, 2, ReplayConfig(window=4, read_dtype=torch.bfloat16))
    q, k, v, g, beta = gdn_inputs(GDN, 2, 1, gen)
    with pytest.raises(ValueError, match="single decode kernel"):
        kernels_g.gdn_step_out(
            q, k, v, g, beta, *_gdn_args(s), torch.arange(2), True, True, None, o=torch.empty_like(v), decode_launches=1,
            read_checkpoint=s.read_checkpoint, ring_beta=s.ring_beta,
        )  # fmt: skip


# --- the fp8 e4m3 copy (Mamba-2): rounding, the read error's bound, bad scales, GDN's refusal ----------


def test_fp8_reads_stay_within_the_e4m3_bound():
    """Outputs read through an fp8 copy, against the same steps reading the fp32 checkpoint (no copy), with
    an empty ring so that the outputs differ only by the checkpoint term ``exp(dt A) (S' - S) C``. Each
    copied value ``S'`` is within ``2^-4 |S| + 2^-10 scale`` of ``S`` (half an e4m3 ulp relative, 3 mantissa
    bits; the absolute term: the subnormal grid 2^-9 times the row's scale), so each output is within
    ``exp(dt A) sum_n (2^-4 |S_n| + 2^-10 scale) |C_n|`` (plus fp32 rounding)."""
    gen = torch.Generator().manual_seed(43)
    slots = 3
    fp8 = Mamba2ReplayState(MAMBA2, slots, ReplayConfig(window=4, read_dtype=FP8))
    exact = Mamba2ReplayState(MAMBA2, slots, ReplayConfig(window=4))
    decayed = torch.exp(-torch.linspace(0, 10, MAMBA2.state_size))  # a state with rows over four decades
    S = torch.randn(slots, MAMBA2.heads, MAMBA2.head_dim, MAMBA2.state_size, generator=gen) * decayed
    fp8.load(S)
    exact.load(S)
    S_read = _read_values(fp8)
    scale = fp8.read_scale[..., None]
    assert bool(((S_read - S).abs() <= 2.0**-4 * S.abs() + 2.0**-10 * scale).all())
    p = mamba2_params(MAMBA2, gen)
    x, dt, B, C, _ = mamba2_inputs(MAMBA2, slots, 1, gen)
    y8 = fp8.step(x, dt, p.A, B, C, p.D, p.dt_bias, None)
    y32 = exact.step(x, dt, p.A, B, C, p.D, p.dt_bias, None)
    decay = torch.exp(torch.nn.functional.softplus(dt[:, 0] + p.dt_bias) * p.A)  # (slots, heads)
    C_heads = C[:, 0].abs().repeat_interleave(MAMBA2.heads // MAMBA2.groups, dim=1)  # (slots, heads, N)
    per_value = 2.0**-4 * S.abs() + 2.0**-10 * scale
    bound = decay[..., None] * torch.einsum("shpn,shn->shp", per_value, C_heads)
    slack = 1e-5 * decay[..., None] * torch.einsum("shpn,shn->shp", S.abs(), C_heads)
    assert bool(((y8[:, 0] - y32[:, 0]).abs() <= bound + slack).all())
    assert 1e-3 < rel_err(y8, y32) < 2.0**-4


@pytest.mark.parametrize(
    "make_scale, error, message",
    [
        (lambda s: None, ValueError, "read_scale.*required"),
        (lambda s: s.read_scale[:, :1], ValueError, "read_scale.*shape"),
        (lambda s: s.read_scale.half(), TypeError, "read_scale.*dtype"),
        (lambda s: s.checkpoint[..., 0], ValueError, "read_scale.*share storage"),  # the checkpoint's own storage
    ],
    ids=["missing", "shape", "dtype", "shared-storage"],
)
def test_bad_fp8_scales_are_refused_before_any_write(make_scale, error, message):
    gen = torch.Generator().manual_seed(44)
    state = Mamba2ReplayState(MAMBA2, 2, ReplayConfig(window=3, read_dtype=FP8))
    state.load(torch.randn(2, 4, 8, 16, generator=gen))
    state.cursor.fill_(3)  # the step would fold
    before = {name: _bits(t).clone() for name, t in state.tensors().items()}
    p = mamba2_params(MAMBA2, gen)
    x, dt, B, C, z = mamba2_inputs(MAMBA2, 2, 1, gen)
    from replayssm import ops

    scale = make_scale(state)
    with pytest.raises(error, match=message):
        ops.mamba2_step(x, dt, p.A, B, C, p.D, p.dt_bias, z, *_mamba2_args(state), torch.arange(2), True, True, state.read_checkpoint, scale)
    with pytest.raises(ValueError, match="read_scale.*only used with an fp8"):  # a scale with a 16-bit copy
        ops.mamba2_step(
            x, dt, p.A, B, C, p.D, p.dt_bias, z, *_mamba2_args(state), torch.arange(2), True, True, state.checkpoint.bfloat16(),
            state.read_scale,
        )  # fmt: skip
    for name, t in state.tensors().items():
        assert torch.equal(_bits(t), before[name]), name


def test_gdn_refuses_an_fp8_read_copy():
    """fp8 read copies are Mamba-2-only for now: a GDN state refuses the config before allocating anything,
    and the GDN op refuses an fp8 copy before writing anything."""
    config = ReplayConfig(window=3, read_dtype=FP8)  # the shared config accepts it
    assert config.read_dtype == FP8
    with pytest.raises(ValueError, match=r"ReplayConfig\.read_dtype.*Mamba-2-only"):
        GDNReplayState(GDN, 2, config)
    plain = GDNReplayState(GDN, 2, ReplayConfig(window=3))
    rings = {name: getattr(plain, name) for name in plain._ring_names}
    with pytest.raises(ValueError, match=r"ReplayConfig\.read_dtype.*Mamba-2-only"):
        GDNReplayState.from_tensors(GDN, plain.checkpoint, rings, plain.cursor, plain.pending, config)
    gen = torch.Generator().manual_seed(45)
    plain.load(torch.randn(2, 2, 16, 16, generator=gen))
    plain.cursor.fill_(3)
    before = {name: t.clone() for name, t in plain.tensors().items()}
    q, k, v, g, beta = gdn_inputs(GDN, 2, 1, gen)
    from replayssm import ops

    with pytest.raises(TypeError, match="read_checkpoint.*Mamba-2-only"):
        ops.gdn_step(q, k, v, g, beta, *_gdn_args(plain), torch.arange(2), True, True, None, plain.checkpoint.to(FP8), plain.ring_g.clone())
    for name, t in plain.tensors().items():
        assert torch.equal(t, before[name]), name


def test_fp8_copy_over_external_tensors_and_its_traffic():
    """``from_tensors`` takes an fp8 copy with its scales (and wants both); ``decode_traffic`` counts the
    copy at 1 byte per value and 4 per row of state_size values (and refuses it for GDN)."""
    from replayssm import decode_traffic

    config = ReplayConfig(window=4, read_dtype=FP8)
    owned = Mamba2ReplayState(MAMBA2, 2, config)
    rings = {name: getattr(owned, name) for name in owned._ring_names}
    args = (MAMBA2, owned.checkpoint, rings, owned.cursor, owned.pending, config)
    wrapped = Mamba2ReplayState.from_tensors(*args, read_checkpoint=owned.read_checkpoint, read_scale=owned.read_scale)
    assert wrapped.read_scale is owned.read_scale and "read_scale" in wrapped.tensors()
    with pytest.raises(TypeError, match="read_scale must be a Tensor"):
        Mamba2ReplayState.from_tensors(*args, read_checkpoint=owned.read_checkpoint)
    bf16 = ReplayConfig(window=4, read_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="read_scale given"):
        Mamba2ReplayState.from_tensors(*args[:-1], bf16, read_checkpoint=owned.read_checkpoint.bfloat16(), read_scale=owned.read_scale)
    geometry = Mamba2Geometry(heads=8, head_dim=64, state_size=128, groups=1)
    values = 8 * 64 * 128
    per_dtype = {d: decode_traffic(geometry, 1, 16, read_dtype=d) for d in (None, torch.bfloat16, FP8)}
    # The copy is read on 15 steps of 16 and written once: its bytes count once per step.
    saved = per_dtype[torch.bfloat16].replay_state - per_dtype[FP8].replay_state
    assert saved == pytest.approx(2 * values - (values + 8 * 64 * 4))
    with pytest.raises(ValueError, match="Mamba-2-only"):
        decode_traffic(GDN, 1, 16, read_dtype=FP8)


# --- on the GPU: capture, and long runs against float64 -----------------------------------------------


def _decode_inputs(state, batch, gen, p=None):
    if isinstance(state, GDNReplayState):
        return tuple(t.to("cuda") for t in gdn_inputs(state.geometry, batch, 1, gen, dtype=torch.bfloat16))
    x, dt, B, C, z = (t.to("cuda") for t in mamba2_inputs(state.geometry, batch, 1, gen, dtype=torch.bfloat16))
    return x, dt, p.A, B, C, p.D, p.dt_bias, z


@pytest.mark.cuda
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_read_copy_step_replays_in_a_cuda_graph(family):
    """Two windows of decode steps through the registered op, captured in one CUDA graph: the replay equals
    eager steps exactly, outputs and every state tensor (the read copy included)."""
    gen = torch.Generator().manual_seed(31)
    config = ReplayConfig(window=4, read_dtype=torch.bfloat16)
    if family == "mamba2":
        geometry = Mamba2Geometry(heads=8, head_dim=64, state_size=128, groups=2)
        make = lambda: Mamba2ReplayState(geometry, 5, config, device="cuda", activation_dtype=torch.bfloat16)  # noqa: E731
        p = mamba2_params(geometry, gen)
        p = type(p)(*(t.cuda() for t in (p.A, p.D, p.dt_bias)))
    else:
        geometry = GDNGeometry(key_heads=2, value_heads=4, key_dim=128, value_dim=128)
        make, p = (lambda: GDNReplayState(geometry, 5, config, device="cuda")), None
    ours, eager = make(), make()
    ours.load(torch.randn((5,) + tuple(ours.checkpoint.shape[1:]), generator=gen).cuda() * 0.3)
    ours.cursor.copy_(torch.arange(5, dtype=torch.int32, device="cuda") % 5)
    for name, t in ours.tensors().items():
        getattr(eager, name).copy_(t)
    steps = [_decode_inputs(ours, 5, gen, p) for _ in range(8)]

    rows = torch.arange(5, device="cuda")  # made before the capture (a list would be copied to the GPU inside it)

    def step(state, inp):
        return state.step(*inp, rows=rows, use_qk_l2norm=True) if family == "gdn" else state.step(*inp, rows=rows)

    from replayssm.ops import set_value_checks

    expected = [step(eager, inp) for inp in steps]
    previous = set_value_checks(False)
    try:
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            outs = [step(ours, inp) for inp in steps]
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
    finally:
        set_value_checks(previous)
    for o, o_ref in zip(outs, expected):
        assert torch.equal(o, o_ref)
    for name, t in ours.tensors().items():
        assert torch.equal(t, getattr(eager, name)), name


@pytest.mark.cuda
def test_mamba2_long_run_with_read_copy_tracks_float64():
    """4096 decode steps (819 flushes per row) with a bf16 read copy: the fp32 checkpoint after every flush
    stays within 1e-5 of a float64 recurrence (the copy never feeds it); outputs within bf16 rounding."""
    gen = torch.Generator().manual_seed(32)
    geometry, batch, window = Mamba2Geometry(heads=8, head_dim=64, state_size=128, groups=2), 4, 5
    state = Mamba2ReplayState(geometry, batch, ReplayConfig(window=window, read_dtype=torch.bfloat16), device="cuda")
    state.cursor.copy_(torch.arange(batch, dtype=torch.int32, device="cuda") % window)  # staggered, empty history
    p = mamba2_params(geometry, gen)
    A, D, dt_bias = (t.cuda() for t in (p.A, p.D, p.dt_bias))
    exact = torch.zeros(batch, 8, 64, 128, dtype=torch.float64, device="cuda")
    worst_state = worst_out = 0.0
    for _ in range(4096):
        x, dt, B, C, z = (t.cuda() for t in mamba2_inputs(geometry, batch, 1, gen))
        before, flushing = exact.clone(), state.cursor == window
        y = state.step(x, dt, A, B, C, D, dt_bias, z)
        dts = torch.nn.functional.softplus(dt[:, 0].double() + dt_bias.double())  # (batch, heads)
        Bh, Ch = (t[:, 0].double().repeat_interleave(4, dim=1) for t in (B, C))  # (batch, heads, N)
        exact = torch.exp(dts * A.double())[..., None, None] * exact + dts[..., None, None] * x[:, 0].double()[..., None] * Bh[:, :, None, :]
        y_exact = torch.einsum("bhpn,bhn->bhp", exact, Ch) + D.double()[:, None] * x[:, 0].double()
        y_exact = y_exact * torch.nn.functional.silu(z[:, 0].double())
        worst_out = max(worst_out, float((y[:, 0].double() - y_exact).norm() / y_exact.norm()))
        if bool(flushing.any()):
            f = flushing.nonzero()[:, 0]
            worst_state = max(worst_state, float((state.checkpoint[f].double() - before[f]).norm() / before[f].norm()))
    assert worst_state < 1e-5, worst_state
    assert worst_out < 1e-2, worst_out


@pytest.mark.cuda
def test_gdn_long_run_with_read_copy_tracks_float64():
    """4096 GDN decode steps with a bf16 read copy. The corrected update d = beta (v - S k) reads the copy,
    and the fold corrects each d by the gap between checkpoint and copy (ring_beta), so the fp32 checkpoint
    after every flush stays within 1e-5 of the float64 recurrence (SPEC §4: the copy never feeds it), as
    it does with fp32 reads. Without the correction it was 1e-4 and more (docs/ops.md)."""
    gen = torch.Generator().manual_seed(33)
    geometry, batch, window = GDNGeometry(key_heads=2, value_heads=4, key_dim=128, value_dim=128), 4, 5
    state = GDNReplayState(geometry, batch, ReplayConfig(window=window, read_dtype=torch.bfloat16), device="cuda")
    state.cursor.copy_(torch.arange(batch, dtype=torch.int32, device="cuda") % window)
    exact = torch.zeros(batch, 4, 128, 128, dtype=torch.float64, device="cuda")
    errors = []
    for _ in range(4096):
        q, k, v, g, beta = (t.cuda() for t in gdn_inputs(geometry, batch, 1, gen))
        before, flushing = exact.clone(), state.cursor == window
        state.step(q, k, v, g, beta, use_qk_l2norm=True)
        kn = k[:, 0].double() * torch.rsqrt((k[:, 0].double() ** 2).sum(-1, keepdim=True) + 1e-6)
        kh = kn.repeat_interleave(2, dim=1)
        prev = torch.exp(g[:, 0].double())[..., None, None] * exact
        d = beta[:, 0].double()[..., None] * (v[:, 0].double() - torch.einsum("bhvk,bhk->bhv", prev, kh))
        exact = prev + d[..., None] * kh[:, :, None, :]
        if bool(flushing.any()):
            f = flushing.nonzero()[:, 0]
            errors.append(float((state.checkpoint[f].double() - before[f]).norm() / before[f].norm()))
    first, last = max(errors[: len(errors) // 8]), max(errors[-len(errors) // 8 :])
    print(f"GDN, bf16 read copy: checkpoint vs float64 after flushes, worst of the first / last eighth: {first:.2e} / {last:.2e}")
    assert max(errors) < 1e-5, (first, last)
