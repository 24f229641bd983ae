"""Train the two small hybrid checkpoints that the quality harness runs on.

No model hub is reachable, so the project trains its own: a Nemotron-H-style
hybrid (Mamba-2 mixers, one attention layer, MLPs) and a Qwen3.5-style hybrid
(Gated DeltaNet layers, one full-attention layer), both built from
transformers classes so that ``replayssm.patch`` applies to them. The corpus
is the Python standard library's source; the tokenizer a byte-level BPE
trained on its train split. This script imports nothing from replayssm.

Two steps, so that the data is fixed once and travels to the GPU as files:

    # once, on any machine: split the stdlib by file, train the tokenizer,
    # tokenize both splits (writes tokenizer.json, train.bin, heldout.bin and
    # manifest.json, which names the interpreter, every file and its split)
    python benchmarks/train_small.py prepare --out out/train_small_data

    # per model (fixed seed; --steps N reproduces a run exactly, --time-budget
    # picks N from the measured step time and records it)
    python benchmarks/train_small.py train --family nemotron_h \\
        --data out/train_small_data --out checkpoints/nemotron_h_small --steps 3000

The stdlib differs between Python versions, so the split and the token
streams depend on the interpreter that ran ``prepare``; manifest.json records
its version, the files, their split and SHA-256s, and the hashes of the token
streams, and ``train`` copies those into the run's numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

EOS = "<|endoftext|>"
#: Directories of the stdlib left out: third-party packages, and the codec
#: tables of encodings/ (generated hex tables, not Python anyone writes).
EXCLUDED_DIRS = ("site-packages", "dist-packages", "encodings", "__pycache__")
HELDOUT_FRACTION = 0.05
SPLIT_SEED = 0


# --------------------------------------------------------------------------
# data


def stdlib_files(root: Path) -> list[Path]:
    """The stdlib's .py files under ``root``, sorted, readable as UTF-8."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = Path(dirpath) / name
                try:
                    path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                out.append(path)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def split_files(rels: list[str], seed: int = SPLIT_SEED, fraction: float = HELDOUT_FRACTION) -> set[str]:
    """The held-out subset of ``rels``: a fixed-seed sample of whole files."""
    rng = random.Random(seed)
    n = max(1, round(len(rels) * fraction))
    return set(rng.sample(sorted(rels), n))


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_stream(tok, texts: list[str]) -> np.ndarray:
    """Concatenate the files' tokens, each file followed by EOS."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def prepare(args: argparse.Namespace) -> None:
    root = Path(args.stdlib or sysconfig.get_paths()["stdlib"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = stdlib_files(root)
    if args.max_files:
        files = files[: args.max_files]
    rels = [p.relative_to(root).as_posix() for p in files]
    texts = {rel: p.read_text(encoding="utf-8") for rel, p in zip(rels, files)}
    heldout = split_files(rels)
    train_rels = [r for r in rels if r not in heldout]
    held_rels = [r for r in rels if r in heldout]

    t0 = time.time()
    tok = train_tokenizer([texts[r] for r in train_rels], args.vocab_size)
    tok.save(str(out / "tokenizer.json"))
    streams = {}
    for split, names in (("train", train_rels), ("heldout", held_rels)):
        ids = encode_stream(tok, [texts[r] for r in names])
        ids.tofile(out / f"{split}.bin")
        streams[split] = {
            "files": len(names),
            # UTF-8 bytes of the files, plus one per file for the separator
            # (EOS is scored like any token, so it is counted like a byte).
            "bytes": sum(len(texts[r].encode("utf-8")) + 1 for r in names),
            "tokens": int(ids.size),
            "sha256": sha256(ids.tobytes()),
        }
    manifest = {
        "python": sys.version.split()[0],
        "stdlib": str(root),
        "excluded_dirs": list(EXCLUDED_DIRS),
        "split_seed": SPLIT_SEED,
        "heldout_fraction": HELDOUT_FRACTION,
        "vocab_size": tok.get_vocab_size(),
        "tokenizer_sha256": sha256((out / "tokenizer.json").read_bytes()),
        "byte_unigram_bits_per_byte": byte_unigram_bits_per_byte([texts[r] for r in train_rels],
                                                                 [texts[r] for r in held_rels]),
        "streams": streams,
        "files": {r: {"split": "heldout" if r in heldout else "train", "sha256": sha256(texts[r].encode())} for r in rels},
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"prepared {out} from Python {manifest['python']} stdlib ({root}) in {time.time() - t0:.1f}s")
    for split, s in streams.items():
        print(f"  {split:8s} {s['files']:5d} files {s['bytes'] / 1e6:7.2f} MB {s['tokens'] / 1e6:7.3f} M tokens"
              f" ({s['bytes'] / s['tokens']:.2f} bytes/token)")


def load_data(path: Path):
    manifest = json.loads((path / "manifest.json").read_text())
    data = {}
    for split in ("train", "heldout"):
        ids = np.fromfile(path / f"{split}.bin", dtype=np.uint16)
        if sha256(ids.tobytes()) != manifest["streams"][split]["sha256"]:
            raise SystemExit(f"{path / split}.bin does not match manifest.json")
        data[split] = torch.from_numpy(ids.astype(np.int64))
    return manifest, data


def unigram_bits_per_byte(train: torch.Tensor, heldout: torch.Tensor, vocab: int, heldout_bytes: int) -> dict:
    """Baselines: a token unigram (add-one smoothed, fit on train) and a byte unigram."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    logp = counts.log() - counts.sum().log()
    nats = -logp[heldout].sum().item()
    return {
        "token_unigram_nats_per_token": nats / heldout.numel(),
        "token_unigram_bits_per_byte": nats / math.log(2) / heldout_bytes,
    }


def byte_unigram_bits_per_byte(train_texts: list[str], heldout_texts: list[str]) -> float:
    """Cross-entropy of the held-out bytes under the train split's byte frequencies (add-one)."""
    counts = {}
    for split, texts in (("train", train_texts), ("heldout", heldout_texts)):
        c = np.zeros(256)
        for text in texts:
            c += np.bincount(np.frombuffer(text.encode("utf-8"), dtype=np.uint8), minlength=256)
        counts[split] = c
    p = (counts["train"] + 1) / (counts["train"] + 1).sum()
    return float(-(counts["heldout"] * np.log2(p)).sum() / counts["heldout"].sum())


