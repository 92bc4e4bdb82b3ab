"""`sglang-cpp tune layout`: rank the parallel layouts of N GPUs for long prefill on the analytic model.

For every TP x PP (x V virtual stages) of --gpus: whether it fits in memory (weights plus the KV of the
longest prompt per GPU, under the cost-balanced layer partition; the others listed with the reason), its
best chunk policy (the plan, or a fixed chunk of --fixed-chunks) and predicted TTFT per length, the
lengths where the winner changes, and the winner's launch flags with SGLANG_PP_LAYER_PARTITION. Virtual
stages (V > 1) are priced by the simulator (whatif/virtual_pp.py); SGLang 0.5.23 has no flag for them.
Attention CP inside a stage (--cp-sizes; SGLang's --attn-cp-size, carved out of the TP group) is priced by
the analytic model's CP terms (whatif/analytic.py).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ...args import add_model_source, alias, parse_fraction, parse_ints, parse_len, parse_lens, progress_bar
from ...core.partition import default_partition, format_partition
from ...whatif.layout import TIE_BAND, ties
from ...whatif.specs import DEVICES
from ...tuning import config_from_args


@dataclass(frozen=True)
class LayoutConfig:
    """Every field is a flag of `sglang-cpp tune layout`."""

    analytic: str
    device: str | None = None  # --gpu: required (the ranking depends on it; none is assumed)
    gpus: int = 8
    input_lens: tuple = (32768, 131072, 1048576)
    virtual_stages: tuple = (1, 2, 4)
    cp_sizes: tuple = (1, 2, 4, 8)  # attention CP degrees tried; each must divide the layout's TP
    fixed_chunks: tuple = (4096, 8192, 16384, 32768)
    efficiency: float | None = None
    chunk_overhead_ms: float | None = None
    mem_gb: float | None = None
    mem_fraction: float = 0.88
    max_tp: int = 8
    context_length: int | None = None
    json: str | None = None
    plot: str | None = None

    def __post_init__(self):
        if self.analytic:  # the GPU preset is required: none is assumed (specs.device_of, every command's check)
            from ...whatif.specs import device_of

            device_of(self.device)
        if self.context_length is not None and max(self.input_lens) > self.context_length:
            raise ValueError(f"--input-len {max(self.input_lens)} is above --context-length {self.context_length}: "
                             "drop the length or raise the context length")
        if any(v < 1 for v in (*self.virtual_stages, *self.fixed_chunks, *self.cp_sizes)):
            raise ValueError("--virtual-stages, --fixed-chunks and --cp-sizes take integers >= 1")
        if self.max_tp < 1:
            raise ValueError(f"--max-tp={self.max_tp} must be >= 1")


def _k(n: int) -> str:
    return f"{n // 1048576}M" if n % 1048576 == 0 else f"{n // 1024}K" if n % 1024 == 0 else str(n)


def wrap_flags(line: str, width: int) -> str:
    """A launch line in lines of at most `width`, broken only between words: a flag (--pp-size) or a value is never
    split at its hyphens, so the figure's line can be pasted back together."""
    import textwrap

    return "\n".join(textwrap.wrap(line, width, break_on_hyphens=False, break_long_words=False))


def launch_flags(cfg: LayoutConfig, r, S: int, num_layers: int) -> str:
    """The winner's launch line at length S (its best policy there)."""
    pol, C, _ = r.best[S]
    lay = r.layout
    env = "" if tuple(r.parts) == tuple(default_partition(num_layers, lay.pp)) or lay.pp == 1 else \
        f"SGLANG_PP_LAYER_PARTITION={format_partition(r.parts)} "
    from ...whatif.analytic import MODELS

    path = f"<{cfg.analytic} checkpoint>" if cfg.analytic in MODELS else cfg.analytic  # a folder given: itself
    cmd = f"{env}python -m sglang.launch_server --model-path {shlex.quote(path)} --tp-size {lay.tp} " \
          f"--pp-size {lay.pp} --chunked-prefill-size {C}" + (" --enable-dynamic-chunking" if pol == "plan" else "") + \
        (f" --attn-cp-size {lay.cp} --enable-prefill-cp --cp-strategy zigzag" if lay.cp > 1 else "")
    return cmd + ("  # virtual PP: not in SGLang 0.5.23 (#39279)" if lay.v > 1 else "")


