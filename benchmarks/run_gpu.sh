#!/bin/bash
# Re-measure BENCHMARKS.md's tables and run the CUDA tests, in parts that each fit one 10-minute call:
#   bash benchmarks/run_gpu.sh PART OUT
# Table parts, one per table group of BENCHMARKS.md: decode, decode-sweeps, spec, spec-sweeps, spec-read (the
# kernel benchmarks), hf (issue 7's bars and batches 1-256), hf-generate (through model.generate()), hf-parts
# (the captured step's parts); all-tables: all of them with fewer repeats, most important first (about 8
# minutes); fork: the side-by-side with the authors' vLLM fork (benchmarks/fork_side_by_side.py); quality,
# quality-read: QUALITY.md's GPU tables. Test parts: gdn-tests, mamba2-tests, hf-tests, other-tests.
# Run from the repository root with PYTHONPATH=src. Each step has its own time limit, so one that hangs or
# overruns leaves the later ones their turn; its output goes to OUT/<step>.log (the kernel benchmarks log each
# row as measured) and OUT/<step>/. With PACK=FILE.tgz the folder is tarred after every step, so a call cut off
# by its limit still returns what finished. OUT/gpu.txt names the GPU and versions. fla's GDN kernel (the
# decode benchmark's second baseline) is optional: pip-install fla-core without deps into a folder on PYTHONPATH.
set -u
parts="decode, decode-sweeps, spec, spec-sweeps, spec-read, hf, hf-generate, hf-parts, all-tables, fork, quality, quality-read, gdn-tests, mamba2-tests, hf-tests, other-tests or all-tests"
part=${1:?part: $parts}
out=${2:?output folder}
mkdir -p "$out" && export PYTHONUNBUFFERED=1
step() {  # step NAME SECONDS COMMAND...: run with a time limit, keep its output in OUT/NAME.log
    local name=$1 limit=$2 && shift 2 && echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    echo "== $name: exit $? after ${SECONDS}s in all"
    tail -n 25 "$out/$name.log"
    if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$out" .; fi
}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
{ echo "GPU: ${gpu:-none}"; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; } > "$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
mamba2="mamba2-96x80x128-g8 mamba2-128x64x128-g8 mamba2-64x64x128-g8"
modes="transformers conventional-captured replay-captured replay-read-captured"
gen=(python3 benchmarks/generate.py --captured --steps 32 --no-assisted)
# One function per table group: LIMIT_SECONDS REPEATS
decode() { step decode "$1" python3 benchmarks/kernel_bench.py decode --headline-only --read-dtype bf16 --repeats "$2" --json "$out/decode.json"; }
decode_sweeps() { step decode-sweeps "$1" python3 benchmarks/kernel_bench.py decode --repeats "$2" --json "$out/decode-sweeps.json" "${@:3}"; }
spec() { step spec "$1" python3 benchmarks/kernel_bench.py spec --headline-only --breakdown --repeats "$2" --json "$out/spec.json"; }
spec_sweeps() { step spec-sweeps "$1" python3 benchmarks/kernel_bench.py spec --breakdown --repeats "$2" --json "$out/spec-sweeps.json" "${@:3}"; }
spec_read() { step spec-read "$1" python3 benchmarks/kernel_bench.py spec --headline-only --read-dtype bf16 --repeats "$2" --json "$out/spec-read.json"; }
conv() { step conv "$1" python3 benchmarks/kernel_bench.py conv --batches 256 --repeats "$2" --json "$out/conv.json"; }
hf() {  # LIMIT_QWEN LIMIT_NEMOTRON REPEATS
    step generate-qwen "$1" "${gen[@]}" --out "$out/generate-qwen" --models qwen3_5-like --batches 256 1 16 64 --repeats "$3" --modes $modes
    step generate-nemotron "$2" "${gen[@]}" --out "$out/generate-nemotron" --models nemotron_h-like --batches 256 1 16 64 --repeats "$3" --modes $modes
}
hf_generate() { step generate-through "$1" python3 benchmarks/generate.py --out "$out/generate-through" --models qwen3_5-like --batches 256 1 --steps 32 --repeats "$2" --through-generate --generate-only --no-assisted --generate-modes transformers replay-captured-new-cache replay-captured-deferred conventional-captured-new-cache conventional-captured-deferred; }
hf_parts() {  # the stacked projections are generate.py's default: compare with the hf part's batch-256 rows
    step projections-separate "$1" "${gen[@]}" --out "$out/projections-separate" --models qwen3_5-like --batches 256 --repeats "$2" --modes conventional-captured replay-captured replay-read-captured --separate-projections
    step hf-parts "$1" python3 benchmarks/hf_parts.py attention projections --variants "packed sdpa (auto)" "replayssm grouped products" "stock repeat_kv + sdpa" --repeats "$2" --json "$out/hf-parts.json"
    conv "$1" "$2"
}
case $part in
decode) decode 150 8 ;;
decode-sweeps) decode_sweeps 300 3 ;;
spec) spec 180 8 ;;
spec-sweeps) spec_sweeps 420 5 ;;
spec-read) spec_read 200 8 ;;
hf) hf 280 220 3 ;;
hf-generate) hf_generate 200 3 ;;
hf-parts) hf_parts 90 3 ;;
all-tables)  # the limits add up to 500 s; the sweeps come last and may be cut (their logs keep the rows measured)
    decode 60 3
    spec 75 3
    hf 95 70 2
    hf_generate 60 2
    spec_read 40 3
    hf_parts 30 2
    decode_sweeps 35 1 --geometries $mamba2
    spec_sweeps 35 1 --accept half
    ;;
