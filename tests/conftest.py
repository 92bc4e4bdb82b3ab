"""Shared fixtures: model paths (built offline by examples/cpu/build_models.py) and server helpers."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SGLANG_CPP_CACHE_DIR", Path.home() / ".cache" / "sglang-cpp"))
SMOLLM2 = CACHE / "models" / "smollm2-135m"
TINY = CACHE / "models" / "tiny-llama"
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="session")
def smollm2() -> str:
    if not (SMOLLM2 / "model.safetensors").exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "examples/cpu/build_models.py"), "--only", "smollm2"], check=True)
    return str(SMOLLM2)


@pytest.fixture(scope="session")
def tiny(smollm2) -> str:
    """The random-init 4-layer Llama (64K context): fast servers where the output text does not matter."""
    if not (TINY / "model.safetensors").exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "examples/cpu/build_models.py"), "--only", "tiny"], check=True)
    return str(TINY)


def read_events(path: Path, event: str) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["event"] == event]


def chunks_of(path: Path, rid_prefix_len: int | None = None) -> dict:
    """rid -> [(prefix, chunk), ...] from a stage's single-request forward events."""
    out: dict = {}
    for r in read_events(path, "forward"):
        if len(r["rids"]) == 1:
            out.setdefault(r["rids"][0], []).append((r["prefix"][0], r["chunk"][0]))
    return out


def sglang_reference_chunks(a: float, b: float, c: float, C: int, n: int, ctx: int, max_prefill: int) -> list[int]:
    """The chunks SGLang 0.5.23 runs for one n-token request, from its own ChunkSizePredictor: the first
    chunk is C, then predict_next_chunk_size (None keeps C), each capped by what remains."""
    from sglang.srt.managers.scheduler_components.dynamic_chunk_sizer import ChunkSizePredictor

    ref = ChunkSizePredictor()
    ref.quadratic_coeff_a, ref.linear_coeff_b, ref.constant_coeff_c = a, b, c
    ref.set_target_latency(C)
    ref.is_ready = True
    out, L = [], 0
    while L < n:
        x = C if not out else (ref.predict_next_chunk_size(L, C, 1, ctx, max_prefill) or C)
        out.append(min(x, n - L))
        L += out[-1]
    return out
