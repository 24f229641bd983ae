"""Issue 50's groundwork: the recall task generators, and the testbed models' measurements on the CPU.

The generators (benchmarks/recall_tasks.py) must be deterministic for a seed,
put the answer exactly where they say, and follow their documented formats.
The training script's new pieces (benchmarks/train_small.py) are checked on
tiny random models: Kimi Linear builds and runs stock, the decay spectrum
reads the decays the modeling code applies, the long-memory initialisation
gives slow heads, and the state-reset ablation cuts only the SSM layers'
memory. The quality harness's recall path is checked against a full forward.
"""

import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "checkpoints" / "qwen3_5_small" / "tokenizer.json"
FAMILIES = ("nemotron_h", "qwen3_5", "kimi_linear")


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rt = _load("recall_tasks")
ts = _load("train_small")


@pytest.fixture(scope="module")
def vocab():
    return rt.TaskVocab.from_file(TOKENIZER)


@pytest.fixture(scope="module")
def filler(vocab):
    """Held-out text (the quality harness's excerpts), as tokens."""
    import json

    excerpts = json.loads((ROOT / "benchmarks" / "data" / "quality_heldout.json").read_text())["excerpts"]
    return [t for ex in excerpts for t in vocab.encode(ex["text"])]


# --------------------------------------------------------------------------
# the generators


@pytest.mark.parametrize("task", rt.PROBE_TASKS)
def test_probes_are_deterministic(vocab, filler, task):
    a = rt.probe_set(vocab, filler, task, 256, 4, seed=3)
    b = rt.probe_set(vocab, filler, task, 256, 4, seed=3)
    c = rt.probe_set(vocab, filler, task, 256, 4, seed=4)
    assert [p.ids for p in a] == [p.ids for p in b]
    assert [p.ids for p in a] != [p.ids for p in c]
    assert len({tuple(p.ids) for p in a}) == 4  # the probes of one set differ from each other


def test_training_documents_are_deterministic(vocab, filler):
    for kind in rt.TRAINING_KINDS:
        a = rt.training_document(vocab, filler, 300, random.Random("7"), kind)
        b = rt.training_document(vocab, filler, 300, random.Random("7"), kind)
        c = rt.training_document(vocab, filler, 300, random.Random("8"), kind)
        assert a == b and a != c
    rows = [torch.zeros(6, 200, dtype=torch.long) for _ in range(3)]
    replaced = [rt.mix_batch(vocab, filler, r, f, seed=1, step=5) for r, f in zip(rows, (0.5, 0.5, 0.0))]
    assert replaced[0] == replaced[1] and torch.equal(rows[0], rows[1])
    assert replaced[2] == [] and not rows[2].any()
    assert all(rows[0][i].any() for i in replaced[0])


@pytest.mark.parametrize("task", rt.PROBE_TASKS)
@pytest.mark.parametrize("context", [128, 1024])
def test_probe_format_and_answer_span(vocab, filler, task, context):
    for p in rt.probe_set(vocab, filler, task, context, 3, seed=0):
        assert len(p.prompt) == context == p.answer_start
        prompt, answer = vocab.decode(p.prompt), vocab.decode(p.answer)
        key = p.keys[p.asked]
        if task == "multivalue":
            assert prompt.endswith(f"\nassert memo.{key} == [")
            assert answer == " " + ", ".join(map(str, p.values)) + "]"
            lines = [f"\nmemo.{key}.append( {v})\n" for v in p.values]
        else:
            assert prompt.endswith(f"\nassert memo.{key} ==")
            assert answer == f" {p.values[p.asked]}"
            lines = [f"\nmemo.{k} = {v}\n" for k, v in zip(p.keys, p.values)]
        # Every inserted line is in the prompt, in order, and before the query.
        cursor = 0
        for line in lines:
            found = prompt.find(line, cursor)
            assert found >= 0, f"{line!r} missing after {cursor}"
            cursor = found + len(line)
        assert cursor <= len(prompt) - len(f"\nassert memo.{key} ==")
        # The answer is recorded nowhere else in the probe's lines: the asked key appears once as a fact.
        assert prompt.count(f"\nmemo.{key} = ") == (1 if task != "multivalue" else 0)
        assert len(p.keys) == len(p.values) == len(p.depths) and p.depths == sorted(p.depths)


