#!/usr/bin/env bash
# The GPU check (issue 27): plugin loads, hooks applied, CUDA-event timing, a FlashAttention-shaped fit and
# predicted-vs-measured forward times over 8K-64K on a random-init Llama at PP=1 (PP=2 calibration with 2+ GPUs),
# and the torch-only kernel measurement (kernels.py). 10 minutes or less on one H100/H200. The SGLang steps need
# SGLang 0.5.23 with its CUDA dependencies; without it they are NOT RUN and the torch-only steps still run.
# With SGLang there, this checkout is installed (--no-deps) for its plugin entry point; without it, it is used in
# place (PYTHONPATH). Writes results/gpu_check.md, gpu_kernels.md,
# gpu_kernels.json and gpu_kernels-<shape>.profile.json (or beside --out FILE). Never part of CI.
# Usage: bash examples/gpu/check.sh [--out FILE] [--shapes a,b,...]    (PYTHON=... to pick the interpreter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" \
  || { echo "[gpu-check] needs a CUDA machine with torch" >&2; exit 2; }
if "$PY" -c "import sglang" 2>/dev/null; then
  "$PY" -c "from importlib.metadata import version; version('sglang-cpp')" 2>/dev/null \
    || "$PY" -m pip install -q --no-deps -e "$ROOT"
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 600 "$PY" "$ROOT/examples/gpu/check.py" "$@"
