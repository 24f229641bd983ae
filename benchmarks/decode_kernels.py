"""Decode-step kernel benchmark: replay vs conventional (and fla where installed), next to bandwidth floors.

One call on the GPU does everything (issue 3, item 3):

    PYTHONPATH=src python benchmarks/decode_kernels.py --out results/

* geometries: Mamba-2 (heads, head_dim, state, groups) (96, 80, 128, 8),
  (128, 64, 128, 8), (64, 64, 128, 8); GDN (key heads, value heads, key dim,
  value dim) (16, 32, 128, 128), (16, 64, 128, 128); fp32 checkpoint, bf16 inputs;
* batch sweep (headline 256) at window 16, window sweep 4..32 at batch 256;
* per-step time: a window of L steps captured in one CUDA graph, replayed,
  divided by L; median of repeats; fresh random inputs per step (never zeros);
* replay with rows at staggered ring positions (about B/L rows flush each
  step) and in phase (all rows flush on the same step); the non-flush and the
  flush step on their own;
* floors: bytes from ``replayssm.decode_traffic`` over the streaming bandwidth
  of an elementwise kernel measured in the same run;
* fla's ``fused_recurrent_gated_delta_rule`` as a second GDN baseline when
  importable.

Prints a table last; writes ``decode_kernels.json`` and ``decode_kernels.png``
(matplotlib, the ``bench`` extra) into ``--out``. ``--sweep`` first times a
few launch configurations of the replay main kernel at the headline point (GDN: also
decoding through verification's three launches, and the conventional kernel's
shapes) and uses the fastest (to fill
``replayssm/ops/triton/configs.py`` by hand). Every configuration timed is
first checked against the PyTorch reference for one step (outputs and state;
a wrong one fails the run, or is dropped from the sweep). ``--dry-run`` runs
the step plumbing and those checks on tiny sizes under the Triton
interpreter (no GPU; CI runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import torch

if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import replayssm  # noqa: E402
from replayssm import GDNGeometry, Mamba2Geometry, decode_traffic  # noqa: E402
from replayssm.ops import reference  # noqa: E402
from replayssm.ops.triton import gdn as gdn_kernels  # noqa: E402
from replayssm.ops.triton import mamba2 as mamba2_kernels  # noqa: E402
from replayssm.ops.triton.configs import (  # noqa: E402
    GDN_READ_COPY_FOLD,
    GDN_READ_COPY_FOLDS,
    LaunchConfig,
    gdn_conventional_config,
    gdn_replay_config,
    mamba2_conventional_config,
    mamba2_replay_config,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

GEOMETRIES = {
    "mamba2-96x80x128-g8": Mamba2Geometry(heads=96, head_dim=80, state_size=128, groups=8),
    "mamba2-128x64x128-g8": Mamba2Geometry(heads=128, head_dim=64, state_size=128, groups=8),
    "mamba2-64x64x128-g8": Mamba2Geometry(heads=64, head_dim=64, state_size=128, groups=8),
    "gdn-16x32x128x128": GDNGeometry(key_heads=16, value_heads=32, key_dim=128, value_dim=128),
    "gdn-16x64x128x128": GDNGeometry(key_heads=16, value_heads=64, key_dim=128, value_dim=128),
}
DRY_GEOMETRIES = {
    "mamba2-tiny": Mamba2Geometry(heads=4, head_dim=16, state_size=16, groups=2),
    "gdn-tiny": GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16),
}
HEADLINE_BATCH, HEADLINE_WINDOW = 256, 16
# GDN with a read copy: the exact fold's form and fold launch the tables held before run 34 (docs/kernels.md),
# timed beside the table's.
PREVIOUS_READ_FOLD = ("blocked", LaunchConfig(16, 1, 4, num_stages=3, form="worklist", programs_per_sm=2))
BATCHES = (1, 8, 32, 64, 128, 256, 512, 1024)
WINDOWS = (4, 8, 16, 32)
ACT = torch.bfloat16


def _rel_err(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


#: the check of a configuration against the reference (relative RMS): state tensors (fp32 state and
#: arithmetic on both sides) and outputs (rounded to the bf16 activations: a rounding apart at most)
CHECK_TOL = {"state": 1e-4, "output": 1e-2}


def check_failure(errors: dict) -> str | None:
    """Why ``check_replay``'s errors fail the check, or None."""
    bad = [f"{k} {v:.2e}" for k, v in errors.items() if not v <= CHECK_TOL[k]]
    return "differs from the reference (relative error: " + ", ".join(bad) + ")" if bad else None


