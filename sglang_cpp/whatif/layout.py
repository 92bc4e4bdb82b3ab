"""Parallel layouts of a GPU count for long prefill, ranked on the analytic model.

Why: nobody answers "PP8 x TP4, or PP4 x TP8, for my 1M prompts?" for chunked prefill. SGLang's own
long-context runs pick the PP depth per length by hand, and NVIDIA's aiconfigurator leaves chunked
prefill x PP out. Here every layout TP x PP (x V virtual stages) of the GPUs is checked against memory
(weights plus the KV of the longest prompt, per GPU, under the cost-balanced layer partition), and each
one that fits gets its best chunk policy, predicted by the pipeline simulator, per length. Each layer's
collectives are charged on the device's link (`analytic.layer_comm_ms`); one GEMM efficiency serves every
shape, so TP's and CP's smaller GEMMs are not penalised. Attention CP inside a stage (SGLang's
--attn-cp-size, carved out of the TP group) is priced by `analytic._layer_coefs`: the same attention and
FFN FLOPs per GPU as TP, the replicated parts (MLA latent projections, extra KV heads) on x/cp tokens, the
MLA prefix rebuild on every CP rank, and CP's all-gathers in place of part of TP's all-reduce.

Pure numpy: the analytic model, the partitioner, the planner and the simulators.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core.partition import default_partition, partition_layers
from ..core.policy import chunks_for
from .analytic import DeviceSpec, ModelSpec, embedding_ms, kv_bytes_per_token, lm_head_ms, per_layer_costs
from .analytic_fit import priced_stages, stage_models
from .simulator import SimConfig, simulate
from .virtual_pp import simulate_virtual

PARTITION_CHUNK = 4096  # per-layer costs for the partition: a 4K chunk over an empty prefix (tune partition's)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    v: int = 1  # virtual stages per rank
    cp: int = 1  # attention CP inside the TP group (--attn-cp-size); attention TP is tp / cp

    @property
    def name(self) -> str:
        return f"TP{self.tp}" + (f" (CP{self.cp})" if self.cp > 1 else "") + f" x PP{self.pp}" + \
            (f" x V{self.v}" if self.v > 1 else "")


@dataclass(frozen=True)
class Ranked:
    """One layout: its partition and memory, why it is infeasible (or ""), and per length the best policy
    {length: (policy label, chunk size C, TTFT ms)} with every policy's TTFT in `all_ms`."""

    layout: Layout
    parts: tuple = ()
    mem_gb: float = 0.0  # the fullest GPU: weights + KV of the longest prompt
    reason: str = ""
    best: dict = field(default_factory=dict)
    all_ms: dict = field(default_factory=dict)


def layouts(gpus: int, num_layers: int, max_tp: int = 8, virtual_stages=(1,), cp_sizes=(1,)) -> list[Layout]:
    """TP a power of two up to max_tp (one node) dividing the GPU count, PP the rest; each CP of `cp_sizes`
    that divides TP (CP shares the TP group's GPUs); V > 1 only with PP > 1 and at least one layer per
    virtual stage."""
    if not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus={gpus!r} must be an integer >= 1")
    out = []
    tp = 1
    while tp <= min(max_tp, gpus):
        if gpus % tp == 0 and gpus // tp <= num_layers:
            pp = gpus // tp
            out += [Layout(tp, pp, v, cp) for cp in sorted(set(cp_sizes)) if tp % cp == 0
                    for v in virtual_stages if v == 1 or (pp > 1 and pp * v <= num_layers)]
        tp *= 2
    return out