# --------------------------------------------------------------------------
# models


#: Model families and the transformers classes they build.
FAMILIES = {
    "nemotron_h": "NemotronHForCausalLM",
    "qwen3_5": "Qwen3_5ForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
}
#: ``small``: the geometry of the 2025 checkpoints (about 8.5M parameters);
#: ``testbed``: issue 50's long-memory checkpoints (about 5M parameters, so
#: that three fit in 30 MB in bf16); ``tiny``: CPU smoke tests only.
SIZES = ("small", "testbed", "tiny")


def _layer_types(ssm_layers: int, attention: str, ssm_before: int) -> list[str]:
    """``ssm_layers`` linear-attention layers and one full-attention layer, first or after ``ssm_before`` of them."""
    at = 0 if attention == "first" else ssm_before
    types = ["linear_attention"] * ssm_layers
    types.insert(at, "full_attention")
    return types


def build_config(family: str, vocab: int, eos_id: int, size: str, attention: str = "middle"):
    """The model geometry (see :data:`SIZES`).

    ``attention='first'`` puts the one attention layer before every SSM
    layer. An attention layer there sees only token embeddings, so it cannot
    form the previous-token features an induction (copy / recall) head needs:
    retrieval across the context must then go through the SSM state, which
    is what issue 50's testbed has to exercise. ``'middle'`` is each
    family's own kind of placement (the 2025 checkpoints).
    """
    tiny = size == "tiny"
    testbed = size == "testbed"
    common = {"vocab_size": vocab, "use_cache": True, "pad_token_id": eos_id, "bos_token_id": eos_id, "eos_token_id": eos_id}
    if family == "nemotron_h":
        from transformers import NemotronHConfig

        # Nemotron-H's layout: Mamba-2 and MLP blocks alternating, one attention block.
        if testbed:
            pattern = "*M-M-M-M-" if attention == "first" else "M-M-*M-M-"
        elif attention == "first":
            pattern = "*M-M-" if tiny else "*M-M-M-M-M-"
        else:
            pattern = "M-M*-M-" if tiny else "M-M-M*-M-M-"
        return NemotronHConfig(
            hidden_size=64 if tiny else 256,
            layers_block_type=[{"M": "linear_attention", "-": "mlp", "*": "full_attention"}[c] for c in pattern],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=128 if tiny else (384 if testbed else 1024),
            mlp_hidden_act="relu2",
            mamba_num_heads=4 if tiny else 8,  # intermediate 512 = 8 heads x 64
            mamba_head_dim=64,
            ssm_state_size=64 if testbed else 128,
            n_groups=2 if tiny or testbed else 4,  # heads per group share B and C
            conv_kernel=4,
            chunk_size=128,
            max_position_embeddings=8192 if testbed else 4096,
            tie_word_embeddings=False,  # NemotronHForCausalLM does not tie
            **common,
        )
    if family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        # Qwen3.5's layout is three GDN layers per full-attention layer.
        if testbed:
            layer_types = _layer_types(4, attention, 3)
        elif attention == "first":
            layer_types = _layer_types(4 if tiny else 6, "first", 0)
        else:
            layer_types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * (1 if tiny else 3)
        return Qwen3_5TextConfig(
            hidden_size=64 if tiny else 256,
            intermediate_size=128 if tiny else (320 if testbed else 768),
            num_hidden_layers=len(layer_types),
            layer_types=layer_types,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_num_key_heads=2,
            linear_num_value_heads=4,  # 2 value heads per key head
            max_position_embeddings=8192 if testbed else 4096,
            tie_word_embeddings=True,
            **common,
        )
    if family == "kimi_linear":
        from transformers import KimiLinearConfig

        if size == "small":
            raise SystemExit("kimi_linear has sizes testbed and tiny (small is the 2025 checkpoints' geometry)")
        # Kimi Linear's layout is three KDA layers per attention (MLA) layer; dense
        # SwiGLU MLPs in every layer (no MoE at this size).
        layer_types = _layer_types(2 if tiny else 4, attention, 1 if tiny else 3)
        return KimiLinearConfig(
            hidden_size=64 if tiny else 256,
            intermediate_size=128 if tiny else 256,
            num_hidden_layers=len(layer_types),
            layer_types=layer_types,
            mlp_layer_types=["dense"] * len(layer_types),
            # MLA: no query compression, a 128-dim compressed KV, 32 rotary + 32 plain query/key dims per head
            num_attention_heads=2 if tiny else 4,
            num_key_value_heads=2 if tiny else 4,
            q_lora_rank=None,
            kv_lora_rank=32 if tiny else 128,
            qk_rope_head_dim=16 if tiny else 32,
            qk_nope_head_dim=16 if tiny else 32,
            v_head_dim=32 if tiny else 64,
            # KDA: per-channel forget gates over 4 heads of 64 (state 4 x 64 x 64 per layer)
            linear_num_heads=2 if tiny else 4,
            linear_head_dim=32 if tiny else 64,
            linear_conv_kernel_dim=4,
            max_position_embeddings=8192,
            tie_word_embeddings=False,  # KimiLinearForCausalLM does not tie
            **common,
        )
    raise SystemExit(f"unknown family {family!r}")


def ssd_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D=None, dt_bias=None, initial_states=None,
                   dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False, **kwargs):
    """Mamba-2's chunked scan (SSD) with matrix products, for training only.

    Same signature and result as transformers' pure-PyTorch ``mamba2_chunk_scan``
    (the fallback when mamba_ssm is absent, as on the GPU machine), which
    forms (batch, chunks, L, L, heads, state) broadcast products and is about
    ten times slower. The trained weights do not depend on which one ran; the
    checkpoints are evaluated and used with transformers' own code.
    """
    with torch.autocast(hidden_states.device.type, enabled=False):  # fp32, as the fallback computes
        return _ssd_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus,
                               dt_limit, return_final_states)