class Case:
    """State, parameters and ``window`` sets of fresh random inputs for one (geometry, batch, window)."""

    def __init__(
        self, geometry, batch: int, window: int, device: str, seed: int = 0, conventional: bool = True, read_dtype: torch.dtype | None = None
    ):
        self.geometry, self.batch, self.window, self.device = geometry, batch, window, device
        self.read_dtype = read_dtype
        config = replayssm.ReplayConfig(window=window, read_dtype=read_dtype)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.rows = torch.arange(batch, device=device)
        self.mamba2 = isinstance(geometry, Mamba2Geometry)
        self.conventional_state = None
        if self.mamba2:
            g = geometry
            self.state = replayssm.Mamba2ReplayState(g, batch, config, device, activation_dtype=ACT)
            self.A = -(self.rand(g.heads) * 4 + 0.5)
            self.D = self.randn(g.heads)
            self.dt_bias = self.randn(g.heads) * 0.5 - 2.0
            self.inputs = [
                (
                    self.randn(batch, 1, g.heads, g.head_dim).to(ACT),
                    (self.randn(batch, 1, g.heads) * 0.5).to(ACT),
                    self.randn(batch, 1, g.groups, g.state_size).to(ACT),
                    self.randn(batch, 1, g.groups, g.state_size).to(ACT),
                    self.randn(batch, 1, g.heads, g.head_dim).to(ACT),
                )
                for _ in range(window)
            ]
            st = self.state
            st.ring_x.copy_(self.randn(*st.ring_x.shape))
            st.ring_B.copy_(self.randn(*st.ring_B.shape))
            st.ring_dt.copy_(self.rand(*st.ring_dt.shape) * 0.1)
            st.ring_logdecay.copy_(-st.ring_dt * 2)
        else:
            g = geometry
            self.state = replayssm.GDNReplayState(g, batch, config, device)
            self.inputs = [
                (
                    self.randn(batch, 1, g.key_heads, g.key_dim).to(ACT),
                    self.randn(batch, 1, g.key_heads, g.key_dim).to(ACT),
                    self.randn(batch, 1, g.value_heads, g.value_dim).to(ACT),
                    (-self.rand(batch, 1, g.value_heads) * 0.3).to(ACT),
                    (self.rand(batch, 1, g.value_heads) * 0.9 + 0.05).to(ACT),
                )
                for _ in range(window)
            ]
            st = self.state
            st.ring_k.copy_(torch.nn.functional.normalize(self.randn(*st.ring_k.shape), dim=-1))
            st.ring_d.copy_(self.randn(*st.ring_d.shape) * 0.1)
            st.ring_g.copy_(-self.rand(*st.ring_g.shape) * 0.3)
        self.state.load(None, self.randn(*self.state.checkpoint.shape) * 0.1)  # the read copy too, if any
        if conventional:
            self.conventional_state = self.randn(*self.state.checkpoint.shape) * 0.1
        self.set_phase("staggered")

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen, device=self.device)

    def rand(self, *shape):
        return torch.rand(*shape, generator=self.gen, device=self.device)

    def set_phase(self, phase: str) -> None:
        """``staggered``: row r at cursor r mod L; ``in-phase``: every row at cursor 0."""
        c = torch.arange(self.batch, device=self.device) % self.window if phase == "staggered" else torch.zeros(self.batch, device=self.device)
        self.state.cursor.copy_(c.to(torch.int32))
        self.state.pending.zero_()

    # -- steps ------------------------------------------------------------------------------

    def state_args(self, state=None) -> tuple:
        """The replay state's tensors in the ops' argument order (of ``state``, a dict of copies, if given)."""
        names = ("checkpoint", "ring_x", "ring_B", "ring_dt", "ring_logdecay") if self.mamba2 else ("checkpoint", "ring_k", "ring_d", "ring_g")
        names += ("cursor", "pending")
        return tuple(state[n] if state is not None else getattr(self.state, n) for n in names)

    def replay_step(self, inp, config=None, via_op: bool = True, commit: bool = True):
        """One replay step on ``inp`` (T tokens per row), returning its output: through the op (the launch
        tables) or, with ``via_op=False``, the launcher with ``config`` (a ``LaunchConfig``, or for GDN a
        ``StepVariant``)."""
        tensors = self.state_args()
        read = self.state.read_checkpoint
        variant = config if isinstance(config, StepVariant) else StepVariant(config)
        if self.mamba2:
            x, dt, B, C, z = inp
            if via_op:
                return replayssm.ops.mamba2_step(x, dt, self.A, B, C, self.D, self.dt_bias, z, *tensors, self.rows, commit, True, read)
            y = torch.empty_like(x)
            mamba2_kernels.mamba2_step_out(
                x, dt, self.A, B, C, self.D, self.dt_bias, z, *tensors, self.rows, commit, True, y=y, config=variant.config,
                fold_in_main=variant.fold_in_main, flush_config=variant.flush, weights_config=variant.weights, overlap=variant.overlap,
                read_checkpoint=read,
            )  # fmt: skip
            return y
        if via_op:
            return replayssm.ops.gdn_step(*inp, *tensors, self.rows, commit, True, None, read, self.state.ring_beta)
        o = torch.empty_like(inp[2])
        gdn_kernels.gdn_step_out(
            *inp, *tensors, self.rows, commit, True, None, o=o, config=variant.config, decode_launches=variant.launches,
            flush_config=variant.flush, weights_config=variant.weights, overlap=variant.overlap, read_checkpoint=read,
            ring_beta=self.state.ring_beta, read_copy_fold=variant.read_fold,
        )  # fmt: skip
        return o

    def reference_step(self, inp, state: dict, commit: bool = True):
        """The same step through the PyTorch reference, on ``state`` (a dict of copies of the state's tensors)."""
        args = self.state_args(state)
        read = state.get("read_checkpoint")
        if self.mamba2:
            x, dt, B, C, z = inp
            return reference.mamba2_step(x, dt, self.A, B, C, self.D, self.dt_bias, z, *args, self.rows, commit, True, read)
        return reference.gdn_step(*inp, *args, self.rows, commit, True, None, read, state.get("ring_beta"))

    def check_replay(self, config=None, inp=None, commit: bool = True, after=None, after_reference=None) -> dict:
        """Relative errors (RMS) of one replay step against the reference: ``output``, and ``state`` (the
        worst state tensor; inf if cursors differ), from the current state, which is then restored.
        ``after`` / ``after_reference`` (``f(state_dict)``), if given, run after the step on the kernels'
        side and on the reference's (a commit through the op, and through the reference)."""
        inp = inp if inp is not None else self.inputs[0]
        saved = {n: t.clone() for n, t in self.state.tensors().items()}
        theirs = {n: t.clone() for n, t in saved.items()}
        y = self.replay_step(inp, config, via_op=config is None, commit=commit)
        y_ref = self.reference_step(inp, theirs, commit)
        if after is not None:
            after(self.state.tensors())
            after_reference(theirs)
        state_errors = []
        for name, ours in self.state.tensors().items():
            if ours.dtype in (torch.int32, torch.int64):
                state_errors.append(0.0 if torch.equal(ours, theirs[name]) else float("inf"))
            else:
                state_errors.append(_rel_err(ours, theirs[name]))
        for name, t in self.state.tensors().items():
            t.copy_(saved[name])
        return {"output": _rel_err(y, y_ref), "state": max(state_errors)}

    def replay_steps(self, config=None, via_op: bool = True):
        return [lambda inp=inp: self.replay_step(inp, config, via_op) for inp in self.inputs]

    def pinned_replay_steps(self, cursor_value: int, count: int, config: LaunchConfig | None = None):
        """``count`` steps, each preceded by resetting every cursor to ``cursor_value`` (a tiny copy kernel)."""
        pinned = torch.full((self.batch,), cursor_value, dtype=torch.int32, device=self.device)
        base = self.replay_steps(config, via_op=False) if config else self.replay_steps()
        steps = []
        for i in range(count):
            step = base[i % len(base)]
            steps.append(lambda step=step: (self.state.cursor.copy_(pinned), step()))
        return steps

    def check_conventional(self, config: LaunchConfig) -> dict:
        """Relative errors of one conventional step with ``config`` against the reference (output, state); the
        state is restored in place (the timed steps hold it)."""
        state, saved = self.conventional_state, self.conventional_state.clone()
        theirs = saved.clone()
        if self.mamba2:
            x, dt, B, C, z = self.inputs[0]
            y = torch.empty_like(x)
            mamba2_kernels.mamba2_conventional_step_out(x, dt, self.A, B, C, self.D, self.dt_bias, z, state, self.rows, True, y=y, config=config)
            y_ref = reference.mamba2_conventional_step(x, dt, self.A, B, C, self.D, self.dt_bias, z, theirs, self.rows, True)
        else:
            y = torch.empty_like(self.inputs[0][2])
            gdn_kernels.gdn_conventional_step_out(*self.inputs[0], state, self.rows, True, None, o=y, config=config)
            y_ref = reference.gdn_conventional_step(*self.inputs[0], theirs, self.rows, True, None)
        errors = {"output": _rel_err(y, y_ref), "state": _rel_err(state, theirs)}
        state.copy_(saved)
        return errors

    def conventional_steps(self, config: LaunchConfig | None = None, via_op: bool = True):
        s = self.conventional_state
        steps = []
        for inp in self.inputs:
            if self.mamba2:
                x, dt, B, C, z = inp
                if via_op:
                    steps.append(lambda x=x, dt=dt, B=B, C=C, z=z: replayssm.ops.mamba2_conventional_step(
                        x, dt, self.A, B, C, self.D, self.dt_bias, z, s, self.rows, True))
                else:
                    y = torch.empty_like(x)
                    steps.append(lambda x=x, dt=dt, B=B, C=C, z=z, y=y: mamba2_kernels.mamba2_conventional_step_out(
                        x, dt, self.A, B, C, self.D, self.dt_bias, z, s, self.rows, True, y=y, config=config))
            else:
                if via_op:
                    steps.append(lambda inp=inp: replayssm.ops.gdn_conventional_step(*inp, s, self.rows, True, None))
                else:
                    o = torch.empty_like(inp[2])
                    steps.append(lambda inp=inp, o=o: gdn_kernels.gdn_conventional_step_out(
                        *inp, s, self.rows, True, None, o=o, config=config))
        return steps  # fmt: skip

    def fla_steps(self, fla_fn):
        """fla's fused recurrent kernel, one token, state read from and written to (N, HV, V, K) fp32."""
        s = self.conventional_state
        steps = []
        for q, k, v, g, beta in self.inputs:
            steps.append(lambda q=q, k=k, v=v, g=g, beta=beta: fla_fn(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=s, output_final_state=True,
                use_qk_l2norm_in_kernel=True, state_v_first=True))
        return steps  # fmt: skip

    def traffic(self):
        return decode_traffic(self.geometry, self.batch, self.window, torch.float32, ACT, read_dtype=self.read_dtype)