def render(cfg: LayoutConfig, ranked, win, cross, num_layers: int) -> str:
    lens = sorted(cfg.input_lens)
    ok = [r for r in ranked if not r.reason]
    out = [f"{cfg.analytic} on {cfg.gpus} x {cfg.device}: predicted TTFT (s) of each layout's best chunk policy",
           "", "| layout | partition | GB per GPU | " + " | ".join(_k(S) for S in lens) + " |",
           "|---|---|---:|" + "---:|" * len(lens)]
    tied = {S: ties(ranked, S) for S in lens}
    for r in sorted(ok, key=lambda r: r.best[lens[-1]][2]):
        cells = [f"{r.best[S][2] / 1e3:.2f} ({r.best[S][0]}{'' if r.best[S][0] == 'plan' else ' ' + _k(r.best[S][1])})"
                 + (" **best**" if win[S] is r else " tie" if r in tied[S] else "") for S in lens]
        out.append(f"| {r.layout.name} | {format_partition(r.parts)} | {r.mem_gb:.1f} | " + " | ".join(cells) + " |")
    out += ["", f"'tie': within {TIE_BAND:.0%} of the fastest, inside the analytic model's error (it predicts the "
                "blog's published TTFTs within 0.99-1.03x); '**best**': of the fastest and its ties, the one with the "
                "least memory per GPU (KV and activation headroom)"]
    bad = [r for r in ranked if r.reason]
    if bad:
        out += ["", "Infeasible:"] + [f"- {r.layout.name}: {r.reason}" for r in bad]
    out += [""] + ([f"Crossover between {_k(a)} and {_k(b)}: {w1} -> {w2}" for a, b, w1, w2 in cross]
                   or [f"No crossover beyond the model's error: {win[lens[0]].layout.name} wins or ties at every "
                       "length" if all(win[lens[0]] in tied[S] for S in lens) else
                       "No crossover beyond the model's error between consecutive lengths"])
    out += ["", "Winner's launch line per length:"]
    out += [f"  {_k(S)}: {launch_flags(cfg, win[S], S, num_layers)}" for S in lens]
    return "\n".join(out)


def to_json(cfg: LayoutConfig, ranked, win, cross) -> dict:
    return {"config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
            "layouts": [{"tp": r.layout.tp, "pp": r.layout.pp, "virtual_stages": r.layout.v, "attn_cp": r.layout.cp,
                         "name": r.layout.name,
                         "partition": list(r.parts), "mem_gb": r.mem_gb, "infeasible": r.reason or None,
                         "best": {str(S): {"policy": p, "chunk": C, "ttft_ms": ms} for S, (p, C, ms) in r.best.items()},
                         "ttft_ms": {str(S): v for S, v in r.all_ms.items()}} for r in ranked],
            "winners": {str(S): r.layout.name for S, r in win.items()},
            "crossovers": [{"from_len": a, "to_len": b, "below": w1, "above": w2} for a, b, w1, w2 in cross]}


def plot(path: str, cfg: LayoutConfig, ranked, win: dict, num_layers: int, top: int = 5) -> Path:
    """One panel per input length: its `top` layouts' predicted TTFT relative to the best, the tie band (the
    analytic model's error) shaded, ties and the winner labelled, the winner's launch line under the panel."""
    from ...files import pyplot, save_figure

    plt = pyplot()
    lens = sorted(cfg.input_lens)
    fig, axes = plt.subplots(len(lens), 1, figsize=(7.5, 2.3 * len(lens)), squeeze=False)
    for ax, S in zip(axes[:, 0], lens):
        ok = sorted((r for r in ranked if not r.reason), key=lambda r: r.best[S][2])[:top]
        best, tied = ok[0].best[S][2], ties(ranked, S)
        ax.axvspan(1.0, 1.0 + TIE_BAND, color="0.85", label=f"tie band ({TIE_BAND:.0%}: the model's error)")
        for k, r in enumerate(ok):
            rel = r.best[S][2] / best
            ax.barh(k, rel, color="tab:green" if r is win[S] else "tab:blue" if r in tied else "0.6")
            tag = "best" if r is win[S] else "tie" if r in tied else f"+{rel - 1:.1%}"
            ax.text(rel, k, f" {r.best[S][2] / 1e3:.2f} s, {tag}", va="center", fontsize=7)
        ax.set_yticks(range(len(ok)), [r.layout.name for r in ok], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0.95, max(1.0 + 2 * TIE_BAND, max(r.best[S][2] / best for r in ok) * 1.15))
        ax.set_title(f"{_k(S)} tokens: TTFT / best (PREDICTED)", fontsize=8, loc="left")
        ax.set_xlabel(wrap_flags(launch_flags(cfg, win[S], S, num_layers), 110), fontsize=6)
    axes[0, 0].legend(fontsize=6, loc="lower right")
    fig.suptitle(f"{cfg.analytic} on {cfg.gpus} x {cfg.device}: the best {top} layouts per length", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)


