"""benchmarks/generate.py runs end to end at tiny sizes on the CPU (its plumbing; the figures come from the GPU)."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.hf


def test_generate_benchmark_smoke(tmp_path):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "generate.py"
    spec = importlib.util.spec_from_file_location("bench_generate", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--tiny", "--device", "cpu", "--models", "qwen3_5-like", "--batches", "2", "--steps", "2", "--new-tokens", "6", "--captured", "--out", str(tmp_path)])
    result = json.loads((tmp_path / "generate.json").read_text())
    assert {r["batch"] for r in result["decode"]} == {2}
    assert set(result["decode"][0]["tokens_per_s"]) == {"transformers", "conventional", "replay", "conventional-captured", "replay-captured"}
    assert [a for a in result["assisted"] if "identical_to_greedy" in a][0]["identical_to_greedy"]
