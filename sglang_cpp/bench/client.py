"""Minimal SGLang HTTP client: native /generate with input_ids, streamed, so the first token is
timestamped client-side. Used by the benchmark, the server profiler, the examples and the tests."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np


class ServerError(RuntimeError):
    pass


@dataclass
class GenResult:
    ttft_s: float
    e2e_s: float
    text: str
    output_ids: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


def random_ids(n: int, seed: int, vocab: int = 10000, low: int = 10) -> list[int]:
    """Distinct per seed, so the radix cache cannot help unless a prefix is shared on purpose."""
    return np.random.default_rng(seed).integers(low, vocab, size=n).tolist()


def _session():
    import requests

    s = requests.Session()
    s.trust_env = False  # loopback only: never route through a proxy
    return s


def get_json(base_url: str, *paths: str, timeout: float = 10.0) -> dict:
    """The first of `paths` that answers 200 with JSON ({} when none does: the routes differ across
    SGLang versions). ServerError when the server cannot be reached."""
    s = _session()
    for path in paths:
        try:
            r = s.get(f"{base_url}{path}", timeout=timeout)
        except Exception as exc:
            raise ServerError(f"SGLang server at {base_url} is unreachable ({exc.__class__.__name__}: {exc}); "
                              "start it or fix --base-url") from None
        if r.status_code == 200:
            try:
                return r.json()
            except ValueError:
                pass
    return {}


def server_info(base_url: str, timeout: float = 10.0) -> dict:
    return get_json(base_url, "/get_server_info", "/server_info", timeout=timeout)


def flush_cache(base_url: str, timeout: float = 30.0) -> bool:
    """Empty the radix cache; best effort: False where the server refused (SGLang flushes only an idle
    scheduler, with nothing queued or running) or did not answer."""
    try:
        return _session().post(f"{base_url}/flush_cache", timeout=timeout).status_code == 200
    except Exception:
        return False


def generate(base_url: str, *, input_ids=None, text=None, max_new_tokens: int = 1, stream: bool = True,
             timeout: float = 3600.0, extra: dict | None = None, on_first=None) -> GenResult:
    """One request; TTFT = time to the first streamed chunk that carries output. `on_first()` is called
    then (a caller that must act while the request decodes waits on it, not on a sleep)."""
    body = {"sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, "stream": stream}
    if input_ids is not None:
        body["input_ids"] = list(input_ids)
    else:
        body["text"] = text
    body.update(extra or {})
    t0 = time.perf_counter()
    try:
        r = _session().post(f"{base_url}/generate", json=body, stream=stream, timeout=timeout)
    except Exception as exc:
        raise ServerError(f"request to {base_url}/generate failed: {exc.__class__.__name__}: {exc}") from None
    if r.status_code != 200:
        raise ServerError(f"{base_url}/generate returned HTTP {r.status_code}: {r.text[:500]}")
    if not stream:
        out = r.json()
        e2e = time.perf_counter() - t0
        return GenResult(e2e, e2e, out.get("text", ""), out.get("output_ids", []), out.get("meta_info", {}))
    ttft, last = None, {}
    for line in r.iter_lines():
        if not line or not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        last = json.loads(payload)
        if "error" in last:
            raise ServerError(f"{base_url}/generate failed midway: {last['error']}")
        if ttft is None:
            ttft = time.perf_counter() - t0
            if on_first is not None:
                on_first()
    e2e = time.perf_counter() - t0
    if ttft is None:
        raise ServerError(f"{base_url}/generate streamed no output")
    return GenResult(ttft, e2e, last.get("text", ""), last.get("output_ids", []), last.get("meta_info", {}))


def wait_healthy(base_url: str, timeout: float, proc=None, failed=None) -> None:
    """Poll /health until it answers 200; fail early if the server process died, or once `failed()` says
    it cannot come up (e.g. its log shows that its port was taken)."""
    s = _session()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerError(f"server process exited with code {proc.returncode} before becoming healthy")
        if failed is not None and failed():
            raise ServerError(f"server at {base_url} cannot become healthy (its log says why)")
        try:
            if s.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except Exception:
            pass
        time.sleep(1.0)
    raise ServerError(f"server at {base_url} not healthy after {timeout:.0f}s")