def _load_fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - any import failure means "not installed here"
        return None, f"{type(exc).__name__}: {exc}"
    return fused_recurrent_gated_delta_rule, None


# ---------------------------------------------------------------------------
# measurements
# ---------------------------------------------------------------------------


def measure_point(
    name, geometry, batch, window, bw, device, fla_fn=None, full=False, repeats=15, config=None, breakdown=False, conventional_config=None,
    read_dtype=None,
):  # fmt: skip
    """One (geometry, batch, window) point; ``config`` / ``conventional_config`` override the replay / conventional
    launch tables (from ``--sweep``);
    ``breakdown``: also the kernel time per step by kernel (staggered rows, profiler);
    ``read_dtype``: also the replay step with a read copy of the checkpoint in that dtype (SPEC §4; the
    tables' launches), checked against the reference and timed alongside."""
    from _common import kernel_times_per_step, time_graph_per_step

    case = Case(geometry, batch, window, device)
    traffic = case.traffic()
    row = {"geometry": name, "batch": batch, "window": window, "replay_config": str(config) if config else "table"}

    def replay():
        return case.replay_steps(config, via_op=False) if config else case.replay_steps()

    row["check_rel_err"] = case.check_replay(config)
    if failure := check_failure(row["check_rel_err"]):
        raise RuntimeError(f"{name}: the replay step {failure}")
    row["replay_us"] = time_graph_per_step(replay(), repeats)
    if full:
        # The same step with every launch a plain one (no programmatic dependent launch), checked and timed alongside.
        plain = dataclasses.replace(config if isinstance(config, StepVariant) else StepVariant(config), overlap=False)
        if failure := check_failure(case.check_replay(plain)):
            raise RuntimeError(f"{name}: the replay step without overlapping launches {failure}")
        row["replay_no_overlap_us"] = time_graph_per_step(case.replay_steps(plain, via_op=False), repeats)
        row["overlap_gain"] = row["replay_no_overlap_us"] / row["replay_us"] - 1
    if breakdown:
        row["replay_kernels_us"] = kernel_times_per_step(replay())
    if full:
        case.set_phase("in-phase")
        row["replay_inphase_us"] = time_graph_per_step(replay(), repeats)
        row["nonflush_us"] = time_graph_per_step(case.pinned_replay_steps(window - 1, window, config), repeats)
        row["flush_us"] = time_graph_per_step(case.pinned_replay_steps(window, window, config), repeats)
        row["stagger_vs_inphase"] = row["replay_us"] / row["replay_inphase_us"] - 1
    row["conventional_config"] = str(conventional_config) if conventional_config else "table"
    row["conventional_us"] = time_graph_per_step(case.conventional_steps(conventional_config, via_op=conventional_config is None), repeats)
    if fla_fn is not None and not case.mamba2:
        row["fla_us"] = time_graph_per_step(case.fla_steps(fla_fn), repeats)
    if read_dtype is not None:
        read_case = Case(geometry, batch, window, device, conventional=False, read_dtype=read_dtype)
        row["read_check_rel_err"] = read_case.check_replay()
        if failure := check_failure(row["read_check_rel_err"]):
            raise RuntimeError(f"{name}: the replay step with a read copy {failure}")
        row["read_dtype"] = str(read_dtype).replace("torch.", "")
        row["replay_read_us"] = time_graph_per_step(read_case.replay_steps(), repeats)
        if full:
            read_case.set_phase("in-phase")
            row["replay_read_inphase_us"] = time_graph_per_step(read_case.replay_steps(), repeats)
        read_traffic = read_case.traffic()
        row["replay_read_floor_us"] = read_traffic.replay / bw * 1e6
        row["replay_read_pct_floor"] = 100 * row["replay_read_floor_us"] / row["replay_read_us"]
        row["speedup_read"] = row["conventional_us"] / row["replay_read_us"]
        row["bytes_model_ratio_read"] = read_traffic.conventional / read_traffic.replay
        if not read_case.mamba2:
            # GDN's exact fold with a copy has several forms (configs.GDN_READ_COPY_FOLDS): the one the table used
            # before, on its launch shape, checked and timed beside the table's.
            other, other_launch = PREVIOUS_READ_FOLD
            variant = StepVariant(None, 3, flush=other_launch, read_fold=other)
            if failure := check_failure(read_case.check_replay(variant)):
                raise RuntimeError(f"{name}: the replay step with a read copy, {other} fold, {failure}")
            row["read_fold"], row["read_fold_other"] = GDN_READ_COPY_FOLD, other
            row["read_fold_other_launch"] = other_launch.as_dict()
            read_case.set_phase("staggered")
            row["replay_read_other_fold_us"] = time_graph_per_step(read_case.replay_steps(variant, via_op=False), repeats)
        del read_case
    row["replay_floor_us"] = traffic.replay / bw * 1e6
    row["conventional_floor_us"] = traffic.conventional / bw * 1e6
    row["replay_pct_floor"] = 100 * row["replay_floor_us"] / row["replay_us"]
    row["conventional_pct_floor"] = 100 * row["conventional_floor_us"] / row["conventional_us"]
    row["speedup"] = row["conventional_us"] / row["replay_us"]
    row["bytes_model_ratio"] = traffic.ratio
    if "fla_us" in row:
        row["fla_pct_floor"] = 100 * row["conventional_floor_us"] / row["fla_us"]
    del case
    torch.cuda.empty_cache()
    return row


