"""Shared fixtures: model paths (built offline by examples/cpu/build_models.py) and server helpers."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from sglang_cpp import files
from sglang_cpp.bench.client import generate, random_ids
from sglang_cpp.bench.server import ServerSpec, launched

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SGLANG_CPP_CACHE_DIR", Path.home() / ".cache" / "sglang-cpp"))
SMOLLM2 = CACHE / "models" / "smollm2-135m"
TINY = CACHE / "models" / "tiny-llama"
TINY_QWEN3 = CACHE / "models" / "tiny-qwen3"
def _device() -> str:
    """The server tests' device: CUDA where torch sees one, else CPU (HiCache's host pool on CPU runs on the
    plugin's kvcacheio ops). torch is imported here, on first use, not at collection: the numpy-only unit tests
    load this file without it."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def __getattr__(name: str):  # `from conftest import DEVICE` (PEP 562): torch only when a test asks for it
    if name == "DEVICE":
        return _device()
    if name == "CUDA":
        return _device() == "cuda"
    raise AttributeError(name)
CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
PARA = ("The river town kept its records in a stone tower. Each spring the archivists copied the ledgers, "
        "counted the boats, and wrote the names of every family that crossed the bridge. ")
LONG = 3000  # test_server_e2e's long prompt: a multi-chunk plan at C=1024, short enough for CI on an AVX2 host
MIXED_CHUNK = 512  # PP1 reference and async-recv servers: the longer mixed prompts take 2 chunks


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


@pytest.fixture(scope="session")
def tiny_qwen3(smollm2) -> str:
    """A random-init 4-layer Qwen3: SGLang runs DP attention on Qwen3 (its Llama does not split attention by DP)."""
    if not (TINY_QWEN3 / "model.safetensors").exists():
        import subprocess

        subprocess.run([sys.executable, str(ROOT / "examples/cpu/build_models.py"), "--only", "qwen3"], check=True)
    return str(TINY_QWEN3)


