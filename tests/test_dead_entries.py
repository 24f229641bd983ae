"""Dead ring entries never reach the arithmetic (issue 48, item 5).

Ring entries at positions >= a row's cursor are dead: rolled back, reset, loaded over, rejected by a
commit, or never written. They may hold anything, NaN and inf included (a draft token's garbage, or a
slot's previous request). A reset, loaded or rolled-back row must then behave exactly like a fresh one.

Each case drives two states through the same operations, on rows [0, 1] in every step (so both states
compute the same batches): ``dirty``, whose row 0 gets non-finite inputs in the tokens that end up dead,
and whose dead entries are then overwritten with non-finite garbage; and ``clean``, which gets finite
inputs in their place, and whose dead entries are then zeroed (what a fresh state holds). ``materialize()``
and the outputs of the following steps (decoding, a flush, a verification and its commit) must be finite
and equal (``torch.equal``), and agree with a float64 recurrence of the live history.

Where a step runs: ``reference`` (the CPU path, through ``ReplayState``), ``interpreter`` (the Triton
launchers on the state's CPU tensors under ``TRITON_INTERPRET=1``, outputs poisoned before each call) and
``cuda`` (``ReplayState`` on a GPU: the kernels). ``materialize`` is the reference on every device.
"""

from __future__ import annotations

import os

import pytest
import torch
from naive import NaiveGDN, NaiveMamba2, rel_err

from replayssm import GDNGeometry, GDNReplayState, Mamba2Geometry, Mamba2ReplayState, ReplayConfig

WINDOW = 4
MAMBA2 = Mamba2Geometry(heads=2, head_dim=16, state_size=16, groups=1)
GDN = GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16)
GARBAGE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}
SCENARIOS = ["reset", "load", "commit0", "partial_commit", "rollback"]
READ = [pytest.param(None, id="no_copy"), pytest.param(torch.bfloat16, id="read_bf16")]

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICES = [
    pytest.param("reference", id="reference"),
    pytest.param(
        "interpreter", id="interpreter",
        marks=[pytest.mark.interpreter, pytest.mark.skipif(not _INTERPRETED, reason="CPU kernels need TRITON_INTERPRET=1")],
    ),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]  # fmt: skip


# The interpreter is slow: it skips load, whose dead entries are reset's (all of the row's).
_CUDA_ONLY = pytest.mark.skipif(_INTERPRETED, reason="as reset for the ring; the interpreter runs reset")