@dataclasses.dataclass(frozen=True)
class StepVariant:
    """A replay step launched otherwise than its tables say: ``config`` is the main launch's (GDN's single
    kernel's); ``launches=3``: a GDN decode step through verification's three launches, whose fold and
    weights launches take ``flush`` and ``weights``; ``fold_in_main`` (Mamba-2): full rings folded inside
    the main launch (no flush launch); ``flush`` and ``weights`` (Mamba-2 too): the flush launch's and the
    weights launch's warps; ``overlap``:
    the later launches with programmatic dependent launch (``configs.replay_overlap``); ``read_fold`` (GDN
    with a read copy): the exact fold's form (``configs.GDN_READ_COPY_FOLDS``). None: the table's
    choice."""

    config: LaunchConfig | None
    launches: int | None = None
    fold_in_main: bool | None = None
    flush: LaunchConfig | None = None
    weights: LaunchConfig | None = None
    overlap: bool | None = None
    read_fold: str | None = None

    def as_dict(self) -> dict:
        out = {**(self.config.as_dict() if self.config else {}), "launches": self.launches, "fold_in_main": self.fold_in_main}
        if self.overlap is not None:
            out["overlap"] = self.overlap
        if self.read_fold is not None:
            out["read_fold"] = self.read_fold
        for name, cfg in (("flush", self.flush), ("weights", self.weights)):
            if cfg is not None:
                out[name] = cfg.as_dict()
        return out


