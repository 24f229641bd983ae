"""Output quality of decode configurations on the small trained checkpoints.

For a checkpoint, held-out prompts and a list of decode configurations, the
unpatched fp32 model samples N tokens after each prompt (a fixed seed); each
configuration then runs teacher-forced over that same sequence, token by
token through its decode path (prefill of the prompt, then one token per
forward with the cache), and is compared with the reference's next-token
distributions: mean and max KL(reference || config), top-1 agreement, and
KL against position (first 128 tokens vs last 128: error that grows with
length is what low-precision states are known for). Each configuration also
runs teacher-forced over N tokens of held-out text after the same prompts,
which gives its held-out perplexity.

    python benchmarks/quality.py --checkpoint checkpoints/qwen3_5_small            # GPU if there is one
    python benchmarks/quality.py --checkpoint checkpoints/nemotron_h_small --device cpu -n 256 --prompts 2

With ``--recall``, each configuration is also scored on long-context
retrieval (benchmarks/recall_tasks.py: RULER-style needle, multi-key and
multi-value probes, generated with a seed, in a haystack of held-out text)
at each of ``--recall-contexts``: the prompt goes in through the
configuration's path (one prefill, or with ``--recall-feed stream`` a
prefill of ``--prompt-len`` tokens and then one token per forward), the
answer is teacher-forced one token per forward, and a probe counts when
every answer token is the first choice (exact match, the same as greedy
decoding). Recall per context and configuration goes into the JSON and a
second panel of the plot.

    python benchmarks/quality.py --checkpoint checkpoints/qwen3_5_small --recall --recall-count 16

Prints a table and writes quality.json and quality.png (matplotlib, if
installed) under --out. The held-out prompts and texts are excerpts of the
held-out split of the checkpoints' corpus, stored in
benchmarks/data/quality_heldout.json (``excerpts`` rebuilds that file from a
prepared data directory and the stdlib it came from). Deterministic for a
fixed seed on a given machine: tokens are sampled on the CPU from float64
probabilities with a seeded generator.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "quality_heldout.json"
POSITION_SPAN = 128


@dataclass(frozen=True)
class DecodeConfig:
    """One way of decoding: unpatched transformers, or ``replayssm.patch`` with a config and step."""

    name: str
    patched: bool = False
    state_dtype: torch.dtype = torch.float32
    step: str = "replay"
    window: int | None = None  # None: the --window argument
    read_dtype: torch.dtype | None = None  # a read copy of the checkpoint (SPEC §4) that every step's outputs read

    def describe(self, window: int) -> str:
        if not self.patched:
            return "unpatched transformers, fp32 state"
        dtype = str(self.state_dtype).replace("torch.", "")
        if self.step == "conventional":
            return f"conventional step, {dtype} state (rounded every token)"
        described = f"replay, {dtype} checkpoint, window {self.window or window} (rounded once per fold)"
        if self.read_dtype is not None:
            described += f", outputs read a {str(self.read_dtype).replace('torch.', '')} copy of it"
        return described


#: The configurations known by name; the reference is always run first.
CONFIGS = {
    c.name: c
    for c in (
        DecodeConfig("reference"),
        DecodeConfig("replay-fp32", True, torch.float32),
        DecodeConfig("replay-fp16", True, torch.float16),
        DecodeConfig("replay-bf16", True, torch.bfloat16),
        DecodeConfig("replay-read-fp16", True, torch.float32, read_dtype=torch.float16),
        DecodeConfig("replay-read-bf16", True, torch.float32, read_dtype=torch.bfloat16),
        DecodeConfig("conventional-fp32", True, torch.float32, "conventional"),
        DecodeConfig("conventional-fp16", True, torch.float16, "conventional"),
        DecodeConfig("conventional-bf16", True, torch.bfloat16, "conventional"),
    )
}
DEFAULT_CONFIGS = ("reference", "replay-fp32", "replay-fp16", "replay-bf16", "conventional-bf16")


# --------------------------------------------------------------------------
# loading and decoding


def load_checkpoint(path: str | Path, device: torch.device):
    """``(model, tokenizer)``: the checkpoint in fp32, eval mode, offline."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return model.to(device).eval(), tokenizer