def test_training_documents_answer_what_they_stated(vocab, filler):
    """Every query in a kv / mqar document is followed by the value stated for its key; every copy repeats."""
    for i in range(12):
        kind = rt.TRAINING_KINDS[i % 3]
        doc = rt.training_document(vocab, filler, 512, random.Random(f"doc{i}"), kind)
        assert len(doc) == 512
        text = vocab.decode(doc)
        if kind == "copy":
            spans = dict(re.findall(r"\n# span memo\.(\w+):\n(.*?)\n# end span\n", text, re.DOTALL))
            again = re.findall(r"\n# again memo\.(\w+):\n(.*?)\n# end span\n", text, re.DOTALL)
            assert spans and again and all(spans[k] == s for k, s in again)
            continue
        state: dict = {}
        queries = 0
        for m in re.finditer(r"\nmemo\.(\w+)( = (\d+)|\.append\( (\d+)\))|\nassert memo\.(\w+) == (\[?[\d, ]+\]?)", text):
            if m.group(1):
                if m.group(3):
                    state[m.group(1)] = int(m.group(3))
                else:
                    state.setdefault(m.group(1), []).append(int(m.group(4)))
            else:
                said = m.group(6).strip()
                expected = state[m.group(5)]
                if isinstance(expected, list):
                    assert said == "[ " + ", ".join(map(str, expected)) + "]"
                else:
                    assert said == str(expected)
                queries += 1
        assert queries >= 1, text[:300]


def test_answer_flags_mark_the_answers(vocab, filler):
    """training_document_and_answers: the same document as training_document, and its flagged tokens are
    exactly the answers (values after queries, a repeated span after its line); mix_batch hands them on."""
    for kind in rt.TRAINING_KINDS:
        for i in range(4):
            doc = rt.training_document(vocab, filler, 1024, random.Random(f"flags:{kind}:{i}"), kind)
            same, flags = rt.training_document_and_answers(vocab, filler, 1024, random.Random(f"flags:{kind}:{i}"), kind)
            assert same == doc and len(flags) == 1024 and any(flags)
            text = vocab.decode(doc)
            flagged = [vocab.decode([t for t, f in zip(doc, flags) if f])]
            if kind == "copy":
                # every flagged run is a repeat: it follows an "# again" line and equals the first span
                assert text.count("# again memo.") == sum(1 for a, b in zip([False] + flags, flags) if b and not a)
            else:
                # every value the queries ask for, and nothing else, is flagged
                asked = re.findall(r"assert memo\.\w+ ==(?: \[)?((?: \d{4}[,\]]?)+)", text)
                assert asked and "".join(asked) == flagged[0]
    rows = torch.zeros(6, 513, dtype=torch.long)
    answers = torch.ones(6, 513, dtype=torch.bool)
    replaced = rt.mix_batch(vocab, filler, rows, 0.5, 3, 7, answers)
    assert 0 < len(replaced) < 6
    for r in range(6):
        if r in replaced:
            doc, flags = rt.training_document_and_answers(vocab, filler, 513, _mix_rng(3, 7, r))
            assert rows[r].tolist() == doc and answers[r].tolist() == flags
        else:
            assert not answers[r].any() and not rows[r].any()


def _mix_rng(seed, step, row):
    rng = random.Random(f"{seed}:mix:{step}:{row}")
    rng.random()  # the draw that picked the row
    return rng


def test_hf_tokenizer_gives_the_same_tasks(vocab, filler):
    from transformers import AutoTokenizer

    hf = rt.TaskVocab(AutoTokenizer.from_pretrained(TOKENIZER.parent, local_files_only=True))
    assert hf.words == vocab.words
    for task in rt.PROBE_TASKS:
        assert [p.ids for p in rt.probe_set(hf, filler, task, 200, 2)] == [p.ids for p in rt.probe_set(vocab, filler, task, 200, 2)]