def _tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def cached_prompts(model: str) -> tuple[list, list]:
    """A LONG-token document, then the same document plus a ~300-token question (radix-cache hit)."""
    tok = _tokenizer(model)
    doc = tok("<|im_start|>user\n" + PARA * 200)["input_ids"][:LONG]
    q = tok(" ".join(["Summarise the duties of the archivists in the tower."] * 30) +
            "<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    return doc, doc + q


def pd_long_ids(model: str) -> list[int]:
    """tests/server/test_pd_disagg.py's long prompt: ~1200 tokens, three chunks at C=512."""
    tok = _tokenizer(model)
    return (tok("<|im_start|>user\n" + PARA * 60)["input_ids"][:1180]
            + tok("Summarise.<|im_end|>\n<|im_start|>assistant\n")["input_ids"])


def run_cached_pair(url: str, model: str) -> dict:
    doc, full = cached_prompts(model)
    first = generate(url, input_ids=doc, max_new_tokens=1)
    second = generate(url, input_ids=full, max_new_tokens=8)
    return {"doc": doc, "full": full, "first": first, "second": second}


def mixed_prompts(n: int = 12) -> list[str]:
    """Real-text chat prompts from ~20 to ~1000 tokens (mixed lengths, one chunk or two)."""
    topics = ["rivers", "bridges", "libraries", "winter", "trains", "gardens", "the moon", "bread", "music",
              "mountains"]
    para = "Write down what you know, in order, and check every fact twice before you answer. "
    return [f"<|im_start|>user\n{para * (i * i // 2)}Tell me about {topics[i % 10]}.<|im_end|>\n"
            f"<|im_start|>assistant\n" for i in range(n)]


@pytest.fixture(scope="session")
def pp1(smollm2) -> dict:
    """One PP=1 SmolLM2 reference server (no plugin policy, static chunks) for every greedy-equality check
    on SmolLM2: test_server_e2e's PP=2 servers and test_pd_disagg's PD pair."""
    with launched(ServerSpec(smollm2, pp_size=1, chunk_size=MIXED_CHUNK), 900) as srv:
        # mixed prompts first: the async-recv servers see them on an empty radix cache too
        mixed = [generate(srv.base_url, text=p, max_new_tokens=8).output_ids for p in mixed_prompts()]
        chat = generate(srv.base_url, text=CHAT, max_new_tokens=16).text
        cached = run_cached_pair(srv.base_url, smollm2)
        pd_long = generate(srv.base_url, input_ids=pd_long_ids(smollm2), max_new_tokens=16, stream=False)
        return {"chat": chat, "cached": cached, "mixed": mixed, "pd_long": pd_long, "log": srv.log()}


def walk(sizer, rid, n, prefix):
    """Drive a sizer the way SGLang does: first chunk via decide(first=True), then predict()."""
    cur = {"req": (rid, n)}
    sizer.current_req = lambda: cur["req"]
    L, out = prefix, []
    c = sizer.decide(rid, n, L, first=True)
    while True:
        out.append(c)
        L += c
        if L >= n:
            return out
        c = sizer.predict(L)


def read_events(path: Path, event: str) -> list[dict]:
    """The `event` records of one stage's decision log (none while it does not exist yet)."""
    return files.read_events([path], event) if path.exists() else []


def switch_stream(path: Path) -> list[tuple]:
    """The order in which a stage switched models and planned requests: ('refit', version) and
    ('plan', prompt length) at each request's first decision."""
    out, seen = [], set()
    for e in files.read_events([path], "refit", "decision"):
        if e["event"] == "refit":
            out.append(("refit", e["version"]))
        elif e["event"] == "decision" and e["rid"] not in seen:
            seen.add(e["rid"])
            out.append(("plan", e["prompt_len"]))
    return out


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


# tiny servers whose tests do not depend on the KV pool's size: 64K tokens instead of ~960K (about 5 s
# less per start on this host, from allocating 0.9 GB of KV per rank)
SMALL_POOL = ("--max-total-tokens", "65536")

# HiCache (--enable-hierarchical-cache): a device KV pool of 8192 tokens holds one ~6K-token document, so
# the second document evicts the first from the device and the third request finds it on the host tier.
HICACHE_ARGS = ("--enable-hierarchical-cache", "--max-total-tokens", "8192")
DOC, OTHER = random_ids(6000, seed=61), random_ids(6000, seed=62)
ASK, ASK2 = random_ids(40, seed=63), random_ids(40, seed=64)
HICACHE_PROMPTS = (DOC + ASK, OTHER + ASK, DOC + ASK2)
HICACHE_NEW = 4
# policy off: upstream profiles 128 fresh prefills of up to 1.25*C tokens at startup; on the tiny model
# fast enough at a C where compute, not per-forward overhead, dominates its fit
OFF_CHUNK, OFF_PROMPT, OFF_CTX = 2048, 6000, 65536
# policy quadratic: coefficients that make upstream's predictor shrink its chunks, sigma 0.75
QUAD_ABC, QUAD_PROMPT, QUAD_SIGMA = (2e-3, 1.5, 30.0), 3000, "0.75"


def serve_hicache(spec: ServerSpec, tail: list[int] | None = None, more=()) -> dict:
    """The three HiCache requests on a server, then `more` (as many new tokens), then `tail` (one new
    token) on a document it never saw."""
    with launched(spec, 900) as srv:
        res = [generate(srv.base_url, input_ids=p, max_new_tokens=HICACHE_NEW, stream=False)
               for p in (*HICACHE_PROMPTS, *more)]
        last = generate(srv.base_url, input_ids=tail, max_new_tokens=1) if tail else None
        return {"hicache": res[:3], "more": res[3:], "tail": last, "log": srv.log()}


@pytest.fixture(scope="session")
def off_run(tiny, tmp_path_factory) -> dict:
    """Tiny PP=2, SGLANG_CPP_POLICY=off with --enable-dynamic-chunking (upstream's own startup profiling,
    fit and chunking, observed only) and HiCache: shared by tests/server/test_server_e2e.py and test_hicache.py,
    one server start instead of two."""
    d = tmp_path_factory.mktemp("off")
    env = {"SGLANG_CPP_POLICY": "off", "SGLANG_CPP_DECISION_LOG": str(d / "dec_{rank}.jsonl")}
    spec = ServerSpec(tiny, pp_size=2, chunk_size=OFF_CHUNK, dynamic=True, env=env, device=_device(),
                      extra_args=HICACHE_ARGS)
    return dict(serve_hicache(spec, random_ids(OFF_PROMPT, seed=11)), dir=d)


@pytest.fixture(scope="session")
def quadratic_run(tiny, tmp_path_factory) -> dict:
    """Tiny PP=2, SGLANG_CPP_POLICY=quadratic on upstream coefficients from a profile file, with HiCache."""
    d = tmp_path_factory.mktemp("quadratic")
    a, b, c = QUAD_ABC
    prof = d / "upstream.json"
    prof.write_text(json.dumps({"format": "sglang-cpp-profile", "samples": [], "upstream": {"a": a, "b": b, "c": c}}))
    env = {"SGLANG_CPP_POLICY": "quadratic", "SGLANG_CPP_PROFILE": str(prof),
           "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": QUAD_SIGMA, "SGLANG_CPP_DECISION_LOG": str(d / "dec_{rank}.jsonl")}
    spec = ServerSpec(tiny, pp_size=2, chunk_size=1024, dynamic=True, env=env, device=_device(),
                      extra_args=HICACHE_ARGS)
    return dict(serve_hicache(spec, random_ids(QUAD_PROMPT, seed=11)), dir=d)


# -- tests/unit: neither torch nor SGLang ----------------------------------------------------------------
UNIT = Path(__file__).resolve().parent / "unit"


def pytest_sessionfinish(session, exitstatus):
    """tests/unit holds the pure layers' tests (core, whatif, the command line's analytic paths, the bench runner
    on fakes): run alone (`pytest tests/unit`, seconds, anywhere numpy runs), the session fails when any of them
    imported torch or SGLang. In the full suite tests/inproc/test_import_graph.py checks their imports."""
    args = [a.split("::")[0] for a in session.config.args] or ["."]
    loaded = [m for m in ("torch", "sglang") if m in sys.modules]
    if loaded and all(Path(a).resolve().is_relative_to(UNIT) for a in args):
        print(f"\ntests/unit imported {', '.join(loaded)}: a unit test must not; import lazily in the code under "
              "test, or move the test to tests/inproc", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
