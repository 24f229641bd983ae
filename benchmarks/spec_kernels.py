"""Speculative verification benchmark: replay verify + commit vs the snapshot baseline (issue 4, item 4).

    PYTHONPATH=src python benchmarks/spec_kernels.py --out results/

* geometries of the decode benchmark; fp32 state, bf16 inputs, window 16;
* batch 256 (sweep 32..1024, ``--batches``), T in {2, 4, 6, 8} draft tokens per row (``--tokens``);
  accepted counts fixed (T/2 of T and T of T) or random per row and step;
* replay: ``*_step(commit=False)`` (all T outputs from checkpoint + committed
  ring + causal terms, entries written as pending; a row whose ring would
  overflow flushes its committed part first, inside the kernel) followed by
  ``commit`` (a cursor move); a sequence of steps captured in one CUDA graph;
* snapshot baseline (what engines do today): the recurrence over the T tokens,
  the full state written after each one (T snapshot slots + the current state,
  T + 1 in all); rollback = pick a slot (free);
* reports time per verify step, per accepted token, state memory per request,
  and each path's bytes over the streaming bandwidth measured in the same run.

Prints a table last; writes ``spec_kernels.json`` / ``.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replayssm  # noqa: E402
from replayssm import GDNGeometry, Mamba2Geometry  # noqa: E402
from replayssm.ops import reference  # noqa: E402
from replayssm.ops.triton import gdn as gdn_kernels  # noqa: E402
from replayssm.ops.triton import mamba2 as mamba2_kernels  # noqa: E402

from decode_kernels import ACT, GEOMETRIES, check_failure  # noqa: E402

WINDOW = 16
HEADLINE_BATCH, HEADLINE_T = 256, 4
BATCHES = (32, 64, 128, 256, 512, 1024)
TOKENS = (2, 4, 6, 8)
STEPS = 16  # verify steps per captured graph


def _size(dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_row(geometry, T: int, window: int) -> dict:
    """Bytes of one row: state, one ring entry, inputs/outputs of T tokens (bf16)."""
    s_in, f32 = _size(ACT), 4
    if isinstance(geometry, Mamba2Geometry):
        g = geometry
        state = g.heads * g.head_dim * g.state_size * f32
        entry = (g.heads * g.head_dim + g.groups * g.state_size) * s_in + 2 * g.heads * f32
        io = T * (3 * g.heads * g.head_dim + 2 * g.groups * g.state_size + g.heads) * s_in
    else:
        g = geometry
        state = g.value_heads * g.value_dim * g.key_dim * f32
        entry = g.key_heads * g.key_dim * f32 + g.value_heads * g.value_dim * f32 + g.value_heads * f32
        io = T * (2 * g.key_heads * g.key_dim + 2 * g.value_heads * g.value_dim + 2 * g.value_heads) * s_in
    return {"state": state, "entry": entry, "io": io, "replay_memory": state + window * entry, "snapshot_memory": (1 + T) * state}


def simulate(cursor0, accepted_seq, T: int, window: int):
    """Host simulation of the cursor schedule: committed entries read and flushes, per step (all rows)."""
    c = cursor0.clone().long()
    reads, flushes = 0, 0
    for acc in accepted_seq:
        flush = c + T > window
        flushes += int(flush.sum())
        c = torch.where(flush, torch.zeros_like(c), c)
        reads += int(c.sum())
        c = c + acc.long()
    return reads, flushes


class SpecCase:
    def __init__(
        self, geometry, batch: int, T: int, accept: str, seed: int = 0, read_dtype: torch.dtype | None = None, device: str = "cuda"
    ):
        """``read_dtype``: the replay state keeps a read copy of its checkpoint in that dtype (SPEC §4); such a
        case times the replay path only (no snapshot state)."""
        from decode_kernels import Case

        self.read_dtype = read_dtype
        self.base = Case(geometry, batch, WINDOW, device, seed=seed, conventional=read_dtype is None, read_dtype=read_dtype)
        self.T, self.batch, self.geometry = T, batch, geometry
        base_inputs = self.base.inputs
        # T-token inputs: the decode case's single tokens stacked, fresh per step
        self.inputs = []
        for i in range(STEPS):
            parts = [base_inputs[(i + t) % len(base_inputs)] for t in range(T)]
            self.inputs.append(tuple(torch.cat([p[j] for p in parts], dim=1) for j in range(len(parts[0]))))
        if accept == "half":
            acc = [torch.full((batch,), T // 2, dtype=torch.int64) for _ in range(STEPS)]
        elif accept == "all":
            acc = [torch.full((batch,), T, dtype=torch.int64) for _ in range(STEPS)]
        else:
            acc = [torch.randint(0, T + 1, (batch,), generator=torch.Generator().manual_seed(seed + i)) for i in range(STEPS)]
        self.accepted_host = acc
        self.accepted = [a.to(device) for a in acc]
        self.snapshots = None
        if self.base.conventional_state is not None:
            self.snapshots = torch.empty((batch, T) + tuple(self.base.conventional_state.shape[1:]), device=device)

    def check(self) -> dict:
        """The first verify step + commit against the reference (``Case.check_replay``; the state is restored)."""
        b, accepted = self.base, self.accepted[0]
        return b.check_replay(
            None, self.inputs[0], commit=False,
            after=lambda st: replayssm.ops.commit(st["cursor"], st["pending"], b.rows, accepted),
            after_reference=lambda st: reference.commit(st["cursor"], st["pending"], b.rows, accepted),
        )  # fmt: skip

    def replay_steps(self):
        b, st = self.base, self.base.state
        steps = []
        for inp, acc in zip(self.inputs, self.accepted):
            if b.mamba2:
                x, dt, B, C, z = inp
                tensors = (st.checkpoint, st.ring_x, st.ring_B, st.ring_dt, st.ring_logdecay, st.cursor, st.pending)
                steps.append(lambda x=x, dt=dt, B=B, C=C, z=z, acc=acc: (
                    replayssm.ops.mamba2_step(x, dt, b.A, B, C, b.D, b.dt_bias, z, *tensors, b.rows, False, True, st.read_checkpoint),
                    replayssm.ops.commit(st.cursor, st.pending, b.rows, acc)))
            else:
                tensors = (st.checkpoint, st.ring_k, st.ring_d, st.ring_g, st.cursor, st.pending)
                steps.append(lambda inp=inp, acc=acc: (
                    replayssm.ops.gdn_step(*inp, *tensors, b.rows, False, True, None, st.read_checkpoint, st.ring_beta),
                    replayssm.ops.commit(st.cursor, st.pending, b.rows, acc)))
        return steps  # fmt: skip

    def snapshot_steps(self):
        b, s, snaps = self.base, self.base.conventional_state, self.snapshots
        steps = []
        for inp in self.inputs:
            if b.mamba2:
                x, dt, B, C, z = inp
                y = torch.empty_like(x)
                steps.append(lambda x=x, dt=dt, B=B, C=C, z=z, y=y: mamba2_kernels.mamba2_conventional_step_out(
                    x, dt, b.A, B, C, b.D, b.dt_bias, z, s, b.rows, True, y=y, snapshots=snaps))
            else:
                o = torch.empty_like(inp[2])
                steps.append(lambda inp=inp, o=o: gdn_kernels.gdn_conventional_step_out(
                    *inp, s, b.rows, True, None, o=o, snapshots=snaps))
        return steps  # fmt: skip


def sweep_tables(geometry) -> list[tuple[str, dict, tuple, list]]:
    """The launch tables a verify step uses that the sweep tunes: (name, table, this geometry's key, candidates).

    The main launch (``_MAMBA2_VERIFY`` / ``_GDN_VERIFY``: one tile per program, as the conventional
    kernel; Mamba-2 also in its token-block forms), the flush launch (``_MAMBA2_FLUSH``, shared with decoding, /
    ``_GDN_FLUSH``; block >= 16, its fold is a ``tl.dot``) and the weights launch (``_MAMBA2_WEIGHTS`` /
    ``_GDN_WEIGHTS``, warps; GDN's also its "dot" form).
    """
    from replayssm.ops.triton import configs
    from replayssm.ops.triton.configs import LaunchConfig

    if isinstance(geometry, Mamba2Geometry):
        dim, key_dim = geometry.head_dim, geometry.state_size
        # The per-token form (8 / 16 rows: 593-603 us), 2-4 warps (742-1000) and "tokens" (531-559) lost every
        # earlier sweep against "tokens_chunked" on 16 rows (516-518, 2026-11-29 and 12-01); it stays first.
        main = ("_MAMBA2_VERIFY", [])
        # The T outputs of a tile as one block (_mamba2_main_kernel). Programs looping over several tiles lost
        # (2026-12-01, split 3 / 2: 742.4 / 687.0 us against 517.3).
        # "tokens_prefetched": the chunks' loads 1 to 4 chunks ahead of their products (num_stages 2 to 5; 8-row
        # tiles have 4 chunks, so 4 ahead loads the whole tile before the first product).
        forms = [("tokens_chunked", 16, 1), ("tokens_chunked", 8, 1)]
        forms += [("tokens_prefetched", block, 1, stages) for block in (16, 8) for stages in (3, 4)]
        forms += [("tokens_prefetched", 8, 1, 5)]
        # (run 23's "mma" form, the T outputs as tf32x3 tensor-core dots over 16 token rows as in GDN's, lost: 577.7
        # / 537.4 us at best against 457.7 / 498.5, 96x80 / 128x64; not merged, benchmarks/data/h200/
        # mamba2-verify-mma-attempt-2026-12-02.diff)
    else:
        dim, key_dim = geometry.value_dim, geometry.key_dim
        # Larger tiles and 2 warps lost every earlier sweep (625-948 against 455-537 us), programs looping over
        # several tiles too (2026-12-01, split 8 / 4: 530.9 / 506.1 against 454.2).
        main = ("_GDN_VERIFY", [(8, 1), (16, 1)])
        # (run 9's block forms lost and were removed; the "mma" form wants stages to pipeline its key chunks, run 17)
        forms = [("mma", 16, 1, 3), ("mma", 16, 1, 4), ("mma", 16, 1, 2), ("mma", 32, 1, 3), ("mma", 32, 1, 4), ("mma", 32, 2, 3), ("mma", 64, 4, 2), ("mma", 128, 4, 2)]
    tiles = lambda block: -(-dim // block)  # noqa: E731
    out = []
    name, shapes = main
    gdn = not isinstance(geometry, Mamba2Geometry)
    if hasattr(configs, name):
        candidates = [LaunchConfig(block, tiles(block), warps) for block, warps in shapes]
        candidates += [LaunchConfig(block, tiles(block), warps, *stages, form=form) for form, block, warps, *stages in forms]
        if gdn:  # programs looping over two tiles
            candidates.append(LaunchConfig(16, tiles(16) // 2, 1, 3, form="mma"))
        out.append((name, getattr(configs, name), (dim, key_dim), candidates))
    flush_table = "_GDN_FLUSH" if gdn else "_MAMBA2_FLUSH"
    if hasattr(configs, flush_table):
        # (32-row and 2-warp shapes lost every earlier sweep; GDN half / quarter heads per program, split 2 / 4:
        # 348.5 / 363.1 us against 343.3 on 2026-12-02)
        # The loop over a head's tiles software-pipelined by Triton, 2 or 3 stages (the next tiles' loads issued
        # by cp.async during this tile's fold; Mamba-2 on 3 since run 21, where 8 warps lost: 505.4 / 563.5 us
        # against 459.1 / 499.1; GDN on 3 tied, 338.2 against 339.3).
        flush = [LaunchConfig(16, 1, 4), LaunchConfig(16, tiles(16), 4), LaunchConfig(16, 1, 4, 2), LaunchConfig(16, 1, 4, 3)]
        if gdn:
            # The decode fold's shape since 2026-12-04 (docs/kernels.md run 36): whole heads on two-warp work-list
            # programs, 4 per multiprocessor (_GDN_FLUSH's entry since run 37: 330.6 against 338.1 us for the grid).
            flush.append(LaunchConfig(16, 1, 2, form="worklist", programs_per_sm=4))
        # (Mamba-2's fold as a work list beside the main launch, run 22: 463.2-464.7 / 501.1-502.8 us against
        # 458.9 / 498.1; it lost in decoding too, run 23, and was removed)
        out.append((flush_table, getattr(configs, flush_table), (dim, key_dim), flush))
    if not gdn and hasattr(configs, "_MAMBA2_WEIGHTS"):
        out.append(("_MAMBA2_WEIGHTS", configs._MAMBA2_WEIGHTS, (dim, key_dim), [LaunchConfig(1, 1, warps) for warps in (4, 1, 2)]))
    if gdn and hasattr(configs, "_GDN_WEIGHTS"):
        # (the headline's T = 4 is past _GDN_WEIGHTS_SHORT_MAX_T; 4 and 8 warps lost on 2026-11-29, the "dot" form on 2
        # warps on 2026-12-03)
        weights = [LaunchConfig(1, 1, 1, form="dot"), LaunchConfig(1, 1, 1), LaunchConfig(1, 1, 2)]
        out.append(("_GDN_WEIGHTS", configs._GDN_WEIGHTS, (dim, key_dim), weights))
    # The table's own entry is always a candidate (first), so the sweep never drops it untimed.
    return [(name, table, key, _with_entry(table.get(key), candidates)) for name, table, key, candidates in out]


def _described(entry):
    """A table entry for the log and the JSON: a LaunchConfig's fields, or the entry itself (a flag)."""
    return entry.as_dict() if hasattr(entry, "as_dict") else entry


def _with_entry(entry, candidates: list) -> list:
    return candidates if entry is None or entry in candidates else [entry, *candidates]


def sweep_verify(geometries: dict, repeats: int, log) -> dict:
    """Time each tuned table's candidates on a verify step (replay only, 2 of 4 accepted, batch 256), one
    geometry per table key, one table after the other (each keeps its fastest); the tables stay set so for
    the rest of this run. Returns {table: {"dim x key_dim": config}}; configs.py is updated by hand."""
    from _common import time_graph_per_step

    chosen, seen = {}, set()
    for name, geometry in geometries.items():
        for table_name, table, key, candidates in sweep_tables(geometry):
            if (table_name, key) in seen:
                continue
            seen.add((table_name, key))
            previous, timings = table.get(key), []
            for cfg in candidates:
                table[key] = cfg
                case = SpecCase(geometry, HEADLINE_BATCH, HEADLINE_T, "half")
                case.base.set_phase("staggered")
                try:
                    if failure := check_failure(case.check()):
                        raise RuntimeError(failure)
                    us = time_graph_per_step(case.replay_steps(), repeats)
                except Exception as err:  # a config the compiler rejects (registers, shared memory), or a wrong one: skip it
                    log(f"sweep {name} {table_name} {cfg}: failed ({type(err).__name__}: {err})")
                    continue
                finally:
                    del case
                    torch.cuda.empty_cache()
                timings.append((us, cfg))
                log(f"sweep {json.dumps({'geometry': name, 'table': table_name, 'config': _described(cfg), 'replay_us': us})}")
            best = min(timings, key=lambda t: t[0])[1] if timings else previous
            if best is not None:
                table[key] = best
                chosen.setdefault(table_name, {})[f"{key[0]}x{key[1]}"] = _described(best)
            log(f"sweep {name} {table_name}: using {best} (table had {previous})")
    return chosen


def measure(name, geometry, batch, T, accept, bw, repeats, breakdown=False, compare_overlap=False, read_dtype=None):
    """One verify + commit point. ``compare_overlap``: the same replay steps also with every launch a plain
    one (``configs._OVERLAP_LAUNCHES`` off: no programmatic dependent launch), checked and timed alongside.
    ``read_dtype``: also the replay steps with a read copy of the checkpoint in that dtype (SPEC §4), checked
    against the reference and timed alongside (same inputs and accepted counts)."""
    from _common import kernel_times_per_step, time_graph_per_step
    from replayssm.ops.triton import configs

    case = SpecCase(geometry, batch, T, accept)
    case.base.set_phase("staggered")
    check = case.check()
    if failure := check_failure(check):
        raise RuntimeError(f"{name}: the verify step {failure}")
    cursor0 = case.base.state.cursor.cpu()
    replay_us = time_graph_per_step(case.replay_steps(), repeats)
    snapshot_us = time_graph_per_step(case.snapshot_steps(), repeats)
    kernels = kernel_times_per_step(case.replay_steps()) if breakdown else None
    no_overlap_us = None
    if compare_overlap:
        previous, configs._OVERLAP_LAUNCHES = configs._OVERLAP_LAUNCHES, False
        try:
            if failure := check_failure(case.check()):
                raise RuntimeError(f"{name}: the verify step without overlapping launches {failure}")
            no_overlap_us = time_graph_per_step(case.replay_steps(), repeats)
        finally:
            configs._OVERLAP_LAUNCHES = previous
    per = bytes_per_row(geometry, T, WINDOW)
    # The captured sequence starts from the cursors left by the warm-up pass and the replays; the schedule
    # of the first pass from the staggered start is representative of the steady state.
    reads, flushes = simulate(cursor0, case.accepted_host, T, WINDOW)
    replay_bytes = (STEPS * batch * (per["state"] + T * per["entry"] + per["io"]) + reads * per["entry"] + flushes * per["state"]) / STEPS
    snapshot_bytes = batch * ((1 + T) * per["state"] + per["io"])
    accepted = float(torch.stack(case.accepted_host).float().mean())
    read = None
    if read_dtype is not None:
        del case
        torch.cuda.empty_cache()
        case = SpecCase(geometry, batch, T, accept, read_dtype=read_dtype)
        case.base.set_phase("staggered")
        read_check = case.check()
        if failure := check_failure(read_check):
            raise RuntimeError(f"{name}: the verify step with a read copy {failure}")
        read_us = time_graph_per_step(case.replay_steps(), repeats)
        copy = per["state"] // 4 * _size(read_dtype)
        if isinstance(geometry, GDNGeometry):
            # GDN's verification reads the fp32 checkpoint even with a copy (docs/ops.md, "Read copy"): the fp32
            # path's bytes, plus the copy written at each fold and each entry's beta (4 bytes per value head).
            beta_bytes = T * STEPS * batch * geometry.value_heads * 4
            read_bytes = replay_bytes + (flushes * copy + beta_bytes) / STEPS
        else:
            # Rows that do not flush read the copy; a flushing row's fold reads the fp32 checkpoint and writes both
            # copies (as traffic.decode_traffic counts a decode step's flush).
            read_bytes = (STEPS * batch * (copy + T * per["entry"] + per["io"]) + reads * per["entry"] + flushes * 2 * per["state"]) / STEPS
        read = {
            "read_dtype": str(read_dtype).replace("torch.", ""), "replay_read_us": read_us, "speedup_read": snapshot_us / read_us,
            "replay_read_floor_us": read_bytes / bw * 1e6, "replay_read_pct_floor": 100 * read_bytes / bw * 1e6 / read_us,
            "replay_read_memory_states": (per["replay_memory"] + copy) / per["state"], "read_check_rel_err": read_check,
        }  # fmt: skip
    row = {
        "geometry": name, "batch": batch, "T": T, "accept": accept, "accepted_mean": accepted,
        "replay_us": replay_us, "snapshot_us": snapshot_us, "speedup": snapshot_us / replay_us,
        "replay_us_per_token": replay_us / max(accepted, 1e-9), "snapshot_us_per_token": snapshot_us / max(accepted, 1e-9),
        "replay_floor_us": replay_bytes / bw * 1e6, "snapshot_floor_us": snapshot_bytes / bw * 1e6,
        "replay_memory_per_request": per["replay_memory"], "snapshot_memory_per_request": per["snapshot_memory"],
        "replay_memory_states": per["replay_memory"] / per["state"], "snapshot_memory_states": per["snapshot_memory"] / per["state"],
        "check_rel_err": check,
    }  # fmt: skip
    if read is not None:
        row.update(read)
    if no_overlap_us is not None:
        row["replay_no_overlap_us"], row["overlap_gain"] = no_overlap_us, no_overlap_us / replay_us - 1
    if kernels is not None:
        row["replay_kernels_us"] = kernels  # per verify step, by kernel: where the replay step's time goes
    row["replay_pct_floor"] = 100 * row["replay_floor_us"] / replay_us
    row["snapshot_pct_floor"] = 100 * row["snapshot_floor_us"] / snapshot_us
    del case
    torch.cuda.empty_cache()
    return row


COLUMNS = [
    ("geometry", "geometry", ""),
    ("batch", "batch", "d"),
    ("T", "T", "d"),
    ("accept", "accepted", ""),
    ("replay_us", "replay us/step", ".1f"),
    ("replay_no_overlap_us", "replay us, no PDL", ".1f"),
    ("snapshot_us", "snapshot us/step", ".1f"),
    ("speedup", "snap/replay", ".2f"),
    ("replay_us_per_token", "replay us/acc tok", ".1f"),
    ("replay_pct_floor", "replay % floor", ".1f"),
    ("snapshot_pct_floor", "snap % floor", ".1f"),
    ("replay_memory_states", "replay mem (states)", ".3f"),
    ("snapshot_memory_states", "snap mem (states)", ".1f"),
]
# With --read-dtype: the replay path reading a low-precision copy of the checkpoint (SPEC §4).
READ_COLUMNS = [
    ("geometry", "geometry", ""),
    ("accept", "accepted", ""),
    ("read_dtype", "read copy", ""),
    ("replay_read_us", "replay us/step", ".1f"),
    ("snapshot_us", "snapshot us/step", ".1f"),
    ("speedup_read", "snap/replay", ".2f"),
    ("replay_read_pct_floor", "replay % floor", ".1f"),
    ("replay_read_memory_states", "replay mem (states)", ".3f"),
]
READ_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="results")
    ap.add_argument("--geometries", nargs="*", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--headline-only", action="store_true")
    ap.add_argument("--accept", nargs="*", default=["half", "all", "random"], choices=["half", "all", "random"])
    ap.add_argument("--sweep", action="store_true", help="time launch configs of a verify step first and use the fastest")
    ap.add_argument("--breakdown", action="store_true", help="headline rows: kernel time per verify step by kernel (profiler)")
    ap.add_argument("--tokens", nargs="*", type=int, default=list(TOKENS), help=f"draft lengths of the T sweep (default {TOKENS})")
    ap.add_argument("--batches", nargs="*", type=int, default=list(BATCHES), help=f"batches of the batch sweep (default {BATCHES})")
    ap.add_argument(
        "--read-dtype", choices=list(READ_DTYPES), default=None,
        help="headline rows: also the replay path with a read copy of the fp32 checkpoint in this dtype (SPEC §4)",
    )  # fmt: skip
    args = ap.parse_args()
    if bad := [T for T in args.tokens if not 2 <= T <= WINDOW]:
        ap.error(f"--tokens: draft lengths must be 2 to the window ({WINDOW}), got {bad}")
    if bad := [b for b in args.batches if b < 1]:
        ap.error(f"--batches: batches must be >= 1, got {bad}")
    from _common import format_table, streaming_bandwidth

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "spec_kernels.log", "w")

    def log(msg: str) -> None:
        print(msg, flush=True)
        log_file.write(msg + "\n")

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "window": WINDOW,
        "command": " ".join(sys.argv),
    }
    log(json.dumps(meta))
    bw, rates = streaming_bandwidth()
    log(f"streaming bandwidth: {bw / 1e12:.3f} TB/s")
    geometries = {n: GEOMETRIES[n] for n in args.geometries}
    headline, sweep = [], []
    chosen = sweep_verify(geometries, args.repeats, log) if args.sweep else None
    for name, geometry in geometries.items():
        for accept in args.accept:
            row = measure(
                name, geometry, HEADLINE_BATCH, HEADLINE_T, accept, bw, args.repeats, breakdown=args.breakdown, compare_overlap=True,
                read_dtype=READ_DTYPES.get(args.read_dtype),
            )  # fmt: skip
            headline.append(row)
            log(f"headline {json.dumps(row)}")
    if not args.headline_only:
        for name, geometry in geometries.items():
            for T in args.tokens:
                if T != HEADLINE_T:
                    row = measure(name, geometry, HEADLINE_BATCH, T, "half", bw, args.repeats)
                    sweep.append(row)
                    log(f"tokens {json.dumps(row)}")
            for batch in args.batches:
                if batch != HEADLINE_BATCH:
                    row = measure(name, geometry, batch, HEADLINE_T, "half", bw, args.repeats)
                    sweep.append(row)
                    log(f"batch {json.dumps(row)}")
    result = {"meta": meta, "bandwidth_Bps": bw, "headline": headline, "sweep": sweep, "chosen_configs": chosen}
    (out / "spec_kernels.json").write_text(json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for name in geometries:
            pts = sorted((r for r in sweep + headline if r["geometry"] == name and r["T"] == HEADLINE_T and r["accept"] == "half"), key=lambda r: r["batch"])
            ax.plot([r["batch"] for r in pts], [r["speedup"] for r in pts], "o-", label=name)
        ax.set_xscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("snapshot time / replay time")
        ax.set_title(f"verify T={HEADLINE_T}, 2 of 4 accepted, window {WINDOW}, fp32 state")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "spec_kernels.png", dpi=110)
    except ImportError:
        log("matplotlib not installed (pip install replayssm[bench])")
    if sweep:
        log("\nsweeps (2 of 4 / half accepted):\n" + format_table(sweep, COLUMNS))
    log(f"\n{meta['gpu']}, streaming bandwidth {bw / 1e12:.3f} TB/s; batch {HEADLINE_BATCH}, T = {HEADLINE_T}, window {WINDOW}\n")
    log(format_table(headline, COLUMNS))
    if args.read_dtype:
        log(f"\nthe same verify steps with a {args.read_dtype} read copy of the fp32 checkpoint (SPEC §4)\n")
        log(format_table(headline, READ_COLUMNS))
    log_file.close()


if __name__ == "__main__":
    main()