# Replay T = 1 candidates, each explicit about the choices the tables make (so a table change does not
# change what a candidate means). Mamba-2: its main launch (split 64: one tile per program at these
# sizes; smaller splits: a program loops over several of its head's tiles), full rings folded in a flush
# launch or in the main launch; GDN: the three launches with small-tile main shapes, the fold launch in
# its grid and work-list forms, and the weights launch on 1 and 4 warps (each with the main launch of
# _GDN_DECODE_MAIN, so each change is timed alone). Left out to keep a GPU call short, having lost every
# sweep (docs/kernels.md): GDN's single replay kernel, 32-row programs and several tiles per main
# program, Mamba-2's 2-warp and 16-row programs, and the block / unrolled / dot forms of run 9 (removed
# from the kernels).
GDN_GRID_FOLD = LaunchConfig(16, 1, 4)
GDN_WORKLIST_FOLD = LaunchConfig(16, 2, 4, form="worklist", programs_per_sm=3)  # the table's (half-head items)
GDN_WORKLIST_FOLD_WHOLE_HEADS = LaunchConfig(16, 1, 4, form="worklist", programs_per_sm=2)  # the table's until 2026-12-01
SWEEP_REPLAY = {
    # (split 64 folding in a flush launch and in the main launch, splits 5 and 2: 320-334 / 299-302 us on
    # 2026-12-01, behind splits 3-4)
    # (num_stages 2: a tie on 2026-12-01; main programs reading their first tile before waiting for the
    # weights launch: 3-5% slower, removed)
    "mamba2": [
        *(StepVariant(LaunchConfig(8, split, 1), fold_in_main=True, overlap=overlap) for split in (4, 3) for overlap in (False, True)),
        # (the fold as a work list beside the main launch, run 22, lost here too: 312.3-313.7 / 332.2-333.0 /
        # 173.3-174.4 us against 297.8 / 315.0 / 168.6 on 2026-12-02, run 23; removed)
    ],
    # (grid-form folds, 8-row main tiles and 4-warp weights launches: behind the work-list fold on 2026-12-01)
    # (main programs reading their tile before the wait: 2-3% slower, removed; 2 or 4 main programs per head,
    # looping: 0.3-1% behind one tile per program)
    "gdn": [
        # (half-head work-list items on 4 programs per multiprocessor: 193.0 / 368.0 us on 2026-12-01, behind 3)
        *(StepVariant(LaunchConfig(16, 64, 1), 3, flush=GDN_WORKLIST_FOLD, overlap=overlap) for overlap in (False, True)),
        StepVariant(LaunchConfig(16, 64, 1), 3, flush=GDN_WORKLIST_FOLD_WHOLE_HEADS, overlap=True),
        # the table's work list with each item's tile loop software-pipelined (3 stages: the next tiles' loads by
        # cp.async during this tile's fold; 165 registers for sm_90, 3 programs per multiprocessor as before; a tie
        # on 2026-12-02 16:31, 187.2 / 349.1 us against 185.9 / 349.3, run 21)
        StepVariant(LaunchConfig(16, 64, 1), 3, flush=LaunchConfig(16, 2, 4, 3, form="worklist", programs_per_sm=3), overlap=True),
        StepVariant(LaunchConfig(16, 64, 1), 3, flush=GDN_GRID_FOLD, overlap=True),
        # the fold launch after the weights launch, beside the main launch, finishing the rows it folds
        # ("alongside", docs/kernels.md run 19: 1.7-1.9% ahead of the table's on 2026-12-02, in one run)
        StepVariant(LaunchConfig(16, 64, 1), 3, flush=LaunchConfig(16, 1, 4, form="alongside", programs_per_sm=2), overlap=True),
        # the same on items of half a head (168 registers against 181 for sm_90, Triton 3.6: 3 programs per
        # multiprocessor), for steps on which many rows fold (2026-12-02 10:33, 16/32 heads, staggered / in-phase:
        # whole heads 182.4 / 193.4 us, half heads 189.7 / 189.8, the table's work list 186.9 / 181.6; run 20)
        StepVariant(LaunchConfig(16, 64, 1), 3, flush=LaunchConfig(16, 2, 4, form="alongside", programs_per_sm=3), overlap=True),
        # (the main launch's "mma" form, verification's from T = 4 on: 344-353 / 663-684 us on 2026-12-01, 16 / 32
        # rows; its 16 token rows are padding but one at T = 1)
    ],
}


