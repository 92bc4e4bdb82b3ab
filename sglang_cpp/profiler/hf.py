"""`--backend hf`: time one chunk forward in-process with transformers, layer by layer.

Why per layer: a PP stage runs a contiguous slice of decoder layers, so the per-layer time lets one
GPU profile a big model from its first K layers (`--layers K`) and extrapolate to an N-layer stage
(`--stage-layers N`); embedding and head are timed apart because only the first / last stage pays.
The forward keeps logits for the last token only, as SGLang's prefill does.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..machine import device_name
from .grid import MAX_LEN_CAP, ProfileConfig, median


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA device; use --device cpu or auto")
    return device


def load_config(model: str):
    from transformers import AutoConfig

    if not Path(model).is_dir():
        raise ValueError(f"--model-path {model!r} is not a local folder; download the model and pass its path")
    try:
        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"--model-path {model!r}: cannot read its config.json ({exc})") from None


def default_max_len(config) -> int:
    return min(int(getattr(config, "max_position_embeddings", 0) or MAX_LEN_CAP), MAX_LEN_CAP)


def load_model(cfg: ProfileConfig, device: str):
    """Model with only the first `cfg.layers` decoder layers (the rest of the checkpoint is skipped)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    config = load_config(cfg.model)
    total = int(config.num_hidden_layers)
    if cfg.layers is not None:
        if cfg.layers > total:
            raise ValueError(f"--layers {cfg.layers} exceeds the model's {total} decoder layers")
        config.num_hidden_layers = cfg.layers
        if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds
            config.layer_types = config.layer_types[:cfg.layers]
    dtype = getattr(torch, cfg.dtype or ("bfloat16" if device == "cuda" else "float32"))
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # silence "unused weights" for the skipped layers
    try:
        model = AutoModelForCausalLM.from_pretrained(cfg.model, config=config, dtype=dtype,
                                                     attn_implementation="sdpa")
    finally:
        transformers.logging.set_verbosity(verbosity)
    return model.to(device).eval(), total


class _Timer:
    """Forward hooks that time each decoder layer, the embedding and norm+lm_head.

    CUDA uses events (one sync per forward, so timing does not stall the launch queue between
    layers); CPU uses perf_counter.
    """

    def __init__(self, model, device: str):
        import torch

        self.cuda = device == "cuda"
        self.enabled = False
        self._t: dict = {}
        self._handles = []
        dec = model.get_decoder()
        self.layers = list(dec.layers)
        head_in = getattr(dec, "norm", None)
        if head_in is None:
            head_in = model.get_output_embeddings()
        spans = [("embed", model.get_input_embeddings(), model.get_input_embeddings()),
                 ("head", head_in, model.get_output_embeddings())]
        spans += [(i, layer, layer) for i, layer in enumerate(self.layers)]
        self._torch = torch
        for key, first, last in spans:
            self._handles.append(first.register_forward_pre_hook(self._mark(key, 0)))
            self._handles.append(last.register_forward_hook(self._mark(key, 1)))

    def _now(self):
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def _mark(self, key, end: int):
        def hook(*_):
            if self.enabled:
                self._t.setdefault(key, [None, None])[end] = self._now()
        return hook

    def start(self):
        self._t = {}
        self.enabled = True

    def stop(self) -> dict:
        """{'layer_ms': [...], 'embed_ms', 'head_ms'} for the forward just run."""
        self.enabled = False
        if self.cuda:
            self._torch.cuda.synchronize()
            ms = {k: a.elapsed_time(b) for k, (a, b) in self._t.items()}
        else:
            ms = {k: (b - a) * 1e3 for k, (a, b) in self._t.items()}
        return {"layer_ms": [ms[i] for i in range(len(self.layers))], "embed_ms": ms.get("embed", 0.0),
                "head_ms": ms.get("head", 0.0)}

    def remove(self):
        for h in self._handles:
            h.remove()


def _new_cache(config):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:
        return DynamicCache()


