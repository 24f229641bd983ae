"""End-to-end decode throughput of patched transformers models (issue 5, item 7).

    PYTHONPATH=src python benchmarks/generate.py --captured --out results/   # the GPU run
    PYTHONPATH=src python benchmarks/generate.py --tiny --out /tmp/gen   # CPU smoke run, tiny sizes

Models (random weights, a few layers, real layer width, bf16 weights and
activations, fp32 recurrent state):

* ``nemotron_h-like``: hidden 4096, Mamba-2 layers of 128 heads x 64 x 128
  state, 8 groups (Nemotron-H 8B's mixer), pattern mamba, mlp, mamba, attention;
* ``qwen3_5-like``: hidden 2048, Gated DeltaNet layers of 16 key heads / 32
  value heads x 128 x 128, pattern linear, linear, linear, full attention.

For each model and batch (1, 16, 64, 256), decode tokens/s of

* ``transformers``: the unpatched model (whatever kernels transformers finds:
  mamba_ssm / causal_conv1d / fla when installed, its torch path otherwise);
* ``conventional``: patched with ``step="conventional"`` (the replayssm
  conventional op: read and write the whole state every token);
* ``replay``: patched with replay (window ``--window``).

With ``--captured``, also ``conventional-captured`` and ``replay-captured``:
the patched step in a static cache through ``torch.compile(fullgraph=True,
dynamic=False)``, mode "reduce-overhead" (CUDA graphs) with inductor; with
``--tiny`` on the CPU the backend is "eager" (a smoke test of the plumbing).

Decode is timed as ``--steps`` single-token forwards after a prefill of
``--prompt`` tokens (prefill not timed), median of ``--repeats``. Then
assisted decoding with prompt lookup at batch 1 vs plain greedy (patched
replay), tokens/s through ``generate``, on a prompt that repeats itself.

Prints a table; writes ``generate.json`` and ``generate.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import replayssm
from replayssm.integrations.hf import testing

MODELS = {
    "nemotron_h-like": dict(
        model_type="nemotron_h",
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        mamba_num_heads=128,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=8,
        conv_kernel=4,
        chunk_size=128,
        layers_block_type=["mamba", "mlp", "mamba", "attention"],
    ),
    "qwen3_5-like": dict(
        model_type="qwen3_5",
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=6144,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_hidden_layers=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    ),
}
TINY = {"nemotron_h-like": "nemotron_h", "qwen3_5-like": "qwen3_5"}
MODES = ("transformers", "conventional", "replay")
#: --captured adds these: the patched step in a static cache, through torch.compile (CUDA graphs on CUDA)
CAPTURED_MODES = ("conventional-captured", "replay-captured")


def build(name: str, tiny: bool, device: torch.device, dtype: torch.dtype):
    if tiny:
        return testing.tiny_model(TINY[name], dtype=dtype).to(device)
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(MODELS[name])
    config = AutoConfig.for_model(spec.pop("model_type"), tie_word_embeddings=False, pad_token_id=0, **spec)
    config = config.get_text_config(decoder=True)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():  # distinct decays (the default init is near identity)
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.uniform_(-1.0, 1.0)
                module.dt_bias.uniform_(-2.0, 0.5)
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_tokens_per_second(
    model, batch: int, prompt: int, steps: int, repeats: int, device: torch.device, compile_kwargs: dict | None = None
) -> float:
    """Median tokens/s of ``steps`` single-token decode forwards at ``batch`` rows, after an untimed prefill.

    With ``compile_kwargs``: a static cache, and each step through
    ``torch.compile(model, **compile_kwargs)`` with the ops' value checks off
    (what ``patch(model, compile=True)`` makes ``generate`` do); the first
    (untimed) repeat compiles and captures.
    """
    vocab = model.config.get_text_config(decoder=True).vocab_size
    kw = testing.cache_kwarg(model)
    forward = model
    if compile_kwargs is not None:
        from transformers import StaticCache

        forward = torch.compile(model, **compile_kwargs)
        text_config = model.config.get_text_config(decoder=True)
        previous_checks = replayssm.ops.set_value_checks(False)
    gen = torch.Generator(device="cpu").manual_seed(batch)
    ids = torch.randint(3, vocab, (batch, prompt + steps + 1), generator=gen).to(device)
    times = []
    with torch.no_grad():
        try:
            for _ in range(repeats + 1):  # the first run warms up (and compiles)
                if compile_kwargs is None:
                    cache = testing.new_cache(model)
                else:
                    cache = StaticCache(config=text_config, max_cache_len=prompt + steps)
                model(input_ids=ids[:, :prompt], **{kw: cache}, use_cache=True, logits_to_keep=1)
                _sync(device)
                start = time.perf_counter()
                for pos in range(prompt, prompt + steps):
                    position = torch.full((batch, 1), pos, device=device)
                    forward(input_ids=ids[:, pos : pos + 1], position_ids=position, **{kw: cache}, use_cache=True, logits_to_keep=1)
                _sync(device)
                times.append(time.perf_counter() - start)
        finally:
            if compile_kwargs is not None:
                replayssm.ops.set_value_checks(previous_checks)
    return batch * steps / statistics.median(times[1:])


def assisted_tokens_per_second(model, new_tokens: int, repeats: int, device: torch.device, lookup: int | None) -> tuple[float, bool]:
    """Tokens/s of greedy ``generate`` at batch 1 (``lookup``: prompt-lookup draft length, None for plain greedy)."""
    vocab = model.config.get_text_config(decoder=True).vocab_size
    phrase = torch.arange(5, 5 + 24) % vocab
    prompt = torch.cat([phrase] * 4).unsqueeze(0).to(device)
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = lookup
    times, out = [], None
    for _ in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        out = model.generate(prompt, **kwargs)
        _sync(device)
        times.append(time.perf_counter() - start)
    return new_tokens / statistics.median(times[1:]), out


def format_table(rows: list[dict]) -> str:
    modes = list(rows[0]["tokens_per_s"]) if rows else list(MODES)
    best = "replay-captured" if "replay-captured" in modes else "replay"
    baseline = "conventional-captured" if best == "replay-captured" else "conventional"
    width = max(19, max(len(m) + 6 for m in modes))
    lines = [
        f"{'model':<16} {'batch':>5} " + " ".join(f"{m + ' tok/s':>{width}}" for m in modes)
        + f" {best + '/transformers':>{len(best) + 14}} {best + '/' + baseline:>{len(best + baseline) + 2}}"
    ]  # fmt: skip
    for r in rows:
        t = r["tokens_per_s"]
        lines.append(
            f"{r['model']:<16} {r['batch']:>5} " + " ".join(f"{t[m]:>{width}.1f}" for m in modes)
            + f" {t[best] / t['transformers']:>{len(best) + 13}.2f}x {t[best] / t[baseline]:>{len(best + baseline) + 1}.2f}x"
        )  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict], assisted: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return
    names = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(names) + 1, figsize=(5 * (len(names) + 1), 4))
    for ax, name in zip(axes, names):
        sub = [r for r in rows if r["model"] == name]
        for mode in sub[0]["tokens_per_s"]:
            ax.plot([r["batch"] for r in sub], [r["tokens_per_s"][mode] for r in sub], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("decode tokens/s")
        ax.set_title(name)
        ax.legend()
    ax = axes[-1]
    labels = [f"{a['model']}\n{a['method']}" for a in assisted]
    ax.bar(range(len(assisted)), [a["tokens_per_s"] for a in assisted])
    ax.set_xticks(range(len(assisted)), labels, fontsize=7)
    ax.set_ylabel("tokens/s (batch 1, generate)")
    ax.set_title("prompt lookup vs greedy (replay)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=None, help="prefill tokens (default 64; 8 with --tiny)")
    parser.add_argument("--steps", type=int, default=None, help="timed decode steps (default 64; 4 with --tiny)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--lookup", type=int, default=8, help="prompt-lookup draft length")
    parser.add_argument("--new-tokens", type=int, default=None, help="generate length for the assisted runs")
    parser.add_argument("--captured", action="store_true", help="also time the patched steps in a static cache through torch.compile")
    parser.add_argument(
        "--compile-backend",
        default=None,
        help="torch.compile backend for --captured (default: inductor, mode reduce-overhead = CUDA graphs; "
        "'eager' with --tiny: traces the step without code generation, a CPU smoke test)",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    tiny = args.tiny
    batches = args.batches or ([1, 2] if tiny else [1, 16, 64, 256])
    prompt = args.prompt or (8 if tiny else 64)
    steps = args.steps or (4 if tiny else 64)
    repeats = args.repeats or (1 if tiny else 5)
    new_tokens = args.new_tokens or (8 if tiny else 128)
    dtype = torch.float32 if tiny else torch.bfloat16
    modes = MODES + (CAPTURED_MODES if args.captured else ())
    backend = args.compile_backend or ("eager" if tiny and device.type != "cuda" else "inductor")
    compile_kwargs = dict(fullgraph=True, dynamic=False, backend=backend)
    if backend == "inductor":
        compile_kwargs["mode"] = "reduce-overhead"

    import transformers

    transformers.logging.set_verbosity_error()
    config = replayssm.ReplayConfig(window=args.window)
    rows, assisted = [], []
    for name in args.models:
        model = build(name, tiny, device, dtype)
        for batch in batches:
            tps = {}
            for mode in modes:
                replayssm.unpatch(model)
                step, _, captured = mode.partition("-")
                if step != "transformers":
                    replayssm.patch(model, config, step=step)
                try:
                    tps[mode] = decode_tokens_per_second(
                        model, batch, prompt, steps, repeats, device, compile_kwargs if captured else None
                    )
                except torch.OutOfMemoryError:
                    tps[mode] = float("nan")
                    torch.cuda.empty_cache()
            rows.append({"model": name, "batch": batch, "tokens_per_s": tps})
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
        replayssm.unpatch(model)
        replayssm.patch(model, config)
        greedy_tps, greedy_out = assisted_tokens_per_second(model, new_tokens, repeats, device, None)
        lookup_tps, lookup_out = assisted_tokens_per_second(model, new_tokens, repeats, device, args.lookup)
        identical = bool(torch.equal(greedy_out, lookup_out))
        assisted.append({"model": name, "method": "greedy", "tokens_per_s": greedy_tps})
        assisted.append({"model": name, "method": f"prompt lookup {args.lookup}", "tokens_per_s": lookup_tps, "identical_to_greedy": identical})
        replayssm.unpatch(model)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    print()
    print(format_table(rows))
    print()
    for a in assisted:
        extra = f" (identical to greedy: {a['identical_to_greedy']})" if "identical_to_greedy" in a else ""
        print(f"{a['model']:<16} batch 1 {a['method']:<18} {a['tokens_per_s']:>10.1f} tok/s{extra}")

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tiny": tiny,
        "dtype": str(dtype),
        "window": args.window,
        "prompt": prompt,
        "steps": steps,
        "repeats": repeats,
        "captured": compile_kwargs if args.captured else None,
        "kernels": {mod: _importable(mod) for mod in ("mamba_ssm", "causal_conv1d", "fla")},
    }
    (args.out / "generate.json").write_text(json.dumps({"meta": meta, "decode": rows, "assisted": assisted}, indent=2))
    plot(rows, assisted, args.out / "generate.png")
    print(f"wrote {args.out / 'generate.json'} and {args.out / 'generate.png'}")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
