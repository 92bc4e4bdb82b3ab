"""The experiment's results: a markdown table with ratios and the simulator's prediction beside each
row, and an optional bar chart. Reads the runner's entries; starts nothing."""
from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from ..machine import provenance_lines

POLICY_OF = {"fixed": "fixed", "dynamic": "quadratic", "plan": "plan", "pp1": "fixed"}  # kind -> simulated policy


def record(ent: dict | None, L: int) -> dict | None:
    """A runner entry's bench record for input length L (None: no such record)."""
    return next((r for r in (ent or {}).get("records") or [] if r["random_input_len"] == L), None)


def median(ent: dict | None, L: int) -> float | None:
    r = record(ent, L)
    return r["median_ttft_ms"] if r else None


@dataclass(frozen=True)
class Row:
    run: object  # experiment.Run
    L: int
    ent: dict | None  # the runner's entry; None: skipped (note says why)
    pred: float | None  # simulated TTFT (ms)
    note: str = ""

    def rec(self) -> dict | None:
        return record(self.ent, self.L)

    @property
    def median(self) -> float | None:
        return median(self.ent, self.L)


def predict_ttft(cfg, run, L: int, stages: list) -> float:
    """Simulated TTFT (ms) of the same server configuration from the per-stage calibration models."""
    from ..core.costmodel import COEFS, CostModel, PipelineCost
    from ..core.policy import chunks_for
    from ..whatif.simulator import simulate

    P = cfg.pp_size
    if len(stages) == 1:
        stages = stages * P
    if len(stages) != P:
        raise ValueError(f"calibration has {len(stages)} stage models; the PP={P} servers need {P}")
    if run.kind == "pp1":  # the whole model on one core: the stages' work, back to back
        stages, P = [CostModel(**{k: sum(getattr(m, k) for m in stages) for k in COEFS})], 1
    cost = stages[0] if P == 1 else PipelineCost(tuple(stages))
    chunks = chunks_for(POLICY_OF[run.kind], L, cost, P, run.chunk, sigma=run.sigma or 0.75, ctx=cfg.ctx)
    return simulate(chunks, stages, P).ttft_ms


def _f(v, spec=".1f") -> str:
    return "—" if v is None else format(v, spec)


def _ratio(a, b) -> str:
    return "—" if a is None or not b else f"{a / b:.3f}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()[:160]


def _best_of(rows, kind: str, L: int) -> float | None:
    meds = [r.median for r in rows if r.run.kind == kind and r.L == L and r.median is not None]
    return min(meds) if meds else None