def heldout_batch(tokenizer, prompt_len: int, n: int, count: int, data: Path = DATA) -> tuple[torch.Tensor, list[str]]:
    """``(ids, sources)``: the first ``count`` excerpts long enough, cut to ``prompt_len + n`` tokens."""
    excerpts = json.loads(data.read_text())["excerpts"]
    rows, sources = [], []
    for ex in excerpts:
        ids = tokenizer(ex["text"], return_tensors="pt").input_ids[0]
        if ids.numel() >= prompt_len + n:
            rows.append(ids[: prompt_len + n])
            sources.append(f"{ex['file']}:{ex['line']}")
        if len(rows) == count:
            break
    if len(rows) < count:
        raise SystemExit(f"{data} has only {len(rows)} excerpts of {prompt_len + n} tokens or more")
    return torch.stack(rows), sources


@contextlib.contextmanager
def configured(model, config: DecodeConfig, window: int):
    """``model`` decoding as ``config`` inside the block; unpatched again after it."""
    import replayssm

    replayssm.unpatch(model)
    if config.patched:
        replay = replayssm.ReplayConfig(window=config.window or window, state_dtype=config.state_dtype, read_dtype=config.read_dtype)
        replayssm.patch(model, replay, step=config.step)
    try:
        yield model
    finally:
        replayssm.unpatch(model)


@torch.no_grad()
def decode(model, prompt: torch.Tensor, n: int, forced: torch.Tensor | None = None, sample=None):
    """Prefill ``prompt`` (B, P), then ``n - 1`` one-token steps: the logits (B, n, V) predicting n tokens.

    The tokens fed are ``forced`` (B, n) if given, else drawn by ``sample(logits)``
    from each step's logits. Returns (logits on the CPU in fp32, tokens (B, n)).
    """
    from replayssm.integrations.hf import testing

    kw = testing.cache_kwarg(model)
    cache = testing.new_cache(model)
    device = next(model.parameters()).device
    out = model(input_ids=prompt.to(device), **{kw: cache}, use_cache=True, logits_to_keep=1)
    logits, tokens = [], []
    for t in range(n):
        step_logits = out.logits[:, -1].float().cpu()
        logits.append(step_logits)
        token = forced[:, t] if forced is not None else sample(step_logits)
        tokens.append(token)
        if t + 1 < n:
            out = model(input_ids=token[:, None].to(device), **{kw: cache}, use_cache=True)
    return torch.stack(logits, dim=1), torch.stack(tokens, dim=1)


def sampler(seed: int, temperature: float):
    gen = torch.Generator().manual_seed(seed)

    def sample(logits: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.double() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=gen)[:, 0]

    return sample


