"""Experiment: registers, spills and shared memory of every launch of a replay step, compiled for the H200
(sm_90) on a machine without a GPU.

One step per case runs on CPU tensors (the decode benchmark's cases: batch 256, window 16, fp32 state, bf16
inputs) with Triton's launch replaced: each launch is specialised on its arguments as Triton would do it
on the GPU (types, 16-byte divisibility, constants), compiled for sm_90 with the installed Triton and its
ptxas, and the resources are read from the cubin (``cuobjdump --dump-resource-usage``); nothing runs. The
cases: each geometry's decode step (T = 1) and verify step (``--tokens``), with the tables' launch
configurations and, for GDN, the fold launch's ``"alongside"`` form and the weights launch's ``"dot"`` form
(the table's from T = 4), for Mamba-2 the flush launch (the decode table folds in the main launch); the
conventional kernels. Per launch it prints warps, registers per thread, the stack frame (where spills go), local bytes, shared
memory, and the programs per multiprocessor those allow (65,536 registers, 227 KiB of shared memory, 32
programs and 64 warps per multiprocessor), the occupancy ceiling before the other limits. ``--ptx-dir``
also writes each launch's PTX without its debug lines, numbered and named by case, so that two checkouts'
launches can be compared (``diff -r``; the register numbering changes with the kernel's parameter list).
``--read-dtype bf16`` compiles the replay steps of states with a read copy (SPEC §4) instead.

The figures are the installed Triton's: run it under the GPU machine's version (3.6 there) for the code
that runs on the lent H200, e.g. in a virtual environment with ``pip install torch==2.13.0`` and
``pip install --no-deps triton==3.6.0``:

    PYTHONPATH=src python3 benchmarks/experiments/kernel_resources.py --out /tmp/kernel_resources.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import string
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime import jit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode_kernels import GEOMETRIES, Case, StepVariant  # noqa: E402

from replayssm.ops.triton import gdn, mamba2  # noqa: E402
from replayssm.ops.triton.configs import GDN_READ_COPY_FOLDS, LaunchConfig  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # the H200
REGISTERS, SHARED, MAX_PROGRAMS, MAX_WARPS = 65536, 227 * 1024, 32, 64
ALONGSIDE = LaunchConfig(16, 1, 4, form="alongside", programs_per_sm=2)  # the decode sweep's candidate

launches: list[dict] = []


def _resources(kernel) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    try:
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    found = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)", usage)
    if found is None:
        raise RuntimeError(f"no resource usage in cuobjdump's output: {usage!r}")
    regs, stack, static_shared, local = map(int, found.groups())
    # Register spills land in the stack frame (STACK), not in LOCAL (which counts local arrays).
    return {"registers": regs, "stack_bytes": stack, "local_bytes": local, "shared_bytes": static_shared + kernel.metadata.shared}


def _compile_instead_of_launch(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` without a device: specialise and compile for ``TARGET``, record, launch nothing."""
    kwargs["debug"] = kwargs.get("debug", self.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    backend = make_backend(TARGET)
    binder = jit.create_function_from_signature(self.signature, self.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = self._pack_args(backend, kwargs, bound_args, specialization, options)
    kernel = triton.compile(ASTSource(self, signature, constexprs, attrs), target=TARGET, options=options.__dict__)
    warps = options.num_warps
    res = _resources(kernel)
    by_regs = REGISTERS // (res["registers"] * 32 * warps) if res["registers"] else MAX_PROGRAMS
    by_shared = SHARED // res["shared_bytes"] if res["shared_bytes"] else MAX_PROGRAMS
    launches.append(
        {"kernel": self.fn.__name__, "warps": warps, "stages": options.num_stages, **res,
         "programs_per_sm": min(by_regs, by_shared, MAX_PROGRAMS, MAX_WARPS // warps), "ptx": _code_lines(kernel.asm["ptx"])}
    )  # fmt: skip


def _code_lines(ptx: str) -> str:
    """The PTX without its debug sections, line records and debug-scope labels (they follow the source file's
    lines and helper functions, not the code)."""
    code = ptx.split(".section")[0]
    debug = (".loc", ".file", "//", "$L__tmp")
    return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(debug)) + "\n"


def _tokens(case: Case, T: int) -> tuple:
    """T-token inputs for every row: the case's single tokens stacked (as the speculative benchmark does)."""
    parts = case.inputs[:T]
    return tuple(torch.cat([p[j] for p in parts], dim=1) for j in range(len(parts[0])))


def cases(name: str, geometry, tokens: list[int], batch: int, read_dtype: torch.dtype | None = None, read_folds=()):
    """(label, thunk) per step to compile: replay steps by T and variant, and the conventional kernel;
    with ``read_dtype``, the replay steps read a copy of the checkpoint in it (SPEC §4), and GDN's steps
    are compiled with each of ``read_folds`` (``configs.GDN_READ_COPY_FOLDS``) too."""
    case = Case(geometry, batch, 16, "cpu", read_dtype=read_dtype)
    variants = [("tables", StepVariant(None))]
    if not case.mamba2:
        variants.append(("alongside fold", StepVariant(None, 3, flush=ALONGSIDE)))
        variants.append(("weights dot", StepVariant(None, 3, weights=LaunchConfig(1, 1, 1, form="dot"))))
        if read_dtype is not None:
            variants += [(f"read fold {form}", StepVariant(None, 3, read_fold=form)) for form in read_folds]
    else:
        variants.append(("flush launch", StepVariant(None, fold_in_main=False)))  # (the decode table folds in the main launch)
    for T in [1, *tokens]:
        inp = _tokens(case, T)
        for label, variant in variants:
            yield f"{name} T={T} replay, {label}", lambda inp=inp, variant=variant: case.replay_step(inp, variant, via_op=False)
    yield f"{name} T=1 conventional", lambda: case.conventional_steps(via_op=False)[0]()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--geometries", nargs="*", default=list(GEOMETRIES), choices=list(GEOMETRIES))
    ap.add_argument("--tokens", nargs="*", type=int, default=[4], help="verify steps' draft lengths (T = 1 always)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--ptx-dir", type=Path, default=None, help="write each launch's PTX (debug lines left out) here")
    ap.add_argument("--read-dtype", choices=["bf16", "fp16"], default=None, help="replay steps with a read copy in this dtype")
    ap.add_argument("--read-folds", nargs="*", default=[], choices=GDN_READ_COPY_FOLDS, help="with --read-dtype: GDN fold forms to compile too")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit("kernel_resources.py compiles the kernels: run it without TRITON_INTERPRET=1")
    # Launch options as on the H200: programmatic dependent launch on (the kernels then carry their waits).
    for module in (gdn, mamba2):
        module.overlap_launches = lambda device, requested: requested
    jit.JITFunction.run = _compile_instead_of_launch
    rows = []
    for name in args.geometries:
        read_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, None: None}[args.read_dtype]
        for label, step in cases(name, GEOMETRIES[name], args.tokens, args.batch, read_dtype, args.read_folds):
            launches.clear()
            step()
            for launch in launches:
                ptx = launch.pop("ptx")
                if args.ptx_dir:
                    args.ptx_dir.mkdir(parents=True, exist_ok=True)
                    safe = "".join(c if c in string.ascii_letters + string.digits + "=-" else "_" for c in label)
                    (args.ptx_dir / f"{len(rows):03d}-{safe}-{launch['kernel']}.ptx").write_text(ptx)
                rows.append({"case": label, **launch})
                print(f"{label:48s} {launch['kernel']:26s} warps {launch['warps']} stages {launch['stages']}  "
                      f"registers {launch['registers']:3d}  stack {launch['stack_bytes']:5d} B  local {launch['local_bytes']:5d} B  shared {launch['shared_bytes']:6d} B  "
                      f"-> {launch['programs_per_sm']} programs per SM", flush=True)  # fmt: skip
    if args.out:
        meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "triton": triton.__version__,
                "torch": torch.__version__, "target": "sm_90", "batch": args.batch, "command": " ".join(sys.argv)}  # fmt: skip
        args.out.write_text(json.dumps({"meta": meta, "launches": rows}, indent=1))


if __name__ == "__main__":
    main()