def render(cfg, rows: list[Row], best: dict, cal: Path | None, cal_err: str, command: str) -> str:
    P = cfg.pp_size
    ents = list({id(r.ent): r.ent for r in rows if r.ent}.values())
    secs = sum(e.get("seconds", 0.0) for e in ents)
    warm = f" (warmup requests of {cfg.warmup_len} tokens)" if cfg.warmup_len else ""
    out = [f"# TTFT side by side: fixed chunks vs upstream dynamic chunking vs sglang-cpp plan (PP={P}, {cfg.device})",
           "", *provenance_lines(command, f" ({platform.node()})"),
           f"- model: `{cfg.model}`; context length {cfg.ctx or 'model default'}",
           f"- workload: random token ids, {cfg.num_requests} measured + {cfg.warmup} warmup request(s) per length "
           f"and server{warm}, max_new_tokens=1, concurrency 1, seed {cfg.seed}",
           f"- simulator cost model: {f'`{cal}`' if cal else 'none found'}{f' ({cal_err})' if cal_err else ''}",
           f"- server time: {secs / 60:.1f} min over {len(ents)} servers (start-up, calibration and requests; "
           "the whole run is this plus a few seconds)", "",
           "| config | chunk | input len | median TTFT (ms) | p90 TTFT (ms) | ok | vs upstream dynamic | "
           f"vs best fixed | PP{P} eff. vs PP1-1core | sim predicted (ms) | measured / predicted |",
           "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        r, med, L = row.rec(), row.median, row.L
        if row.ent is None:
            ok = _cell(f"skipped: {row.note}")
        elif row.ent["status"] != "ok":
            ok = _cell(f"server failed: {row.ent['reason'].splitlines()[0]}")
        else:
            ok = f"{r['completed']}/{r['num_prompts']}" if r else "no result"
            ok += f" ({_cell(row.note)})" if row.note else ""
        t_best = next((x.median for x in rows if x.run.kind == "fixed" and x.L == L and x.run.chunk == best.get(L)), None)
        t_pp1 = _best_of(rows, "pp1", L)
        name = row.run.label() + (" **(best)**" if row.run.kind == "fixed" and best.get(L) == row.run.chunk else "")
        eff = "—" if row.run.kind == "pp1" or med is None or t_pp1 is None else f"{t_pp1 / (P * med):.2f}"
        out.append(f"| {name} | {row.run.chunk or '—'} | {L} | {_f(med)} | {_f(r['p90_ttft_ms'] if r else None)} | "
                   f"{ok} | {_ratio(med, _best_of(rows, 'dynamic', L))} | {_ratio(med, t_best)} | {eff} | "
                   f"{_f(row.pred)} | {_ratio(med, row.pred)} |")
    out += ["", "- vs upstream dynamic / vs best fixed: median TTFT divided by that config's median at the same "
            "length (< 1 is faster); upstream dynamic is its best sigma.",
            f"- PP{P} eff. vs PP1-1core: strong-scaling efficiency T_pp1 / ({P} * T_pp{P}); 1.0 = perfect speed-up.",
            "- sim predicted: `sglang_cpp.whatif.simulator` on the chunk sequence each policy produces, with the per-stage "
            "calibration models (free P2P, no host overhead); PP=1 sums the stage models.",
            f"- upstream dynamic runs at base {cfg.dynamic_base} x the best fixed chunk, clamped to the input. " +
            ("SGLang's own profiling and fit at startup (`--upstream-profiling`)." if cfg.upstream_profiling else
             "Upstream's algorithm run by `SGLANG_CPP_POLICY=quadratic` (chunk-for-chunk equal to SGLang's "
             "`ChunkSizePredictor`, tests/server/test_server_e2e.py) on a, b, c fitted, as upstream fits them, to the "
             "calibration's fresh-prefill times at upstream's 128 profiling lengths (`*-upstream-C=*.json`); "
             "upstream's own startup profiling is skipped because it alone would exceed this benchmark's time."),
            f"- raw per-request results: the `.jsonl` next to this file; server logs under `{Path(cfg.results).stem}-logs/`."]
    out += _failed([(row.run.label(), row.ent["reason"]) for row in rows if row.ent and row.ent["status"] != "ok"])
    return "\n".join(out) + "\n"


def _failed(fails: list) -> list[str]:
    """The 'Failed servers' section: each failed configuration once, with its reason's tail."""
    out = ["", "## Failed servers", ""] if fails else []
    for label, reason in dict.fromkeys(fails):
        out += [f"- {label}:", "", "```", reason.strip()[-3000:], "```"]
    return out


def plot_bars(cfg, rows: list[Row], path) -> Path:
    """Median TTFT per configuration and length; the fastest at each length outlined."""
    from ..files import pyplot, save_figure

    plt = pyplot()
    colors = {"fixed": "tab:gray", "dynamic": "tab:orange", "plan": "tab:blue", "pp1": "tab:green"}
    fastest = {L: min((r.median for r in rows if r.L == L and r.median is not None), default=None)
               for L in cfg.input_lens}
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4.5))
    for i, r in enumerate(rows):
        if r.median is None:
            ax.text(i, 0, "failed" if r.ent else "skipped", ha="center", va="bottom", rotation=90, color="red")
            continue
        ax.bar(i, r.median, color=colors[r.run.kind], edgecolor="black" if r.median == fastest[r.L] else "none",
               linewidth=2)
        ax.text(i, r.median, f"{r.median:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"{r.run.label()}, {r.L}" for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("median TTFT (ms), lower is better")
    ax.set_title(f"{Path(cfg.model).name}: PP={cfg.pp_size} (fastest per length outlined)")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)


def _write(cfg, text: str) -> Path:
    out = Path(cfg.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text, flush=True)
    return out