class _Oracle(torch.nn.Module):
    """Logits whose first choice at position t is ``future[t + 1]`` (or a wrong token)."""

    def __init__(self, future: dict, wrong: bool = False):
        super().__init__()
        self.future, self.wrong = future, wrong

    def forward(self, input_ids, use_cache=False):
        logits = torch.zeros(*input_ids.shape, 4096)
        for i, row in enumerate(input_ids.tolist()):
            gold = self.future[tuple(row[:8])]
            for t in range(len(gold) - 1):
                logits[i, t, (gold[t + 1] + (1 if self.wrong and t == len(gold) - 2 else 0)) % 4096] = 1.0
        return type("Out", (), {"logits": logits})()


def test_exact_match_scores_the_answer_span(vocab, filler):
    probes = [p for task in rt.PROBE_TASKS for p in rt.probe_set(vocab, filler, task, 96, 2)]
    future = {tuple(p.ids[:8]): p.ids for p in probes}
    assert all(rt.exact_match(_Oracle(future), probes, "cpu", batch=4))
    # Wrong on the last answer token only: every probe misses, with all its other answer tokens right.
    assert not any(rt.exact_match(_Oracle(future, wrong=True), probes, "cpu", batch=4))
    scores = rt.answer_scores(_Oracle(future, wrong=True), probes, "cpu", batch=4)
    assert [n for _, n in scores] == [len(p.answer) - 1 for p in probes]


# --------------------------------------------------------------------------
# the models


def _tiny(family, attention="first", decay_init="stock"):
    torch.manual_seed(0)
    model = ts.build_model(family, ts.build_config(family, 4096, 0, "tiny", attention))
    ts.init_decays(model, decay_init, 0.5, (64.0, 2048.0), seed=0)
    return model.eval()


def test_kimi_linear_runs_stock():
    """The KDA family builds, and its cached decode (unpatched) continues a prefill as a full forward does."""
    from transformers import DynamicCache

    model = _tiny("kimi_linear", attention="middle")
    assert type(model).__name__ == "KimiLinearForCausalLM"
    ids = torch.randint(1, 4096, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :32], past_key_values=cache, use_cache=True)
        steps = [model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits[:, -1] for t in range(32, 40)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, 32:40], atol=1e-4, rtol=1e-4)


def test_testbed_sizes_fit_the_budget():
    """The three testbed checkpoints fit 30 MB in bf16, and 'first' puts attention before every SSM layer."""
    total = 0
    for family in FAMILIES:
        config = ts.build_config(family, 4096, 0, "testbed", "first")
        with torch.device("meta"):
            model = ts.build_model(family, config)
        total += 2 * sum(p.numel() for p in model.parameters())
        types = getattr(config, "layers_block_type", None) or config.layer_types
        assert types[0] == "full_attention" and types.count("full_attention") == 1
        assert types.count("linear_attention") == 4
    assert total <= 30e6, f"{total / 1e6:.1f} MB"