def compare(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, position): KL(ref || config) in nats (float64) and top-1 agreement."""
    ref_lp = torch.log_softmax(ref_logits.double(), dim=-1)
    lp = torch.log_softmax(logits.double(), dim=-1)
    kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1).clamp_min(0.0)
    agree = ref_logits.argmax(-1) == logits.argmax(-1)
    return kl, agree


def nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per (row, position) negative log-likelihood of ``targets`` in nats (float64)."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    return -lp.gather(-1, targets[..., None]).squeeze(-1)


# --------------------------------------------------------------------------
# long-context retrieval


def _recall_tasks():
    """The sibling module ``recall_tasks`` (this file runs as a script or is loaded by path)."""
    import sys

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import recall_tasks

    return recall_tasks


def heldout_haystack(tokenizer, data: Path = DATA) -> list[int]:
    """The held-out excerpts' tokens, end to end: the text the probes' needles are hidden in."""
    ids: list[int] = []
    for ex in json.loads(data.read_text())["excerpts"]:
        ids.extend(tokenizer(ex["text"], add_special_tokens=False).input_ids)
        ids.append(tokenizer.eos_token_id)
    return ids


def recall_probes(tokenizer, contexts, tasks, count: int, seed: int) -> dict:
    """``{context: [probes]}``: ``count`` seeded probes of each task at each context."""
    rt = _recall_tasks()
    vocab = rt.TaskVocab(tokenizer)
    haystack = heldout_haystack(tokenizer)
    return {c: [p for t in tasks for p in rt.probe_set(vocab, haystack, t, c, count, seed)] for c in contexts}


@torch.no_grad()
def recall_answer_logits(model, probes, feed: str, prompt_len: int, batch: int, pad_id: int) -> list[torch.Tensor]:
    """Each probe's logits at its answer positions (answer length x vocab), through the decode path.

    ``feed='prefill'``: the whole prompt in one forward; ``'stream'``: its
    first ``prompt_len`` tokens in one forward and the rest one token per
    forward, as generated text would go. The answer tokens follow one per
    forward either way (teacher-forced). All probes share one context length.
    """
    out: list[torch.Tensor] = []
    for s in range(0, len(probes), batch):
        group = probes[s : s + batch]
        prompt = torch.tensor([p.prompt for p in group])
        width = max(len(p.answer) for p in group)
        answers = torch.full((len(group), width), pad_id, dtype=torch.long)
        for i, p in enumerate(group):
            answers[i, : len(p.answer)] = torch.tensor(p.answer)
        if feed == "stream":
            head, rest = prompt[:, :prompt_len], prompt[:, prompt_len:]
            logits, _ = decode(model, head, rest.shape[1] + width, forced=torch.cat([rest, answers], dim=1))
            logits = logits[:, rest.shape[1] :]
        else:
            logits, _ = decode(model, prompt, width, forced=answers)
        out.extend(logits[i, : len(p.answer)] for i, p in enumerate(group))
    return out


def recall_hits(model, probes, feed: str, prompt_len: int, batch: int, pad_id: int) -> list[bool]:
    """Exact match of each probe's answer: every answer token the first choice (what greedy decoding gives)."""
    logits = recall_answer_logits(model, probes, feed, prompt_len, batch, pad_id)
    return [bool((lg.argmax(-1) == torch.tensor(p.answer)).all()) for lg, p in zip(logits, probes)]


def score_recall(model, probes_by_context: dict, feed: str, prompt_len: int, batch: int, pad_id: int) -> dict:
    """``{context: {task: accuracy, ..., "mean": accuracy}}`` (JSON keys: strings)."""
    out = {}
    for context, probes in probes_by_context.items():
        hits = recall_hits(model, probes, feed, prompt_len, batch, pad_id)
        row: dict = {}
        for p, hit in zip(probes, hits):
            row.setdefault(p.task, []).append(hit)
        row = {task: sum(h) / len(h) for task, h in row.items()}
        row["mean"] = sum(hits) / len(hits)
        out[str(context)] = row
    return out


# --------------------------------------------------------------------------
# the run


