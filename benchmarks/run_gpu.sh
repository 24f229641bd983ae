#!/bin/bash
# One GPU session's runs, in parts that each fit a 10-minute call; every part writes under OUT.
#
#   bash benchmarks/run_gpu.sh gdn-tests OUT     # CUDA tests of the GDN kernels, with and without a read copy
#   bash benchmarks/run_gpu.sh mamba2-tests OUT  # CUDA tests of the Mamba-2 kernels, with and without a read copy
#   bash benchmarks/run_gpu.sh kernels OUT       # decode and spec headline tables (--sweep)
#   bash benchmarks/run_gpu.sh sweeps OUT        # decode batch/window and spec T/batch sweeps
#   bash benchmarks/run_gpu.sh hf-tests OUT      # CUDA tests of the HF path
#   bash benchmarks/run_gpu.sh hf OUT            # generate.py (all modes, batches, assisted)
#   bash benchmarks/run_gpu.sh quality OUT       # quality.py on both checkpoints
#   bash benchmarks/run_gpu.sh copy-verify OUT   # GDN with a bf16 read copy: its CUDA tests, then verify and decode timed
#   bash benchmarks/run_gpu.sh hf-parts OUT      # the captured HF step's other parts: attention forms, GDN input projections
#   bash benchmarks/run_gpu.sh issue7 OUT        # issue 7's bars: both models at batch 1 and 256, Qwen3.5-like twice
#   bash benchmarks/run_gpu.sh issue7-generate OUT  # the same through model.generate(), stock against patched compile=...
#   bash benchmarks/run_gpu.sh issue7-next OUT  # one call for what issue 7 still lacks: the bars (on an H200 only), the
#                                               # deferred stop check's CUDA test and its timing through generate()
#   bash benchmarks/run_gpu.sh issue7-defer OUT # the HF path's CUDA tests (stop check deferred by default), generate() timed
#
# The GDN and HF test limits come from their durations on the H200 on 2026-12-04, with some margin; the other
# parts keep earlier limits. Each part's limits add up to less than the lent machine's 600 s per call.
#
# fla's GDN kernel (the decode benchmark's second baseline) is not on the GPU machine: download its wheel into an
# ignored .whl/ (the device README's `pip download` line, fla-core), carry .whl, and start the call with
# `python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=src:/tmp/site`.
#
# Run from the repository root with PYTHONPATH=src (nothing is installed on the GPU machine); on the lent
# machine, which returns at most 8 files, write to a scratch folder and set PACK=$OUT/results.tgz: the folder
# is tarred there after every step, so a call cut off by its limit still returns what finished. Each step
# has its own time limit, so one that hangs or overruns leaves the later ones their turn; logs and
# JSON go to OUT/<step>/ as they are written; OUT/gpu.txt names the GPU and the versions.
set -u
part=${1:?part: gdn-tests, mamba2-tests, kernels, sweeps, hf-tests, hf, quality, copy-verify, hf-parts, issue7, issue7-generate, issue7-next or issue7-defer}
out=${2:?output folder}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output in OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "== $name: exit $? after ${SECONDS}s in all"
    tail -n 25 "$out/$name.log"
    if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$out" .; fi
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
{ echo "GPU: ${gpu:-none}"; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
# generate.py --through-generate as the issue7-* parts run it (model, batches and modes follow)
through=(python3 benchmarks/generate.py --out "$out/generate-through" --steps 32 --repeats 3 --through-generate --generate-only --no-assisted)
case $part in
gdn-tests)  # 2026-12-04: 215 s (41 tests) + 53 s (21) + 103 s (26)
    step gdn-verify-tests 260 python3 -m pytest -q tests/test_triton_gdn.py -k "cuda and (verify or mma or snapshot or dot_forms)"
    step gdn-other-tests 120 python3 -m pytest -q tests/test_triton_gdn.py -k "cuda and not (verify or mma or snapshot or dot_forms)"
    step gdn-read-copy-tests 180 python3 -m pytest -q tests/test_read_copy.py -k "cuda and gdn"
    ;;
mamba2-tests)
    step mamba2-tests 240 python3 -m pytest -q tests/test_triton_mamba2.py -k cuda
    step mamba2-read-copy-tests 180 python3 -m pytest -q tests/test_read_copy.py -k "cuda and not gdn"
    step overlap-tests 120 python3 -m pytest -q tests/test_triton_launch_overlap.py
    ;;
kernels)
    step decode 210 python3 benchmarks/decode_kernels.py --out "$out/decode" --headline-only --sweep --breakdown --repeats 8
    step spec 180 python3 benchmarks/spec_kernels.py --out "$out/spec" --headline-only --sweep --breakdown --accept half all --repeats 8
    ;;
sweeps)  # the batch / window / T sweeps with the launch tables as they are
    step decode-sweeps 280 python3 benchmarks/decode_kernels.py --out "$out/decode-sweeps" --repeats 5
    step spec-sweeps 300 python3 benchmarks/spec_kernels.py --out "$out/spec-sweeps" --repeats 5
    ;;
hf-tests)  # test_hf_cuda.py about 7 min on 2026-12-04 (inductor compiles; its last test alone 108 s)
    step hf-tests 470 python3 -m pytest -q tests/test_hf_cuda.py
    step hf-conv-tests 110 python3 -m pytest -q tests/test_hf_conv.py -m cuda
    ;;
