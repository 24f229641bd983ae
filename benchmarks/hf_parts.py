"""Parts of a patched Hugging Face model's captured decode step, timed on their own: a registry of named cases
sharing one set of options.

    PYTHONPATH=src python benchmarks/hf_parts.py --list
    PYTHONPATH=src python benchmarks/hf_parts.py attention --kv 104 1024 4096 --json $OUT/attention.json
    PYTHONPATH=src python benchmarks/hf_parts.py projections --json $OUT/projections.json
    PYTHONPATH=src python benchmarks/hf_parts.py attention projections --dry-run     # CPU, no timing

Cases (``--list``): ``attention``, the decode attention of ``generate.py``'s Qwen3.5-like layer (16 query / 2
key-value heads of 256, bf16, a static cache filled to a random length per row, the rest masked) in each form:
transformers' stock path (every key/value head repeated for its query heads, then SDPA), each group's query
heads packed into the query length with SDPA (its own backend choice, or one forced), the packed query as two
products around a softmax with bf16 scores, and as ``integrations/hf/attention.py`` ships it (fp32 scores);
``projections``, the same model's Gated DeltaNet input projections (hidden 2048 -> 8192 + 4096 + 32 + 32,
bf16), as four products and as the one product over the stacked weights of ``integrations/hf/projections.py``.

Method: every form is first checked against float64 (one that differs fails the run; one a backend refuses is
recorded with its error and the run goes on), then, eagerly and through inductor (``torch.compile``, full
graph, static shapes, no CUDA graphs of its own), ``--calls`` calls are captured in one CUDA graph, replayed
``--repeats`` times, and the median per call is kept. Attention's floor: query, key, value and output bytes
over the streaming bandwidth measured in the same run. ``--dry-run`` checks every form on tiny sizes on the
CPU (the inductor mode as dynamo's full-graph trace, without code generation) and times nothing (CI runs it).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, rel_err  # noqa: E402
from replayssm.integrations.hf.attention import grouped_products_attention  # noqa: E402
from replayssm.integrations.hf.projections import StackedProjections  # noqa: E402

MODES = ("eager", "inductor")


@dataclasses.dataclass
class Bench:
    dry: bool
    calls: int
    repeats: int
    bandwidth: float | None = None  # bytes/s (GPU runs)

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def compile(self, fn):
        # a dry run traces the whole form with dynamo (a graph break fails it) but leaves code generation to the GPU
        return torch.compile(fn, fullgraph=True, dynamic=False, backend="eager" if self.dry else "inductor")

    def time(self, call) -> float | None:
        """Microseconds per call, ``calls`` calls in one captured graph (a dry run: one call, no timing)."""
        if self.dry:
            call()
            return None
        from _common import time_graph_per_step

        return time_graph_per_step([call] * self.calls, repeats=self.repeats)


def measure(bench: Bench, row: dict, fn, args: tuple, check: Callable[[object], dict], tol: float, rows: list) -> None:
    """One form in both modes: check against float64 (``check(out)``: errors, ``rel_err`` first), then time."""
    for mode in MODES:
        r = {**row, "mode": mode}
        try:
            call = fn if mode == "eager" else bench.compile(fn)
            r.update(check(call(*args)))
            if not r["rel_err"] < tol:  # SystemExit: not caught below
                raise SystemExit(f"{r}: relative error against float64 over {tol}")
            r["us"] = bench.time(lambda c=call: c(*args))
            if r["us"] is not None and "floor_us" in r:
                r["pct_floor"] = 100 * r["floor_us"] / r["us"]
        except Exception as e:  # a backend that refuses the shape (or its capture): record why, go on
            if bench.dry:
                raise
            r["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        rows.append(r)
        print(json.dumps(r), flush=True)
        torch._dynamo.reset()


# attention


def stock(q, k, v, mask, scale):
    """transformers' SDPA path with a mask (``repeat_kv``): every key/value head repeated for its query heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _packed(q, k, mask):
    """The query with each group's heads folded into its length (row g * q + t: token t) and the mask over those rows."""
    batch, heads, q_len, dim = q.shape
    packed = q.reshape(batch, k.shape[1], heads // k.shape[1] * q_len, dim)
    return packed, mask if q_len == 1 else mask.repeat(1, 1, heads // k.shape[1], 1)


def packed_sdpa(backend):
    def fn(q, k, v, mask, scale):
        packed, packed_mask = _packed(q, k, mask)
        if backend is None:
            return F.scaled_dot_product_attention(packed, k, v, attn_mask=packed_mask, scale=scale).reshape(q.shape)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(packed, k, v, attn_mask=packed_mask, scale=scale).reshape(q.shape)

    return fn


def packed_matmul(q, k, v, mask, scale):
    """The packed query as two batched products around an fp32 softmax, the scores rounded to bf16 first."""
    packed, packed_mask = _packed(q, k, mask)
    scores = torch.matmul(packed, k.transpose(-1, -2)).float() * scale
    probs = torch.softmax(scores.masked_fill(~packed_mask, float("-inf")), dim=-1).to(v.dtype)
    return torch.matmul(probs, v).reshape(q.shape)


ATTENTION_FORMS = {
    "stock repeat_kv + sdpa": stock,
    "packed sdpa (auto)": packed_sdpa(None),
    "packed sdpa cudnn": packed_sdpa(SDPBackend.CUDNN_ATTENTION),
    "packed sdpa efficient": packed_sdpa(SDPBackend.EFFICIENT_ATTENTION),
    "packed sdpa math": packed_sdpa(SDPBackend.MATH),
    "packed matmul": packed_matmul,
    "replayssm grouped products": grouped_products_attention,  # fp32 scores: the shipped form
}
CUDA_ONLY = {"packed sdpa cudnn", "packed sdpa efficient"}  # backends the CPU lacks


def attention_reference(q, k, v, mask, scale):
    groups = q.shape[1] // k.shape[1]
    q, k, v = (t.double() for t in (q, k, v))
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def run_attention(args, bench: Bench, variants: list) -> list:
    heads, kv_heads, dim = (4, 2, 16) if bench.dry else (16, 2, 256)
    dev, rows = bench.device, []
    if bench.dry:
        variants = [v for v in variants if v not in CUDA_ONLY]
    for batch in args.batches or ((1, 3) if bench.dry else (1, 16, 64, 256)):
        for kv in args.kv or ((8,) if bench.dry else (104, 1024, 4096)):
            for q_len in args.queries or ((1, 3) if bench.dry else (1,)):
                q = torch.randn(batch, heads, q_len, dim, device=dev, dtype=torch.bfloat16)
                k, v = (torch.randn(batch, kv_heads, kv, dim, device=dev, dtype=torch.bfloat16) for _ in range(2))
                # a static cache: each row filled to a random length (at least q_len), query token t sees up to its own
                filled = torch.randint(max(q_len, kv // 2), kv + 1, (batch,), device=dev)[:, None, None, None]
                pos, token = torch.arange(kv, device=dev), torch.arange(q_len, device=dev)[:, None]
                mask = (pos < filled) & (pos <= filled - q_len + token)  # (batch, 1, q, kv)
                scale = dim**-0.5
                ref = attention_reference(q, k, v, mask, scale)

                def check(out, ref=ref):
                    if out.shape != ref.shape:
                        raise SystemExit(f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
                    return {"rel_err": rel_err(out, ref), "max_abs_err": (out.double() - ref).abs().max().item()}

                row = {"batch": batch, "kv": kv, "q": q_len}
                if bench.bandwidth:
                    row["floor_us"] = (2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()) / bench.bandwidth * 1e6
                for name in variants:
                    measure(bench, {**row, "variant": name}, ATTENTION_FORMS[name], (q, k, v, mask, scale), check, 2e-2, rows)
    columns = [("batch", "batch", ""), ("kv", "kv", ""), ("q", "q", ""), ("variant", "variant", ""), ("mode", "mode", ""),
               ("us", "us per call", ".1f"), ("pct_floor", "% of floor", ".1f"), ("rel_err", "rel. error", ".1e"), ("error", "error", "")]  # fmt: skip
    print(format_table(rows, columns))
    return rows


# projections


GDN_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")  # Qwen3_5GatedDeltaNet's names


def gdn_projections(hidden: int, outputs: tuple, device) -> torch.nn.Module:
    layer = torch.nn.Module()
    for name, n in zip(GDN_PROJECTIONS, outputs):
        lin = torch.nn.Linear(hidden, n, bias=False, device=device, dtype=torch.bfloat16)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(n, hidden, device=device) * hidden**-0.5)
        setattr(layer, name, lin)
    return layer.requires_grad_(False)


def run_projections(args, bench: Bench, variants: list) -> list:
    hidden, outputs = (32, (48, 16, 4, 4)) if bench.dry else (2048, (2 * 16 * 128 + 32 * 128, 32 * 128, 32, 32))
    layer = gdn_projections(hidden, outputs, bench.device)
    forms = {"separate": StackedProjections(layer, GDN_PROJECTIONS), "fused": StackedProjections(copy.deepcopy(layer), GDN_PROJECTIONS)}
    assert forms["fused"].bind()  # unbound, the other calls the four layers as the model built them
    rows = []
    for batch in args.batches or ((1, 3) if bench.dry else (1, 16, 64, 256)):
        h = torch.randn(batch, 1, hidden, device=bench.device, dtype=torch.bfloat16)
        refs = [F.linear(h.double(), lay.weight.double()) for lay in forms["separate"].layers()]

        def check(outs, refs=refs):
            if [o.shape for o in outs] != [r.shape for r in refs]:
                raise SystemExit(f"shapes {[tuple(o.shape) for o in outs]}, expected {[tuple(r.shape) for r in refs]}")
            return {"rel_err": max(rel_err(o, r) for o, r in zip(outs, refs))}

        for name in variants:
            measure(bench, {"batch": batch, "form": name}, lambda x, f=forms[name]: f(x), (h,), check, 1e-2, rows)
    print(format_table(rows, [("batch", "batch", ""), ("form", "form", ""), ("mode", "mode", ""), ("us", "us per layer", ".1f"),
                              ("rel_err", "rel. error", ".1e"), ("error", "error", "")]))  # fmt: skip
    return rows


# the registry, main


@dataclasses.dataclass(frozen=True)
class Case:
    run: Callable
    description: str
    variants: tuple[str, ...]


CASES = {
    "attention": Case(run_attention, "decode attention forms: packed SDPA, replayssm's grouped products, stock repeat_kv + SDPA", tuple(ATTENTION_FORMS)),
    "projections": Case(run_projections, "a GDN layer's four input projections vs one GEMM over the stacked weights", ("separate", "fused")),
}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases:\n" + "\n".join(f"  {n:12s} {c.description}" for n, c in CASES.items()))  # fmt: skip
    ap.add_argument("cases", nargs="*", help="cases to run, in order (--list)")
    ap.add_argument("--list", action="store_true", help="print the cases and their variants, and exit")
    ap.add_argument("--batches", nargs="*", type=int, help="rows, one token each (default 1 16 64 256)")
    ap.add_argument("--kv", nargs="*", type=int, help="attention: static cache lengths (default 104 1024 4096)")
    ap.add_argument("--queries", nargs="*", type=int, help="attention: query tokens per row (default 1: decoding)")
    all_variants = [v for c in CASES.values() for v in c.variants]
    ap.add_argument("--variants", nargs="*", default=[], choices=all_variants, help="forms to run; a case none of whose forms is named runs all")
    ap.add_argument("--calls", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--repeats", type=int, default=15, help="graph replays timed, the median kept")
    ap.add_argument("--json", type=Path, help="write every case's rows (and the run's metadata) here")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU, every form checked, no timing")
    args = ap.parse_args(argv)
    if args.list:
        print("\n".join(f"{n:12s} {c.description}; variants: " + ", ".join(repr(v) for v in c.variants) for n, c in CASES.items()))
        return
    if bad := [c for c in args.cases if c not in CASES]:
        ap.error(f"unknown case(s) {bad}; --list names them")
    if not args.cases:
        ap.error("name at least one case (--list names them)")
    if bad := [n for n in [*(args.batches or ()), *(args.kv or ()), *(args.queries or ()), args.calls, args.repeats] if n < 1]:
        ap.error(f"--batches / --kv / --queries / --calls / --repeats: must be >= 1, got {bad}")
    bench = Bench(args.dry_run, args.calls, args.repeats)
    torch.manual_seed(0)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": None if args.dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__, "command": " ".join(sys.argv), "calls": args.calls, "repeats": args.repeats,
    }  # fmt: skip
    if not args.dry_run:
        from _common import streaming_bandwidth

        bench.bandwidth = meta["bandwidth_Bps"] = streaming_bandwidth()[0]
    print(json.dumps(meta), flush=True)
    result = {"meta": meta}
    for name in args.cases:
        case = CASES[name]
        variants = [v for v in args.variants if v in case.variants] or list(case.variants)
        result[name] = {"rows": case.run(args, bench, variants)}
        print(f"{'dry run' if args.dry_run else 'case'} {name}: ok", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