def write_report(cfg, rows: list[Row], best: dict, cal, cal_err: str, command: str) -> Path:
    out = _write(cfg, render(cfg, rows, best, cal, cal_err, command))
    if cfg.plot:
        print(f"wrote {plot_bars(cfg, rows, cfg.plot)}")
    if cfg.json:
        from .report_json import row_json, save_results_json

        body = {"best_fixed_chunk": {str(L): C for L, C in best.items()}, "rows": [row_json(r) for r in rows]}
        print(f"wrote {save_results_json(cfg, command, body)}")
    return out


TIE = "tie (the spreads overlap)"


def verdict(ratio: float, limit: float, mine, theirs) -> str:
    """The one rule for a target against another configuration, both measured: where the two rows' ranges
    (min to max over their requests) overlap, the difference is inside the noise, a tie whichever way it
    points, and a tie never counts as met; apart, `ratio` <= `limit` is met, else MISSED."""
    if min(mine) <= max(theirs) and max(mine) >= min(theirs):
        return TIE
    return "met" if ratio <= limit else "MISSED"


def spread(vals, med: float) -> str:
    """A row's spread as the noise rule reads it (results/README.md): its min and max against its median."""
    return f"{min(vals) / med - 1:+.1%} / {max(vals) / med - 1:+.1%}"


# -- the tuning-free mode (--plan-chunks): interleaved rounds, no sweep --------------------------------
def _ttfts(ents: list, L: int) -> list[float]:
    """Every measured TTFT (s) of one configuration at length L, over its rounds' servers."""
    return [t for e in ents if e and e["status"] == "ok" and (r := record(e, L)) for t in r["ttfts"] if t > 0]


def _ran(ents: list, L: int) -> list:
    """The chunk sequences a plan configuration's requests ran (response meta_info), in order."""
    return [(p or {}).get("ran") for e in ents if e and e["status"] == "ok" and (r := record(e, L))
            for p in (r.get("chunk_plan") or [])]


