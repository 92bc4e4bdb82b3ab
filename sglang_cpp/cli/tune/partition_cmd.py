"""`sglang-cpp tune partition`: a cost-balanced SGLANG_PP_LAYER_PARTITION, with the gain it buys.

Why: SGLang splits layers evenly by count, but stage 0 also embeds and the last stage runs lm_head,
and dense/MoE layers differ; the slowest stage paces every chunk. Per-layer costs come from a
profile's per-layer breakdown (`sglang-cpp profile --backend hf` stores layer_ms, embed_ms,
head_ms) or from the analytic FLOP model, at one chunk shape (L, x).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace

import numpy as np

from ...core.partition import default_partition, parse_partition, partition_layers, stage_times_for
from ...tuning import config_from_args

DEFAULT_CHUNK = 4096  # analytic default shape: a 4K chunk over an empty prefix


@dataclass(frozen=True)
class PartitionConfig:
    """Every field is a flag of `sglang-cpp tune partition`."""

    pp_size: int
    profile: str | None = None
    analytic: str | None = None
    device: str | None = None  # --gpu: required with --analytic / --model-path (none is assumed)
    tp: int = 1
    dtype: str | None = None
    num_layers: int | None = None
    prefix_len: int | None = None
    chunk: int | None = None
    mem_limit_gb: float | None = None
    json: str | None = None  # also write the result here

    def __post_init__(self):
        if bool(self.profile) == bool(self.analytic):
            raise ValueError("give exactly one cost source: --profile PROFILE (with a per-layer breakdown) "
                             "or --analytic MODEL --gpu GPU --tp-size N")
        if self.analytic:  # the GPU preset is required: none is assumed (specs.device_of, every command's check)
            from ...whatif.specs import device_of

            device_of(self.device)
        for name in ("pp_size", "tp"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"--{name.replace('_', '-')}={v!r} must be an integer >= 1")
        if self.num_layers is not None and self.num_layers < self.pp_size:
            raise ValueError(f"--num-layers {self.num_layers} is below --pp-size {self.pp_size}; "
                             "every stage needs >= 1 layer")
        if self.prefix_len is not None and self.prefix_len < 0:
            raise ValueError(f"--prefix-len {self.prefix_len} must be >= 0")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"--chunked-prefill-size {self.chunk} must be >= 1")
        if self.mem_limit_gb is not None and not (math.isfinite(self.mem_limit_gb) and self.mem_limit_gb > 0):
            raise ValueError(f"--mem-limit-gb {self.mem_limit_gb} must be a number > 0")
        if self.mem_limit_gb is not None and self.profile:
            raise ValueError("--mem-limit-gb needs per-layer weight sizes, which only --analytic MODEL provides; "
                             "drop --mem-limit-gb or use --analytic")


@dataclass(frozen=True)
class LayerCosts:
    layers: tuple  # ms per layer
    embed: float
    head: float
    source: str
    layer_gb: tuple | None = None
    embed_gb: float = 0.0
    head_gb: float = 0.0


def analytic_costs(cfg: PartitionConfig, flag: str = "--analytic") -> LayerCosts:
    from ...whatif.analytic import check_tp, device_of, embedding_ms, lm_head_ms, model_of, per_layer_costs

    model = model_of(cfg.analytic, flag)
    check_tp(model, cfg.tp)
    dev = device_of(cfg.device)
    if cfg.num_layers is not None and cfg.num_layers != model.num_layers:
        model = replace(model, num_layers=cfg.num_layers,
                        num_dense_layers=min(model.num_dense_layers, cfg.num_layers))
    L = cfg.prefix_len or 0
    x = cfg.chunk or DEFAULT_CHUNK
    costs = per_layer_costs(model, dev, L, x, tp=cfg.tp, dtype=cfg.dtype)
    gb = lambda params, nbytes: params * nbytes / cfg.tp / 1e9  # noqa: E731  (TP shards weights)
    table = gb(model.vocab_size * model.hidden_size, 2)  # bf16 embedding / lm_head, vocab-parallel
    return LayerCosts(layers=tuple(float(c) for c in costs), embed=float(embedding_ms(model, dev, x)),
                      head=float(lm_head_ms(model, dev, cfg.tp)),
                      source=f"analytic {cfg.analytic} on {cfg.device} (tp={cfg.tp}) at L={L}, x={x}",
                      layer_gb=tuple(gb(model.layer_params(i, active=False), model.weight_bytes)
                                     for i in range(model.num_layers)),
                      embed_gb=table, head_gb=table)


def profile_costs(cfg: PartitionConfig) -> tuple[LayerCosts, list[str]]:
    """Median per-layer breakdown at the requested (L, x) (nearest measured), else the largest shape."""
    from ...tuning.fit import read_profile

    where = f"profile {cfg.profile}"
    doc, samples = read_profile(cfg.profile)
    rows = [s for s in samples if isinstance(s.get("layer_ms"), list) and s["layer_ms"]]
    if not rows:
        raise ValueError(f"{where} has no per-layer breakdown (samples lack 'layer_ms'); profile with "
                         "`sglang-cpp profile --backend hf`, or use --analytic MODEL")
    notes = []
    points = sorted({(s["L"], s["x"]) for s in rows})
    if cfg.prefix_len is None and cfg.chunk is None:
        pt = max(points, key=lambda p: (p[0] + p[1], p[1]))
    else:
        want = (cfg.prefix_len if cfg.prefix_len is not None else 0,
                cfg.chunk if cfg.chunk is not None else max(p[1] for p in points))
        dist = lambda p: abs(math.log1p(p[0]) - math.log1p(want[0])) + abs(math.log(p[1] / want[1]))  # noqa: E731
        pt = min(points, key=dist)
        if pt != want:
            notes.append(f"no samples at L={want[0]}, x={want[1]}: using the nearest measured shape "
                         f"L={int(pt[0])}, x={int(pt[1])}")
    sel = [s for s in rows if (s["L"], s["x"]) == pt]
    K = {len(s["layer_ms"]) for s in sel}
    if len(K) != 1:
        raise ValueError(f"{where}: samples at L={pt[0]}, x={pt[1]} have different layer counts {sorted(K)}")
    K = K.pop()
    try:
        layer = np.median(np.array([s["layer_ms"] for s in sel], dtype=float), axis=0)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: layer_ms must be lists of numbers (ms per layer)") from None
    if not np.all(np.isfinite(layer)) or np.any(layer < 0):
        raise ValueError(f"{where}: layer_ms at L={pt[0]}, x={pt[1]} has negative or non-finite times; re-profile")
    meta = doc.get("meta", {})
    N = cfg.num_layers or int(meta.get("num_hidden_layers") or meta.get("num_layers") or K)
    if N < K:
        raise ValueError(f"--num-layers {N} is below the {K} layers measured in {where}; pass the model's "
                         f"num_hidden_layers (>= {K})")
    if N > K:
        notes.append(f"{where} measured {K} of {N} layers: layers {K}..{N - 1} take the measured mean "
                     f"({layer.mean():.3f} ms)")
        layer = np.concatenate([layer, np.full(N - K, layer.mean())])
    med = lambda k: float(np.median([float(s.get(k) or 0.0) for s in sel]))  # noqa: E731
    return LayerCosts(layers=tuple(float(v) for v in layer), embed=med("embed_ms"), head=med("head_ms"),
                      source=f"{where} at L={int(pt[0])}, x={int(pt[1])} (median of {len(sel)} sample(s))"), notes


def compare(cfg: PartitionConfig, lc: LayerCosts) -> dict:
    """Our split against SGLang's default: stage times, bottlenecks and the gain."""
    N, P = len(lc.layers), cfg.pp_size
    mem = {}
    if cfg.mem_limit_gb is not None:
        mem = dict(layer_mem=lc.layer_gb, mem_limit=cfg.mem_limit_gb, embed_mem=lc.embed_gb, head_mem=lc.head_gb)
    try:
        ours = partition_layers(lc.layers, P, embed_cost=lc.embed, head_cost=lc.head, **mem)
    except ValueError as exc:
        raise ValueError(f"--mem-limit-gb {cfg.mem_limit_gb:g}: {exc}" if mem else str(exc)) from None
    parse_partition(ours.as_string(), N, P)  # the string we print must be one SGLang accepts
    dflt = default_partition(N, P)
    dtimes = stage_times_for(dflt, lc.layers, lc.embed, lc.head)
    return {"ours": ours, "default": dflt, "default_times": dtimes,
            "gain": max(dtimes) / ours.bottleneck if ours.bottleneck > 0 else 1.0}


