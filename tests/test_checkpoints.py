"""The shipped checkpoints load offline, are trained, and decode through replay exactly.

Each checkpoint runs teacher-forced over a held-out excerpt (the quality
harness's data): prefill of a prompt, then one token per forward with the
cache, unpatched and patched with a fp32 replay state. The window is short so
that every row folds its ring into the checkpoint several times. The quality
harness itself must give the same report twice for a fixed seed.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

pytestmark = pytest.mark.hf

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = {"nemotron_h_small": "NemotronHForCausalLM", "qwen3_5_small": "Qwen3_5ForCausalLM"}
PROMPT, STEPS, WINDOW = 24, 40, 8
#: Bound on KL(unpatched || replay fp32). Measured: about 4e-12 on both models.
#: Issue 6 asks for < 1e-6, but a bf16 checkpoint already gives 8e-7 here (and
#: fp16 2e-8), so 1e-6 would not notice a state silently kept in low precision.
MAX_KL = 1e-9


def _quality():
    spec = importlib.util.spec_from_file_location("bench_quality", ROOT / "benchmarks" / "quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


quality = _quality()


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request):
    # A local directory with local_files_only=True: no hub lookup at all.
    model, tokenizer = quality.load_checkpoint(ROOT / "checkpoints" / request.param, torch.device("cpu"))
    return request.param, model, tokenizer


def test_loads_offline_and_is_trained(checkpoint):
    name, model, tokenizer = checkpoint
    assert type(model).__name__ == CHECKPOINTS[name]
    text = "def f(x):\n    return x + 1\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    ids, _ = quality.heldout_batch(tokenizer, 0, 256, 2)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    nll = quality.nll(logits[:, :-1], ids[:, 1:]).mean().item()
    # The token unigram scores 6.7 nats/token on the held-out split; the
    # trained models about 2.5 (see the model cards).
    assert nll < 4.0, f"{name}: held-out loss {nll:.2f} nats/token"


def test_replay_fp32_matches_unpatched(checkpoint):
    name, model, tokenizer = checkpoint
    ids, _ = quality.heldout_batch(tokenizer, PROMPT, STEPS, 2)
    prompt, forced = ids[:, :PROMPT], ids[:, PROMPT:]
    runs = {}
    for config in ("reference", "replay-fp32"):
        with quality.configured(model, quality.CONFIGS[config], WINDOW):
            assert hasattr(model, "_replayssm") == (config != "reference")
            runs[config], _ = quality.decode(model, prompt, STEPS, forced=forced)
    kl, agree = quality.compare(runs["reference"], runs["replay-fp32"])
    assert kl.max().item() < MAX_KL, f"{name}: max KL {kl.max().item():.3g}"
    assert agree.all(), f"{name}: top-1 differs at {(~agree).nonzero().tolist()}"


def test_quality_harness_is_deterministic(tmp_path):
    args = ["--checkpoint", str(ROOT / "checkpoints" / "qwen3_5_small"), "--device", "cpu", "-n", "12",
            "--prompts", "2", "--prompt-len", "16", "--window", "4", "--configs", "replay-bf16"]
    reports = []
    for run in ("a", "b"):
        quality.main([*args, "--out", str(tmp_path / run)])
        report = json.loads((tmp_path / run / "quality.json").read_text())
        for r in report["configs"].values():
            del r["seconds"]
        del report["meta"]["date"]
        reports.append(report)
    assert reports[0] == reports[1]
    configs = reports[0]["configs"]
    assert list(configs) == ["reference", "replay-bf16"]
    assert configs["reference"]["kl_max"] == 0.0 and configs["reference"]["top1_agreement"] == 1.0
    assert 0.0 < configs["replay-bf16"]["kl_max"] < 1e-3
    assert len(configs["replay-bf16"]["kl_by_position"]) == 12


def test_read_copy_config_reads_a_bf16_copy(checkpoint):
    """``quality.py``'s ``replay-read-bf16``: the fp32 checkpoint with a bf16 read copy. Its outputs carry
    bf16 rounding (KL far above fp32 replay's, so the copy is used) yet stay close to the unpatched model."""
    name, model, tokenizer = checkpoint
    ids, _ = quality.heldout_batch(tokenizer, PROMPT, STEPS, 2)
    prompt, forced = ids[:, :PROMPT], ids[:, PROMPT:]
    runs = {}
    for config in ("reference", "replay-fp32", "replay-read-bf16"):
        with quality.configured(model, quality.CONFIGS[config], WINDOW):
            runs[config], _ = quality.decode(model, prompt, STEPS, forced=forced)
    kl_fp32, _ = quality.compare(runs["reference"], runs["replay-fp32"])
    kl_read, agree = quality.compare(runs["reference"], runs["replay-read-bf16"])
    assert kl_read.max().item() > 100 * max(kl_fp32.max().item(), 1e-14), f"{name}: the read copy left no trace"
    assert kl_read.max().item() < 1e-3, f"{name}: max KL {kl_read.max().item():.3g} with a bf16 read copy"
    assert agree.float().mean().item() >= 0.95, f"{name}: top-1 agreement {agree.float().mean().item():.3f}"