def _garbage_like(t: torch.Tensor, kind: str) -> torch.Tensor:
    """Non-finite values of ``kind`` (``mixed``: NaN, +inf, -inf in turn) shaped like ``t``."""
    if kind != "mixed":
        return torch.full_like(t, GARBAGE[kind])
    cycle = torch.tensor(list(GARBAGE.values()), dtype=t.dtype, device=t.device)
    return cycle.repeat(t.numel() // 3 + 1)[: t.numel()].view(t.shape)


class Family:
    """One layer family: its state, inputs, step (per device) and float64 recurrence."""

    def __init__(self, name: str, device: str):
        self.name, self.device = name, device
        self.tensor_device = "cuda" if device == "cuda" else "cpu"

    def state(self, read_dtype):
        config = ReplayConfig(window=WINDOW, read_dtype=read_dtype)
        if self.name == "mamba2":
            return Mamba2ReplayState(MAMBA2, 2, config, device=self.tensor_device)
        return GDNReplayState(GDN, 2, config, device=self.tensor_device)

    def checkpoint_shape(self):
        g = MAMBA2 if self.name == "mamba2" else GDN
        return (g.heads, g.head_dim, g.state_size) if self.name == "mamba2" else (g.value_heads, g.value_dim, g.key_dim)

    def params(self, gen):
        h = MAMBA2.heads
        self.A = -(0.5 + torch.rand(h, generator=gen))
        self.D = torch.randn(h, generator=gen)
        self.dt_bias = 0.1 * torch.randn(h, generator=gen)

    def inputs(self, T: int, gen) -> list[torch.Tensor]:
        """Inputs of rows [0, 1] for T tokens (float32, CPU)."""
        if self.name == "mamba2":
            g = MAMBA2
            return [
                torch.randn(2, T, g.heads, g.head_dim, generator=gen),  # x
                torch.randn(2, T, g.heads, generator=gen),  # dt
                torch.randn(2, T, g.groups, g.state_size, generator=gen),  # B
                torch.randn(2, T, g.groups, g.state_size, generator=gen),  # C
                torch.randn(2, T, g.heads, g.head_dim, generator=gen),  # z
            ]
        g = GDN
        return [
            torch.randn(2, T, g.key_heads, g.key_dim, generator=gen),  # q
            torch.randn(2, T, g.key_heads, g.key_dim, generator=gen),  # k
            torch.randn(2, T, g.value_heads, g.value_dim, generator=gen),  # v
            -0.5 * torch.rand(2, T, g.value_heads, generator=gen) - 1e-3,  # g
            torch.rand(2, T, g.value_heads, generator=gen) * 0.98 + 0.01,  # beta
        ]

    def step(self, state, inputs, commit: bool) -> torch.Tensor:
        dev = self.tensor_device
        inputs = [t.to(dev) for t in inputs]
        rows = torch.tensor([0, 1], device=dev)
        if self.name == "mamba2":
            x, dt, B, C, z = inputs
            A, D, dt_bias = self.A.to(dev), self.D.to(dev), self.dt_bias.to(dev)
            if self.device != "interpreter":
                return state.step(x, dt, A, B, C, D, dt_bias, z, rows=rows, commit=commit).cpu()
            kernels = pytest.importorskip("replayssm.ops.mamba2.kernels", reason="needs Triton")
            y = torch.full_like(x, float("nan"))
            kernels.mamba2_step_out(
                x, dt, A, B, C, D, dt_bias, z, state.checkpoint, state.ring_x, state.ring_B, state.ring_dt,
                state.ring_logdecay, state.cursor, state.pending, rows, commit, True, y=y, read_checkpoint=state.read_checkpoint,
            )  # fmt: skip
            return y
        q, k, v, g, beta = inputs
        if self.device != "interpreter":
            return state.step(q, k, v, g, beta, rows=rows, commit=commit, use_qk_l2norm=True).cpu()
        kernels = pytest.importorskip("replayssm.ops.gdn.step", reason="needs Triton")
        o = torch.full_like(v, float("nan"))
        kernels.gdn_step_out(
            q, k, v, g, beta, state.checkpoint, state.ring_k, state.ring_d, state.ring_g, state.cursor, state.pending,
            rows, commit, True, None, o=o, read_checkpoint=state.read_checkpoint, ring_beta=state.ring_beta,
        )  # fmt: skip
        return o

    def naive(self):
        if self.name == "mamba2":
            return NaiveMamba2(2, MAMBA2.heads, MAMBA2.head_dim, MAMBA2.state_size, MAMBA2.groups)
        return NaiveGDN(2, GDN.key_heads, GDN.value_heads, GDN.key_dim, GDN.value_dim)

    def naive_token(self, naive, row: int, inputs, t: int, state):
        """(output, state after) of token t of ``row`` in float64."""
        if self.name == "mamba2":
            x, dt, B, C, z = (a[row, t] for a in inputs)
            return naive.token(row, x, dt, self.A, B, C, self.D, self.dt_bias, z, state=state)
        q, k, v, g, beta = (a[row, t] for a in inputs)
        return naive.token(row, q, k, v, g, beta, l2norm=True, state=state)


class Pair:
    """The dirty and the clean state, driven together, and the float64 history of their live tokens."""

    def __init__(self, family: Family, read_dtype, seed: int):
        self.family, self.read_dtype = family, read_dtype
        self.gen = torch.Generator().manual_seed(seed)
        family.params(self.gen)
        self.dirty, self.clean = family.state(read_dtype), family.state(read_dtype)
        self.naive = family.naive()
        self.history: list[list[torch.Tensor]] = [[self.naive.state[r].clone()] for r in range(2)]  # row -> states

    def _advance(self, row: int, inputs, count: int) -> torch.Tensor:
        """Advance the float64 history of ``row`` by the first ``count`` tokens; returns all T outputs
        (from the row's current state, whether or not they are accepted)."""
        s, outs = self.history[row][-1], []
        for t in range(inputs[0].shape[1]):
            y, s = self.family.naive_token(self.naive, row, inputs, t, s)
            outs.append(y)
            if t < count:
                self.history[row].append(s)
        return torch.stack(outs)

    def step(self, T: int, commit: bool, accepted=None, garbage: dict | None = None, check: bool = True):
        """One step of rows [0, 1] on both states; ``garbage``: {"kind": k, "tokens": [t...]} puts non-finite
        inputs in those tokens of row 0 of the dirty state (the clean one gets the finite draws). Checks the
        outputs of the live tokens (equal, finite, close to float64) unless ``check`` is off. Verification
        (``commit=False``) then commits ``accepted`` (rows 0 and 1)."""
        inputs = self.family.inputs(T, self.gen)
        dirty_inputs = [t.clone() for t in inputs]
        bad = [] if garbage is None else garbage["tokens"]
        for t in bad:
            for a in dirty_inputs:
                a[0, t] = _garbage_like(a[0, t], garbage["kind"])
        y_clean = self.family.step(self.clean, inputs, commit)
        y_dirty = self.family.step(self.dirty, dirty_inputs, commit)
        counts = [T, T] if commit else list(accepted)
        expected = [self._advance(r, inputs, counts[r]) for r in range(2)]
        if not commit:
            self.both("commit", accepted=accepted, rows=[0, 1])
        if check:
            # Row 0's outputs before its first garbage token see no garbage (causality); row 1's none.
            live = [min(bad, default=T), T]
            tol = 3e-2 if self.read_dtype is not None else 1e-4
            for r in range(2):
                a, b = y_dirty[r, : live[r]], y_clean[r, : live[r]]
                assert torch.isfinite(a).all(), f"row {r}: non-finite outputs {a}"
                assert torch.equal(a, b), f"row {r}: {(a - b).abs().max()}"
                assert rel_err(a, expected[r][: live[r]]) < tol
        return y_dirty, y_clean

    def both(self, op: str, **kwargs):
        getattr(self.clean, op)(**kwargs)
        getattr(self.dirty, op)(**kwargs)

    def fill_dead(self, kind: str) -> None:
        """Garbage in the dead entries of the dirty state's rows; zeros in the clean one's (a fresh state's)."""
        for r in range(2):
            c = int(self.dirty.cursor[r])
            assert c == int(self.clean.cursor[r]) and int(self.dirty.pending[r]) == 0
            for name in self.dirty._ring_names:
                dead = getattr(self.dirty, name)[r, c:]
                dead.copy_(_garbage_like(dead, kind))
                getattr(self.clean, name)[r, c:] = 0

    def check_materialize(self) -> None:
        a, b = self.dirty.materialize().cpu(), self.clean.materialize().cpu()
        assert torch.isfinite(a).all(), a
        assert torch.equal(a, b), (a - b).abs().max()
        for r in range(2):
            assert rel_err(a[r], self.history[r][-1]) < 1e-5


def _run(family_name: str, device: str, read_dtype, scenario: str, kind: str, draft_garbage: bool = True, seed: int = 0) -> None:
    """``scenario`` on both states, then garbage in the dead entries, then steps over them. ``draft_garbage``:
    partial_commit's rejected draft token is garbage too (else only direct writes put garbage there)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pair = Pair(Family(family_name, device), read_dtype, seed)
    natural = kind if kind != "mixed" else "nan"
    pair.step(2, commit=True)  # a short committed history (cursor 2)

    if scenario == "reset":
        pair.step(1, commit=True, garbage={"kind": natural, "tokens": [0]}, check=False)
        pair.both("reset", rows=[0])
        pair.history[0] = [torch.zeros_like(pair.history[0][0])]
    elif scenario == "load":
        pair.step(1, commit=True, garbage={"kind": natural, "tokens": [0]}, check=False)
        loaded = torch.randn((1,) + pair.family.checkpoint_shape(), generator=pair.gen) * 0.3
        pair.both("load", state=loaded.to(pair.family.tensor_device), rows=[0])
        pair.history[0] = [pair.clean.checkpoint[0].cpu().double()]  # as rounded to the checkpoint dtype
    elif scenario == "commit0":  # a rejected draft whose every token is garbage (a flush first: 2 + 3 > 4)
        pair.step(3, commit=False, accepted=[0, 3], garbage={"kind": natural, "tokens": [0, 1, 2]}, check=False)
    elif scenario == "partial_commit":  # the draft's last token is garbage and rejected
        pair.step(2, commit=False, accepted=[1, 2], garbage={"kind": natural, "tokens": [1]} if draft_garbage else None)
    elif scenario == "rollback":  # garbage tokens committed, then taken back
        pair.step(1, commit=True, garbage={"kind": natural, "tokens": [0]}, check=False)
        pair.step(1, commit=True, garbage={"kind": natural, "tokens": [0]}, check=False)
        pair.both("rollback", count=[2], rows=[0])
        del pair.history[0][-2:]
    else:
        raise AssertionError(scenario)

    pair.fill_dead(kind)
    pair.check_materialize()
    # What follows runs over the dead entries: decoding next to them, verifications and commits, and a fold
    # of a ring that holds dead entries (row 0 at cursor 2 or 3 when the 3-token draft comes).
    for T, commit, accepted in ((1, True, None), (2, False, [2, 1]), (3, False, [1, 3])):
        pair.step(T, commit, accepted)
        pair.check_materialize()
        pair.fill_dead(kind)


@pytest.mark.parametrize("kind", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("read_dtype", READ)
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_reference_dead_entries_behave_like_a_fresh_state(family, read_dtype, scenario, kind):
    _run(family, "reference", read_dtype, scenario, kind)


@pytest.mark.parametrize("device", [d for d in DEVICES if d.id != "reference"])
@pytest.mark.parametrize("scenario", [pytest.param(s, marks=_CUDA_ONLY) if s == "load" else s for s in SCENARIOS])
@pytest.mark.parametrize("read_dtype", READ)
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_kernels_dead_entries_behave_like_a_fresh_state(family, read_dtype, scenario, device):
    """The kernels' steps over garbage dead entries (NaN, +inf, -inf in turn). A garbage draft token that a
    partial commit rejects is ``test_draft_garbage_reaches_only_later_tokens``'s case."""
    _run(family, device, read_dtype, scenario, "mixed", draft_garbage=False)


# The verification kernels weight a later draft token's terms by 0 instead of selecting them out, so its
# garbage reaches the earlier tokens' outputs (and, for GDN, their d entries, which a partial commit then
# keeps): mamba2/kernels.py ``_mamba2_main_kernel`` (x only), gdn/verify.py ``_gdn_main_kernel`` and
# ``_main_tile_mma`` (k, v, g, beta).
_KERNEL_DRAFT_LEAK = pytest.mark.xfail(
    strict=True, reason="verification kernels multiply a later draft token's terms by 0 (0 x NaN): see _KERNEL_DRAFT_LEAK"
)


@pytest.mark.parametrize(
    "device", [pytest.param(d.values[0], id=d.id, marks=list(d.marks) + ([_KERNEL_DRAFT_LEAK] if d.id != "reference" else [])) for d in DEVICES]
)
@pytest.mark.parametrize("read_dtype", READ)
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_draft_garbage_reaches_only_later_tokens(family, read_dtype, device):
    """A verification whose last draft token is garbage: the earlier tokens' outputs and entries equal a
    clean draft's, and after the partial commit that rejects it the state behaves like a fresh one."""
    _run(family, device, read_dtype, "partial_commit", "mixed", draft_garbage=True)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_issue_reproduction(family):
    """The issue's cases: a 1-row GDN state (key_dim 2, value_dim 1, window 4), one step with v = NaN,
    ``reset``; a Mamba-2 draft with x = inf, rejected by ``commit(0)``: ``materialize()`` and the next
    step are finite and equal a fresh state's."""
    gen = torch.Generator().manual_seed(3)
    if family == "gdn":
        geometry = GDNGeometry(key_heads=1, value_heads=1, key_dim=2, value_dim=1)
        fresh, used = (GDNReplayState(geometry, 1, ReplayConfig(window=4)) for _ in range(2))
        q, k = torch.randn(1, 1, 1, 2, generator=gen), torch.randn(1, 1, 1, 2, generator=gen)
        g, beta = torch.full((1, 1, 1), -0.1), torch.full((1, 1, 1), 0.5)
        used.step(q, k, torch.full((1, 1, 1, 1), float("nan")), g, beta, use_qk_l2norm=True)
        used.reset(rows=[0])
        run = lambda s: s.step(q, k, torch.ones(1, 1, 1, 1), g, beta, use_qk_l2norm=True)
    else:
        geometry = Mamba2Geometry(heads=1, head_dim=2, state_size=2, groups=1)
        fresh, used = (Mamba2ReplayState(geometry, 1, ReplayConfig(window=4)) for _ in range(2))
        dt, A = torch.zeros(1, 1, 1), -torch.ones(1)
        B, C = torch.randn(1, 1, 1, 2, generator=gen), torch.randn(1, 1, 1, 2, generator=gen)
        used.step(torch.full((1, 1, 1, 2), float("inf")), dt, A, B, C, commit=False)
        used.commit([0], rows=[0])
        run = lambda s: s.step(torch.ones(1, 1, 1, 2), dt, A, B, C)
    assert torch.isfinite(used.materialize()).all() and torch.equal(used.materialize(), fresh.materialize())
    for _ in range(5):  # across a flush
        a, b = run(used), run(fresh)
        assert torch.isfinite(a).all() and torch.equal(a, b)