def render(cfg: PartitionConfig, lc: LayerCosts, res: dict) -> str:
    ours, dflt, dt = res["ours"], res["default"], res["default_times"]
    lay = np.array(lc.layers)
    lines = [f"per-layer costs: {lc.source}",
             f"  {len(lay)} layers, ms/layer min {lay.min():.4g} median {np.median(lay):.4g} max {lay.max():.4g}; "
             f"embedding {lc.embed:.4g} ms (stage 0), lm_head {lc.head:.4g} ms (last stage)", "",
             ours.env, "",
             f"{'stage':>5} {'ours: layers':>13} {'ms':>11}   {'default: layers':>16} {'ms':>11}"]
    for s in range(cfg.pp_size):
        lines.append(f"{s:>5} {ours.parts[s]:>13} {ours.stage_times[s]:>11.4g}   {dflt[s]:>16} {dt[s]:>11.4g}")
    lines.append(f"bottleneck (the pipeline's pace): ours {ours.bottleneck:.4g} ms, default {max(dt):.4g} ms "
                 f"-> gain {res['gain']:.4f}x (higher is better)")
    if cfg.mem_limit_gb is not None:
        use = lambda parts: max(stage_times_for(parts, lc.layer_gb, lc.embed_gb, lc.head_gb))  # noqa: E731
        lines.append(f"weights per stage (max): ours {use(ours.parts):.2f} GB, default {use(dflt):.2f} GB, "
                     f"limit {cfg.mem_limit_gb:g} GB (KV cache not included)")
    lines.append(f"use: {ours.env} python -m sglang.launch_server ... --pp-size {cfg.pp_size}")
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser) -> None:
    from ...args import add_model_source, alias, parse_gemm_dtype, parse_len, positive_int

    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", help="profile JSON with per-layer breakdown (layer_ms, embed_ms, head_ms)")
    add_model_source(src.add_argument)
    p.add_argument("--gpu", dest="device", default=None,
                   help="GPU preset, required with --model-path (H100, H200, H20, B200, MI300X, ...; any case)")
    p.add_argument("--tp-size", dest="tp", type=int, default=1, help="tensor parallel size (--analytic)")
    alias(p, "--tp-size", "--tp")
    alias(p, "--gpu", "--device")
    p.add_argument("--dtype", type=parse_gemm_dtype, default=None, metavar="DTYPE",
      help="GEMM dtype in SGLang's words: auto (the checkpoint's, the default), bfloat16, float16, fp8")
    p.add_argument("--pp-size", type=positive_int, required=True, metavar="N", help="pipeline stages (SGLang's --pp-size)")
    p.add_argument("--num-layers", type=int, default=None,
                   help="model layers (default: the model's / the profile's num_hidden_layers)")
    p.add_argument("--prefix-len", type=parse_len, default=None, help="chunk shape: cached prefix L (default 0)")
    p.add_argument("--chunked-prefill-size", dest="chunk", type=parse_len, default=None,
                   help=f"chunk shape: x new tokens (analytic default {DEFAULT_CHUNK}; "
                        "profile default: the largest measured)")
    alias(p, "--chunked-prefill-size", "--chunk")
    p.add_argument("--mem-limit-gb", type=float, default=None, help="max weight GB per stage (--analytic)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write the result (strict JSON)")


def run(args) -> int:
    cfg = config_from_args(PartitionConfig, args)
    lc, notes = profile_costs(cfg) if cfg.profile else (analytic_costs(cfg, getattr(args, "model_flag", "--analytic")), [])
    for n in notes:
        print(f"note: {n}")
    res = compare(cfg, lc)
    print(render(cfg, lc, res))
    if cfg.json:
        from ...files import save_json

        ours = res["ours"]
        doc = {"source": lc.source, "notes": notes, "pp_size": cfg.pp_size, "partition": list(ours.parts),
               "env": ours.env, "stage_ms": [float(t) for t in ours.stage_times],
               "default_partition": list(res["default"]),
               "default_stage_ms": [float(t) for t in res["default_times"]], "gain": float(res["gain"])}
        print(f"wrote {save_json(cfg.json, doc)}")
    return 0


__all__ = ["PartitionConfig", "LayerCosts", "analytic_costs", "profile_costs", "compare", "render", "add_args", "run"]