def add_args(p: argparse.ArgumentParser) -> None:
    d = LayoutConfig(analytic="")
    add_model_source(p.add_argument, required=True)
    p.add_argument("--gpu", dest="device", default=d.device, metavar="GPU",
                   help=f"GPU preset (required), any case: {', '.join(sorted(DEVICES))}")
    p.add_argument("--gpus", type=int, default=d.gpus, help="GPUs for one prefill instance (TP x PP)")
    p.add_argument("--input-len", dest="input_lens", metavar="LEN[,LEN...]", type=parse_lens, default=d.input_lens,
                   help="prompt lengths, e.g. 32k,128k,1m")
    p.add_argument("--virtual-stages", type=parse_ints, default=d.virtual_stages, help="V values to try (1: plain PP)")
    p.add_argument("--cp-sizes", type=parse_ints, default=d.cp_sizes,
                   help="attention CP degrees to try inside each TP group (SGLang's --attn-cp-size; 1: none)")
    p.add_argument("--fixed-chunks", type=parse_ints, default=d.fixed_chunks, help="fixed chunk sizes tried beside the plan")
    p.add_argument("--efficiency", type=parse_fraction, default=None, help="fraction of peak (default: the preset's)")
    p.add_argument("--chunk-overhead-ms", type=float, default=None,
                   help="per chunk (per visit with V > 1) and stage; default the preset's")
    p.add_argument("--mem-gb", type=float, default=None, help="HBM per GPU (default: the preset's)")
    p.add_argument("--mem-fraction", type=float, default=d.mem_fraction,
                   help="share of HBM for weights and KV (SGLang's --mem-fraction-static)")
    p.add_argument("--max-tp", type=int, default=d.max_tp, help="largest TP (GPUs per node)")
    p.add_argument("--context-length", type=parse_len, default=None, help="the model's context (lengths above fail)")
    p.add_argument("--json", default=None, metavar="OUT.json", help="also write every layout's figures as strict JSON")
    p.add_argument("--plot", default=None, metavar="OUT.png", help="PNG of each length's best layouts against the fastest")
    p.add_argument("--disable-tqdm", action="store_true", help="no progress bar (stderr)")
    alias(p, "--input-len", "--input-lens")
    alias(p, "--gpu", "--device")


def run(args) -> int:
    from ...whatif.analytic import device_of, model_of
    from ...whatif.layout import crossovers, rank_layouts, winners

    cfg = config_from_args(LayoutConfig, args)
    flag = getattr(args, "model_flag", "--analytic")
    model = model_of(cfg.analytic, flag)
    ctx = model.max_context
    if ctx and max(cfg.input_lens) > ctx and cfg.input_lens == LayoutConfig.input_lens:  # the defaults: trimmed
        kept = tuple(n for n in cfg.input_lens if n <= ctx) or (ctx,)
        print(f"note: {flag} {cfg.analytic} serves at most {ctx} tokens (its config.json, as SGLang derives it): "
              f"the default lengths past it are left out ({', '.join(map(str, kept))} ranked)", file=sys.stderr)
        cfg = replace(cfg, input_lens=kept)
    from ..cost_source import CostSource

    CostSource(analytic=cfg.analytic, model_flag=flag).check_lengths(cfg.input_lens)
    dev = device_of(cfg.device)
    dev = replace(dev, **{k: v for k, v in (("efficiency", cfg.efficiency), ("mem_gb", cfg.mem_gb)) if v is not None})
    ranked = rank_layouts(model, dev, cfg.gpus, cfg.input_lens, virtual_stages=cfg.virtual_stages,
                          fixed_chunks=cfg.fixed_chunks, chunk_overhead_ms=cfg.chunk_overhead_ms,
                          mem_fraction=cfg.mem_fraction, max_tp=cfg.max_tp, cp_sizes=cfg.cp_sizes,
                          progress=progress_bar("tune layout", "layout", getattr(args, "disable_tqdm", False)))
    win = winners(ranked)
    if not ranked or not win:
        why = "; ".join(f"{r.layout.name}: {r.reason}" for r in ranked) or "no TP x PP split of the GPUs"
        raise ValueError(f"--gpus {cfg.gpus}: no layout of {cfg.analytic} on {cfg.device} fits ({why}); raise --gpus "
                         "or shorten --input-len")
    cross = crossovers(win, ranked)
    print(render(cfg, ranked, win, cross, model.num_layers))
    if cfg.json:
        from ...files import save_json

        print(f"wrote {save_json(cfg.json, to_json(cfg, ranked, win, cross))}")
    if cfg.plot:
        print(f"wrote {plot(cfg.plot, cfg, ranked, win, model.num_layers)}")
    return 0


__all__ = ["LayoutConfig", "launch_flags", "render", "to_json", "add_args", "run"]
