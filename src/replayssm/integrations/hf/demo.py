"""``python -m replayssm demo``: replay decoding on a small hybrid model, offline.

Builds a small random Nemotron-H-style hybrid (Mamba-2 + attention + MLP
layers) from a config, generates with and without the patch and checks the
tokens are identical, runs assisted decoding (prompt lookup, and a patched
hybrid assistant; stock transformers refuses it on this model before 5.25
and keeps a state per draft token from 5.25), and prints
what replay saves: recurrent-state bytes written per generated token (from
the traffic model, ``replayssm.decode_traffic``) and wall-clock timings.
Runs on the CPU by default, on the GPU when one is present.
"""

from __future__ import annotations

import copy
import time

import torch

from ...config import ReplayConfig
from ...traffic import decode_traffic
from .cache import ReplayLayerMixin
from .patch import patch, unpatch
from .testing import output_cache, stock_refuses_assisted

#: model sizes: "small" for the demo, "tiny" for its test
SIZES = {
    "small": dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        mamba_num_heads=8,
        mamba_head_dim=32,
        ssm_state_size=64,
        n_groups=2,
        layers_block_type=["mamba", "attention", "mamba", "mlp", "mamba", "mlp"],
    ),
    "tiny": dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=32,
        ssm_state_size=16,
        n_groups=2,
        layers_block_type=["mamba", "attention", "mamba", "mlp"],
    ),
}