def _crop_to(cache, L: int) -> bool:
    """Drop the chunk's tokens, keeping the L-token prefix; False when this cache cannot crop.

    A negative argument removes that many tokens in transformers 4.x (crop(max_length)) and 5.x
    (crop(tokens_to_remove)) alike.
    """
    crop = getattr(cache, "crop", None)
    if crop is None or not getattr(cache, "is_croppable", True):
        return False
    n = cache.get_seq_length() - L
    if n > 0:
        crop(-n)
    return cache.get_seq_length() == L


def profile_hf(cfg: ProfileConfig, progress: bool = True) -> tuple[list[dict], dict]:
    """Measure every grid point; returns (samples, meta) for save_profile."""
    import torch

    device = resolve_device(cfg.device)
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _profile(cfg, device, progress)
    finally:
        torch.set_num_threads(threads)


def _profile(cfg: ProfileConfig, device: str, progress: bool) -> tuple[list[dict], dict]:
    import torch

    if progress:  # the load takes tens of seconds before the first point's bar moves
        print(f"profile hf: loading {cfg.model} on {device} ...", file=sys.stderr, flush=True)
    model, total_layers = load_model(cfg, device)
    config = model.config
    max_len = cfg.max_len or default_max_len(config)
    grid = cfg.grid(max_len)
    loaded = len(model.get_decoder().layers)
    stage_layers = cfg.stage_layers or loaded
    gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    vocab = int(config.vocab_size)

    def ids(n: int):
        return torch.randint(0, vocab, (1, n), generator=gen).to(device)

    def forward(tokens, cache):
        return model(input_ids=tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)

    timer = _Timer(model, device)
    samples: list[dict] = []
    cache, cache_L, prefix = None, -1, None
    try:
        with torch.inference_mode():
            for L, x in tqdm(grid, desc=f"profile hf {Path(cfg.model).name}", unit="pt",
                             disable=not progress):
                runs = []
                for r in range(cfg.warmup + cfg.repeats):
                    if cache is None or cache_L != L:  # prefill the prefix once, reuse it across x
                        if cache_L != L:
                            prefix = ids(L)
                        cache = _new_cache(config)
                        if L:
                            forward(prefix, cache)
                        cache_L = L
                    tokens = ids(x)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    timer.start()
                    t0 = time.perf_counter()
                    forward(tokens, cache)
                    parts = timer.stop()
                    parts["wall_ms"] = (time.perf_counter() - t0) * 1e3
                    if not _crop_to(cache, L):
                        cache = None  # re-prefill next time
                    if r >= cfg.warmup:
                        runs.append(parts)
                samples.append(_sample(L, x, runs, stage_layers, cfg))
    finally:
        timer.remove()
    meta = {
        "device_name": device_name(device),  # as the plugin names it: its tuned file is then found
        "dtype": str(model.dtype).replace("torch.", ""), "tp": 1, "pp": 1, "stage": 0, "page_size": 1,
        "device": device, "num_hidden_layers": total_layers, "layers_loaded": loaded,
        "stage_layers": stage_layers, "max_len": max_len, "attn_implementation": "sdpa",
        "model_type": getattr(config, "model_type", None), "threads": torch.get_num_threads(),
    }
    return samples, meta


def _sample(L: int, x: int, runs: list[dict], stage_layers: int, cfg: ProfileConfig) -> dict:
    """Per-component medians over the repeats; ms is derived from them so it matches the breakdown."""
    layer_ms = [median([r["layer_ms"][i] for r in runs]) for i in range(len(runs[0]["layer_ms"]))]
    embed_ms = median([r["embed_ms"] for r in runs])
    head_ms = median([r["head_ms"] for r in runs])
    ms = sum(layer_ms) / len(layer_ms) * stage_layers
    ms += (embed_ms if cfg.include_embedding else 0.0) + (head_ms if cfg.include_head else 0.0)
    return {"L": L, "x": x, "ms": ms, "stage": 0, "layer_ms": layer_ms, "embed_ms": embed_ms,
            "head_ms": head_ms, "wall_ms": median([r["wall_ms"] for r in runs]), "backend": "hf"}


__all__ = ["profile_hf", "load_model", "load_config", "default_max_len", "resolve_device"]