def _time_candidates(name, kind, candidates, check, steps, log, set_phase=None) -> tuple[list[dict], tuple | None]:
    """Check each candidate against the reference (``check(cfg)``), time its steps (``steps(cfg)``); returns the
    rows and the fastest (config, us). A candidate that does not compile, or is wrong, is logged and skipped.
    ``set_phase`` (replay steps): each candidate is also timed with every row folding on the same step
    (``us_inphase``, what ``generate()`` does), then the rows are staggered again; the choice stays by the
    staggered time, the headline's."""
    from _common import time_graph_per_step

    rows, best = [], None
    for cfg in candidates:
        us_inphase = None
        try:
            if failure := check_failure(check(cfg)):
                raise RuntimeError(failure)
            us = time_graph_per_step(steps(cfg), repeats=10)
            if set_phase is not None:
                set_phase("in-phase")
                try:
                    us_inphase = time_graph_per_step(steps(cfg), repeats=10)
                finally:
                    set_phase("staggered")
        except Exception as exc:  # noqa: BLE001 - a config that does not compile, or is wrong, is a result too
            us = None
            log(f"sweep {name} {kind} {cfg}: {type(exc).__name__}: {exc}")
        rows.append({"geometry": name, "kernel": kind, **cfg.as_dict(), "us": us, "us_inphase": us_inphase})
        log(f"sweep {name:24s} {kind} {cfg} -> {us}" + ("" if us_inphase is None else f" (in-phase {us_inphase})"))
        if us is not None and (best is None or us < best[1]):
            best = (cfg, us)
    return rows, best


# Conventional candidates: GDN's (Mamba-2's table entry, one 8-row tile per 1-warp program, is at 98-99% of
# its floor): the table's 32-row 8-warp programs and the small-tile shapes that won for the replay kernels.
SWEEP_CONVENTIONAL = {
    "mamba2": [],
    # (three more shapes lost in runs 7-8; two programs per head on 8 / 4 warps on 2026-12-01: 283.4 / 280.4 us
    # against 266.8 for the table's, 16/32 heads)
    "gdn": [LaunchConfig(32, 4, 8), LaunchConfig(8, 16, 1), LaunchConfig(16, 8, 1), LaunchConfig(16, 8, 2), LaunchConfig(32, 4, 4)],
}


def sweep(geometries, device, log, kind: str = "replay") -> tuple[list[dict], dict]:
    """Time the ``kind`` ("replay" or "conventional") kernel's candidates at the headline point; returns the
    rows and the fastest config per geometry (the headline then uses it)."""
    out, best = [], {}
    for name, geometry in geometries.items():
        family = "mamba2" if isinstance(geometry, Mamba2Geometry) else "gdn"
        candidates = SWEEP_REPLAY[family] if kind == "replay" else SWEEP_CONVENTIONAL[family]
        if not candidates:
            continue
        case = Case(geometry, HEADLINE_BATCH, HEADLINE_WINDOW, device, conventional=kind == "conventional")
        set_phase = None
        if kind == "replay":
            check, steps, set_phase = case.check_replay, lambda cfg: case.replay_steps(cfg, via_op=False), case.set_phase
        else:
            check, steps = case.check_conventional, lambda cfg: case.conventional_steps(cfg, via_op=False)
        rows, fastest = _time_candidates(name, kind, candidates, check, steps, log, set_phase)
        out += rows
        if fastest:
            best[name] = fastest[0]
        del case
        torch.cuda.empty_cache()
    return out, best