def render_tuning_free(cfg, order: list, ents: dict, stages, cal, cal_err: str, command: str) -> str:
    import numpy as np

    from ..core.costmodel import PipelineCost
    from ..core.objective import fixed_split, makespan

    P = cfg.pp_size
    cost = None if not stages else (stages[0] if len(stages) == 1 else PipelineCost(tuple(stages)))
    secs = sum(e.get("seconds", 0.0) for es in ents.values() for e in es)
    names = ", ".join(r.key.split(":L=")[0] for r in order)
    out = ["# The plan without a sweep: plan at several C beside fixed chunks, interleaved "
           f"(PP={P}, {cfg.device})", "", *provenance_lines(command, f" ({platform.node()})"),
           f"- model: `{cfg.model}`; context length {cfg.ctx or 'model default'}",
           f"- {cfg.rounds} rounds, each starting every configuration in turn ({names}); per start "
           f"{cfg.warmup} warm-up request(s)" + (f" of {cfg.warmup_len} tokens" if cfg.warmup_len else "") +
           f" and {cfg.num_requests} measured; random token ids, seed {cfg.seed}, max_new_tokens=1",
           f"- served cost model: {f'`{cal}`' if cal else 'none reported'}{f' ({cal_err})' if cal_err else ''}",
           f"- server time: {secs / 60:.1f} min over {sum(map(len, ents.values()))} server starts", ""]
    for L in cfg.input_lens:
        got = {r.key: _ttfts(ents[r.key], L) for r in order}
        med = {k: float(np.median(v)) for k, v in got.items() if v}
        fixed = [r for r in order if r.kind == "fixed" and r.key in med]
        plan = [r for r in order if r.kind == "plan"]
        out += [f"## {L} tokens", "", "| config | TTFT per request (s) | median (s) | spread (min / max vs median) | "
                "vs best fixed | served model's prediction (s) | measured / predicted |", "|---|---|---:|---:|---:|---:|---:|"]
        best = min(fixed, key=lambda r: med[r.key]) if fixed else None
        b = med[best.key] if best else None
        for r in order:
            v = got[r.key]
            if not v:
                out.append(f"| {r.label()} | no successful request | — | — | — | — | — |")
                continue
            m = med[r.key]
            ch = fixed_split(L, r.chunk) if r.kind == "fixed" else next((c for c in _ran(ents[r.key], L) if c), None)
            pr = makespan(ch, 0, cost, P) / 1e3 if cost is not None and ch else None
            out.append(f"| {r.label()} | {' / '.join(f'{t:.2f}' for t in v)} | {m:.2f} | {spread(v, m)} | "
                       f"{_ratio(m, b)} | {_f(pr, '.2f')} | {_ratio(m, pr)} |")
        if best is None or not any(r.key in med for r in plan):
            out += ["", "No best fixed chunk or no plan result at this length: no targets.", ""]
            continue
        out += ["", f"Best fixed chunk: C={best.chunk}, median {b:.2f} s.", "", "| target | value | verdict |",
                "|---|---:|---|"]
        for r in plan:
            if r.key not in med:
                continue
            ratio = med[r.key] / b
            out.append(f"| plan C={r.chunk}: median <= 1.01x the best fixed | {ratio:.3f} | "
                       f"{verdict(ratio, 1.01, got[r.key], got[best.key])} |")
        pm = [med[r.key] for r in plan if r.key in med]
        out.append(f"| plan medians across C within 3% | {max(pm) / min(pm) - 1:.1%} | "
                   f"{'met' if max(pm) / min(pm) - 1 <= 0.03 else 'MISSED'} |")
        pooled = float(np.median([t for r in plan for t in got[r.key]]))
        out += ["", "Regret of each fixed chunk against the plan (its median over every C and round):", "",
                "| fixed C | median (s) | / plan |", "|---:|---:|---:|"]
        out += [f"| {r.chunk} | {med[r.key]:.2f} | {med[r.key] / pooled:.3f} |" for r in fixed]
        out += ["", "Chunks the plan servers ran (response meta_info):", ""]
        for r in plan:
            ran = _ran(ents[r.key], L)
            same = bool(ran) and all(c == ran[0] for c in ran)
            out.append(f"- C={r.chunk}: {ran[0] if ran else 'not reported'} (the same in all {len(ran)} requests: "
                       f"{'yes' if same else 'no'})")
        out.append("")
        out += _drift_table(cfg, order, ents, L, cost)
        out += _forward_table(order, ents, L, stages, P)
    out += _step_table(order, ents, P)
    out += ["A difference inside a row's spread is a tie, whichever way it points. Raw records: the `.jsonl` beside "
            "this file."]
    out += _failed([(r.label(), e["reason"]) for r in order for e in ents[r.key] if e["status"] != "ok"])
    return "\n".join(out) + "\n"


def _drift_table(cfg, order: list, ents: dict, L: int, cost) -> list[str]:
    """Each server start in the order it ran: its requests' chunk counts and each TTFT over the served model's
    prediction for the chunks that request ran. One model prices every start, so where the same chunks ran
    the ratio moves with the host alone: that separates the host's drift from what the plan chose."""
    import numpy as np

    from ..core.objective import fixed_split, makespan

    if cost is None:
        return []
    rows, meds = [], {}
    for i in range(cfg.rounds):
        for r in order:
            e = ents[r.key][i] if i < len(ents[r.key]) else None
            rec = record(e, L) if e and e["status"] == "ok" else None
            if not rec:
                continue
            plans = rec.get("chunk_plan") or [None] * len(rec["ttfts"])
            pairs = [(t, (p or {}).get("ran") or (fixed_split(L, r.chunk) if r.kind == "fixed" else None))
                     for t, p in zip(rec["ttfts"], plans)]
            ratios = [t / (makespan(ch, 0, cost, cfg.pp_size) / 1e3) for t, ch in pairs if t > 0 and ch]
            if not ratios:
                continue
            m = float(np.median(ratios))
            meds.setdefault(r.key, []).append(m)
            rows.append(f"| {len(rows) + 1} | {r.label()} | {i} | {' / '.join(str(len(ch)) for _, ch in pairs if ch)} | "
                        f"{' / '.join(f'{x:.3f}' for x in ratios)} | {m:.3f} |")
    if not rows:
        return []
    per = [f"{k.split(':L=')[0]} {min(v):.3f}-{max(v):.3f}" for k, v in meds.items()]
    return ["Each start in the order it ran: every request's TTFT over the served model's prediction for the chunks "
            "it ran (one model prices every start, so for the same chunks the ratio moves with the host alone):", "",
            "| start | config | round | chunks per request | measured / predicted per request | median |",
            "|---:|---|---:|---|---|---:|", *rows, "", "Start medians per configuration: " + "; ".join(per) + ".", ""]


