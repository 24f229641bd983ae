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


def build_config(family: str, vocab: int, eos_id: int, size: str):
    """The model geometry. ``size='tiny'`` is for CPU smoke tests only."""
    tiny = size == "tiny"
    if family == "nemotron_h":
        from transformers import NemotronHConfig

        # Nemotron-H's layout: Mamba-2 and MLP blocks alternating, one attention block.
        pattern = "M-M*-M-" if tiny else "M-M-M*-M-M-"
        return NemotronHConfig(
            vocab_size=vocab,
            hidden_size=64 if tiny else 256,
            layers_block_type=[{"M": "linear_attention", "-": "mlp", "*": "full_attention"}[c] for c in pattern],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            intermediate_size=128 if tiny else 1024,
            mlp_hidden_act="relu2",
            mamba_num_heads=4 if tiny else 8,  # intermediate 512 = 8 heads x 64
            mamba_head_dim=64,
            ssm_state_size=128,
            n_groups=2 if tiny else 4,  # 2 heads per group: B and C shared within a group
            conv_kernel=4,
            chunk_size=128,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            use_cache=True,
            pad_token_id=eos_id,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
        )
    if family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        # Qwen3.5's layout is three GDN layers per full-attention layer.
        layer_types = ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * (1 if tiny else 3)
        return Qwen3_5TextConfig(
            vocab_size=vocab,
            hidden_size=64 if tiny else 256,
            intermediate_size=128 if tiny else 768,
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
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            use_cache=True,
            pad_token_id=eos_id,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
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
    g, n = B.shape[2], B.shape[3]
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


def build_model(family: str, config):
    if family == "nemotron_h":
        from transformers import NemotronHForCausalLM as cls
    else:
        from transformers import Qwen3_5ForCausalLM as cls
    return cls(config)


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


def train(args: argparse.Namespace) -> None:
    import transformers

    data_dir = Path(args.data)
    manifest, data = load_data(data_dir)
    vocab = manifest["vocab_size"]
    from tokenizers import Tokenizer

    eos_id = Tokenizer.from_file(str(data_dir / "tokenizer.json")).token_to_id(EOS)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    amp = device.type == "cuda" and not args.no_amp
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)

    restore_scan = use_fast_training_scan() if args.family == "nemotron_h" and not args.reference_scan else None
    config = build_config(args.family, vocab, eos_id, args.size)
    model = build_model(args.family, config).to(device)
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
    last_print = time.time()
    running = 0.0
    step = 0
    while step < planned:
        starts = torch.randint(0, max_start, (args.batch,), generator=gen)
        chunk = train_ids[starts[:, None] + offsets].to(device, non_blocking=True)
        x, y = chunk[:, :-1], chunk[:, 1:]
        lr = lr_at(step, planned if total is not None else max(planned, args.warmup), args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
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

    record = {
        "family": args.family,
        "model_class": type(model).__name__,
        "parameters": n_params,
        "config": {k: v for k, v in model.config.to_diff_dict().items() if k != "transformers_version"},
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "reproduce": f"--steps {step} --seed {args.seed} --batch {args.batch} --seq-len {args.seq_len} --lr {args.lr}",
        "seed": args.seed,
        "steps": step,
        "batch": args.batch,
        "seq_len": args.seq_len,
        "tokens_seen": tokens_seen,
        "train_epochs": tokens_seen / train_ids.numel(),
        "train_seconds": train_s,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "autocast_bf16": amp,
        "training_scan": "transformers" if restore_scan is None else "train_small.ssd_chunk_scan",
        "saved_dtype": args.save_dtype,
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "data": {k: manifest[k] for k in ("python", "split_seed", "heldout_fraction", "vocab_size",
                                          "tokenizer_sha256", "streams")},
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
    (out / "train_small.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"saved {out}: held-out loss {held_loss:.4f} nats/token, {bpb:.3f} bits/byte "
          f"(token unigram {base['token_unigram_bits_per_byte']:.3f}"
          f", byte unigram {byte_bpb:.3f}), {tokens_seen / 1e6:.1f}M tokens "
          f"in {train_s:.0f}s", flush=True)
    for p, s in samples.items():
        print(f"--- sample ({p!r}) ---\n{s}\n---")


SAMPLE_PROMPTS = ("def ", "class ", "import os\n\n")


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
    t.add_argument("--family", choices=("nemotron_h", "qwen3_5"), required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--size", choices=("small", "tiny"), default="small")
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--time-budget", type=float, default=None, help="seconds; fixes --steps from the step time")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--seq-len", type=int, default=512)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--weight-decay", type=float, default=0.1)
    t.add_argument("--clip", type=float, default=1.0)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--log-every", type=int, default=50)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--eval-seqs", type=int, default=64)
    t.add_argument("--final-eval-seqs", type=int, default=0, help="0: the whole held-out split (smoke tests: fewer)")
    t.add_argument("--sample-tokens", type=int, default=96)
    t.add_argument("--save-dtype", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--device", default=None)
    t.add_argument("--no-amp", action="store_true")
    t.add_argument("--reference-scan", action="store_true",
                   help="train Nemotron-H with transformers' own (slow) PyTorch scan")
    t.set_defaults(fn=train)

    args = ap.parse_args(argv)
    args.fn(args)


if __name__ == "__main__":
    main()