def dry_run() -> None:
    """Run each step kind once on tiny CPU tensors (Triton interpreter): catches plumbing errors."""
    for name, geometry in DRY_GEOMETRIES.items():
        case = Case(geometry, 3, 4, "cpu")
        for step in case.replay_steps(via_op=False) + case.conventional_steps(via_op=False) + case.replay_steps():
            step()
        for cfg in [None] + SWEEP_REPLAY["mamba2" if case.mamba2 else "gdn"]:
            for _ in range(case.window + 1):  # every row flushes once, at its own step
                failure = check_failure(case.check_replay(cfg))
                assert failure is None, f"dry run {name} {cfg}: the replay step {failure}"
                case.replay_step(case.inputs[0], cfg, via_op=cfg is None)
        # a verify step (T = 2, entries pending) and a commit of 0..2 per row: spec_kernels.py's check
        pair = tuple(torch.cat(parts, dim=1) for parts in zip(case.inputs[0], case.inputs[1]))
        accepted = torch.arange(case.batch, device=case.device) % 3
        main_config = LaunchConfig(16, 1, 2)  # the verification main launch
        for _ in range(case.window):
            errors = case.check_replay(
                main_config, pair, commit=False,
                after=lambda st: replayssm.ops.commit(st["cursor"], st["pending"], case.rows, accepted),
                after_reference=lambda st: reference.commit(st["cursor"], st["pending"], case.rows, accepted),
            )  # fmt: skip
            assert check_failure(errors) is None, f"dry run {name}: the verify step {check_failure(errors)}"
            case.replay_step(pair, main_config, via_op=False, commit=False)
            replayssm.ops.commit(case.state.cursor, case.state.pending, case.rows, accepted)
        if not case.mamba2:
            for cfg in SWEEP_CONVENTIONAL["gdn"]:
                failure = check_failure(case.check_conventional(cfg))
                assert failure is None, f"dry run {name} conventional {cfg}: {failure}"
        read_case = Case(geometry, 3, 4, "cpu", conventional=False, read_dtype=torch.bfloat16)
        for _ in range(read_case.window + 1):  # with a read copy of the checkpoint (the tables' launches)
            failure = check_failure(read_case.check_replay())
            assert failure is None, f"dry run {name}, bf16 read copy: the replay step {failure}"
            read_case.replay_step(read_case.inputs[0])
        if not case.mamba2:
            # The exact fold's forms through the kernels (the op above is the reference on the CPU), as the
            # headline times them. An fp16 copy: the interpreter truncates fp32 -> bf16 casts (NOTES-TRITON).
            fp16_case = Case(geometry, 3, 4, "cpu", conventional=False, read_dtype=torch.float16)
            for _ in range(fp16_case.window + 1):
                for fold in GDN_READ_COPY_FOLDS:
                    failure = check_failure(fp16_case.check_replay(StepVariant(None, read_fold=fold)))
                    assert failure is None, f"dry run {name}, fp16 read copy, {fold} fold: the replay step {failure}"
                fp16_case.replay_step(fp16_case.inputs[0])
        cfg = mamba2_replay_config(16, 16) if case.mamba2 else gdn_replay_config(16, 16)
        conv = mamba2_conventional_config(16, 16) if case.mamba2 else gdn_conventional_config(16, 16)
        print(f"dry run {name}: ok (replay {cfg}, conventional {conv}); traffic ratio {case.traffic().ratio:.2f}")