def _ssd_chunk_scan(hidden_states, dt, A, B, C, chunk_size, D, dt_bias, initial_states, dt_softplus, dt_limit,
                    return_final_states):
    import torch.nn.functional as F

    b, t, h, p = hidden_states.shape
    g = B.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    x = hidden_states.float()
    pad = (chunk_size - t % chunk_size) % chunk_size
    rep = h // g
    B = B.float().repeat_interleave(rep, dim=2)
    C = C.float().repeat_interleave(rep, dim=2)
    xdt = x * dt[..., None]
    a = A.float() * dt  # (b, t, h)

    def chunks(v):
        v = F.pad(v, (0, 0) * (v.ndim - 2) + (0, pad))
        return v.reshape(b, -1, chunk_size, *v.shape[2:])

    xdt, a, B, C = chunks(xdt), chunks(a), chunks(B), chunks(C)  # (b, c, l, h, ...)
    a = a.permute(0, 3, 1, 2)  # (b, h, c, l)
    a_cum = torch.cumsum(a, dim=-1)
    seg = a_cum[..., :, None] - a_cum[..., None, :]  # (b, h, c, l, s)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=x.device).tril()
    L = torch.exp(seg.masked_fill(~causal, -torch.inf))
    scores = torch.einsum("bclhn,bcshn->bhcls", C, B) * L
    y_diag = torch.einsum("bhcls,bcshp->bclhp", scores, xdt)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)  # (b, h, c, l)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, xdt)
    init = (initial_states[:, None].to(states) if initial_states is not None else torch.zeros_like(states[:, :1]))
    states = torch.cat([init, states], dim=1)  # (b, c+1, h, p, n)
    ends = F.pad(a_cum[..., -1], (1, 0))  # (b, h, c+1)
    zc = ends.shape[-1]
    causal_c = torch.ones(zc, zc, dtype=torch.bool, device=x.device).tril()
    ends_cum = torch.cumsum(ends, dim=-1)
    decay_chunk = torch.exp((ends_cum[..., :, None] - ends_cum[..., None, :]).masked_fill(~causal_c, -torch.inf))
    new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    states, final_state = new_states[:, :-1], new_states[:, -1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(a_cum))
    y = (y_diag + y_off).reshape(b, -1, h, p)[:, :t]
    if D is not None:
        y = y + D[:, None].float() * x
    return (y, final_state) if return_final_states else y


def use_fast_training_scan():
    """Route NemotronH's Mamba-2 chunked scan to :func:`ssd_chunk_scan`; returns the undo."""
    from transformers.models.nemotron_h import modeling_nemotron_h

    original = modeling_nemotron_h.mamba2_chunk_scan
    modeling_nemotron_h.mamba2_chunk_scan = ssd_chunk_scan

    def restore():
        modeling_nemotron_h.mamba2_chunk_scan = original

    return restore


#: The KDA chunk length used for training (transformers' default is 64).
KDA_TRAINING_CHUNK = 32


def use_fast_kda_training(chunk_size: int = KDA_TRAINING_CHUNK):
    """Run Kimi Linear's chunked KDA with ``chunk_size``-token chunks; returns the undo.

    transformers' pure-PyTorch ``chunk_kimi_delta_attention`` (the fallback
    without flash-linear-attention) forms (chunk x chunk x key channels)
    decay products per chunk and solves each chunk's triangular system row
    by row, so its cost grows with the chunk length: at 32 a training step
    took a seventh of the time at 64 on the CPU (2,048 tokens, the testbed
    geometry), with outputs equal to 1e-6. The checkpoints are evaluated and
    used with transformers' own chunk length.
    """
    from transformers.models.kimi_linear import modeling_kimi_linear

    original = modeling_kimi_linear.chunk_kimi_delta_attention

    def chunked(*args, **kwargs):
        try:
            return original(*args, chunk_size=chunk_size, **kwargs)
        except TypeError:  # a kernel (fla's) that picks its own chunking
            return original(*args, **kwargs)

    modeling_kimi_linear.chunk_kimi_delta_attention = chunked

    def restore():
        modeling_kimi_linear.chunk_kimi_delta_attention = original

    return restore


def build_model(family: str, config):
    import transformers

    return getattr(transformers, FAMILIES[family])(config)


# --------------------------------------------------------------------------
# the SSM layers: decays, decay initialisation, state reset


#: The SSM mixer classes of the families, by class name (no import needed to recognise them).
SSM_MIXERS = ("NemotronHMamba2Mixer", "Qwen3_5GatedDeltaNet", "KimiLinearDeltaAttention")


def ssm_mixers(model) -> list:
    """The model's SSM mixer modules, in layer order."""
    return [m for m in model.modules() if type(m).__name__ in SSM_MIXERS]


def _softplus_inverse(x: torch.Tensor) -> torch.Tensor:
    return x + torch.log(-torch.expm1(-x))