def run(args: argparse.Namespace) -> dict:
    import transformers

    transformers.logging.set_verbosity_error()
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    names = list(dict.fromkeys(["reference", *args.configs]))
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {', '.join(CONFIGS)}")
    model, tokenizer = load_checkpoint(args.checkpoint, device)
    ids, sources = heldout_batch(tokenizer, args.prompt_len, args.n, args.prompts)
    prompt, heldout = ids[:, : args.prompt_len], ids[:, args.prompt_len :]
    n = args.n
    probes = None
    if args.recall:
        probes = recall_probes(tokenizer, args.recall_contexts, args.recall_tasks, args.recall_count, args.seed)

    t0 = time.time()
    with configured(model, CONFIGS["reference"], args.window):
        gen_logits, generated = decode(model, prompt, n, sample=sampler(args.seed, args.temperature))
        ref_held_logits, _ = decode(model, prompt, n, forced=heldout)
    print(f"reference: sampled {args.prompts} x {n} tokens in {time.time() - t0:.1f}s", flush=True)

    results = {}
    for name in names:
        config = CONFIGS[name]
        t0 = time.time()
        with configured(model, config, args.window):
            logits, _ = decode(model, prompt, n, forced=generated)
            held_logits, _ = decode(model, prompt, n, forced=heldout)
            if probes is not None:
                recall = score_recall(model, probes, args.recall_feed, args.prompt_len, args.recall_batch, tokenizer.eos_token_id)
        kl, agree = compare(gen_logits, logits)
        kl_held, agree_held = compare(ref_held_logits, held_logits)
        held_nll = nll(held_logits, heldout)
        span = min(POSITION_SPAN, n)
        per_pos = kl.mean(0)
        results[name] = {
            "description": config.describe(args.window),
            "kl_mean": kl.mean().item(),
            "kl_max": kl.max().item(),
            "top1_agreement": agree.double().mean().item(),
            "kl_first": per_pos[:span].mean().item(),
            "kl_last": per_pos[-span:].mean().item(),
            "heldout_ppl": math.exp(held_nll.mean().item()),
            "heldout_kl_mean": kl_held.mean().item(),
            "heldout_top1_agreement": agree_held.double().mean().item(),
            "sampled_nll": nll(logits, generated).mean().item(),
            "kl_by_position": per_pos.tolist(),
            "seconds": time.time() - t0,
        }
        if probes is not None:
            results[name]["recall"] = recall
        r = results[name]
        print(f"{name}: KL mean {r['kl_mean']:.3g} max {r['kl_max']:.3g}, top-1 {r['top1_agreement']:.4%}, "
              f"held-out ppl {r['heldout_ppl']:.4f} ({r['seconds']:.1f}s)", flush=True)
        if probes is not None:
            print(f"{name}: recall " + ", ".join(f"{c}: {v['mean']:.1%}" for c, v in recall.items()), flush=True)

    return {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "checkpoint": str(args.checkpoint),
            "model": type(model).__name__,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "replayssm_git": _git_revision(),
            "seed": args.seed,
            "temperature": args.temperature,
            "prompts": args.prompts,
            "prompt_len": args.prompt_len,
            "n": n,
            "window": args.window,
            "position_span": min(POSITION_SPAN, n),
            "sources": sources,
            "sample": tokenizer.decode(torch.cat([prompt[0], generated[0]])[: args.prompt_len + 96]),
            **({"recall": recall_meta(args)} if probes is not None else {}),
        },
        "configs": results,
    }


def recall_meta(args: argparse.Namespace) -> dict:
    rt = _recall_tasks()
    return {
        "contexts": list(args.recall_contexts),
        "tasks": list(args.recall_tasks),
        "count_per_task": args.recall_count,
        "seed": args.seed,
        "feed": args.recall_feed,
        "format_version": rt.FORMAT_VERSION,
        "haystack": f"{DATA.name} excerpts, end to end",
        "scoring": "exact match: every answer token the first choice, teacher-forced one token per forward",
    }


def _git_revision() -> str | None:
    import subprocess

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"], cwd=HERE.parent, capture_output=True, text=True, check=False)
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def format_table(report: dict) -> str:
    span = report["meta"]["position_span"]
    head = (f"| config | KL mean | KL max | top-1 agree | KL first {span} | KL last {span} | held-out ppl |\n"
            "|---|---|---|---|---|---|---|")
    lines = [head]
    for name, r in report["configs"].items():
        lines.append(f"| {name} | {r['kl_mean']:.3g} | {r['kl_max']:.3g} | {r['top1_agreement']:.2%} | "
                     f"{r['kl_first']:.3g} | {r['kl_last']:.3g} | {r['heldout_ppl']:.4f} |")
    recall = report["meta"].get("recall")
    if recall:
        contexts = [str(c) for c in recall["contexts"]]
        lines += ["", "| config | " + " | ".join(f"recall @{c}" for c in contexts) + " |", "|---|" + "---|" * len(contexts)]
        for name, r in report["configs"].items():
            lines.append(f"| {name} | " + " | ".join(f"{r['recall'][c]['mean']:.1%}" for c in contexts) + " |")
    return "\n".join(lines)