hf)
    step generate-qwen 240 python3 benchmarks/generate.py --out "$out/generate-qwen" --models qwen3_5-like --captured --steps 32 --repeats 3
    step generate-nemotron 230 python3 benchmarks/generate.py --out "$out/generate-nemotron" --models nemotron_h-like --captured --steps 32 --repeats 3
    ;;
quality)
    configs="reference replay-fp32 replay-fp16 replay-bf16 conventional-fp32 conventional-fp16 conventional-bf16"
    step quality-nemotron 270 python3 benchmarks/quality.py --checkpoint checkpoints/nemotron_h_small --device cuda --out "$out/quality-nemotron" --configs $configs
    step quality-qwen 300 python3 benchmarks/quality.py --checkpoint checkpoints/qwen3_5_small --device cuda --out "$out/quality-qwen" --configs $configs
    ;;
copy-verify)  # GDN verification with a copy reads the checkpoint since 2026-12-04 (docs/ops.md); timed 2026-12-05
    step gdn-read-copy-tests 180 python3 -m pytest -q tests/test_read_copy.py -k "cuda and gdn"
    step spec-gdn-read-bf16 220 python3 benchmarks/spec_kernels.py --out "$out/spec-read" --geometries gdn-16x32x128x128 gdn-16x64x128x128 --headline-only --accept half all random --read-dtype bf16 --repeats 8
    step decode-gdn-read-bf16 150 python3 benchmarks/decode_kernels.py --out "$out/decode-read" --geometries gdn-16x32x128x128 gdn-16x64x128x128 --headline-only --read-dtype bf16 --repeats 8
    ;;
hf-parts)  # experiments (2026-12-06): the attention run took 88 s on an H100; the projections one has not run yet
    step decode-attention 200 python3 benchmarks/experiments/decode_attention.py --out "$out/decode_attention.json" --batches 1 16 64 256 --kv 104 1024 4096 --variants "packed sdpa (auto)" "replayssm grouped products" "stock repeat_kv + sdpa"
    step gdn-projections 120 python3 benchmarks/experiments/gdn_projections.py --out "$out/gdn_projections.json"
    ;;
issue7)  # 2026-12-06 on an H100: about 70 s per Qwen3.5-like call at batches 1 and 256, 50 s for Nemotron-H-like
    modes="transformers conventional-captured replay-captured replay-read-captured"
    step generate-qwen 200 python3 benchmarks/generate.py --out "$out/generate-qwen" --models qwen3_5-like --batches 1 256 --captured --steps 32 --repeats 3 --no-assisted --modes $modes
    step generate-qwen-again 150 python3 benchmarks/generate.py --out "$out/generate-qwen-again" --models qwen3_5-like --batches 256 --captured --steps 32 --repeats 3 --no-assisted --modes $modes
    step generate-nemotron 180 python3 benchmarks/generate.py --out "$out/generate-nemotron" --models nemotron_h-like --batches 1 256 --captured --steps 32 --repeats 3 --no-assisted --modes $modes
    ;;
issue7-generate)  # 2026-12-07 (H100, an earlier form: 4 modes, 2 models, 2 batches) 108 s; now 8 modes and 3 calls a round
    step defer-tests 150 python3 -m pytest -q tests/test_hf_cuda.py -k defers
    step generate-through 400 "${through[@]}" --models qwen3_5-like nemotron_h-like --batches 256 1
    ;;
issue7-next)  # estimated from the H100 runs of 2026-12-06/07 (issue7 steps 70 and 50 s; issue7-generate's 4-mode form 108 s)
    case "$gpu" in
    *H200*)
        modes="transformers conventional-captured replay-captured replay-read-captured"
        step bars-qwen 150 python3 benchmarks/generate.py --out "$out/bars-qwen" --models qwen3_5-like --batches 256 1 --captured --steps 32 --repeats 3 --no-assisted --modes $modes
        step bars-nemotron 110 python3 benchmarks/generate.py --out "$out/bars-nemotron" --models nemotron_h-like --batches 256 1 --captured --steps 32 --repeats 3 --no-assisted --modes $modes
        ;;
    *) echo "== not an H200 ($gpu): issue 7's bars are set on an H200, skipped" ;;
    esac
    step defer-tests 120 python3 -m pytest -q tests/test_hf_cuda.py -k defers
    step generate-through 170 "${through[@]}" --models qwen3_5-like --batches 256 1 --generate-modes transformers replay-captured-new-cache replay-captured-deferred conventional-captured-new-cache conventional-captured-deferred
    ;;
issue7-defer)  # with the deferred stop check on by default: every CUDA test of the HF path, then generate() timed
    step hf-tests 300 python3 -m pytest -q tests/test_hf_cuda.py
    step generate-through 140 "${through[@]}" --models qwen3_5-like --batches 256 --generate-modes transformers replay-captured-new-cache replay-captured-deferred replay-read-captured-deferred conventional-captured-new-cache conventional-captured-deferred
    ;;
*)
    echo "unknown part $part: gdn-tests, mamba2-tests, kernels, sweeps, hf-tests, hf, quality, copy-verify, hf-parts, issue7, issue7-generate, issue7-next or issue7-defer" >&2
    exit 2
    ;;
esac