@torch.no_grad()
def init_decays(model, mode: str, slow_fraction: float, memory: tuple[float, float], seed: int) -> dict:
    """Give part of the SSM heads long memory at initialisation; returns what was set.

    Every family's per-token decay is ``exp(-exp(A_log) * softplus(x + dt_bias))``
    for an input-dependent ``x`` (Mamba-2: the dt projection; Gated DeltaNet:
    ``in_proj_a``; KDA: the forget-gate projection, per key channel).
    ``mode='stock'`` keeps transformers' initialisation. ``mode='long'``
    takes every other head (``slow_fraction`` of them, spread over every
    layer) and sets ``A_log`` so that at ``x = 0`` its decay is
    ``exp(-1 / m)`` for a memory of ``m`` tokens drawn log-uniformly from
    ``memory`` (per key channel for KDA); the other heads keep the stock
    initialisation, so fast and slow heads start side by side.
    """
    if mode == "stock":
        return {"mode": "stock"}
    gen = torch.Generator().manual_seed(seed + 7919)
    lo, hi = math.log(memory[0]), math.log(memory[1])

    def memories(*shape):
        return torch.exp(lo + (hi - lo) * torch.rand(*shape, generator=gen))

    slow_heads = []
    for layer, mixer in enumerate(ssm_mixers(model)):
        name = type(mixer).__name__
        heads = (mixer.forget_gate if name == "KimiLinearDeltaAttention" else mixer).A_log.numel()
        stride = max(1, round(1 / slow_fraction)) if slow_fraction > 0 else heads + 1
        slow = list(range(0, heads, stride))[: max(0, round(heads * slow_fraction))]
        if name == "KimiLinearDeltaAttention":
            gate = mixer.forget_gate
            d = gate.head_dim
            for h in slow:
                # A = 1; each key channel's dt_bias sets its own memory length.
                gate.A_log.view(-1)[h] = 0.0
                gate.dt_bias.view(-1, d)[h] = _softplus_inverse(1.0 / memories(d)).to(gate.dt_bias.dtype)
        else:
            dt = torch.nn.functional.softplus(mixer.dt_bias.detach().float())
            for h in slow:
                # Keep the head's dt (its input scale in Mamba-2); A = 1 / (memory * dt).
                a = 1.0 / (memories(1)[0] * dt[h])
                mixer.A_log[h] = torch.log(a).to(mixer.A_log.dtype)
        slow_heads.append({"layer_module": layer, "mixer": name, "heads": heads, "slow": slow})
    return {
        "mode": "long",
        "slow_fraction": slow_fraction,
        "memory_tokens": list(memory),
        "seed": seed + 7919,
        "layers": slow_heads,
    }


def _log_decay_hooks(model, sink: list):
    """Forward hooks that append each SSM mixer's per-token log decay to ``sink[layer]``; returns the handles.

    Mamba-2 and GDN give (batch, time, heads), KDA (batch, time, heads, key channels).
    """
    handles = []
    for layer, mixer in enumerate(ssm_mixers(model)):
        name = type(mixer).__name__
        sink.append([])

        if name == "NemotronHMamba2Mixer":

            def hook(module, args, out, layer=layer, mixer=mixer):
                raw = out[..., -mixer.num_heads :].float()
                dt = torch.nn.functional.softplus(raw + mixer.dt_bias.float())
                dt = dt.clamp(min=mixer.time_step_limit[0], max=mixer.time_step_limit[1])
                sink[layer].append((-torch.exp(mixer.A_log.float()) * dt).cpu())

            handles.append(mixer.in_proj.register_forward_hook(hook))
        elif name == "Qwen3_5GatedDeltaNet":

            def hook(module, args, out, layer=layer, mixer=mixer):
                g = -mixer.A_log.float().exp() * torch.nn.functional.softplus(out.float() + mixer.dt_bias.float())
                sink[layer].append(g.cpu())

            handles.append(mixer.in_proj_a.register_forward_hook(hook))
        else:

            def hook(module, args, out, layer=layer):
                sink[layer].append(out.float().cpu())

            handles.append(mixer.forget_gate.register_forward_hook(hook))
    return handles


