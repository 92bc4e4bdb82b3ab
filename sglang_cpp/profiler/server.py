"""`--backend server`: time chunks against a live SGLang server through its radix cache.

Why: this measures the kernels, attention backend, TP/PP and scheduler SGLang really uses. The
prefix is sent once (the radix cache keeps it), then prefix + x fresh tokens is sent per repeat;
only the x tokens are prefilled. The time is the server's own prefill span when its meta_info has
one (`--enable-metrics`: prefill_finished_time - forward_entry_time), else the client-side time to
the first streamed chunk. Samples cover the whole model (all PP stages), marked scope "all".
Keep the server's --chunked-prefill-size >= the largest chunk, or SGLang splits the chunk itself.
"""
from __future__ import annotations

import warnings

from tqdm import tqdm

from sglang_cpp.bench.client import flush_cache, generate, get_json

from .grid import MAX_LEN_CAP, ProfileConfig, median

TOKEN_RANGE = (1000, 30000)  # inside any modern vocabulary, clear of special tokens


def server_prefill_ms(meta: dict) -> float | None:
    """The server-side prefill span in ms, when the server reports it (--enable-metrics)."""
    a, b = meta.get("forward_entry_time"), meta.get("prefill_finished_time")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > a:
        return (b - a) * 1e3
    return None


def profile_server(cfg: ProfileConfig, progress: bool = True) -> tuple[list[dict], dict]:
    import random

    url = cfg.base_url.rstrip("/")
    info = get_json(url, "/server_info", "/get_server_info", timeout=min(cfg.timeout, 30.0))
    minfo = get_json(url, "/model_info", "/get_model_info", timeout=min(cfg.timeout, 30.0))
    if info.get("disable_radix_cache"):
        raise ValueError(f"SGLang server at {url} runs with --disable-radix-cache; the server backend "
                         "needs the radix cache to hold the prefix. Restart it without that flag.")
    ctx = info.get("context_length") or MAX_LEN_CAP
    max_len = cfg.max_len or min(int(ctx), MAX_LEN_CAP)
    grid = cfg.grid(max_len)
    cps = info.get("chunked_prefill_size")
    if isinstance(cps, int) and cps > 0 and max(x for _, x in grid) > cps:
        warnings.warn(f"server --chunked-prefill-size {cps} < largest chunk {max(x for _, x in grid)}: SGLang "
                      "will split those chunks, so their times cover several forwards", stacklevel=2)
    rng = random.Random(cfg.seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]

    samples, low_hits, sources = [], [], set()
    for L, x in tqdm(grid, desc=f"profile server {url}", unit="pt", disable=not progress):
        flush_cache(url)
        prefix = ids(L)
        if L:
            generate(url, input_ids=prefix, stream=False, timeout=cfg.timeout)  # caches the prefix (radix tree)
        runs, cached = [], []
        for r in range(cfg.warmup + cfg.repeats):
            res = generate(url, input_ids=prefix + ids(x), timeout=cfg.timeout)
            meta, ttft = res.meta, res.ttft_s
            srv = server_prefill_ms(meta)
            sources.add("server_meta" if srv is not None else "client_ttft")
            if r >= cfg.warmup:
                runs.append(srv if srv is not None else ttft * 1e3)
                cached.append(int(meta.get("cached_tokens", 0) or 0))
        hit = median(cached)
        if L and hit < 0.9 * L:
            low_hits.append((L, x, hit))
        samples.append({"L": L, "x": x, "ms": median(runs), "stage": 0, "scope": "all", "backend": "server",
                        "cached_tokens": hit})
    if low_hits:
        L, x, hit = low_hits[0]
        warnings.warn(f"{len(low_hits)} points reused less than 90% of the prefix (e.g. L={L}, x={x}: "
                      f"cached_tokens={hit:.0f}); is the radix cache disabled or too small?", stacklevel=2)
    meta = {
        "model": minfo.get("model_path") or info.get("model_path"),
        "device_name": _device_name(info.get("device"), url), "dtype": _dtype(info.get("dtype"), minfo, info),
        "tp": info.get("tp_size"), "pp": info.get("pp_size"), "stage": "all",
        "page_size": info.get("page_size"),
        "base_url": url, "attention_backend": info.get("attention_backend"),
        "chunked_prefill_size": cps, "max_len": max_len, "timing": sorted(sources),
    }
    if info.get("version"):
        meta["sglang_version"] = info["version"]  # the server's, not this client's
    return samples, meta


def _device_name(device, url: str) -> str | None:
    """The plugin's name for the server's device (machine.device_name: the GPU's name, not 'cuda') when the server
    runs on this host; else what it reports (`tune chunk --device-name` names the file for the server then)."""
    from urllib.parse import urlparse

    from ..machine import device_name

    if device and urlparse(url).hostname in ("127.0.0.1", "localhost", "::1"):
        try:
            return device_name(str(device))
        except Exception:  # noqa: BLE001  (no torch here: keep the server's word)
            return device
    return device


def _dtype(dtype, minfo: dict, info: dict) -> str | None:
    """The weights' dtype as the plugin names it: SGLang's `auto` resolved from the model's config.json as SGLang
    resolves it (configs/model_config.py:2285-2325) when the model folder is readable here, else as reported."""
    import json
    from pathlib import Path

    names = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}
    if str(dtype) != "auto":
        return names.get(str(dtype).lower(), dtype)
    cfg = Path(str(minfo.get("model_path") or info.get("model_path") or "")) / "config.json"
    try:
        doc = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return dtype
    got = names.get(str(doc.get("dtype") or doc.get("torch_dtype") or "float32"))  # SGLang reads dtype first
    if got in (None, "float32"):  # SGLang runs a float32 checkpoint in 16 bits (model_config.py:2302-2319)
        return "bfloat16" if str(doc.get("model_type", "")).startswith("gemma") else "float16"
    return got


__all__ = ["profile_server", "server_prefill_ms"]