fork)  # BENCHMARKS.md's side-by-side with the authors' vLLM fork (the harness copied to .anchors and carried)
    step side-by-side 300 python3 benchmarks/fork_side_by_side.py --only qwen4b,qwen122b --json "$out/side_by_side.json"
    ;;
quality | quality-read)  # QUALITY.md: the state dtypes; the read copy
    configs="reference replay-fp32 replay-fp16 replay-bf16 conventional-fp32 conventional-fp16 conventional-bf16"
    [ "$part" = quality-read ] && configs="reference replay-fp32 replay-read-bf16 replay-read-fp16"
    for ck in nemotron_h_small qwen3_5_small; do
        step "$part-$ck" 290 python3 benchmarks/quality.py --checkpoint checkpoints/$ck --device cuda --out "$out/$part-$ck" --configs $configs
    done
    ;;
gdn-tests)
    step gdn-verify-tests 260 python3 -m pytest -q tests/test_triton_gdn.py -k "cuda and (verify or mma or snapshot or dot_forms)"
    step gdn-other-tests 120 python3 -m pytest -q tests/test_triton_gdn.py -k "cuda and not (verify or mma or snapshot or dot_forms)"
    step gdn-read-copy-tests 180 python3 -m pytest -q tests/test_read_copy.py -k "cuda and gdn"
    ;;
mamba2-tests)
    step mamba2-tests 240 python3 -m pytest -q tests/test_triton_mamba2.py -k cuda
    step mamba2-read-copy-tests 180 python3 -m pytest -q tests/test_read_copy.py -k "cuda and not gdn"
    step overlap-tests 120 python3 -m pytest -q tests/test_triton_launch_overlap.py
    ;;
hf-tests)
    step hf-tests 470 python3 -m pytest -q tests/test_hf_cuda.py
    step hf-conv-tests 110 python3 -m pytest -q tests/test_hf_conv.py -m cuda
    ;;
all-tests)  # every CUDA test group at once (the GPU is shared; Triton compiles use the host's cores)
    step_bg() { local name=$1 limit=$2 && shift 2 && (timeout "$limit" "$@" > "$out/$name.log" 2>&1; echo "exit $?" >> "$out/$name.log") & }
    step_bg gdn-tests 560 python3 -m pytest -q tests/test_triton_gdn.py -k cuda
    step_bg mamba2-tests 560 python3 -m pytest -q tests/test_triton_mamba2.py -k cuda
    step_bg overlap-tests 300 python3 -m pytest -q tests/test_triton_launch_overlap.py
    step_bg read-copy-tests 560 python3 -m pytest -q tests/test_read_copy.py -k cuda
    step_bg hf-tests 560 python3 -m pytest -q tests/test_hf_cuda.py tests/test_hf_conv.py -m cuda
    step_bg other-tests 560 python3 -m pytest -q tests/test_conv_step.py tests/test_ops_library.py tests/test_bad_input.py tests/test_state_ops.py tests/test_hf_attention.py $(ls tests/test_dead_entries.py 2>/dev/null) tests/test_replay_exact.py
    wait
    for f in "$out"/*-tests.log; do echo "== $f" && tail -n 4 "$f"; done
    if [ -n "${PACK:-}" ]; then tar czf "$PACK" -C "$out" .; fi
    ;;
other-tests)
    step conv-step-tests 200 python3 -m pytest -q tests/test_conv_step.py -m cuda
    step ops-tests 200 python3 -m pytest -q tests/test_ops_library.py tests/test_bad_input.py tests/test_state_ops.py tests/test_hf_attention.py -k cuda
    ;;
*) echo "unknown part $part: $parts" >&2 && exit 2 ;;
esac