def plot(rows, path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install replayssm[bench])"
    names = list(dict.fromkeys(r["geometry"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8), squeeze=False)
    for ax, name in zip(axes[0], names):
        pts = sorted((r for r in rows if r["geometry"] == name), key=lambda r: r["batch"])
        b = [r["batch"] for r in pts]
        ax.loglog(b, [r["replay_us"] for r in pts], "o-", label="replay")
        ax.loglog(b, [r["conventional_us"] for r in pts], "s-", label="conventional")
        if any("fla_us" in r for r in pts):
            ax.loglog(b, [r.get("fla_us") for r in pts], "^-", label="fla fused_recurrent")
        ax.loglog(b, [r["replay_floor_us"] for r in pts], "--", color="C0", alpha=0.6, label="replay floor")
        ax.loglog(b, [r["conventional_floor_us"] for r in pts], "--", color="C1", alpha=0.6, label="conventional floor")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("batch")
        ax.set_ylabel("us per decode step")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"decode step, window {HEADLINE_WINDOW}, fp32 state, bf16 inputs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


READ_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
HEADLINE_COLUMNS = [
    ("geometry", "geometry", ""),
    ("replay_us", "replay us (staggered)", ".1f"),
    ("replay_inphase_us", "replay us (in-phase)", ".1f"),
    ("replay_no_overlap_us", "replay us, no PDL", ".1f"),
    ("stagger_vs_inphase", "stag/in-phase - 1", "+.1%"),
    ("nonflush_us", "non-flush us", ".1f"),
    ("flush_us", "flush us", ".1f"),
    ("conventional_us", "conventional us", ".1f"),
    ("fla_us", "fla us", ".1f"),
    ("speedup", "conv/replay", ".2f"),
    ("bytes_model_ratio", "bytes ratio", ".2f"),
    ("replay_pct_floor", "replay % floor", ".1f"),
    ("conventional_pct_floor", "conv % floor", ".1f"),
]
# With --read-dtype: the replay step reading a low-precision copy of the checkpoint (SPEC §4).
READ_COLUMNS = [
    ("geometry", "geometry", ""),
    ("read_dtype", "read copy", ""),
    ("replay_read_us", "replay us (staggered)", ".1f"),
    ("replay_read_inphase_us", "replay us (in-phase)", ".1f"),
    ("conventional_us", "conventional us", ".1f"),
    ("speedup_read", "conv/replay", ".2f"),
    ("bytes_model_ratio_read", "bytes ratio", ".2f"),
    ("replay_read_pct_floor", "replay % floor", ".1f"),
    ("read_fold", "GDN fold", ""),
    ("read_fold_other", "other fold", ""),
    ("replay_read_other_fold_us", "replay us, other fold", ".1f"),
]
SWEEP_COLUMNS = [
    ("geometry", "geometry", ""),
    ("batch", "batch", "d"),
    ("window", "L", "d"),
    ("replay_us", "replay us", ".1f"),
    ("conventional_us", "conv us", ".1f"),
    ("fla_us", "fla us", ".1f"),
    ("speedup", "conv/replay", ".2f"),
    ("replay_pct_floor", "replay % floor", ".1f"),
    ("conventional_pct_floor", "conv % floor", ".1f"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results", help="folder for decode_kernels.json / .png / .log")
    ap.add_argument("--geometries", nargs="*", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    ap.add_argument("--batches", nargs="*", type=int, default=list(BATCHES))
    ap.add_argument("--windows", nargs="*", type=int, default=list(WINDOWS))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--sweep", action="store_true", help="time launch configurations at the headline point first")
    ap.add_argument("--breakdown", action="store_true", help="headline rows: replay kernel time per step by kernel (profiler)")
    ap.add_argument("--headline-only", action="store_true", help="only the batch-256, window-16 table")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU under the Triton interpreter; no timing")
    ap.add_argument(
        "--read-dtype", choices=list(READ_DTYPES), default=None,
        help="headline rows: also the replay step reading a copy of the checkpoint in this dtype (SPEC §4)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.dry_run:
        dry_run()
        return
    from _common import format_table, streaming_bandwidth

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "decode_kernels.log", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")
        log_file.flush()

    device = "cuda"
    geometries = {n: GEOMETRIES[n] for n in args.geometries}
    fla_fn, fla_error = _load_fla()
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": platform.python_version(),
        "fla": "not importable: " + fla_error if fla_fn is None else "fla-core " + getattr(sys.modules.get("fla"), "__version__", "?"),
        "state_dtype": "float32",
        "input_dtype": "bfloat16",
        "command": " ".join(sys.argv),
    }
    log(json.dumps(meta))
    result = {"meta": meta}
    chosen, chosen_conventional = {}, {}
    if args.sweep:
        result["sweep"], chosen = sweep(geometries, device, log)
        result["chosen_replay_config"] = {k: v.as_dict() for k, v in chosen.items()}
        log("chosen replay configs: " + json.dumps(result["chosen_replay_config"]))
        conventional_rows, chosen_conventional = sweep(geometries, device, log, kind="conventional")
        result["sweep"] += conventional_rows
        result["chosen_conventional_config"] = {k: v.as_dict() for k, v in chosen_conventional.items()}
        log("chosen conventional configs: " + json.dumps(result["chosen_conventional_config"]))
    bw, rates = streaming_bandwidth()
    bw_end = None
    result["bandwidth_Bps"], result["bandwidth_by_config"] = bw, rates
    log(f"streaming bandwidth (elementwise Triton kernel, read + write, best of {len(rates)} configs): {bw / 1e12:.3f} TB/s")
    log("  " + ", ".join(f"{k}: {v / 1e12:.3f}" for k, v in rates.items()))

    headline = []
    for name, geometry in geometries.items():
        row = measure_point(
            name, geometry, HEADLINE_BATCH, HEADLINE_WINDOW, bw, device, fla_fn, full=True, repeats=args.repeats,
            config=chosen.get(name), breakdown=args.breakdown, conventional_config=chosen_conventional.get(name),
            read_dtype=READ_DTYPES.get(args.read_dtype),
        )  # fmt: skip
        headline.append(row)
        log(f"headline {json.dumps(row)}")
    result["headline"] = headline
    batch_rows, window_rows = [], []
    if not args.headline_only:
        for name, geometry in geometries.items():
            for batch in args.batches:
                if batch == HEADLINE_BATCH:
                    row = next(r for r in headline if r["geometry"] == name)
                else:
                    row = measure_point(name, geometry, batch, HEADLINE_WINDOW, bw, device, fla_fn, repeats=args.repeats, config=chosen.get(name))
                batch_rows.append(row)
                log(f"batch {json.dumps(row)}")
            for window in args.windows:
                if window == HEADLINE_WINDOW:
                    row = next(r for r in headline if r["geometry"] == name)
                else:
                    row = measure_point(name, geometry, HEADLINE_BATCH, window, bw, device, None, repeats=args.repeats, config=chosen.get(name))
                window_rows.append(row)
                log(f"window {json.dumps(row)}")
        bw_end = streaming_bandwidth()[0]
        log(f"streaming bandwidth at the end: {bw_end / 1e12:.3f} TB/s")
    result.update(batch_sweep=batch_rows, window_sweep=window_rows, bandwidth_end_Bps=bw_end)
    (out / "decode_kernels.json").write_text(json.dumps(result, indent=1))
    plot_error = plot(batch_rows or headline, out / "decode_kernels.png")
    if plot_error:
        log(plot_error)
    if batch_rows:
        log("\nbatch sweep (window 16):\n" + format_table(batch_rows, SWEEP_COLUMNS))
        log("\nwindow sweep (batch 256, staggered):\n" + format_table(window_rows, SWEEP_COLUMNS))
    log(f"\n{meta['gpu']}, streaming bandwidth {bw / 1e12:.3f} TB/s; fla: {meta['fla']}")
    log(f"headline: batch {HEADLINE_BATCH}, window {HEADLINE_WINDOW}, fp32 state, bf16 inputs, us per decode step\n")
    log(format_table(headline, HEADLINE_COLUMNS))
    if args.read_dtype:
        log(f"\nthe same steps with a {args.read_dtype} read copy of the fp32 checkpoint (SPEC §4), same conventional kernel\n")
        log(format_table(headline, READ_COLUMNS))
    log_file.close()


if __name__ == "__main__":
    main()