@torch.no_grad()
def decay_spectrum(model, ids: torch.Tensor, seq_len: int, batch: int, windows: int, device) -> dict:
    """Per layer and head: the per-token decay and memory length on held-out windows of ``ids``.

    A head's decay is the geometric mean over tokens of its per-token decay
    (``exp`` of the mean log decay); its memory is ``-1 / mean log decay``,
    the number of tokens after which a write has faded to 1/e. For KDA, whose
    decay is per key channel, the head's figures are those of its median
    channel, and ``slow_channels`` counts channels above 0.95.
    """
    model.eval()
    sink: list = []
    handles = _log_decay_hooks(model, sink)
    try:
        starts = [r * seq_len for r in range(min(windows, (ids.numel() - 1) // seq_len))]
        for s in range(0, len(starts), batch):
            x = torch.stack([ids[a : a + seq_len] for a in starts[s : s + batch]]).to(device)
            model(input_ids=x, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    layers = []
    kinds = [type(m).__name__ for m in ssm_mixers(model)]
    for layer, (kind, parts) in enumerate(zip(kinds, sink)):
        g = torch.cat([p.flatten(0, 1) for p in parts])  # (tokens, heads[, channels])
        heads = []
        for h in range(g.shape[1]):
            gh = g[:, h].double()
            if gh.ndim == 2:  # KDA: per channel
                channel = gh.mean(0)
                mean = channel.median().item()
                extra = {
                    "slow_channels": int((channel.exp() > 0.95).sum()),
                    "channels": channel.numel(),
                    "channel_decay_min": channel.min().exp().item(),
                    "channel_decay_max": channel.max().exp().item(),
                }
                per_token = gh.median(1).values
            else:
                mean, extra, per_token = gh.mean().item(), {}, gh
            q = torch.quantile(per_token.exp(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
            heads.append({
                "head": h,
                "decay": math.exp(mean),
                "memory_tokens": -1.0 / mean if mean < 0 else math.inf,
                "decay_p10": q[0],
                "decay_median": q[1],
                "decay_p90": q[2],
                **extra,
            })
        layers.append({"ssm_layer": layer, "mixer": kind, "heads": heads})
    decays = [h["decay"] for layer in layers for h in layer["heads"]]
    slow = sum(d > 0.95 for d in decays)
    model.train()
    return {
        "tokens_per_head": int(sum(p.shape[0] * p.shape[1] for p in sink[0])) if sink else 0,
        "heads": len(decays),
        "heads_above_0.95": slow,
        "fraction_above_0.95": slow / max(1, len(decays)),
        "layers": layers,
    }


@contextlib.contextmanager
def ssm_state_reset(model, every: int):
    """Inside the block, every SSM layer starts from an empty state every ``every`` tokens.

    Each SSM mixer's forward runs on consecutive ``every``-token slices of
    its input, each with no cache: the recurrent state and the short
    convolution's window start empty at every slice boundary, exactly as if
    the layer's whole cache were cleared there. The attention layers and the
    MLPs still see the full sequence, so only the SSM layers' memory is cut.
    For full-sequence forwards without a cache (training-style calls).
    """
    patched = []
    for mixer in ssm_mixers(model):
        forward = mixer.forward

        def sliced(hidden_states, *args, _forward=forward, **kwargs):
            if kwargs.get("cache_params") is not None or args:
                raise RuntimeError("ssm_state_reset works on forwards without a cache")
            mask = kwargs.pop("attention_mask", None)
            t = hidden_states.shape[1]
            outs = []
            for s in range(0, t, every):
                m = mask[:, s : s + every] if isinstance(mask, torch.Tensor) and mask.ndim == 2 else mask
                outs.append(_forward(hidden_states[:, s : s + every], attention_mask=m, **kwargs))
            return torch.cat(outs, dim=1)

        mixer.forward = sliced
        patched.append(mixer)
    try:
        yield model
    finally:
        for mixer in patched:
            del mixer.forward  # back to the class's forward


# --------------------------------------------------------------------------
# training


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


@torch.no_grad()
def evaluate(model, ids: torch.Tensor, seq_len: int, batch: int, device, amp: bool, max_seqs: int | None = None):
    """Next-token loss over ``ids`` cut into non-overlapping windows, each scored from an empty state.

    Returns (summed nats, tokens scored). With ``max_seqs`` only the first
    windows are scored (a quick estimate during training); without, every
    token but the first is scored once, the last window being shorter.
    """
    model.eval()
    n_full = (ids.numel() - 1) // seq_len
    windows = [(r * seq_len, seq_len) for r in range(n_full)]
    tail = ids.numel() - 1 - n_full * seq_len
    if max_seqs:
        windows = windows[:max_seqs]
    total, count = 0.0, 0
    groups = [windows[s : s + batch] for s in range(0, len(windows), batch)]
    if tail and not max_seqs:
        groups.append([(n_full * seq_len, tail)])
    for group in groups:
        x = torch.stack([ids[a : a + n] for a, n in group]).to(device)
        y = torch.stack([ids[a + 1 : a + n + 1] for a, n in group]).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        total += loss.item()
        count += y.numel()
    model.train()
    return total, count


def generate_sample(model, tokenizer, prompt: str, n: int, device) -> str:
    model.eval()
    enc = tokenizer(prompt, return_tensors="pt").to(device)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    model.train()
    return tokenizer.decode(out[0], skip_special_tokens=False)


def save_tokenizer(data_dir: Path, out: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(data_dir / "tokenizer.json")),
        bos_token=EOS,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=4096,
    )
    tok.save_pretrained(out)


def _recall_tasks():
    """The sibling module ``recall_tasks`` (this file runs as a script or is loaded by path)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import recall_tasks

    return recall_tasks


def recall_accuracy(model, vocab, heldout, contexts, count: int, seed: int, device, batch: int, reset: int | None = None) -> dict:
    """Exact-match accuracy of the probe tasks at each context, with the full state or reset every ``reset`` tokens."""
    rt = _recall_tasks()
    model.eval()
    out = {}
    for context in contexts:
        row, right, tokens = {}, 0, 0
        for task in rt.PROBE_TASKS:
            probes = rt.probe_set(vocab, heldout, task, context, count, seed)
            with ssm_state_reset(model, reset) if reset else contextlib.nullcontext():
                scores = rt.answer_scores(model, probes, device, batch=batch)
            row[task] = sum(exact for exact, _ in scores) / len(scores)
            right += sum(n for _, n in scores)
            tokens += sum(len(p.answer) for p in probes)
        row["mean"] = sum(row[t] for t in rt.PROBE_TASKS) / len(rt.PROBE_TASKS)
        row["answer_tokens"] = right / tokens
        out[str(context)] = row
    model.train()
    return out


def heldout_bits_per_byte(model, data, manifest, seq_len: int, batch: int, windows: int, device, reset: int | None = None) -> dict:
    """Held-out loss on the first ``windows`` windows (0: all), with the full state or reset every ``reset`` tokens."""
    with ssm_state_reset(model, reset) if reset else contextlib.nullcontext():
        nats, tokens = evaluate(model, data["heldout"], seq_len, batch, device, amp=False, max_seqs=windows or None)
    held = manifest["streams"]["heldout"]
    held_bytes = held["bytes"] * tokens / held["tokens"] if windows else held["bytes"]
    return {"tokens_scored": tokens, "loss_nats_per_token": nats / tokens, "bits_per_byte": nats / math.log(2) / held_bytes}


def measure(model, data, manifest, vocab, args, device) -> dict:
    """Decay spectrum, the state-reset ablation and recall of a model (what issue 50's cards report)."""
    t0 = time.time()
    contexts = [int(c) for c in args.recall_contexts]
    spectrum = decay_spectrum(model, data["heldout"], args.seq_len, args.batch, args.spectrum_windows, device)
    full = heldout_bits_per_byte(model, data, manifest, args.seq_len, args.batch, args.ablate_windows, device)
    reset = heldout_bits_per_byte(model, data, manifest, args.seq_len, args.batch, args.ablate_windows, device,
                                  reset=args.reset_every)
    heldout = data["heldout"].numpy()
    kw = {"count": args.recall_count, "seed": args.seed, "device": device, "batch": args.recall_batch}
    recall_full = recall_accuracy(model, vocab, heldout, contexts, **kw)
    recall_reset = recall_accuracy(model, vocab, heldout, contexts, reset=args.reset_every, **kw)
    rt = _recall_tasks()
    return {
        "seconds": time.time() - t0,
        "spectrum": spectrum,
        "ablation": {
            "reset_every": args.reset_every,
            "how": "each SSM mixer runs on consecutive reset_every-token slices without a cache (recurrent "
                   "state and conv window empty at each slice start); attention and MLPs see the full window",
            "windows": args.ablate_windows,
            "seq_len": args.seq_len,
            "full": full,
            "reset": reset,
            "gap_bits_per_byte": reset["bits_per_byte"] - full["bits_per_byte"],
        },
        "recall": {
            "tasks": list(rt.PROBE_TASKS),
            "count_per_task": args.recall_count,
            "seed": args.seed,
            "format_version": rt.FORMAT_VERSION,
            "haystack": "held-out split (heldout.bin), contiguous slices",
            "scoring": "exact match of the answer span, teacher-forced first choices (= greedy decoding)",
            "full": recall_full,
            "reset": recall_reset,
        },
    }


def load_trained(path: Path, device):
    """A saved checkpoint in fp32, eval mode, offline."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return model.to(device).eval()


def probe_checkpoint(args: argparse.Namespace) -> None:
    """The ``spectrum`` and ``ablate`` subcommands: measure a saved checkpoint."""
    rt = _recall_tasks()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    manifest, data = load_data(Path(args.data))
    model = load_trained(Path(args.checkpoint), device)
    t0 = time.time()
    if args.cmd == "spectrum":
        result = decay_spectrum(model, data["heldout"], args.seq_len, args.batch, args.spectrum_windows, device)
        for layer in result["layers"]:
            print(f"SSM layer {layer['ssm_layer']} ({layer['mixer']}): "
                  + " ".join(f"{h['decay']:.3f}/{h['memory_tokens']:.0f}" for h in layer["heads"]))
        print(f"{result['heads_above_0.95']} of {result['heads']} heads decay slower than 0.95 per token")
    else:
        vocab = rt.TaskVocab.from_file(Path(args.data) / "tokenizer.json")
        result = measure(model, data, manifest, vocab, args, device)
        ab = result["ablation"]
        print(f"held-out bits/byte: full {ab['full']['bits_per_byte']:.4f}, reset every {ab['reset_every']}: "
              f"{ab['reset']['bits_per_byte']:.4f} (gap {ab['gap_bits_per_byte']:+.4f})")
        for kind in ("full", "reset"):
            print(f"recall ({kind}): " + ", ".join(f"{c}: {r['mean']:.1%} ({r['answer_tokens']:.1%} of answer tokens)"
                                                  for c, r in result["recall"][kind].items()))
    result = {
        "checkpoint": str(args.checkpoint),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "wall_seconds": time.time() - t0,
        args.cmd: result,
    }
    out = Path(args.out) if args.out else Path(args.checkpoint) / f"{args.cmd}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


def train(args: argparse.Namespace) -> None:
    import transformers

    rt = _recall_tasks()
    if args.answer_weight <= 0 or (args.answer_weight != 1.0 and not args.task_mix):
        raise SystemExit(f"--answer-weight must be positive and needs --task-mix; got {args.answer_weight:g}")
    t_wall = time.time()
    data_dir = Path(args.data)
    manifest, data = load_data(data_dir)
    vocab = manifest["vocab_size"]
    from tokenizers import Tokenizer

    eos_id = Tokenizer.from_file(str(data_dir / "tokenizer.json")).token_to_id(EOS)
    task_vocab = rt.TaskVocab.from_file(data_dir / "tokenizer.json") if args.task_mix or args.measure else None

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda" and not args.no_amp
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)

    restore_scan = None
    if not args.reference_scan:
        restore_scan = {"nemotron_h": use_fast_training_scan,
                        "kimi_linear": use_fast_kda_training}.get(args.family, lambda: None)()
    config = build_config(args.family, vocab, eos_id, args.size, args.attention)
    model = build_model(args.family, config)
    decay_init = init_decays(model, args.decay_init, args.slow_fraction, tuple(args.slow_memory), args.seed)
    model = model.to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.family}: {n_params / 1e6:.2f}M parameters, transformers {transformers.__version__}, "
          f"torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""), flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda",
    )

    train_ids = data["train"]
    train_np = train_ids.numpy()
    heldout_np = data["heldout"].numpy()
    gen = torch.Generator().manual_seed(args.seed)
    max_start = train_ids.numel() - args.seq_len - 1
    offsets = torch.arange(args.seq_len + 1)

    total = args.steps
    budget = args.time_budget
    if total is None and budget is None:
        raise SystemExit("give --steps or --time-budget")
    if total is None and args.warmup <= 25:
        raise SystemExit("--time-budget fixes the step count at step 25: it needs --warmup > 25")
    planned = total if total is not None else 10**9
    curve = []
    t_start = time.time()
    t_measure = None
    step = 0
    synthetic_rows = 0
    answers = torch.zeros(args.batch, args.seq_len + 1, dtype=torch.bool) if args.answer_weight != 1.0 else None
    while step < planned:
        starts = torch.randint(0, max_start, (args.batch,), generator=gen)
        chunk = train_ids[starts[:, None] + offsets]
        if args.task_mix:
            # Seeded per (step, row): a run with the same seed sees the same documents.
            synthetic_rows += len(rt.mix_batch(task_vocab, train_np, chunk, args.task_mix, args.seed, step, answers))
        chunk = chunk.to(device, non_blocking=True)
        x, y = chunk[:, :-1], chunk[:, 1:]
        lr = lr_at(step, planned if total is not None else max(planned, args.warmup), args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits
        token_loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")
        loss = token_loss.mean()  # what the log shows, whatever the weights
        if answers is not None:
            # Answer tokens weigh answer_weight, every other token 1, over the same count of tokens.
            weights = 1.0 + (args.answer_weight - 1.0) * answers[:, 1:].flatten().to(device, torch.float32)
            objective = (token_loss * weights).mean()
        else:
            objective = loss
        opt.zero_grad(set_to_none=True)
        objective.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1

        if budget is not None and total is None:
            # Fix the step count from the measured speed while still in warmup,
            # where the schedule does not depend on it; the count is recorded.
            if step == 5:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t_measure = time.time()
            elif step == 25:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                per_step = (time.time() - t_measure) / 20
                remaining = budget - (time.time() - t_start)
                planned = max(step + 1, step + int(remaining / per_step))
                total = planned
                print(f"measured {per_step * 1e3:.1f} ms/step: training {planned} steps", flush=True)
                if planned <= args.warmup:
                    raise SystemExit("time budget too small for the warmup")

        if step % args.log_every == 0 or step == planned:
            loss_v = loss.item()
            entry = {"step": step, "loss": loss_v, "lr": lr, "grad_norm": float(gnorm),
                     "tokens": step * args.batch * args.seq_len, "elapsed_s": time.time() - t_start}
            if step % args.eval_every == 0 or step == planned:
                nats, n = evaluate(model, data["heldout"], args.seq_len, args.batch, device, amp,
                                   max_seqs=args.eval_seqs)
                entry["heldout_loss"] = nats / n
                if args.task_mix and args.eval_recall:
                    # A quick look at the skill being trained: needle probes at the training length.
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                        r = recall_accuracy(model, task_vocab, heldout_np, [min(args.seq_len, 1024)], args.eval_recall,
                                            args.seed + 1, device, args.recall_batch)
                    row = next(iter(r.values()))
                    entry["recall"], entry["answer_tokens"] = row["mean"], row["answer_tokens"]
            curve.append(entry)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()),
                  flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    train_s = time.time() - t_start
    tokens_seen = step * args.batch * args.seq_len

    if restore_scan is not None:  # evaluate and sample with transformers' own code
        restore_scan()
    # Round to the stored dtype first, so the reported numbers are those of the checkpoint.
    save_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.save_dtype]
    model.to(save_dtype).to(torch.float32)
    held_nats, held_tokens = evaluate(model, data["heldout"], args.seq_len, args.batch, device, amp=False,
                                      max_seqs=args.final_eval_seqs or None)
    held_loss = held_nats / held_tokens
    held_bytes = manifest["streams"]["heldout"]["bytes"]
    if args.final_eval_seqs:  # a partial score: scale the bytes by the tokens scored
        held_bytes = held_bytes * held_tokens / manifest["streams"]["heldout"]["tokens"]
    bpb = held_nats / math.log(2) / held_bytes
    base = unigram_bits_per_byte(train_ids, data["heldout"][1:], vocab, manifest["streams"]["heldout"]["bytes"])
    byte_bpb = manifest["byte_unigram_bits_per_byte"]
    measured = measure(model, data, manifest, task_vocab, args, device) if args.measure else None

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(save_dtype)
    model.config.dtype = save_dtype
    model.save_pretrained(out)
    save_tokenizer(data_dir, out)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    model.to(torch.float32)
    samples = {p: generate_sample(model, tokenizer, p, args.sample_tokens, device) for p in SAMPLE_PROMPTS}

    reproduce = (f"--steps {step} --seed {args.seed} --batch {args.batch} --seq-len {args.seq_len} --lr {args.lr}"
                 f" --size {args.size} --attention {args.attention}")
    if args.task_mix:
        reproduce += f" --task-mix {args.task_mix}"
    if args.answer_weight != 1.0:
        reproduce += f" --answer-weight {args.answer_weight:g}"
    if args.decay_init != "stock":
        reproduce += (f" --decay-init {args.decay_init} --slow-fraction {args.slow_fraction}"
                      f" --slow-memory {args.slow_memory[0]:g} {args.slow_memory[1]:g}")
    record = {
        "family": args.family,
        "model_class": type(model).__name__,
        "parameters": n_params,
        "config": {k: v for k, v in model.config.to_diff_dict().items() if k != "transformers_version"},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "reproduce": reproduce,
        "seed": args.seed,
        "seeds": {
            "training": args.seed,
            "data_split": manifest["split_seed"],
            "synthetic_documents": f"random.Random(f'{args.seed}:mix:{{step}}:{{row}}')",
            "decay_init": decay_init.get("seed"),
        },
        "size": args.size,
        "attention": args.attention,
        "decay_init": decay_init,
        "steps": step,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "tokens_seen": tokens_seen,
        "train_epochs": tokens_seen / train_ids.numel(),
        "train_seconds": train_s,
        "wall_seconds": None,  # set below, once everything has run
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "autocast_bf16": amp,
        "training_scan": "transformers" if restore_scan is None else {
            "nemotron_h": "train_small.ssd_chunk_scan",
            "kimi_linear": f"transformers' chunk_kimi_delta_attention with chunk_size={KDA_TRAINING_CHUNK}",
        }[args.family],
        "saved_dtype": args.save_dtype,
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "data": {k: manifest[k] for k in ("python", "split_seed", "heldout_fraction", "vocab_size",
                                          "tokenizer_sha256", "streams")},
        "data_recipe": {
            "text": "train split of the stdlib corpus, uniformly random windows of seq_len + 1 tokens",
            "synthetic_fraction": args.task_mix,
            "synthetic_rows": synthetic_rows,
            "synthetic_kinds": list(rt.TRAINING_KINDS) if args.task_mix else [],
            "synthetic_formats": f"benchmarks/recall_tasks.py, format version {rt.FORMAT_VERSION}",
            "synthetic_filler": "train split",
            "answer_weight": args.answer_weight,
        },
        "heldout": {
            "tokens_scored": held_tokens,
            "loss_nats_per_token": held_loss,
            "perplexity": math.exp(held_loss),
            "bits_per_byte": bpb,
            **base,
            "byte_unigram_bits_per_byte": byte_bpb,
        },
        "samples": samples,
        "curve": curve,
    }
    if measured is not None:
        record["measured"] = measured
    record["wall_seconds"] = time.time() - t_wall
    (out / "train_small.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.size == "testbed" and not (out / "README.md").exists():
        (out / "README.md").write_text(card(record))
    print(f"saved {out}: held-out loss {held_loss:.4f} nats/token, {bpb:.3f} bits/byte "
          f"(token unigram {base['token_unigram_bits_per_byte']:.3f}"
          f", byte unigram {byte_bpb:.3f}), {tokens_seen / 1e6:.1f}M tokens "
          f"in {train_s:.0f}s", flush=True)
    if measured is not None:
        ab, sp, rc = measured["ablation"], measured["spectrum"], measured["recall"]
        print(f"state reset every {ab['reset_every']}: {ab['reset']['bits_per_byte']:.4f} bits/byte "
              f"(gap {ab['gap_bits_per_byte']:+.4f}); {sp['heads_above_0.95']} of {sp['heads']} heads above 0.95")
        for kind in ("full", "reset"):
            print(f"recall ({kind}): " + ", ".join(f"{c}: {r['mean']:.1%} ({r['answer_tokens']:.1%} of answer tokens)"
                                              for c, r in rc[kind].items()))
    for p, s in samples.items():
        print(f"--- sample ({p!r}) ---\n{s}\n---")


def card(record: dict) -> str:
    """A first model card from a run's record (facts only; the prose is written by hand)."""
    h = record["heldout"]
    lines = [
        f"# {record['family']} testbed checkpoint",
        "",
        f"* **Class**: `{record['model_class']}`, {record['parameters']:,} parameters, saved in {record['saved_dtype']}.",
        f"* **Command**: `{record['command']}`",
        f"* **Reproduce**: `{record['reproduce']}`",
        f"* **Seeds**: {json.dumps(record['seeds'])}",
        f"* **Data**: {json.dumps(record['data_recipe'])}",
        f"* **Decay initialisation**: {record['decay_init']['mode']}",
        (f"* **Training**: {record['steps']} steps x {record['batch']} x {record['seq_len']} tokens "
         f"({record['tokens_seen'] / 1e6:.1f}M), {record['train_seconds']:.0f} s on {record['device']} "
         f"(wall {record['wall_seconds']:.0f} s), torch {record['versions']['torch']}, "
         f"transformers {record['versions']['transformers']}"),
        f"* **Held-out**: {h['bits_per_byte']:.4f} bits/byte (token unigram {h['token_unigram_bits_per_byte']:.4f})",
    ]
    m = record.get("measured")
    if m:
        ab, sp = m["ablation"], m["spectrum"]
        lines += [
            (f"* **State reset every {ab['reset_every']} tokens**: {ab['reset']['bits_per_byte']:.4f} "
             f"bits/byte (gap {ab['gap_bits_per_byte']:+.4f})"),
            f"* **Slow heads**: {sp['heads_above_0.95']} of {sp['heads']} with per-token decay above 0.95",
            "",
            "| context | recall (full state) | recall (reset) | answer tokens right (full / reset) |",
            "|---|---|---|---|",
        ]
        for c, r in m["recall"]["full"].items():
            reset = m["recall"]["reset"][c]
            lines.append(f"| {c} | {r['mean']:.1%} | {reset['mean']:.1%} | {r['answer_tokens']:.1%} / {reset['answer_tokens']:.1%} |")
        lines += ["", "| SSM layer | head | decay | memory (tokens) |", "|---|---|---|---|"]
        for layer in sp["layers"]:
            for hd in layer["heads"]:
                lines.append(f"| {layer['ssm_layer']} | {hd['head']} | {hd['decay']:.4f} | {hd['memory_tokens']:.0f} |")
    lines += ["", "Loss curve: `curve` in `train_small.json`.", ""]
    return "\n".join(lines)


SAMPLE_PROMPTS = ("def ", "class ", "import os\n\n")


def _measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spectrum-windows", type=int, default=16, help="held-out windows the decay spectrum reads")
    p.add_argument("--ablate-windows", type=int, default=64, help="held-out windows of the reset ablation (0: all)")
    p.add_argument("--reset-every", type=int, default=64, help="tokens between SSM state resets in the ablation")
    p.add_argument("--recall-contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--recall-count", type=int, default=32, help="probes per task and context")
    p.add_argument("--recall-batch", type=int, default=8)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prepare", help="split the stdlib, train the tokenizer, tokenize")
    p.add_argument("--out", required=True)
    p.add_argument("--stdlib", default=None, help="stdlib directory (default: this interpreter's)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-files", type=int, default=0, help="first N files only (smoke tests)")
    p.set_defaults(fn=prepare)

    t = sub.add_parser("train", help="train one model on prepared data")
    t.add_argument("--family", choices=tuple(FAMILIES), required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--size", choices=SIZES, default="small")
    t.add_argument("--attention", choices=("middle", "first"), default="middle",
                   help="where the one attention layer goes (first: recall must use the SSM state)")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--time-budget", type=float, default=None, help="seconds; fixes --steps from the step time")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq-len", type=int, default=512, help="training context (issue 50's checkpoints: 2048)")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--task-mix", type=float, default=0.0,
                   help="fraction of training sequences replaced by synthetic recall documents (recall_tasks.py)")
    t.add_argument("--answer-weight", type=float, default=1.0,
                   help="with --task-mix: loss weight of the synthetic documents' answer tokens (others: 1)")
    t.add_argument("--decay-init", choices=("stock", "long"), default="stock",
                   help="long: part of the SSM heads start with long memory (see init_decays)")
    t.add_argument("--slow-fraction", type=float, default=0.5, help="with --decay-init long: share of slow heads")
    t.add_argument("--slow-memory", type=float, nargs=2, default=[64.0, 2048.0],
                   help="with --decay-init long: range of the slow heads' memory at init, tokens")
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--eval-seqs", type=int, default=64)
    t.add_argument("--eval-recall", type=int, default=8,
                   help="with --task-mix: probes per task scored at each evaluation (0: none)")
    t.add_argument("--final-eval-seqs", type=int, default=0, help="0: the whole held-out split (smoke tests: fewer)")
    t.add_argument("--sample-tokens", type=int, default=96)
    t.add_argument("--save-dtype", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--device", default=None)
    t.add_argument("--no-amp", action="store_true")
    t.add_argument("--reference-scan", action="store_true",
                   help="train with transformers' own (slow) scans (Nemotron-H's SSD, KDA's chunk of 64)")
    t.add_argument("--measure", action="store_true",
                   help="after training, measure the decay spectrum, the state-reset ablation and recall")
    _measure_args(t)
    t.set_defaults(fn=train)

    for name, about in (
        ("spectrum", "per-token decay and memory length of every SSM head of a checkpoint"),
        ("ablate", "held-out bits/byte and recall, full state vs SSM state reset every N tokens"),
    ):
        m = sub.add_parser(name, help=about)
        m.add_argument("--checkpoint", required=True)
        m.add_argument("--data", required=True, help="the prepare directory (held-out stream, tokenizer)")
        m.add_argument("--seq-len", type=int, default=2048)
        m.add_argument("--batch", type=int, default=8)
        m.add_argument("--seed", type=int, default=0)
        m.add_argument("--device", default=None)
        m.add_argument("--out", default=None, help=f"default: <checkpoint>/{name}.json")
        _measure_args(m)
        m.set_defaults(fn=probe_checkpoint)

    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