def _forward_table(order: list, ents: dict, L: int, stages, P: int) -> list[str]:
    """Every forward of the requests that reached L, per stage, over the served model's prediction for its
    (prefix, chunk): forwards alone, no per-chunk overhead. The drift table's TTFT ratio mixes the host with
    the pipeline; this one shows which chunk sizes the model prices high or low (empty without logs)."""
    import numpy as np

    def priced(fw: list, model) -> list[tuple[int, float]]:  # (chunk, measured / predicted) of requests reaching L
        reach: dict = {}
        for rid, pre, x, _ in fw:
            reach[rid] = max(reach.get(rid, 0), pre + x)
        return [(x, ms / float(model.time(pre, x))) for rid, pre, x, ms in fw if reach[rid] >= L]

    if not stages:
        return []
    rows = []
    for r in order:
        n, sizes, cells = 0, set(), []
        for s in range(P):
            model = stages[min(s, len(stages) - 1)]
            got = [priced((e.get("forwards") or {}).get(str(s)) or [], model) for e in ents[r.key]
                   if e.get("status") == "ok"]
            starts = [[q for _, q in g] for g in got if g]
            n, sizes = n + sum(map(len, starts)), sizes | {x for g in got for x, _ in g}
            meds = [float(np.median(v)) for v in starts]
            cells.append(f"{np.median([q for v in starts for q in v]):.3f} ({min(meds):.3f}-{max(meds):.3f})"
                         if starts else "—")
        if n:
            rows.append(f"| {r.label()} | {n} | {min(sizes)}-{max(sizes)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    head = " | ".join(f"PP{s}: median (start medians)" for s in range(P))
    return ["Per forward: each forward of these requests over the served model's prediction for its (prefix, "
            "chunk) on its stage, forwards alone (no per-chunk overhead); above 1 the model prices the chunk low:", "",
            f"| config | forwards | chunk sizes | {head} |", "|---|---:|---:|" + "---:|" * P, *rows, ""]


def _step_table(order: list, ents: dict, P: int) -> list[str]:
    """What a chunk step costs each stage beyond its forward and its waits, and the plugin's hooks' share
    of it, per configuration (the median of each server start's median, from the decision logs' `step`
    events, plugin/serving/steps.py); empty when no server logged steps."""
    import numpy as np

    rows = []
    for r in order:
        got = [e["steps"] for e in ents[r.key] if e.get("status") == "ok" and e.get("steps")]
        if not got:
            continue
        cells = []
        for s in map(str, range(P)):
            per = [g[s] for g in got if s in g]
            if not per:
                cells += ["—"] * 3
                continue
            cells += [f"{np.median([p['forward_ms'] for p in per]):.1f}", f"{np.median([p['loop_ms'] for p in per]):.2f}",
                      f"{np.median([p['plugin_ms'] for p in per]):.3f}"]
        rows.append(f"| {r.label()} | {sum(g[s]['steps'] for g in got for s in g)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    head = " | ".join(f"PP{s} forward | PP{s} loop beyond forward and waits | PP{s} plugin hooks" for s in range(P))
    return ["## Per chunk step (ms)", "",
            "Between two consecutive chunks of a request, per stage: the forward, what the step cost beyond the forward "
            "and the waits on the other stage (the per-chunk overhead online refinement charges), and the plugin's "
            "own hooks within it. Medians over each server start's chunk steps (warm-up requests included), then over "
            "the starts.", "", f"| config | steps | {head} |", "|---|---:|" + "---:|" * (3 * P), *rows, ""]


def write_tuning_free(cfg, order, ents, stages, cal, cal_err: str, command: str) -> Path:
    out = _write(cfg, render_tuning_free(cfg, order, ents, stages, cal, cal_err, command))
    if cfg.json:
        from .report_json import save_results_json, tuning_free_rows

        body = {"rounds": cfg.rounds, "rows": tuning_free_rows(cfg, order, ents, _ttfts, _ran)}
        print(f"wrote {save_results_json(cfg, command, body)}")
    return out