def plot(report: dict, path: Path, bin_size: int = 32) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    recall = report["meta"].get("recall")
    if recall:
        fig, (ax, rax) = plt.subplots(1, 2, figsize=(12, 4))
    else:
        fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in report["configs"].items():
        kl = torch.tensor(r["kl_by_position"])
        if name == "reference" or kl.max() <= 0:
            continue
        bins = kl[: kl.numel() // bin_size * bin_size].view(-1, bin_size).mean(1)
        x = (torch.arange(bins.numel()) + 0.5) * bin_size
        ax.plot(x, bins.clamp_min(1e-16), label=name)
    meta = report["meta"]
    ax.set_yscale("log")
    ax.set_xlabel("generated token")
    ax.set_ylabel(f"KL(reference || config), nats (mean of {bin_size})")
    ax.set_title(f"{Path(meta['checkpoint']).name}: {meta['prompts']} prompts, window {meta['window']}")
    ax.legend(fontsize=8)
    if recall:
        contexts = recall["contexts"]
        for name, r in report["configs"].items():
            rax.plot(contexts, [r["recall"][str(c)]["mean"] for c in contexts], marker="o", label=name)
        rax.set_xscale("log", base=2)
        rax.set_xticks(contexts, [str(c) for c in contexts])
        rax.set_ylim(-0.02, 1.02)
        rax.set_xlabel("context (tokens)")
        rax.set_ylabel("recall, exact match")
        rax.set_title(f"{', '.join(recall['tasks'])}: {recall['count_per_task']} each, feed {recall['feed']}")
        rax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------
# the held-out excerpts


def build_excerpts(args: argparse.Namespace) -> None:
    """Excerpts of held-out files (from a ``train_small.py prepare`` directory and its stdlib)."""
    import random

    from tokenizers import Tokenizer

    data_dir = Path(args.data)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    tok = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    root = Path(args.stdlib or manifest["stdlib"])
    held = sorted(r for r, info in manifest["files"].items() if info["split"] == "heldout")
    random.Random(args.seed).shuffle(held)
    excerpts = []
    for rel in held:
        lines = (root / rel).read_text(encoding="utf-8").splitlines(keepends=True)
        start = len(lines) // 4  # past the license header and imports
        text, end = "", start
        while end < len(lines) and len(tok.encode(text).ids) < args.tokens:
            text += "".join(lines[end : end + 20])
            end += 20
        if len(tok.encode(text).ids) >= args.tokens:
            excerpts.append({"file": rel, "line": start + 1, "text": text})
        if len(excerpts) == args.count:
            break
    doc = {
        "about": "Excerpts of held-out files of the checkpoints' corpus (CPython's Lib/, Python "
                 f"{manifest['python']}; PSF License), made by benchmarks/quality.py excerpts.",
        "excerpts": excerpts,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(excerpts)} excerpts to {args.out}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default=str(HERE.parent / "checkpoints" / "qwen3_5_small"))
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), help=f"of: {', '.join(CONFIGS)}")
    ap.add_argument("-n", type=int, default=1024, help="tokens generated (and held-out tokens scored) per prompt")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=None, help="default: out/quality/<checkpoint name>")
    ap.add_argument("--recall", action="store_true", help="also score long-context retrieval (recall_tasks.py)")
    ap.add_argument("--recall-contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--recall-tasks", nargs="+", default=["needle", "multikey", "multivalue"],
                    choices=["needle", "multikey", "multivalue"])
    ap.add_argument("--recall-count", type=int, default=16, help="probes per task and context")
    ap.add_argument("--recall-feed", choices=("prefill", "stream"), default="prefill",
                    help="how the probe prompt goes in (stream: one token per forward after --prompt-len)")
    ap.add_argument("--recall-batch", type=int, default=4)
    sub = ap.add_subparsers(dest="cmd")
    ex = sub.add_parser("excerpts", help="rebuild benchmarks/data/quality_heldout.json")
    ex.add_argument("--data", required=True, help="a train_small.py prepare directory")
    ex.add_argument("--stdlib", default=None)
    ex.add_argument("--count", type=int, default=8)
    ex.add_argument("--tokens", type=int, default=1200)
    ex.add_argument("--out", default=str(DATA))
    args = ap.parse_args(argv)
    if args.cmd == "excerpts":
        build_excerpts(args)
        return

    report = run(args)
    out = args.out or Path("out") / "quality" / Path(args.checkpoint).name
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").write_text(json.dumps(report, indent=1) + "\n")
    wrote = [out / "quality.json"]
    if plot(report, out / "quality.png"):
        wrote.append(out / "quality.png")
    print()
    print(format_table(report))
    print(f"\nwrote {', '.join(map(str, wrote))}")


if __name__ == "__main__":
    main()
