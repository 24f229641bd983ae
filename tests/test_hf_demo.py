"""The demo (``python -m replayssm demo``) at tiny size: identical outputs, assisted decoding exact, report printed."""

import pytest

pytest.importorskip("transformers")

from replayssm.integrations.hf.demo import run_demo  # noqa: E402

pytestmark = pytest.mark.hf


def test_demo_runs_and_outputs_are_identical(capsys):
    results = run_demo(device="cpu", size="tiny", new_tokens=12, window=4)
    assert results["greedy_identical"]
    assert results["prompt_lookup_identical"]
    assert results["assistant_identical"]
    written = results["state_bytes_written_per_token"][1]
    assert written["replay"] < written["conventional"]
    report = capsys.readouterr().out
    assert "identical: True" in report and "state written" in report and "ms/token" in report
