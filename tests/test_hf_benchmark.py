"""benchmarks/generate.py runs end to end at tiny sizes on the CPU (its plumbing; the figures come from the GPU)."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.hf


@pytest.fixture
def bench():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "generate.py"
    spec = importlib.util.spec_from_file_location("bench_generate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generate_benchmark_smoke(bench, tmp_path, capsys):
    bench.main(["--tiny", "--device", "cpu", "--models", "qwen3_5-like", "--batches", "2", "--steps", "2", "--new-tokens", "6", "--captured", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "generate.json").read_text())
    modes = {"transformers", "conventional", "replay", "conventional-captured", "replay-captured"}
    [row] = result["decode"]
    assert row["batch"] == 2
    assert row["errors"] == {}
    for figure in bench.FIGURES + ("wall_seconds",):
        assert set(row[figure]) == modes, figure
    for mode in modes:
        assert row["ms_per_step"][mode] > 0
        assert row["ms_per_step"][mode] == pytest.approx(1000 * 2 / row["tokens_per_s"][mode], rel=1e-9)
        assert row["peak_memory_gib"][mode] is None and row["decode_peak_memory_gib"][mode] is None  # CPU
        assert 0 < row["weights_gib"][mode] < 0.01  # a tiny model
        assert row["kv_cache_gib"][mode] > 0 and row["ssm_state_gib"][mode] > 0  # one attention layer, GDN layers
        assert row["state_op_share"][mode] is None  # not profiled on the CPU
        assert row["kernel_ms_per_step"][mode] is None
        assert row["wall_seconds"][mode] > 0
    assert [a for a in result["assisted"] if "identical_to_greedy" in a][0]["identical_to_greedy"]
    # --captured: the assisted runs again through patch(compile=...), every verification captured
    captured = {a["method"]: a for a in result["assisted"] if a["method"].endswith(", captured")}
    assert set(captured) == {"greedy, captured", "prompt lookup 8, captured"}
    lookup = captured["prompt lookup 8, captured"]
    assert lookup["identical_to_eager_lookup"] and lookup["compile_failure"] is None and lookup["captured_verifications"] > 0
    out = capsys.readouterr().out
    assert "qwen3_5-like batch 2 replay-captured: " in out  # a progress line per mode
    assert "| qwen3_5-like | 2 |" in out  # the table


def test_failed_mode_is_recorded_and_the_run_goes_on(bench, tmp_path, capsys, monkeypatch):
    time_decode = bench.time_decode
    calls = []

    def fail_on_first_call(*args, **kwargs):  # the first mode is transformers
        calls.append(args)
        if len(calls) == 1:  # any exception, not only an out-of-memory
            raise ValueError("no kernel for this shape\nmore detail")
        return time_decode(*args, **kwargs)

    monkeypatch.setattr(bench, "time_decode", fail_on_first_call)
    bench.main(["--tiny", "--device", "cpu", "--models", "qwen3_5-like", "--batches", "1", "--steps", "2", "--modes", "transformers", "replay", "--no-assisted", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "generate.json").read_text())
    [row] = result["decode"]
    assert row["errors"] == {"transformers": "ValueError: no kernel for this shape"}
    assert math.isnan(row["tokens_per_s"]["transformers"]) and math.isnan(row["ms_per_step"]["transformers"])
    assert row["tokens_per_s"]["replay"] > 0
    assert result["assisted"] == []
    out = capsys.readouterr().out
    assert "WARNING qwen3_5-like batch 1 transformers failed" in out
    assert "| qwen3_5-like | 1 | failed | failed |" in out


def test_state_op_share_counts_replayssm_kernels_only(bench):
    kernels = [("_mamba2_main_kernel", 3.0), ("_commit_kernel", 1.0), ("triton_poi_fused__gdn_step_0", 2.0), ("sm90_gemm", 4.0)]
    assert bench.state_op_share(kernels) == pytest.approx(0.4)
    assert bench.state_op_share([]) is None  # no kernels seen: unknown, not 0


def test_benchmark_models_have_the_issue_geometry(bench):
    """The GPU models are the ones the issue names (a multimodal type's keywords must reach its decoder)."""
    nemotron, qwen = bench.model_config("nemotron_h-like"), bench.model_config("qwen3_5-like")
    assert (nemotron.hidden_size, nemotron.mamba_num_heads, nemotron.mamba_head_dim, nemotron.ssm_state_size, nemotron.n_groups) == (3072, 96, 64, 128, 8)
    kinds = [{"linear_attention": "mamba", "full_attention": "attention"}.get(k, k) for k in nemotron.layers_block_type]
    assert kinds == ["mamba", "mlp", "mamba", "attention"]  # transformers 5.24 renames the kinds
    assert (qwen.hidden_size, qwen.linear_num_key_heads, qwen.linear_num_value_heads, qwen.linear_key_head_dim) == (2048, 16, 32, 128)
    assert qwen.num_hidden_layers == 4 and qwen.layer_types.count("linear_attention") == 3
    assert qwen.vocab_size == nemotron.vocab_size == 32000


def test_read_copy_modes_run(bench, tmp_path):
    """``--modes replay-read replay-read-captured``: replay with a bf16 read copy of the checkpoint, eager and
    through the compiled static-cache step; the copy adds half an fp32 checkpoint to the state bytes."""
    bench.main(["--tiny", "--device", "cpu", "--models", "qwen3_5-like", "--batches", "2", "--steps", "2", "--modes", "replay", "replay-read", "replay-read-captured", "--no-assisted", "--out", str(tmp_path)])
    [row] = json.loads((tmp_path / "generate.json").read_text())["decode"]
    assert row["errors"] == {}
    for mode in ("replay-read", "replay-read-captured"):
        assert row["tokens_per_s"][mode] > 0
        assert row["ssm_state_gib"][mode] > row["ssm_state_gib"]["replay"]


def test_timed_steps_hold_the_steady_state_folds(bench):
    """generate.py's count of folds per row in the timed steps matches what a patched model does after a
    prefill (its rings empty), and the lead of window // 2 steps gives ``steps / window`` folds per row."""
    import torch

    import replayssm
    from replayssm.integrations.hf import ReplayLayerMixin, testing

    window, prompt, lead, steps = 4, 6, 2, 8
    model = replayssm.patch(testing.tiny_model("qwen3_5"), replayssm.ReplayConfig(window=window))
    ids = torch.randint(3, testing.VOCAB, (1, prompt + lead + steps), generator=torch.Generator().manual_seed(3))
    cache = testing.new_cache(model)
    with torch.no_grad():
        kw = {testing.cache_kwarg(model): cache, "use_cache": True}
        model(input_ids=ids[:, :prompt], **kw)
        layers = [layer for layer in cache.layers if isinstance(layer, ReplayLayerMixin)]
        folded_on = []
        for step in range(1, lead + steps + 1):
            before = [layer.replay.checkpoint.clone() for layer in layers]
            pos = prompt + step - 1
            model(input_ids=ids[:, pos : pos + 1], **kw)
            changed = [not torch.equal(b, layer.replay.checkpoint) for b, layer in zip(before, layers)]
            assert len(set(changed)) == 1  # every layer folds on the same step
            if changed[0]:
                folded_on.append(step)
    folds = folded_on
    assert folds == [s for s in range(1, lead + steps + 1) if s > window and (s - 1) % window == 0] == [5, 9]
    timed = [s for s in folds if lead < s <= lead + steps]
    assert len(timed) == bench.folds_per_row(window, lead, steps) == steps // window
    assert bench.folds_per_row(16, 8, 32) == 2 and bench.folds_per_row(16, 0, 32) == 1 and bench.folds_per_row(16, 8, 64) == 4


def test_through_generate_times_stock_and_patched_generate(bench, tmp_path, capsys, monkeypatch):
    """``--through-generate --generate-only``: per-step times of ``model.generate()`` for stock and the patched
    compiled modes (time_generate); every patched call keeps its compiled step (no eager fallback)."""
    from replayssm.integrations.hf import compiled

    calls, deferred = [], []
    time_generate = bench.time_generate

    def spy(model, batch, prompt, steps, repeats, device, cache=None):
        patched = getattr(model, "_replayssm", None)
        calls.append((batch, cache is not None, patched is not None))
        deferred.append(compiled.DEFER_STOP_CHECK)
        timed = time_generate(model, batch, prompt, steps, repeats, device, cache)
        if patched is not None:  # the compiled decode step ran, not the eager fallback
            assert patched.compile_failure is None
        return timed

    monkeypatch.setattr(bench, "time_generate", spy)
    argv = ["--tiny", "--device", "cpu", "--models", "qwen3_5-like", "--batches", "2", "--steps", "3", "--repeats", "1"]
    bench.main(argv + ["--through-generate", "--generate-only", "--no-assisted", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "generate.json").read_text())
    assert result["decode"] == [] and result["meta"]["through_generate"] == list(bench.GENERATE_MODES)
    [row] = result["through_generate"]
    assert row["errors"] == {} and set(row["ms_per_step"]) == set(bench.GENERATE_MODES)
    for mode in bench.GENERATE_MODES:
        assert row["tokens_per_s"][mode] == pytest.approx(2000 / row["ms_per_step"][mode], rel=1e-9)
    # stock generate() builds its own cache; the patched modes keep one static cache across their calls, but
    # for the -new-cache ones, where generate() makes one per call
    assert calls == [(2, False, False)] + [(2, True, True)] * 3 + [(2, False, True)] * 5
    # the patched modes (stock generate() is not patched): only the -deferred ones defer; the default is back after
    assert deferred[1:] == [False] * 5 + [True] * 3 and compiled.DEFER_STOP_CHECK is True
    out = capsys.readouterr().out
    assert "qwen3_5-like batch 2 replay-captured through generate(): " in out
    assert "| qwen3_5-like | 2 |" in out


def test_time_generate_differences_long_and_short_calls(bench, monkeypatch):
    """Per step = (time of 2 steps + 1 new tokens - time of steps + 1) / steps; per call = (time of steps + 1 - time
    of 1) - steps x per step; medians over the repeats after a warm-up round."""
    import torch

    # (start, end) of each call, rounds of 1 / 3 / 5 new tokens (steps 2): a slow warm-up round (left out), then
    # per step 0.25 and 0.75 s, per call 1.0 and 0.0 s
    clock = iter([0, 1, 1, 2, 2, 100] + [10, 10.5, 10.5, 12.5, 12.5, 15] + [20, 20.5, 20.5, 22.5, 22.5, 26])
    asked = []

    class Model:
        config = type("C", (), {"get_text_config": lambda self, decoder: type("T", (), {"vocab_size": 50})()})()

        def generate(self, input_ids, attention_mask, max_new_tokens, min_new_tokens, do_sample, **kwargs):
            assert min_new_tokens == max_new_tokens and not do_sample
            asked.append(max_new_tokens)
            return torch.zeros(input_ids.shape[0], input_ids.shape[1] + max_new_tokens, dtype=torch.long)

    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    per_step, per_call = bench.time_generate(Model(), 2, 5, 2, 2, torch.device("cpu"))
    assert asked == [1, 3, 5] * 3
    assert per_step == pytest.approx(0.5) and per_call == pytest.approx(0.5)