def build_demo_model(size: str = "small", device=None, seed: int = 0):
    """A random Nemotron-H-style hybrid built offline from a config, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "nemotron_h", conv_kernel=4, chunk_size=32, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, **copy.deepcopy(SIZES[size]),
    )  # fmt: skip
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # give the recurrences distinct decays (the default init is near identity)
        for module in model.modules():
            if hasattr(module, "A_log") and hasattr(module, "dt_bias"):
                module.A_log.uniform_(-1.0, 1.0)
                module.dt_bias.uniform_(-2.0, 0.5)
    return model.to(device).eval()


class _Timer:
    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.start


def _generate(model, prompt, new_tokens, **kwargs):
    device = prompt.device
    forwards = []
    handle = model.register_forward_hook(lambda *args: forwards.append(1))
    try:
        with _Timer(device) as timer:
            out = model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                return_dict_in_generate=True, **kwargs,
            )  # fmt: skip
    finally:
        handle.remove()
    cache = output_cache(out)
    layers = [layer for layer in getattr(cache, "layers", []) if isinstance(layer, ReplayLayerMixin)]
    rolled_back = layers[0].rolled_back if layers else 0  # every SSM layer rolls back the same tokens
    return out.sequences, timer.seconds, len(forwards), rolled_back


def run_demo(device=None, size: str = "small", new_tokens: int = 64, window: int = 16, quiet: bool = False) -> dict:
    """Run the demo, print its report, and return the figures as a dict.

    Args:
        device: where to run (default: "cuda" when available, else "cpu").
        size: "small" (the demo) or "tiny" (seconds on a CPU; used by the tests).
        new_tokens: tokens generated per run.
        window: the replay ring window.
        quiet: return the figures without printing.
    """
    import transformers

    transformers.logging.set_verbosity_error()
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    say = (lambda *args: None) if quiet else print
    model = build_demo_model(size, device)
    vocab = model.config.vocab_size
    phrase = torch.arange(5, 5 + 7) % vocab
    prompt = torch.cat([phrase, phrase, phrase[:4]]).unsqueeze(0).to(device)  # repeats itself: prompt lookup helps
    config = ReplayConfig(window=window)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"replayssm demo: random Nemotron-H-style hybrid ({len(SIZES[size]['layers_block_type'])} layers: "
        f"{', '.join(SIZES[size]['layers_block_type'])}; {n_params / 1e6:.1f}M parameters), {device}, fp32, "
        f"transformers {transformers.__version__}")  # fmt: skip

    assistant = copy.deepcopy(model)  # perturbed below: right often, wrong sometimes
    _generate(model, prompt, 4)  # warm-up (first-call overheads stay out of the timings)
    ref, t_ref, _, _ = _generate(model, prompt, new_tokens)
    patch(model, config)
    _generate(model, prompt, 4)
    got, t_replay, _, _ = _generate(model, prompt, new_tokens)
    lookup, t_lookup, lookup_forwards, lookup_back = _generate(model, prompt, new_tokens, prompt_lookup_num_tokens=4)

    with torch.no_grad():
        head = assistant.get_output_embeddings().weight
        head.add_(torch.randn(head.shape, generator=torch.Generator().manual_seed(7)).to(head) * head.std() * 0.5)
    assistant.generation_config.num_assistant_tokens = 5
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    patch(assistant, config)
    assisted, t_assisted, assisted_forwards, assisted_back = _generate(model, prompt, new_tokens, assistant_model=assistant)

    results = {
        "device": str(device),
        "new_tokens": new_tokens,
        "window": window,
        "greedy_identical": bool(torch.equal(ref, got)),
        "prompt_lookup_identical": bool(torch.equal(ref, lookup)),
        "assistant_identical": bool(torch.equal(ref, assisted)),
        "prompt_lookup_forwards": lookup_forwards,
        "prompt_lookup_rolled_back": lookup_back,
        "assistant_forwards": assisted_forwards,
        "assistant_rolled_back": assisted_back,
        "seconds": {"unpatched": t_ref, "replay": t_replay, "prompt_lookup": t_lookup, "assistant": t_assisted},
    }
    say("")
    say(f"greedy, {new_tokens} new tokens: unpatched vs patched identical: {results['greedy_identical']}")
    say(f"  generated: {ref[0, prompt.shape[1]:prompt.shape[1] + 16].tolist()} ...")
    stock = (
        "stock transformers refuses it on this model: 'not supported with stateful models'"
        if stock_refuses_assisted()
        else "stock transformers >= 5.25 runs it with a state snapshot per draft token; replay moves a cursor"
    )
    say(f"assisted decoding ({stock}):")
    say(f"  prompt lookup (4 drafted):  identical to greedy: {results['prompt_lookup_identical']}; "
        f"{lookup_forwards} target forwards for {new_tokens} tokens, {lookup_back} drafted tokens rolled back")  # fmt: skip
    say(f"  patched hybrid assistant:   identical to greedy: {results['assistant_identical']}; "
        f"{assisted_forwards} target forwards for {new_tokens} tokens, {assisted_back} drafted tokens rolled back")  # fmt: skip

    # What replay saves, per generated token, summed over the model's SSM layers (traffic model).
    adapters = list(model._replayssm.adapters.values())
    rows = []
    for batch in (1, 64):
        traffic = [decode_traffic(a.geometry, batch, window, torch.float32, torch.float32) for a in adapters]
        conventional_w = sum(t.state_bytes_written_per_token_conventional for t in traffic)
        replay_w = sum(t.state_bytes_written_per_token_replay for t in traffic)
        moved_c = sum(t.conventional for t in traffic)
        moved_r = sum(t.replay for t in traffic)
        rows.append((batch, conventional_w, replay_w, moved_c, moved_r))
    results["state_bytes_written_per_token"] = {b: {"conventional": c, "replay": r} for b, c, r, _, _ in rows}
    say("")
    say(f"state traffic per generated token, {len(adapters)} Mamba-2 layers, fp32 state, window {window} (traffic model):")
    say(f"  {'batch':>5} | {'state written: conventional':>27} | {'replay':>10} | {'fewer':>6} | {'all SSM bytes moved: conv':>25} | {'replay':>10} | {'fewer':>6}")  # fmt: skip
    for batch, cw, rw, mc, mr in rows:
        say(f"  {batch:>5} | {_fmt(cw):>27} | {_fmt(rw):>10} | {cw / rw:>5.1f}x | {_fmt(mc):>25} | {_fmt(mr):>10} | {mc / mr:>5.2f}x")  # fmt: skip
    say("")
    say(f"timings ({device}; the CPU path runs the PyTorch reference ops, so CPU times show overheads, not the GPU saving):")
    per_token = {k: 1e3 * v / new_tokens for k, v in results["seconds"].items()}
    say(f"  unpatched greedy {per_token['unpatched']:.1f} ms/token | replay greedy {per_token['replay']:.1f} ms/token | "
        f"replay + prompt lookup {per_token['prompt_lookup']:.1f} ms/token | replay + assistant {per_token['assistant']:.1f} ms/token")  # fmt: skip
    unpatch(model)
    return results


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    run_demo()