def _layer_gb(model: ModelSpec, tp: int, tokens: int, kv_bytes: int = 2, cp: int = 1) -> list[float]:
    """Per layer, the GB one GPU holds: its attention-TP rank's attention weights (with what is replicated),
    a TP shard of the FFN (every expert), and the KV of `tokens` tokens for its attention-TP rank (with CP,
    every CP rank holds the whole prefix)."""
    kv = kv_bytes_per_token(model, tp // cp, kv_bytes) * tokens
    attn = model.attn_rank_params(tp // cp)
    return [((attn + model.ffn_params(i, active=False) / tp) * model.weight_bytes + kv) / 1e9
            for i in range(model.num_layers)]


def _table_gb(model: ModelSpec, tp: int) -> float:
    """The bf16 embedding (first stage) or LM head (last stage), vocab-parallel over TP."""
    return model.vocab_size * model.hidden_size * 2 / tp / 1e9


def stage_memory_gb(model: ModelSpec, parts, tp: int, tokens: int, cp: int = 1) -> list[float]:
    """Per stage, the GB one GPU holds: its layers' weights and KV of `tokens` tokens, plus the embedding on
    the first stage and the LM head on the last."""
    per, table, out, first = _layer_gb(model, tp, tokens, cp=cp), _table_gb(model, tp), [], 0
    for s, n in enumerate(parts):
        out.append(sum(per[first:first + n]) + table * ((s == 0) + (s == len(parts) - 1)))
        first += n
    return out


def partition_for(model: ModelSpec, device: DeviceSpec, tp: int, pp: int, tokens: int, limit_gb: float,
                  cp: int = 1) -> tuple:
    """The cost-balanced layer partition whose every stage fits `limit_gb` with the KV of `tokens` tokens;
    ValueError (the partitioner's, naming the totals) when none does."""
    if pp == 1:
        if stage_memory_gb(model, (model.num_layers,), tp, tokens, cp)[0] > limit_gb:
            raise ValueError("one stage does not fit")
        return (model.num_layers,)
    table = _table_gb(model, tp)
    return partition_layers(per_layer_costs(model, device, 0, PARTITION_CHUNK, tp=tp, cp=cp), pp,
                            embed_cost=float(embedding_ms(model, device, PARTITION_CHUNK)),
                            head_cost=lm_head_ms(model, device, tp), layer_mem=_layer_gb(model, tp, tokens, cp=cp),
                            mem_limit=limit_gb, embed_mem=table, head_mem=table).parts


def rank_layouts(model: ModelSpec, device: DeviceSpec, gpus: int, lengths, *, virtual_stages=(1,),
                 fixed_chunks=(4096, 8192, 16384, 32768), chunk_overhead_ms: float | None = None,
                 mem_fraction: float = 0.88, max_tp: int = 8, cp_sizes=(1,), progress=None) -> list[Ranked]:
    """Every layout of `gpus` GPUs, feasible ones with their best policy per length; the plan (whose
    chunks do not depend on C) and fixed chunks of `fixed_chunks` are the policies tried. `progress`: wraps the
    list of layouts (the CLI's tqdm bar; None: none)."""
    if device.mem_gb <= 0:
        raise ValueError(f"device {device.name} has no memory size: give --mem-gb")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"--mem-fraction={mem_fraction!r} must be in (0, 1]")
    lengths = sorted(int(v) for v in lengths)
    if not lengths or lengths[0] < 1:
        raise ValueError(f"--input-len {lengths}: give one or more lengths >= 1")
    o = device.chunk_overhead_ms if chunk_overhead_ms is None else float(chunk_overhead_ms)
    limit = device.mem_gb * mem_fraction
    cap = max(fixed_chunks)
    cfg = SimConfig()
    split: dict = {}  # (tp, pp, cp) -> what V does not change: the partition, the stage models, every policy's chunks

    def per_split(tp: int, pp: int, cp: int):
        if (tp, pp, cp) not in split:
            try:
                parts = partition_for(model, device, tp, pp, lengths[-1], limit, cp)
            except ValueError:
                parts = default_partition(model.num_layers, pp)
                mem = stage_memory_gb(model, parts, tp, lengths[-1], cp)
                s = max(range(pp), key=lambda i: mem[i])
                split[(tp, pp, cp)] = (tuple(parts), max(mem), None, (
                    f"no layer split fits: even split's fullest GPU (stage {s}) needs {mem[s]:.1f} GB for weights and "
                    f"the KV of {lengths[-1]} tokens, over {limit:.1f} GB ({mem_fraction:g} of {device.mem_gb:g} GB)"))
            else:
                cost = priced_stages(model, device, tp, pp, o, parts=parts, tp_comm=True, cp=cp)
                chunks = {(S, pol, C): chunks_for(pol, S, cost, pp, C, max_prefill=cap)
                          for S in lengths for pol, C in [("plan", cap)] + [("fixed", C) for C in fixed_chunks]}
                split[(tp, pp, cp)] = (tuple(parts), max(stage_memory_gb(model, parts, tp, lengths[-1], cp)),
                                       (cost, chunks), "")
        return split[(tp, pp, cp)]

    out = []
    todo = layouts(gpus, model.num_layers, max_tp, virtual_stages, cp_sizes)
    for lay in (progress(todo) if progress else todo):
        parts, mem, planned, reason = per_split(lay.tp, lay.pp, lay.cp)
        if reason:
            out.append(Ranked(lay, parts, mem, reason=reason))
            continue
        cost, chunks = planned  # every stage with its per-chunk overhead
        best, every = {}, {}
        for S in lengths:
            got = {}
            for (S_, pol, C), ch in chunks.items():
                if S_ == S:
                    res = simulate_virtual(ch, cost, lay.pp, lay.v, cfg) if lay.v > 1 else simulate(ch, cost, lay.pp, cfg)
                    got[(pol, C)] = res.ttft_ms
            (pol, C), ms = min(got.items(), key=lambda kv: kv[1])
            best[S] = (pol, C, ms)
            every[S] = {f"{p}:{c}": v for (p, c), v in got.items()}
        out.append(Ranked(lay, parts, mem, best=best, all_ms=every))
    return out


def decode_ms(model: ModelSpec, device: DeviceSpec, tp: int, pp: int, context: int, parts=None,
              dtype: str | None = None) -> float:
    """One decode step of one request (batch 1) over a context of `context` tokens: every stage's roofline
    time for x = 1 in turn (weights and KV read, the layer collectives on the link), plus one activation hop
    per stage boundary at the link's latency and bandwidth. Why: seed doc B's layout rules are about decode
    latency; this checks them on the same model that ranks prefill layouts. No per-step scheduler overhead
    (CUDA graphs) and one link figure for every hop (doc B's PP hops cross nodes on InfiniBand)."""
    stages = stage_models(model, device, tp, pp, parts, dtype=dtype, tp_comm=True)
    hop = device.link_latency_ms + (model.hidden_size * 2 / (device.link_gbps * 1e9) * 1e3 if device.link_gbps else 0.0)
    return sum(float(s.time(context, 1)) for s in stages) + (pp - 1) * hop


def winners(ranked: list[Ranked], band: float | None = None) -> dict:
    """{length: the layout to run there}: of the feasible layouts within the model's error (`band`, TIE_BAND) of
    the fastest, the one with the least memory per GPU (its KV and activation headroom), then the faster."""
    ok = [r for r in ranked if not r.reason]
    if not ok:
        return {}
    return {S: min(ties(ranked, S, TIE_BAND if band is None else band), key=lambda r: (r.mem_gb, r.best[S][2]))
            for S in ok[0].best}


# The analytic model's stated error: it predicts the blog's Table 1 within 0.99-1.03x (tests/unit/test_analytic.py
# holds it within 5%), so layouts within 3% of the best are ties, not a ranking.
TIE_BAND = 0.03


def ties(ranked: list[Ranked], S: int, band: float = TIE_BAND) -> list[Ranked]:
    """The feasible layouts at length S within `band` of the best there, best first (the winner and its ties)."""
    ok = sorted((r for r in ranked if not r.reason), key=lambda r: r.best[S][2])
    return [r for r in ok if r.best[S][2] <= ok[0].best[S][2] * (1 + band)] if ok else []


def crossovers(win: dict, ranked: list[Ranked] | None = None, band: float = TIE_BAND) -> list[tuple]:
    """[(shorter length, longer length, winner below, winner above)] where the winner changes; with `ranked`, a
    change inside the model's error (the earlier winner within `band` of the new one at the longer length, or the
    new one within it at the shorter) is a tie, not a crossover."""
    lens = sorted(win)
    out = []
    for a, b in zip(lens, lens[1:]):
        if win[a].layout == win[b].layout:
            continue
        if ranked is not None and (win[a] in ties(ranked, b, band) or win[b] in ties(ranked, a, band)):
            continue
        out.append((a, b, win[a].layout.name, win[b].layout.name))
    return out


__all__ = ["Layout", "Ranked", "layouts", "stage_memory_gb", "partition_for", "rank_layouts", "winners", "crossovers",
           "ties", "TIE_BAND",
           "decode_ms"]
