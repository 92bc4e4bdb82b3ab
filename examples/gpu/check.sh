#!/usr/bin/env bash
# The GPU check (issue 27): plugin loads, hooks applied, CUDA-event timing, a FlashAttention-shaped fit and
# predicted-vs-measured forward times over 8K-64K on a random-init Llama at PP=1 (PP=2 calibration with 2+ GPUs).
# 10 minutes or less on one H100/H200. Needs SGLang 0.5.23 installed with its CUDA dependencies; installs this
# checkout (--no-deps) into that Python. Writes results/gpu_check.md (or --out FILE). Never part of CI.
# Usage: bash examples/gpu/check.sh [--out FILE]    (PYTHON=... to pick the interpreter)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-python3}"
"$PY" -c "import sglang, torch; assert torch.cuda.is_available(), 'no CUDA device'" \
  || { echo "[gpu-check] needs a CUDA machine with sglang==0.5.23 installed (pip install sglang==0.5.23)" >&2; exit 2; }
"$PY" -c "import sglang_cpp" 2>/dev/null || "$PY" -m pip install -q --no-deps -e "$ROOT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
exec timeout 600 "$PY" "$ROOT/examples/gpu/check.py" "$@"
