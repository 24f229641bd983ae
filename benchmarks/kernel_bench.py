"""Kernel benchmarks: a registry of named cases sharing one set of options.

    PYTHONPATH=src python benchmarks/kernel_bench.py --list
    PYTHONPATH=src python benchmarks/kernel_bench.py decode spec --headline-only --json $OUT/kernels.json
    PYTHONPATH=src python benchmarks/kernel_bench.py decode spec conv --dry-run     # CPU, Triton interpreter

Cases (``--list``): ``decode`` (replay decode step against the conventional one and fla's),
``spec`` (verify + commit against the snapshot baseline), ``conv`` (the conv decode step's
forms against transformers' path), ``resources`` (registers and shared memory of every launch,
compiled for sm_90 without a GPU).

Method, for every timed case: a sequence of steps with fresh random inputs (never zeros) captured in
one CUDA graph, replayed ``--repeats`` times; the median over the steps; every configuration timed
is first checked against the PyTorch reference (outputs and every state tensor; a wrong one fails
the run, or is dropped from a sweep). Floors: bytes of a bandwidth model over the streaming bandwidth
of an elementwise kernel measured in the same run. ``--sweep`` first times the candidates of each
launch table the case's steps use (``replayssm/ops/<family>/launch.py``, set in place, one table after
another), keeps the fastest for the case's measurements and reports them (the tables are edited by
hand). ``--dry-run`` runs the same code on tiny sizes on the CPU under the Triton interpreter, each
timing replaced by one call of the first step: plumbing and checks only (CI runs it).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

if "--dry-run" in sys.argv:  # before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import check_failure, format_table, patched, plot, rel_err  # noqa: E402

import replayssm  # noqa: E402
import replayssm.ops.launch as launch_defaults  # noqa: E402
from replayssm import GDNGeometry, Mamba2Geometry, decode_traffic  # noqa: E402
from replayssm.ops.commit import reference as commit_reference  # noqa: E402
from replayssm.ops.gdn import launch as gdn_launch  # noqa: E402
from replayssm.ops.gdn import reference as gdn_reference  # noqa: E402
from replayssm.ops.launch import LaunchConfig  # noqa: E402
from replayssm.ops.mamba2 import launch as mamba2_launch  # noqa: E402
from replayssm.ops.mamba2 import reference as mamba2_reference  # noqa: E402

GEOMETRIES = {
    "mamba2-96x80x128-g8": Mamba2Geometry(heads=96, head_dim=80, state_size=128, groups=8),
    "mamba2-128x64x128-g8": Mamba2Geometry(heads=128, head_dim=64, state_size=128, groups=8),
    "mamba2-64x64x128-g8": Mamba2Geometry(heads=64, head_dim=64, state_size=128, groups=8),
    "gdn-16x32x128x128": GDNGeometry(key_heads=16, value_heads=32, key_dim=128, value_dim=128),
    "gdn-16x64x128x128": GDNGeometry(key_heads=16, value_heads=64, key_dim=128, value_dim=128),
}
DRY_GEOMETRIES = {
    "mamba2-tiny": Mamba2Geometry(heads=2, head_dim=16, state_size=16, groups=1),
    "gdn-tiny": GDNGeometry(key_heads=1, value_heads=2, key_dim=16, value_dim=16),
}
#: the tuned shape each tiny geometry takes its table entries from in a dry run (so the tables' forms run)
DRY_MIRRORS = {(16, 16): [(80, 128), (128, 128)]}
HEADLINE_BATCH, HEADLINE_WINDOW, HEADLINE_T = 256, 16, 4
ACT = torch.bfloat16
READ_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}  # fp8: Mamba-2 only


def _require(errors: dict, what: str) -> dict:
    if failure := check_failure(errors):
        raise RuntimeError(f"{what} {failure}")
    return errors


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


# how a run times: the GPU, or (dry run) one call of the first step


@dataclasses.dataclass
class Bench:
    device: str
    repeats: int
    dry: bool
    bandwidth: float = 1.0
    log: Callable[[str], None] = print

    @property
    def batch(self) -> int:
        """The headline batch (a dry run's: 2 rows, one folding in a check's step, one not)."""
        return 2 if self.dry else HEADLINE_BATCH

    @property
    def window(self) -> int:
        return 4 if self.dry else HEADLINE_WINDOW

    def time(self, steps, repeats: int | None = None) -> float:
        """Microseconds per step (``_common.time_graph_per_step``)."""
        if self.dry:
            steps[0]()
            return 1.0
        from _common import time_graph_per_step

        return time_graph_per_step(steps, repeats or self.repeats)

    def kernel_times(self, steps) -> dict:
        if self.dry:
            steps[0]()
            return {}
        from _common import kernel_times_per_step

        return kernel_times_per_step(steps)

    def free(self) -> None:
        if self.device == "cuda":
            torch.cuda.empty_cache()


def implementations(device: str) -> dict:
    """The step functions timed: the ops (the GPU), or their Triton launchers (the CPU, where the ops run the reference)."""
    if device == "cuda":
        ops = replayssm.ops
        return {"mamba2": ops.mamba2_step, "gdn": ops.gdn_step, "mamba2_conv": ops.mamba2_conventional_step,
                "gdn_conv": ops.gdn_conventional_step, "commit": ops.commit}  # fmt: skip
    from replayssm.ops.commit import kernels as commit_kernels
    from replayssm.ops.gdn import conventional as gdn_conv
    from replayssm.ops.gdn import step as gdn_step
    from replayssm.ops.mamba2 import conventional as mamba2_conv
    from replayssm.ops.mamba2 import kernels as mamba2_kernels

    return {"mamba2": mamba2_kernels.mamba2_step, "gdn": gdn_step.gdn_step, "mamba2_conv": mamba2_conv.mamba2_conventional_step,
            "gdn_conv": gdn_conv.gdn_conventional_step, "commit": commit_kernels.commit}  # fmt: skip


# one (geometry, batch, window) point: state, parameters, inputs, steps


class Point:
    """State, parameters and ``window`` sets of fresh random inputs for one (geometry, batch, window)."""

    def __init__(self, geometry, batch: int, window: int, device: str, seed: int = 0, conventional: bool = True, read_dtype=None):
        self.geometry, self.batch, self.window, self.device, self.read_dtype = geometry, batch, window, device, read_dtype
        self.fn = implementations(device)
        config = replayssm.ReplayConfig(window=window, read_dtype=read_dtype)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.rows = torch.arange(batch, device=device)
        self.mamba2 = isinstance(geometry, Mamba2Geometry)
        g = geometry
        if self.mamba2:
            self.state = st = replayssm.Mamba2ReplayState(g, batch, config, device, activation_dtype=ACT)
            self.A = -(self.rand(g.heads) * 4 + 0.5)
            self.D = self.randn(g.heads)
            self.dt_bias = self.randn(g.heads) * 0.5 - 2.0
            shapes = [(g.heads, g.head_dim), (g.heads,), (g.groups, g.state_size), (g.groups, g.state_size), (g.heads, g.head_dim)]
            scales = [1, 0.5, 1, 1, 1]
            self.inputs = [tuple((self.randn(batch, 1, *s) * c).to(ACT) for s, c in zip(shapes, scales)) for _ in range(window)]
            st.ring_x.copy_(self.randn(*st.ring_x.shape))
            st.ring_B.copy_(self.randn(*st.ring_B.shape))
            st.ring_dt.copy_(self.rand(*st.ring_dt.shape) * 0.1)
            st.ring_logdecay.copy_(-st.ring_dt * 2)
        else:
            self.state = st = replayssm.GDNReplayState(g, batch, config, device)
            # The fused gates, as the integrations call the ops: raw a and b (bf16) with A_log and dt_bias (fp32),
            # g = -exp(A_log) softplus(a + dt_bias) mostly in -0.6..-0.05 per token.
            self.A_log = (self.rand(g.value_heads) + 1).log()
            self.dt_bias = self.randn(g.value_heads) * 0.5 - 2.0
            self.inputs = [
                tuple(self.randn(*shape).to(ACT) for shape in (
                    (batch, 1, g.key_heads, g.key_dim), (batch, 1, g.key_heads, g.key_dim), (batch, 1, g.value_heads, g.value_dim),
                    (batch, 1, g.value_heads), (batch, 1, g.value_heads),
                ))  # q, k, v, a, b
                for _ in range(window)
            ]  # fmt: skip
            st.ring_k.copy_(torch.nn.functional.normalize(self.randn(*st.ring_k.shape), dim=-1))
            st.ring_d.copy_(self.randn(*st.ring_d.shape) * 0.1)
            st.ring_g.copy_(-self.rand(*st.ring_g.shape) * 0.3)
        self.state.load(state=self.randn(*self.state.checkpoint.shape) * 0.1, rows=None)  # the read copy too, if any
        self.conventional_state = self.randn(*self.state.checkpoint.shape) * 0.1 if conventional else None
        self.set_phase("staggered")

    def randn(self, *shape):
        return torch.randn(*shape, generator=self.gen, device=self.device)

    def rand(self, *shape):
        return torch.rand(*shape, generator=self.gen, device=self.device)

    def set_phase(self, phase: str) -> None:
        """``staggered``: row r at cursor r mod L (about B/L rows fold per step); ``in-phase``: every row at cursor 0."""
        c = self.rows % self.window if phase == "staggered" else torch.zeros_like(self.rows)
        self.state.cursor.copy_(c.to(torch.int32))
        self.state.pending.zero_()

    def state_args(self, state: dict | None = None) -> tuple:
        """The replay state's tensors in the ops' argument order (of ``state``, a dict of copies, if given)."""
        names = ("checkpoint", "ring_x", "ring_B", "ring_dt", "ring_logdecay") if self.mamba2 else ("checkpoint", "ring_k", "ring_d", "ring_g")
        return tuple(state[n] if state is not None else getattr(self.state, n) for n in names + ("cursor", "pending"))

    def _step(self, fn, inp, args, commit: bool, read, read_scale, ring_beta):
        if self.mamba2:
            x, dt, B, C, z = inp
            return fn(x, dt, self.A, B, C, self.D, self.dt_bias, z, *args, self.rows, commit, True, read, read_scale)
        return fn(*inp, *args, self.rows, commit, True, None, read, ring_beta, self.A_log, self.dt_bias)

    def replay_step(self, inp, commit: bool = True):
        """One replay step on ``inp`` (T tokens per row) through the launch tables; returns its output."""
        st = self.state
        fn = self.fn["mamba2" if self.mamba2 else "gdn"]
        return self._step(fn, inp, self.state_args(), commit, st.read_checkpoint, st.read_scale, getattr(st, "ring_beta", None))

    def reference_step(self, inp, state: dict, commit: bool = True):
        """The same step through the PyTorch reference, on ``state`` (a dict of copies of the state's tensors)."""
        fn = mamba2_reference.mamba2_step if self.mamba2 else gdn_reference.gdn_step
        return self._step(fn, inp, self.state_args(state), commit, state.get("read_checkpoint"), state.get("read_scale"), state.get("ring_beta"))

    def check_replay(self, inp=None, accepted=None) -> dict:
        """Relative errors (RMS) of one replay step against the reference: ``output``, and ``state`` (the worst
        state tensor; inf if cursors differ), from row r at cursor (L - r) mod (L + 1), so that rows fold and
        rows do not. ``accepted``: a verify step (no commit in the step) followed by a commit of that many
        entries per row. The state is restored afterwards (the timed steps hold it)."""
        inp = inp if inp is not None else self.inputs[0]
        saved = {n: t.clone() for n, t in self.state.tensors().items()}
        self.state.cursor.copy_((self.window - self.rows) % (self.window + 1))
        self.state.pending.zero_()
        theirs = {n: t.clone() for n, t in self.state.tensors().items()}
        y = self.replay_step(inp, commit=accepted is None)
        y_ref = self.reference_step(inp, theirs, commit=accepted is None)
        if accepted is not None:
            self.fn["commit"](self.state.cursor, self.state.pending, self.rows, accepted)
            commit_reference.commit(theirs["cursor"], theirs["pending"], self.rows, accepted)
        errors = [
            (0.0 if torch.equal(ours, theirs[n]) else float("inf")) if ours.dtype in (torch.int32, torch.int64) else rel_err(ours, theirs[n])
            for n, ours in self.state.tensors().items()
        ]
        for name, t in self.state.tensors().items():
            t.copy_(saved[name])
        return {"output": rel_err(y, y_ref), "state": max(errors)}

    def replay_steps(self):
        return [lambda inp=inp: self.replay_step(inp) for inp in self.inputs]

    def pinned_replay_steps(self, cursor_value: int, count: int):
        """``count`` steps, each preceded by resetting every cursor to ``cursor_value`` (a tiny copy kernel)."""
        pinned = torch.full((self.batch,), cursor_value, dtype=torch.int32, device=self.device)
        base = self.replay_steps()
        return [lambda step=step: (self.state.cursor.copy_(pinned), step()) for step in (base * count)[:count]]

    def conventional_step(self, inp, state, fn=None):
        fn = fn or self.fn["mamba2_conv" if self.mamba2 else "gdn_conv"]
        if self.mamba2:
            x, dt, B, C, z = inp
            return fn(x, dt, self.A, B, C, self.D, self.dt_bias, z, state, self.rows, True)
        return fn(*inp, state, self.rows, True, None, self.A_log, self.dt_bias)

    def check_conventional(self) -> dict:
        """Relative errors of one conventional step against the reference; the state is restored in place."""
        state, saved = self.conventional_state, self.conventional_state.clone()
        theirs = saved.clone()
        reference = mamba2_reference.mamba2_conventional_step if self.mamba2 else gdn_reference.gdn_conventional_step
        y = self.conventional_step(self.inputs[0], state)
        y_ref = self.conventional_step(self.inputs[0], theirs, reference)
        errors = {"output": rel_err(y, y_ref), "state": rel_err(state, theirs)}
        state.copy_(saved)
        return errors

    def conventional_steps(self):
        return [lambda inp=inp: self.conventional_step(inp, self.conventional_state) for inp in self.inputs]

    def fla_steps(self, fla_fn):
        """fla's fused recurrent kernel, one token, state read from and written to (N, HV, V, K) fp32; it takes
        the gates formed (here, outside the timed step)."""
        s = self.conventional_state
        steps = []
        for q, k, v, a, b in self.inputs:
            g, beta = gdn_reference.gates(a, b, self.A_log, self.dt_bias, torch.float32)
            steps.append(lambda q=q, k=k, v=v, g=g, beta=beta: fla_fn(q=q, k=k, v=v, g=g, beta=beta, initial_state=s, output_final_state=True,
                                                                      use_qk_l2norm_in_kernel=True, state_v_first=True))
        return steps  # fmt: skip

    def traffic(self):
        return decode_traffic(self.geometry, self.batch, self.window, torch.float32, ACT, read_dtype=self.read_dtype)


def stacked(single: list, T: int, offset: int = 0) -> tuple:
    """T-token inputs: single-token inputs ``offset``, ``offset + 1``, ... stacked along the token axis."""
    parts = [single[(offset + t) % len(single)] for t in range(T)]
    return tuple(torch.cat([p[j] for p in parts], dim=1) for j in range(len(parts[0])))


class SpecPoint:
    """A ``Point`` (window 16) with ``steps`` T-token verify inputs and accepted counts (``half``: T/2 of T,
    ``all``, ``random`` per row and step); ``read_dtype``: replay only (no snapshot state)."""

    def __init__(self, geometry, batch: int, T: int, accept: str, device: str, steps: int = 16, seed: int = 0, read_dtype=None, window=16):
        self.base = Point(geometry, batch, window, device, seed, conventional=read_dtype is None, read_dtype=read_dtype)
        self.T, self.batch, self.geometry = T, batch, geometry
        self.inputs = [stacked(self.base.inputs, T, i) for i in range(steps)]  # the decode point's tokens, fresh per step
        if accept == "random":
            acc = [torch.randint(0, T + 1, (batch,), generator=torch.Generator().manual_seed(seed + i)) for i in range(steps)]
        else:
            acc = [torch.full((batch,), T // 2 if accept == "half" else T, dtype=torch.int64) for _ in range(steps)]
        self.accepted_host = acc
        self.accepted = [a.to(device) for a in acc]
        s = self.base.conventional_state
        self.snapshots = None if s is None else torch.empty((batch, T) + tuple(s.shape[1:]), device=device)

    def check(self) -> dict:
        return self.base.check_replay(self.inputs[0], self.accepted[0])

    def replay_steps(self):
        b, st = self.base, self.base.state
        return [lambda inp=inp, acc=acc: (b.replay_step(inp, commit=False), b.fn["commit"](st.cursor, st.pending, b.rows, acc))
                for inp, acc in zip(self.inputs, self.accepted)]  # fmt: skip

    def snapshot_steps(self):
        """The conventional kernel writing the state after each of the T tokens (T slots + the current state)."""
        from replayssm.ops.gdn.conventional import gdn_conventional_step_out
        from replayssm.ops.mamba2.conventional import mamba2_conventional_step_out

        b, s, snaps = self.base, self.base.conventional_state, self.snapshots
        steps = []
        for inp in self.inputs:
            out = torch.empty_like(inp[0] if b.mamba2 else inp[2])
            if b.mamba2:
                x, dt, B, C, z = inp
                steps.append(lambda x=x, dt=dt, B=B, C=C, z=z, y=out: mamba2_conventional_step_out(
                    x, dt, b.A, B, C, b.D, b.dt_bias, z, s, b.rows, True, y=y, snapshots=snaps))
            else:
                steps.append(lambda inp=inp, o=out: gdn_conventional_step_out(
                    *inp, s, b.rows, True, None, o=o, snapshots=snaps, A_log=b.A_log, dt_bias=b.dt_bias))
        return steps  # fmt: skip


# launch-table sweeps


@dataclasses.dataclass
class Sweep:
    """Candidates for one launch table's entry, timed on ``path`` steps ("replay" or "conventional") of T tokens."""

    name: str
    table: dict
    key: tuple
    candidates: list
    T: int = 1
    path: str = "replay"
    read: bool = False  # timed on a state with a read copy


def _wl(block, split, warps, per_sm, stages=1) -> LaunchConfig:
    return LaunchConfig(block, split, warps, num_stages=stages, form="worklist", programs_per_sm=per_sm)


def sweep_tables(geometry, kind: str, read: bool = False) -> list[Sweep]:
    """The tables a ``kind`` ("decode": T = 1, "spec": verify steps) step uses, with their candidates; the table's
    own entry is first (added if missing), so a sweep only replaces it by something it timed. Shapes that lost
    every earlier sweep are left out to keep a GPU call short (docs/kernels.md lists them)."""
    L = lambda *a, **k: LaunchConfig(*a, **k)  # noqa: E731
    out: list[Sweep] = []
    if isinstance(geometry, Mamba2Geometry):
        key = (geometry.head_dim, geometry.state_size)
        tiles = lambda block: -(-key[0] // block)  # noqa: E731
        flush = [L(16, 1, 4), L(16, tiles(16), 4), L(16, 1, 4, 2), L(16, 1, 4, 3)]
        if kind == "decode":
            out += [Sweep("mamba2.DECODE", mamba2_launch.DECODE, key, [L(8, 4, 1), L(8, 3, 1), L(8, tiles(8), 1)]),
                    Sweep("mamba2.FOLD_IN_MAIN", mamba2_launch.FOLD_IN_MAIN, key, [True, False]),
                    Sweep("mamba2.CONVENTIONAL", mamba2_launch.CONVENTIONAL, key, [L(8, tiles(8), 1), L(16, tiles(16), 1)], path="conventional")]  # fmt: skip
            if read:
                out += [Sweep("mamba2.DECODE_READ_COPY", mamba2_launch.DECODE_READ_COPY, key,
                              [L(16, tiles(16), 1), L(32, tiles(32), 1), L(8, 4, 1), L(16, 4, 1)], read=True),
                        Sweep("mamba2.FLUSH", mamba2_launch.FLUSH, key, flush, read=True)]  # fmt: skip
        else:
            T = HEADLINE_T
            # the T outputs of a tile per token, or as one block whose N chunks load 1 to 4 chunks ahead
            verify = [L(8, tiles(8), 1)] + [L(b, tiles(b), 1, s, form="tokens_prefetched") for b in (8, 16) for s in (3, 4)]
            verify += [L(8, tiles(8), 1, 5, form="tokens_prefetched"), L(8, tiles(8), 1, 2, form="tokens_prefetched")]
            out += [Sweep("mamba2.VERIFY", mamba2_launch.VERIFY, key, verify, T),
                    Sweep("mamba2.FLUSH", mamba2_launch.FLUSH, key, flush, T),
                    Sweep("mamba2.WEIGHTS_VERIFY", mamba2_launch.WEIGHTS_VERIFY, key, [L(1, 1, w) for w in (4, 1, 2)], T),
                    Sweep("mamba2.CONVENTIONAL", mamba2_launch.CONVENTIONAL, key, [L(8, tiles(8), 1), L(16, tiles(16), 1)], T, "conventional")]  # fmt: skip
    else:
        key = (geometry.value_dim, geometry.key_dim)
        tiles = lambda block: -(-key[0] // block)  # noqa: E731
        half = max(1, tiles(16) // 2)  # 16-row programs looping over two tiles
        # whole heads or half heads per work-list item, 2 or 4 warps, pipelined tile loops, and the grid form
        fold = [_wl(16, 1, 2, 4), _wl(16, 1, 2, 4, 3), _wl(16, 1, 2, 3), _wl(16, 2, 2, 4), _wl(16, 1, 4, 2), _wl(16, 2, 4, 3),
                _wl(16, 2, 4, 3, 3), L(16, 1, 4)]  # fmt: skip
        conventional = [L(8, tiles(8), 1), L(32, tiles(32), 8), L(16, tiles(16), 1), L(16, tiles(16), 2), L(32, tiles(32), 4)]
        if kind == "decode":
            out += [Sweep("gdn.DECODE_LAUNCHES", gdn_launch.DECODE_LAUNCHES, key, [3, 1]),
                    Sweep("gdn.DECODE", gdn_launch.DECODE, key, [L(16, tiles(16), 1), L(8, tiles(8), 1), L(16, half, 1)]),
                    Sweep("gdn.FOLD", gdn_launch.FOLD, key, fold),
                    Sweep("gdn.WEIGHTS_SHORT", gdn_launch.WEIGHTS_SHORT, key, [L(1, 1, 1), L(1, 1, 4)]),
                    Sweep("gdn.CONVENTIONAL", gdn_launch.CONVENTIONAL, key, conventional, path="conventional")]  # fmt: skip
            if read:
                out += [Sweep("gdn.DECODE_READ_COPY", gdn_launch.DECODE_READ_COPY, key, [L(32, tiles(32), 1), L(16, tiles(16), 1)], read=True),
                        Sweep("gdn.FOLD", gdn_launch.FOLD, key, fold, read=True)]  # fmt: skip
        else:
            T = HEADLINE_T
            # tensor-core dots over pipelined key chunks ("mma") against per-token products; at the short tables'
            # longest draft (VERIFY_SHORT_MAX_T) too, where the tensor-core form pads the tokens to 16 rows
            mma = [L(b, tiles(b), w, s, form="mma") for b, w, s in ((32, 1, 4), (32, 1, 3), (16, 1, 3), (16, 1, 4), (32, 2, 3), (64, 4, 2))]
            mma.append(L(16, half, 1, 3, form="mma"))
            per_token = [L(8, tiles(8), 1), L(16, tiles(16), 1)]
            short_t = gdn_launch.VERIFY_SHORT_MAX_T
            out += [Sweep("gdn.VERIFY", gdn_launch.VERIFY, key, mma + per_token, T),
                    Sweep("gdn.VERIFY_SHORT", gdn_launch.VERIFY_SHORT, key, per_token + mma[:1], short_t),
                    Sweep("gdn.FOLD", gdn_launch.FOLD, key, fold[:2] + [L(16, 1, 4), L(16, tiles(16), 4), L(16, 1, 4, 3)], T),
                    Sweep("gdn.WEIGHTS", gdn_launch.WEIGHTS, key, [L(1, 1, 1, form="dot"), L(1, 1, 1), L(1, 1, 2)], T),
                    Sweep("gdn.CONVENTIONAL", gdn_launch.CONVENTIONAL, key, conventional + [L(16, tiles(16), 4)], T, "conventional")]  # fmt: skip
    for s in out:
        entry = s.table.get(s.key)
        s.candidates = list(dict.fromkeys(([entry] if entry is not None else []) + s.candidates))
    return out


def _described(entry):
    """A table entry for the log and the JSON: a LaunchConfig's fields, or the entry itself (a flag, a count)."""
    return entry.as_dict() if hasattr(entry, "as_dict") else entry


def run_sweeps(kind: str, geometries: dict, bench: Bench, read_dtype=None, only: list[str] | None = None) -> tuple[list[dict], dict]:
    """Time each table's candidates (batch 256; decode: window 16, rows staggered, and in phase for the record;
    spec: 2 of T accepted), one geometry per table key, one table after another; each table keeps its
    fastest (by the staggered time) for the rest of the case. Returns the rows and {table: {key: entry}}."""
    rows, chosen, seen = [], {}, set()
    for name, geometry in geometries.items():
        for s in sweep_tables(geometry, kind, read_dtype is not None):
            if (s.name, s.key, s.read) in seen or (only and s.name not in only):
                continue
            seen.add((s.name, s.key, s.read))
            timings = []
            for cfg in s.candidates:
                row = {"geometry": name, "table": s.name, "T": s.T, "read": s.read, "config": _described(cfg)}
                try:
                    with patched(s.table, s.key, cfg):
                        row.update(_time_candidate(kind, geometry, s, bench, read_dtype))
                    timings.append((row["us"], cfg))
                except Exception as err:  # noqa: BLE001 - a config the compiler rejects, or a wrong one, is a result too
                    if bench.dry:
                        raise
                    row["error"] = f"{type(err).__name__}: {err}"[:300]
                rows.append(row)
                bench.log(f"sweep {json.dumps(row)}")
                bench.free()
            best = min(timings, key=lambda t: t[0])[1] if timings else s.table.get(s.key)
            if best is not None:
                s.table[s.key] = best
                chosen.setdefault(s.name, {})[f"{s.key[0]}x{s.key[1]}"] = _described(best)
            bench.log(f"sweep {s.name} {s.key}: using {best}")
    return rows, chosen


def _time_candidate(kind, geometry, s: Sweep, bench: Bench, read_dtype) -> dict:
    """Check one candidate against the reference and time it (a dry run checks only: the steps timed are the
    headline's, which it runs)."""
    read = read_dtype if s.read else None
    if kind == "spec":
        point = SpecPoint(geometry, bench.batch, s.T, "half", bench.device, read_dtype=read, window=bench.window)
        base, steps = point.base, (point.snapshot_steps if s.path == "conventional" else point.replay_steps)
    else:
        base = point = Point(geometry, bench.batch, bench.window, bench.device, conventional=s.path == "conventional", read_dtype=read)
        steps = point.conventional_steps if s.path == "conventional" else point.replay_steps
    if s.path == "conventional":
        _require(base.check_conventional(), "the conventional step")
    else:
        _require(point.check() if kind == "spec" else point.check_replay(), "the replay step")
    if bench.dry:
        return {"us": 1.0}
    row = {"us": bench.time(steps())}
    if kind == "decode" and s.path == "replay":  # every row folding on the same step, as generate() runs
        point.set_phase("in-phase")
        row["us_inphase"] = bench.time(steps())
    return row


# case: decode


def _load_fla():
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except Exception as exc:  # noqa: BLE001 - any import failure means "not installed here"
        return None, f"{type(exc).__name__}: {exc}"
    return fused_recurrent_gated_delta_rule, None


def decode_point(name, geometry, batch, window, bench: Bench, fla_fn=None, full=False, breakdown=False, read_dtype=None) -> dict:
    """One (geometry, batch, window) decode point. ``full`` (the headline): also the step without overlapping
    launches, rows in phase, the non-flush and the flush step alone; ``breakdown``: kernel time per step by
    kernel; ``read_dtype``: also the replay step reading a copy of the checkpoint in that dtype (SPEC §4)."""
    point = Point(geometry, batch, window, bench.device)
    traffic = point.traffic()
    row = {"geometry": name, "batch": batch, "window": window}
    row["check_rel_err"] = _require(point.check_replay(), f"{name}: the replay step")
    row["replay_us"] = bench.time(point.replay_steps())
    if full:  # every launch a plain one (no programmatic dependent launch), checked and timed alongside
        with patched(vars(launch_defaults), "OVERLAP_LAUNCHES", False):
            _require(point.check_replay(), f"{name}: the replay step without overlapping launches")
            row["replay_no_overlap_us"] = bench.time(point.replay_steps())
        row["overlap_gain"] = row["replay_no_overlap_us"] / row["replay_us"] - 1
    if breakdown:
        row["replay_kernels_us"] = bench.kernel_times(point.replay_steps())
    if full:
        point.set_phase("in-phase")
        row["replay_inphase_us"] = bench.time(point.replay_steps())
        row["nonflush_us"] = bench.time(point.pinned_replay_steps(window - 1, window))
        row["flush_us"] = bench.time(point.pinned_replay_steps(window, window))
        row["stagger_vs_inphase"] = row["replay_us"] / row["replay_inphase_us"] - 1
    _require(point.check_conventional(), f"{name}: the conventional step")
    row["conventional_us"] = bench.time(point.conventional_steps())
    if fla_fn is not None and not point.mamba2:
        row["fla_us"] = bench.time(point.fla_steps(fla_fn))
    if read_dtype is not None:
        read = Point(geometry, batch, window, bench.device, conventional=False, read_dtype=read_dtype)
        row["read_check_rel_err"] = _require(read.check_replay(), f"{name}: the replay step with a read copy")
        row["read_dtype"] = _dtype_name(read_dtype)
        row["replay_read_us"] = bench.time(read.replay_steps())
        if full:
            read.set_phase("in-phase")
            row["replay_read_inphase_us"] = bench.time(read.replay_steps())
        read_traffic = read.traffic()
        row["replay_read_floor_us"] = read_traffic.replay / bench.bandwidth * 1e6
        row["replay_read_pct_floor"] = 100 * row["replay_read_floor_us"] / row["replay_read_us"]
        row["speedup_read"] = row["conventional_us"] / row["replay_read_us"]
        row["bytes_model_ratio_read"] = read_traffic.conventional / read_traffic.replay
        del read
    row["replay_floor_us"] = traffic.replay / bench.bandwidth * 1e6
    row["conventional_floor_us"] = traffic.conventional / bench.bandwidth * 1e6
    row["replay_pct_floor"] = 100 * row["replay_floor_us"] / row["replay_us"]
    row["conventional_pct_floor"] = 100 * row["conventional_floor_us"] / row["conventional_us"]
    row["speedup"] = row["conventional_us"] / row["replay_us"]
    row["bytes_model_ratio"] = traffic.ratio
    if "fla_us" in row:
        row["fla_pct_floor"] = 100 * row["conventional_floor_us"] / row["fla_us"]
    del point
    bench.free()
    return row


DECODE_COLUMNS = [
    ("geometry", "geometry", ""), ("replay_us", "replay us (staggered)", ".1f"), ("replay_inphase_us", "replay us (in-phase)", ".1f"),
    ("replay_no_overlap_us", "replay us, no PDL", ".1f"), ("stagger_vs_inphase", "stag/in-phase - 1", "+.1%"),
    ("nonflush_us", "non-flush us", ".1f"), ("flush_us", "flush us", ".1f"), ("conventional_us", "conventional us", ".1f"),
    ("fla_us", "fla us", ".1f"), ("speedup", "conv/replay", ".2f"), ("bytes_model_ratio", "bytes ratio", ".2f"),
    ("replay_pct_floor", "replay % floor", ".1f"), ("conventional_pct_floor", "conv % floor", ".1f"),
]  # fmt: skip
DECODE_READ_COLUMNS = [
    ("geometry", "geometry", ""), ("read_dtype", "read copy", ""), ("replay_read_us", "replay us (staggered)", ".1f"),
    ("replay_read_inphase_us", "replay us (in-phase)", ".1f"), ("conventional_us", "conventional us", ".1f"),
    ("speedup_read", "conv/replay", ".2f"), ("bytes_model_ratio_read", "bytes ratio", ".2f"),
    ("replay_read_pct_floor", "replay % floor", ".1f"),
]  # fmt: skip
DECODE_SWEEP_COLUMNS = [
    ("geometry", "geometry", ""), ("batch", "batch", "d"), ("window", "L", "d"), ("replay_us", "replay us", ".1f"),
    ("conventional_us", "conv us", ".1f"), ("fla_us", "fla us", ".1f"), ("speedup", "conv/replay", ".2f"),
    ("replay_pct_floor", "replay % floor", ".1f"), ("conventional_pct_floor", "conv % floor", ".1f"),
]  # fmt: skip


def run_decode(args, bench: Bench, geometries: dict) -> dict:
    """Headline (batch 256, window 16), then unless --headline-only the batch sweep (window 16) and the window
    sweep (batch 256); fla's fused recurrent kernel as a second GDN baseline where importable."""
    fla_fn, fla_error = (None, "dry run") if bench.dry else _load_fla()
    fla = "not importable: " + fla_error if fla_fn is None else "fla-core " + getattr(sys.modules.get("fla"), "__version__", "?")
    read_dtype = READ_DTYPES.get(args.read_dtype)
    batch0, window0 = bench.batch, bench.window
    result = {"fla": fla}
    if args.sweep:
        result["sweep"], result["chosen"] = run_sweeps("decode", geometries, bench, read_dtype, args.sweep_tables)
    headline = []
    for name, geometry in geometries.items():
        headline.append(decode_point(name, geometry, batch0, window0, bench, fla_fn, True, args.breakdown, read_dtype))
        bench.log(f"headline {json.dumps(headline[-1])}")
    batch_rows, window_rows = [], []
    if not args.headline_only:
        for name, geometry in geometries.items():
            for batch in args.batches or ((1, 2) if bench.dry else (1, 8, 32, 64, 128, 256, 512, 1024)):
                row = headline[list(geometries).index(name)] if batch == batch0 else decode_point(name, geometry, batch, window0, bench, fla_fn)
                batch_rows.append(row)
                bench.log(f"batch {json.dumps(row)}")
            for window in args.windows or ((2, 4) if bench.dry else (4, 8, 16, 32)):
                row = headline[list(geometries).index(name)] if window == window0 else decode_point(name, geometry, batch0, window, bench)
                window_rows.append(row)
                bench.log(f"window {json.dumps(row)}")
    result.update(headline=headline, batch_sweep=batch_rows, window_sweep=window_rows)
    if batch_rows:
        bench.log(f"\nbatch sweep (window {window0}):\n" + format_table(batch_rows, DECODE_SWEEP_COLUMNS))
        bench.log(f"\nwindow sweep (batch {batch0}, staggered):\n" + format_table(window_rows, DECODE_SWEEP_COLUMNS))
    bench.log(f"\ndecode, batch {batch0}, window {window0}, fp32 state, bf16 inputs, us per decode step; fla: {fla}\n")
    bench.log(format_table(headline, DECODE_COLUMNS))
    if read_dtype is not None:
        bench.log(f"\nthe same steps with a {args.read_dtype} read copy of the fp32 checkpoint (SPEC §4), same conventional kernel\n")
        bench.log(format_table(headline, DECODE_READ_COLUMNS))
    if args.plots:
        series = ["replay_us", "conventional_us", "fla_us", "replay_floor_us", "conventional_floor_us"]
        if error := plot(batch_rows or headline, series, args.plots / "decode.png", f"decode step, window {window0}, fp32 state, bf16 inputs"):
            bench.log(error)
    return result


# case: spec


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_row(geometry, T: int, window: int) -> dict:
    """Bytes of one row: state, one ring entry, inputs/outputs of T tokens (bf16)."""
    s_in, f32 = _size(ACT), 4
    g = geometry
    if isinstance(geometry, Mamba2Geometry):
        state = g.heads * g.head_dim * g.state_size * f32
        entry = (g.heads * g.head_dim + g.groups * g.state_size) * s_in + 2 * g.heads * f32
        io = T * (3 * g.heads * g.head_dim + 2 * g.groups * g.state_size + g.heads) * s_in
    else:
        state = g.value_heads * g.value_dim * g.key_dim * f32
        entry = g.key_heads * g.key_dim * f32 + g.value_heads * g.value_dim * f32 + g.value_heads * f32
        io = T * (2 * g.key_heads * g.key_dim + 2 * g.value_heads * g.value_dim + 2 * g.value_heads) * s_in
    return {"state": state, "entry": entry, "io": io, "replay_memory": state + window * entry, "snapshot_memory": (1 + T) * state}


def simulate(cursor0, accepted_seq, T: int, window: int):
    """Host simulation of the cursor schedule: committed entries read and flushes, over the steps (all rows)."""
    c = cursor0.clone().long()
    reads, flushes = 0, 0
    for acc in accepted_seq:
        flush = c + T > window
        flushes += int(flush.sum())
        c = torch.where(flush, torch.zeros_like(c), c)
        reads += int(c.sum())
        c = c + acc.long()
    return reads, flushes


def spec_point(name, geometry, batch, T, accept, bench: Bench, steps: int, breakdown=False, compare_overlap=False, read_dtype=None) -> dict:
    """One verify + commit point (rows staggered). ``compare_overlap``: the replay steps also with every launch a
    plain one, checked and timed alongside; ``read_dtype``: also the replay steps with a read copy of the
    checkpoint in that dtype (SPEC §4), same inputs and accepted counts."""
    window = bench.window
    point = SpecPoint(geometry, batch, T, accept, bench.device, steps, window=window)
    check = _require(point.check(), f"{name}: the verify step")
    _require(point.base.check_conventional(), f"{name}: the conventional step")
    cursor0 = point.base.state.cursor.cpu()
    replay_us = bench.time(point.replay_steps())
    snapshot_us = bench.time(point.snapshot_steps())
    kernels = bench.kernel_times(point.replay_steps()) if breakdown else None
    no_overlap_us = None
    if compare_overlap:
        with patched(vars(launch_defaults), "OVERLAP_LAUNCHES", False):
            _require(point.check(), f"{name}: the verify step without overlapping launches")
            no_overlap_us = bench.time(point.replay_steps())
    per = bytes_per_row(geometry, T, window)
    # The captured sequence starts from the cursors the warm-up pass and the replays leave; the schedule of the
    # first pass from the staggered start stands for the steady state.
    reads, flushes = simulate(cursor0, point.accepted_host, T, window)
    replay_bytes = (steps * batch * (per["state"] + T * per["entry"] + per["io"]) + reads * per["entry"] + flushes * per["state"]) / steps
    snapshot_bytes = batch * ((1 + T) * per["state"] + per["io"])
    accepted = float(torch.stack(point.accepted_host).float().mean())
    bw = bench.bandwidth
    row = {
        "geometry": name, "batch": batch, "T": T, "accept": accept, "accepted_mean": accepted,
        "replay_us": replay_us, "snapshot_us": snapshot_us, "speedup": snapshot_us / replay_us,
        "replay_us_per_token": replay_us / max(accepted, 1e-9), "snapshot_us_per_token": snapshot_us / max(accepted, 1e-9),
        "replay_floor_us": replay_bytes / bw * 1e6, "snapshot_floor_us": snapshot_bytes / bw * 1e6,
        "replay_memory_per_request": per["replay_memory"], "snapshot_memory_per_request": per["snapshot_memory"],
        "replay_memory_states": per["replay_memory"] / per["state"], "snapshot_memory_states": per["snapshot_memory"] / per["state"],
        "check_rel_err": check,
    }  # fmt: skip
    del point
    bench.free()
    if read_dtype is not None:
        point = SpecPoint(geometry, batch, T, accept, bench.device, steps, read_dtype=read_dtype, window=window)
        read_check = _require(point.check(), f"{name}: the verify step with a read copy")
        read_us = bench.time(point.replay_steps())
        copy = per["state"] // 4 * _size(read_dtype)
        if isinstance(geometry, GDNGeometry):
            # GDN's verification reads the fp32 checkpoint even with a copy (docs/ops.md, "Read copy"): the fp32
            # path's bytes, plus the copy written at each fold and each entry's beta (4 bytes per value head).
            beta_bytes = T * steps * batch * geometry.value_heads * 4
            read_bytes = replay_bytes + (flushes * copy + beta_bytes) / steps
        else:
            # Rows that do not flush read the copy; a flushing row's fold reads the fp32 checkpoint and writes both
            # copies (as traffic.decode_traffic counts a decode step's flush).
            read_bytes = (steps * batch * (copy + T * per["entry"] + per["io"]) + reads * per["entry"] + flushes * 2 * per["state"]) / steps
        row.update({
            "read_dtype": _dtype_name(read_dtype), "replay_read_us": read_us, "speedup_read": snapshot_us / read_us,
            "replay_read_floor_us": read_bytes / bw * 1e6, "replay_read_pct_floor": 100 * read_bytes / bw * 1e6 / read_us,
            "replay_read_memory_states": (per["replay_memory"] + copy) / per["state"], "read_check_rel_err": read_check,
        })  # fmt: skip
        del point
        bench.free()
    if no_overlap_us is not None:
        row["replay_no_overlap_us"], row["overlap_gain"] = no_overlap_us, no_overlap_us / replay_us - 1
    if kernels is not None:
        row["replay_kernels_us"] = kernels  # per verify step, by kernel: where the replay step's time goes
    row["replay_pct_floor"] = 100 * row["replay_floor_us"] / replay_us
    row["snapshot_pct_floor"] = 100 * row["snapshot_floor_us"] / snapshot_us
    return row


SPEC_COLUMNS = [
    ("geometry", "geometry", ""), ("batch", "batch", "d"), ("T", "T", "d"), ("accept", "accepted", ""),
    ("replay_us", "replay us/step", ".1f"), ("replay_no_overlap_us", "replay us, no PDL", ".1f"),
    ("snapshot_us", "snapshot us/step", ".1f"), ("speedup", "snap/replay", ".2f"), ("replay_us_per_token", "replay us/acc tok", ".1f"),
    ("replay_pct_floor", "replay % floor", ".1f"), ("snapshot_pct_floor", "snap % floor", ".1f"),
    ("replay_memory_states", "replay mem (states)", ".3f"), ("snapshot_memory_states", "snap mem (states)", ".1f"),
]  # fmt: skip
SPEC_READ_COLUMNS = [
    ("geometry", "geometry", ""), ("accept", "accepted", ""), ("read_dtype", "read copy", ""), ("replay_read_us", "replay us/step", ".1f"),
    ("snapshot_us", "snapshot us/step", ".1f"), ("speedup_read", "snap/replay", ".2f"), ("replay_read_pct_floor", "replay % floor", ".1f"),
    ("replay_read_memory_states", "replay mem (states)", ".3f"),
]  # fmt: skip


def run_spec(args, bench: Bench, geometries: dict) -> dict:
    """Headline (batch 256, T = 4, each of --accept), then unless --headline-only the T sweep (--tokens) and the
    batch sweep (--batches), 2 of 4 / half accepted."""
    read_dtype = READ_DTYPES.get(args.read_dtype)
    batch0, steps = bench.batch, 2 if bench.dry else args.steps
    result = {"window": bench.window}
    if args.sweep:
        result["sweep"], result["chosen"] = run_sweeps("spec", geometries, bench, only=args.sweep_tables)
    headline, sweep = [], []
    for name, geometry in geometries.items():
        for accept in args.accept:
            row = spec_point(name, geometry, batch0, HEADLINE_T, accept, bench, steps, args.breakdown, True, read_dtype)
            headline.append(row)
            bench.log(f"headline {json.dumps(row)}")
    if not args.headline_only:
        for name, geometry in geometries.items():
            for T in args.tokens or ((2,) if bench.dry else (2, 4, 6, 8)):
                if T != HEADLINE_T:
                    sweep.append(spec_point(name, geometry, batch0, T, "half", bench, steps))
                    bench.log(f"tokens {json.dumps(sweep[-1])}")
            for batch in args.batches or ((1,) if bench.dry else (32, 64, 128, 256, 512, 1024)):
                if batch != batch0:
                    sweep.append(spec_point(name, geometry, batch, HEADLINE_T, "half", bench, steps))
                    bench.log(f"batch {json.dumps(sweep[-1])}")
    result.update(headline=headline, sweep=sweep)
    if sweep:
        bench.log("\nsweeps (2 of 4 / half accepted):\n" + format_table(sweep, SPEC_COLUMNS))
    bench.log(f"\nspec, batch {batch0}, T = {HEADLINE_T}, window {bench.window}, fp32 state, bf16 inputs\n")
    bench.log(format_table(headline, SPEC_COLUMNS))
    if read_dtype is not None:
        bench.log(f"\nthe same verify steps with a {args.read_dtype} read copy of the fp32 checkpoint (SPEC §4)\n")
        bench.log(format_table(headline, SPEC_READ_COLUMNS))
    if args.plots:
        rows = [r for r in sweep + headline if r["T"] == HEADLINE_T and r["accept"] == "half"]
        series = ["replay_us", "snapshot_us", "replay_floor_us", "snapshot_floor_us"]
        if error := plot(rows, series, args.plots / "spec.png", f"verify T={HEADLINE_T}, 2 of 4 accepted, window {HEADLINE_WINDOW}"):
            bench.log(error)
    return result


# case: conv

#: (form, block_channels, num_warps) of the conv step kernel; the first is the op's
CONV_CONFIGS = [("w4", None, None), ("w4", 64, 2), ("w4", 256, 4), ("w4", 512, 4), ("w4", 1024, 8), ("tile", 128, 4), ("tile", 256, 4)]


def run_conv(args, bench: Bench, geometries: dict) -> dict:
    """The conv decode step at the HF models' shape (8192 channels, 4 taps, transformers' window of 4 columns,
    bf16), each step on a window and column of its own (out of L2, as between the layers of a decode step):
    the op's kernel in a few launch shapes, and transformers' path (concatenate, copy the tail back, the fp64
    sum and SiLU), through ``torch.compile``; bytes moved over the streaming bandwidth as the floor."""
    from replayssm.ops.conv import kernels as conv
    from replayssm.ops.conv import reference as conv_reference

    channels, taps, width = (256, 4, 4) if bench.dry else (8192, 4, 4)
    steps = 2 if bench.dry else 16
    dev = bench.device
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.float16 if bench.dry else torch.bfloat16  # (the interpreter truncates fp32 -> bf16 casts)
    weight = torch.randn(channels, taps, device=dev, generator=gen).to(dtype)
    bias = torch.randn(channels, device=dev, generator=gen).to(dtype)

    def transformers_step(window, x, weight, bias):
        full = torch.cat([window, x[..., None]], dim=-1)
        window.copy_(full[..., -window.shape[-1] :])
        return conv_reference.causal_conv_columns(full[..., -taps:], weight, bias, True)

    compiled = transformers_step if bench.dry else torch.compile(transformers_step, fullgraph=True, dynamic=False)
    rows = []
    for batch in args.batches or ((2,) if bench.dry else (1, 64, 256)):
        windows = [torch.randn(batch, channels, width, device=dev, generator=gen).to(dtype) for _ in range(steps)]
        columns = [torch.randn(batch, channels, device=dev, generator=gen).to(dtype) for _ in range(steps)]
        out = torch.empty(batch, channels, device=dev, dtype=dtype)
        floor_us = (2 * windows[0].numel() * 2 + 2 * batch * channels * 2) / bench.bandwidth * 1e6
        forms = {}
        for form, block, warps in CONV_CONFIGS:
            block, warps = block or conv._BLOCK_CHANNELS, warps or conv._NUM_WARPS
            forms[f"op {form} {block}x{warps}w"] = lambda w, c, f=form, b=block, n=warps, o=out: conv.causal_conv_step_out(c, weight, bias, w, True, o, b, n, form=f)
        forms["transformers path" + ("" if bench.dry else ", inductor")] = lambda w, c, o=out: o.copy_(compiled(w, c, weight, bias))
        for name, step in forms.items():
            saved, expected_window = windows[0].clone(), windows[0].clone()
            expected = conv_reference.causal_conv_step(columns[0], weight, bias, expected_window, True)
            out.fill_(float("nan"))
            step(windows[0], columns[0])
            ok = torch.equal(windows[0], expected_window) and bool(torch.allclose(out, expected, rtol=2**-8, atol=0))
            if bench.dry and not ok:
                raise RuntimeError(f"conv {name}: differs from the reference")
            windows[0].copy_(saved)
            us = bench.time([lambda w=w, c=c, step=step: step(w, c) for w, c in zip(windows, columns)])
            rows.append({"batch": batch, "form": name, "us": us, "floor_us": floor_us, "pct_floor": 100 * floor_us / us, "ok": ok})
            bench.log(json.dumps(rows[-1]))
        del windows, columns
    columns = [("batch", "batch", ""), ("form", "form", ""), ("us", "us/step", ".2f"), ("floor_us", "floor us", ".2f"),
               ("pct_floor", "% floor", ".1f"), ("ok", "matches reference", "")]  # fmt: skip
    bench.log(f"\nconv step, {channels} channels, {taps} taps, window {width}, bf16\n" + format_table(rows, columns))
    return {"channels": channels, "taps": taps, "width": width, "rows": rows}


# case: resources


SM90 = {"registers": 65536, "shared": 227 * 1024, "programs": 32, "warps": 64}  # per multiprocessor


@contextlib.contextmanager
def compiling_for_sm90():
    """Every Triton launch specialised on its arguments as on the GPU, compiled for sm_90 and recorded (warps,
    registers, stack, shared memory, programs per multiprocessor); nothing runs. Yields the list of launches."""
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime import jit

    from replayssm.ops.gdn import step as gdn_step
    from replayssm.ops.mamba2 import kernels as mamba2_kernels

    target, launches = GPUTarget("cuda", 90, 32), []
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"

    def run(self, *args, grid, warmup, **kwargs):
        kwargs["debug"] = kwargs.get("debug", self.debug) or triton.knobs.runtime.debug
        kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
        backend = make_backend(target)
        bound_args, specialization, options = jit.create_function_from_signature(self.signature, self.params, backend)(*args, **kwargs)
        options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
        kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=target, options=options.__dict__)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            usage = subprocess.run([str(cuobjdump), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
        regs, stack, shared, local = map(int, re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", usage).groups())
        shared += kernel.metadata.shared
        warps = options.num_warps
        by_regs = SM90["registers"] // (regs * 32 * warps) if regs else SM90["programs"]
        by_shared = SM90["shared"] // shared if shared else SM90["programs"]
        launches.append({"kernel": self.fn.__name__, "warps": warps, "stages": options.num_stages, "registers": regs,
                         "stack_bytes": stack, "local_bytes": local, "shared_bytes": shared,  # spills land in the stack frame
                         "programs_per_sm": min(by_regs, by_shared, SM90["programs"], SM90["warps"] // warps)})  # fmt: skip

    saved = jit.JITFunction.run
    jit.JITFunction.run = run
    try:  # launch options as on the H200: programmatic dependent launch on (the kernels then carry their waits)
        with patched(vars(mamba2_kernels), "overlap_launches", lambda device, requested: requested), \
                patched(vars(gdn_step), "overlap_launches", lambda device, requested: requested):  # fmt: skip
            yield launches
    finally:
        jit.JITFunction.run = saved


def run_resources(args, bench: Bench, geometries: dict) -> dict:
    """Registers, stack (spills), shared memory and the programs per multiprocessor they allow, of every launch
    of a decode step (T = 1) and a verify step (T = 4) with the tables' configurations, and of the conventional
    kernel, at batch 256 (``--batches``: the first); compiled for sm_90 with the installed Triton and its ptxas
    (run it under the GPU machine's Triton version for its code), from CPU tensors: nothing runs. With
    --read-dtype the replay steps read a copy."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("the resources case compiles the kernels: run it without TRITON_INTERPRET=1")
    rows = []
    with compiling_for_sm90() as launches:
        for name, geometry in geometries.items():
            batch = args.batches[0] if args.batches else HEADLINE_BATCH
            point = Point(geometry, batch, HEADLINE_WINDOW, "cpu", read_dtype=READ_DTYPES.get(args.read_dtype))
            work = [(f"T={T} replay", lambda p=point, T=T: p.replay_step(stacked(p.inputs, T))) for T in (1, HEADLINE_T)]
            work.append(("T=1 conventional", lambda p=point: p.conventional_steps()[0]()))
            for label, step in work:
                launches.clear()
                step()
                for launch in launches:
                    rows.append({"case": f"{name} {label}", **launch})
                    bench.log(f"{name} {label:16s} " + " ".join(f"{k} {v}" for k, v in launch.items()))
    return {"target": "sm_90", "launches": rows}


# the registry, plots, main


@dataclasses.dataclass(frozen=True)
class Case:
    run: Callable
    description: str
    repeats: int = 10  # default --repeats
    gpu: bool = True  # times on the GPU (a dry run runs it on the CPU)


CASES = {
    "decode": Case(run_decode, "decode step (T = 1): replay (staggered, in phase, no PDL, flush / non-flush) vs conventional and fla", 15),
    "spec": Case(run_spec, "verify + commit (T draft tokens) vs the snapshot baseline; time per step and per accepted token, memory"),
    "conv": Case(run_conv, "the conv decode step's launch shapes vs transformers' path (inductor)", 15),
    "resources": Case(run_resources, "registers / spills / shared memory per launch, compiled for sm_90 without a GPU", gpu=False),
}


def mirror_tables() -> None:
    """Dry run: every table's entries for the tuned shapes also under the tiny geometries' key, so the tiny steps
    run the forms the tables choose."""
    for module in (mamba2_launch, gdn_launch):
        for table in (v for v in vars(module).values() if isinstance(v, dict)):
            for tiny, tuned in DRY_MIRRORS.items():
                entry = next((table[k] for k in tuned if k in table), None)
                if entry is not None:
                    table.setdefault(tiny, entry)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases:\n" + "\n".join(f"  {n:10s} {c.description}" for n, c in CASES.items()))  # fmt: skip
    ap.add_argument("cases", nargs="*", help="cases to run, in order (--list)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--geometries", nargs="*", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    ap.add_argument("--batches", nargs="*", type=int, help="batch sweep (decode: 1..1024; spec: 32..1024; conv: 1 64 256)")
    ap.add_argument("--windows", nargs="*", type=int, help="decode's window sweep at batch 256 (default 4 8 16 32)")
    ap.add_argument("--tokens", nargs="*", type=int, help="spec's draft-length sweep at batch 256 (default 2 4 6 8)")
    ap.add_argument("--accept", nargs="*", default=["half", "all", "random"], choices=["half", "all", "random"], help="spec's headline")
    ap.add_argument("--steps", type=int, default=16, help="spec: verify steps per captured graph")
    ap.add_argument("--read-dtype", choices=list(READ_DTYPES), help="headline rows: also the replay step reading a copy of the checkpoint")
    ap.add_argument("--repeats", type=int, help="graph replays timed per point, the median kept (default: decode 15, spec 10, conv 15)")
    ap.add_argument("--headline-only", action="store_true", help="decode / spec: only the batch-256 headline")
    ap.add_argument("--sweep", action="store_true", help="decode / spec: time the launch tables' candidates first and use the fastest")
    ap.add_argument("--sweep-tables", nargs="*", default=None, help="with --sweep: only these tables (e.g. gdn.DECODE gdn.VERIFY)")
    ap.add_argument("--breakdown", action="store_true", help="headline rows: kernel time per step by kernel (profiler)")
    ap.add_argument("--json", type=Path, help="write every case's results (and the run's metadata) here")
    ap.add_argument("--plots", type=Path, help="folder for decode.png / spec.png (matplotlib)")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU under the Triton interpreter; no timing")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(f"{n:10s} {c.description}" for n, c in CASES.items()))
        return
    if bad := [c for c in args.cases if c not in CASES]:
        ap.error(f"unknown case(s) {bad}; --list names them")
    if not args.cases:
        ap.error("name at least one case (--list names them)")
    if bad := [T for T in args.tokens or () if not 2 <= T <= HEADLINE_WINDOW]:
        ap.error(f"--tokens: draft lengths must be 2 to the window ({HEADLINE_WINDOW}), got {bad}")
    if bad := [b for b in [*(args.batches or ()), *(args.windows or ())] if b < 1]:
        ap.error(f"--batches / --windows: must be >= 1, got {bad}")
    geometries = DRY_GEOMETRIES if args.dry_run else {n: GEOMETRIES[n] for n in args.geometries}
    if args.read_dtype == "fp8":  # GDN refuses an fp8 read copy (docs/ops.md)
        geometries = {n: g for n, g in geometries.items() if isinstance(g, Mamba2Geometry)}
        if not geometries:
            ap.error("--read-dtype fp8: the fp8 read copy is Mamba-2-only; name a Mamba-2 geometry")
    if args.dry_run:
        mirror_tables()
    gpu = any(CASES[c].gpu for c in args.cases) and not args.dry_run
    bench = Bench("cuda" if gpu else "cpu", 1, args.dry_run)
    if args.dry_run and args.read_dtype == "bf16":
        bench.log("dry run: an fp16 read copy (the interpreter truncates fp32 -> bf16 casts, the GPU rounds)")
        args.read_dtype = "fp16"
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if gpu else None,
        "torch": torch.__version__, "triton": __import__("triton").__version__, "python": platform.python_version(),
        "state_dtype": "float32", "input_dtype": "bfloat16", "command": " ".join(sys.argv),
    }  # fmt: skip
    bench.log(json.dumps(meta))
    result = {"meta": meta}
    if gpu:
        from _common import streaming_bandwidth

        bench.bandwidth, result["bandwidth_by_config"] = streaming_bandwidth()
        bench.log(f"streaming bandwidth (elementwise Triton kernel, read + write, best of its configs): {bench.bandwidth / 1e12:.3f} TB/s")
    result["bandwidth_Bps"] = bench.bandwidth
    tables = {m: {n: dict(t) for n, t in vars(m).items() if isinstance(t, dict) and not n.startswith("_")} for m in (mamba2_launch, gdn_launch)}
    for name in args.cases:
        if args.dry_run and not CASES[name].gpu:
            continue  # compiles for a GPU target: nothing to dry-run
        bench.repeats = args.repeats or CASES[name].repeats
        try:
            result[name] = CASES[name].run(args, bench, geometries)
        finally:  # a sweep's choices hold for its case only
            for module, saved in tables.items():
                for table_name, entries in saved.items():
                    getattr(module, table_name).clear()
                    getattr(module, table_name).update(entries)
        bench.log(f"{'dry run' if args.dry_run else 'case'} {name}: ok")
    if gpu:
        from _common import streaming_bandwidth

        result["bandwidth_end_Bps"] = streaming_bandwidth()[0]
        bench.log(f"streaming bandwidth at the end: {result['bandwidth_end_Bps'] / 1e12:.3f} TB/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