@pytest.mark.parametrize("family", FAMILIES)
def test_spectrum_reads_the_decays_the_model_applies(family):
    """With the input-dependent part of the decay zeroed, the spectrum must equal the closed form."""
    model = _tiny(family, decay_init="long")
    expected = []
    with torch.no_grad():
        for mixer in ts.ssm_mixers(model):
            if family == "nemotron_h":
                mixer.in_proj.weight[-mixer.num_heads :] = 0
                dt = torch.nn.functional.softplus(mixer.dt_bias.float()).clamp(min=mixer.time_step_limit[0])
                expected.append(torch.exp(-mixer.A_log.float().exp() * dt))
            elif family == "qwen3_5":
                mixer.in_proj_a.weight.zero_()
                expected.append(torch.exp(-mixer.A_log.float().exp() * torch.nn.functional.softplus(mixer.dt_bias)))
            else:
                gate = mixer.forget_gate
                gate.f_b_proj.weight.zero_()
                g = -gate.A_log.float().exp().view(-1, 1) * torch.nn.functional.softplus(gate.dt_bias.float().view(gate.num_heads, -1))
                expected.append(g.median(1).values.exp())
    ids = torch.randint(1, 4096, (200,), generator=torch.Generator().manual_seed(1))
    spectrum = ts.decay_spectrum(model, ids, 64, 2, 3, torch.device("cpu"))
    assert spectrum["tokens_per_head"] == 3 * 64
    got = [torch.tensor([h["decay"] for h in layer["heads"]], dtype=torch.float64) for layer in spectrum["layers"]]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e.double(), atol=1e-6, rtol=1e-5)
    # The long initialisation: half of the heads are slow, each within its memory range.
    assert spectrum["fraction_above_0.95"] >= 0.5
    for layer in spectrum["layers"]:
        chosen = layer["heads"][::2]  # init_decays takes every other head
        assert all(60 <= h["memory_tokens"] <= 2100 for h in chosen), [h["memory_tokens"] for h in chosen]


def test_stock_init_of_gdn_is_fast():
    """Without --decay-init long, the stock GDN initialisation has no head near 0.95 (why the option exists)."""
    model = _tiny("qwen3_5")
    with torch.no_grad():
        for mixer in ts.ssm_mixers(model):
            mixer.in_proj_a.weight.zero_()
    ids = torch.randint(1, 4096, (65,), generator=torch.Generator().manual_seed(1))
    assert ts.decay_spectrum(model, ids, 64, 1, 1, torch.device("cpu"))["fraction_above_0.95"] < 0.25


@pytest.mark.parametrize("family", FAMILIES)
def test_state_reset_cuts_only_ssm_memory(family):
    model = _tiny(family)
    ids = torch.randint(1, 4096, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        with ts.ssm_state_reset(model, 64):
            same = model(input_ids=ids, use_cache=False).logits
        with ts.ssm_state_reset(model, 32):
            cut = model(input_ids=ids, use_cache=False).logits
        after = model(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(same, full)
    torch.testing.assert_close(after, full)  # the mixers' own forward is back
    torch.testing.assert_close(cut[:, :32], full[:, :32], atol=1e-5, rtol=1e-5)  # nothing to forget yet
    assert (cut[:, 32:] - full[:, 32:]).abs().amax() > 1e-3
    # At the mixer: a slice after a reset is the mixer run on that slice alone.
    mixer = ts.ssm_mixers(model)[0]
    x = torch.randn(1, 64, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        with ts.ssm_state_reset(model, 32):
            sliced = mixer(x)
        alone = mixer(x[:, 32:64])
    torch.testing.assert_close(sliced[:, 32:64], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.hf
def test_quality_recall_path_matches_a_full_forward(vocab, filler):
    """quality.py's recall path (prefill, or token by token) gives a full forward's logits at the answer positions."""
    quality = _load("quality")
    model, tokenizer = quality.load_checkpoint(ROOT / "checkpoints" / "qwen3_5_small", torch.device("cpu"))
    probes = [p for task in rt.PROBE_TASKS for p in rt.probe_set(vocab, filler, task, 96, 1, seed=1)]
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        full = [model(input_ids=torch.tensor([p.ids])).logits[0, p.answer_start - 1 : len(p.ids) - 1] for p in probes]
    for feed in ("prefill", "stream"):
        got = quality.recall_answer_logits(model, probes, feed, 64, 3, eos)
        for g, f, p in zip(got, full, probes):
            assert g.shape == (len(p.answer), model.config.vocab_size)
            torch.testing.assert_close(g, f.float(), atol=2e-4, rtol=2e-4, msg=f"{feed}, {p.task}")
    hits = quality.recall_hits(model, probes, "prefill", 64, 3, eos)
    assert hits == rt.exact_match(model, probes, "cpu", batch=3, pad_id=eos)
