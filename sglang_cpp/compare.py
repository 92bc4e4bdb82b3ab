"""`sglang-cpp bench compare`: the side-by-side on the real CPU server.

Fixed-chunk sweep, upstream dynamic chunking and the sglang-cpp plan at the best fixed chunk, and PP=1
on one core, each on a fresh server, in one run on one machine; a markdown results table with ratios
and a simulator check. Resumable: state is saved after every server.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .args import alias, parse_ints, parse_lens
from .bench import BenchConfig, _log, any_failed, run_ttft, write_jsonl
from .policy import chunks_for
from .server import reported_calibration

# -- compare: the side-by-side on the real CPU server ------------------------------------------------
RESULTS = "results/compare.md"  # relative to the working directory, never inside an installed package
DEFAULT_MODEL = "~/.cache/sglang-cpp/models/smollm2-135m"
KINDS = {"fixed": "fixed", "dynamic": "quadratic", "plan": "plan", "pp1": "fixed"}  # kind -> simulated policy


def compare_doc() -> str:
    return ("Fixed-chunk sweep (PP=2), upstream dynamic chunking and the sglang-cpp plan at the best fixed chunk, "
            "and PP=1 on one core, each on a fresh server; writes a markdown table with a simulator check.")


@dataclass(frozen=True)
class CompareConfig:
    """One side-by-side; everything but fixed_chunks and fresh keys the resumable state."""

    model: str = DEFAULT_MODEL
    input_lens: tuple = (8192, 16384)
    num_requests: int = 2
    fixed_chunks: tuple = (512, 1024, 2048, 4096)
    sigma: float = 0.75
    results: str = RESULTS
    context_length: int | None = None
    timeout_per_server: float = 900.0
    request_timeout: float = 3600.0
    profile: str | None = None
    warmup: int = 1
    warmup_len: int = 0
    seed: int = 0
    fresh: bool = False
    upstream_profiling: bool = False  # True: upstream profiles at startup (128 fresh prefills; slow on CPU)

    @property
    def ctx(self) -> int | None:
        """SmolLM2 serves 8192 tokens; longer prompts get the longest input plus room for the output,
        rounded up to 1K (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 lets SGLang accept it)."""
        longest = max(self.input_lens)
        return self.context_length or (-(-(longest + 16) // 1024) * 1024 if longest > 8192 else None)

    @property
    def state_path(self) -> Path:
        return Path(self.results).with_suffix(".state.json")

    def params(self) -> dict:
        return json.loads(json.dumps({"model": self.model, "input_lens": self.input_lens, "ctx": self.ctx,
                                      "num_requests": self.num_requests, "warmup": self.warmup,
                                      "warmup_len": self.warmup_len, "seed": self.seed,
                                      "sigma": self.sigma, "profile": self.profile,
                                      "upstream_profiling": self.upstream_profiling}))


def server_spec(cfg: CompareConfig, kind: str, chunk: int, upstream_json: str | None = None):
    """upstream_json: for kind 'dynamic', run upstream's algorithm (policy quadratic) on these a, b, c
    instead of letting upstream profile at startup."""
    from .server import ServerSpec

    env = {"SGLANG_CPP_POLICY": "plan" if kind == "plan" else "off"}
    if kind == "dynamic":
        env["SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"] = str(cfg.sigma)
        if upstream_json:
            env.update(SGLANG_CPP_POLICY="quadratic", SGLANG_CPP_PROFILE=str(Path(upstream_json).resolve()))
    if kind == "plan" and cfg.profile:
        env["SGLANG_CPP_PROFILE"] = str(Path(cfg.profile).resolve())
    elif kind == "plan":  # calibrate exactly the lengths measured, with no budget cut
        env.update(SGLANG_CPP_CALIB_MAX_LEN=str(-(-max(cfg.input_lens) // 64) * 64), SGLANG_CPP_CALIB_BUDGET_S="0")
    if kind == "pp1":
        return ServerSpec(cfg.model, pp_size=1, chunk_size=chunk, cores="0", env=env, context_length=cfg.ctx)
    return ServerSpec(cfg.model, pp_size=2, chunk_size=chunk, dynamic=kind in ("dynamic", "plan"), env=env,
                      context_length=cfg.ctx)


def label_of(kind: str, chunk, sigma: float) -> str:
    return {"fixed": f"fixed C={chunk}", "dynamic": f"upstream dynamic (sigma={sigma}, C={chunk})",
            "plan": f"sglang-cpp plan (C={chunk})", "pp1": f"PP=1 on 1 core (fixed C={chunk})"}[kind]


def _save_json(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)  # atomic: an interrupted run never leaves a half-written state


def _load_state(cfg: CompareConfig, log) -> dict:
    p = cfg.state_path
    if p.exists() and not cfg.fresh:
        try:
            doc = json.loads(p.read_text())
            if doc.get("params") == cfg.params():
                log(f"resuming from {p} ({sum(e['status'] == 'ok' for e in doc['runs'].values())} runs done)")
                return doc
            log(f"{p} was written with other parameters: starting over")
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            log(f"{p} is unreadable ({exc}): starting over")
    return {"params": cfg.params(), "runs": {}}


def _run_server(cfg, kind, chunk, lens, state, launch, log, upstream_json: str | None = None) -> dict:
    """Start, bench, tear down; a failure is recorded (with its reason), never raised."""
    key = f"{kind}:C={chunk}:L={','.join(map(str, lens))}"
    ent = state["runs"].get(key)
    if ent and ent["status"] == "ok":
        log(f"{key}: done in an earlier run, skipped")
        return ent
    spec, t0 = server_spec(cfg, kind, chunk, upstream_json), time.time()
    log(f"{key}: starting server (pp={spec.pp_size}, chunk={chunk}, dynamic={spec.dynamic}, env={spec.env})")
    try:
        with launch(spec, timeout=cfg.timeout_per_server, log_dir=str(Path(cfg.results).parent / "compare-logs")) as srv:
            log(f"{key}: healthy at {srv.base_url} after {time.time() - t0:.0f} s")
            bcfg = BenchConfig(tuple(lens), cfg.num_requests, cfg.warmup, 1, cfg.seed, 0,
                               label_of(kind, chunk, cfg.sigma), cfg.request_timeout, cfg.warmup_len)
            recs = run_ttft(srv.base_url, bcfg, log=lambda m: log(f"{key}: {m}"))
            ent = {"status": "ok", "records": recs, "log": str(getattr(srv, "log_path", "")),
                   "calibration": reported_calibration(srv.log())}
    except Exception as exc:  # a server that cannot start goes into the table, not up the stack
        ent = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
        log(f"{key}: FAILED: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    ent["seconds"] = round(time.time() - t0, 1)
    state["runs"][key] = ent
    _save_json(cfg.state_path, state)
    if ent["status"] == "ok":
        write_jsonl(ent["records"], Path(cfg.results).with_suffix(".jsonl"))
        log(f"{key}: finished in {ent['seconds']:.0f} s")
    return ent


def _rec(ent, L):
    for r in (ent or {}).get("records") or []:
        if r["random_input_len"] == L:
            return r
    return None


def _median(ent, L):
    r = _rec(ent, L)
    return r["median_ttft_ms"] if r else None


def find_calibration(cfg: CompareConfig, plan_runs: dict) -> Path | None:
    """--profile, else the cost-model file the plan server reported in its log (never a guess by mtime)."""
    if cfg.profile:
        return Path(cfg.profile)
    for ent in plan_runs.values():
        if ent and ent.get("calibration"):
            return Path(ent["calibration"])
    return None


def write_upstream_json(path: Path, cost, chunk: int, ctx: int | None) -> tuple[float, float, float]:
    """A profile holding only upstream's a, b, c for base `chunk`, emulated from `cost` (policy quadratic)."""
    from .upstream import emulated_fit

    a, b, c = emulated_fit(cost, chunk, ctx)
    _save_json(path, {"format": "sglang-cpp-profile", "samples": [], "upstream": {"a": a, "b": b, "c": c},
                      "note": "upstream's fit emulated from the calibration at its own profiling lengths"})
    return a, b, c


def predict_ttft(kind: str, chunk: int, L: int, stages: list, cfg: CompareConfig) -> float:
    """Simulated TTFT (ms) of the same server config from the per-stage calibration models."""
    from .costmodel import COEFS, CostModel, PipelineCost
    from .simulator import simulate

    if len(stages) == 1:
        stages = stages * 2
    if len(stages) != 2:
        raise ValueError(f"calibration has {len(stages)} stage models; the PP=2 servers need 2")
    if kind == "pp1":  # the whole model on one core: the two stages' work, back to back
        stages = [CostModel(**{k: sum(getattr(m, k) for m in stages) for k in COEFS})]
    P = len(stages)
    cost = stages[0] if P == 1 else PipelineCost(tuple(stages))
    chunks = chunks_for(KINDS[kind], L, cost, P, chunk, sigma=cfg.sigma, ctx=cfg.ctx or 8192)
    return simulate(chunks, stages, P).ttft_ms


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("torch", "sglang"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    out["sglang-cpp"] = __version__
    return out


from .machine import cpu_isa, cpu_model  # noqa: E402  (kept importable from here)


def _f(v, spec=".1f") -> str:
    return "—" if v is None else format(v, spec)


def _ratio(a, b) -> str:
    return "—" if a is None or not b else f"{a / b:.3f}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()[:160]


def render_table(cfg: CompareConfig, rows: list, best: dict, cal: Path | None, cal_err: str, command: str) -> str:
    """rows: (kind, chunk, L, ent or None, predicted ms or None, note)."""
    by = {(k, L): e for k, c, L, e, *_ in rows if k != "fixed"}
    t_best = {L: _median(e, L) for k, c, L, e, *_ in rows if k == "fixed" and c == best.get(L)}
    t_dyn = {L: _median(by.get(("dynamic", L)), L) for L in cfg.input_lens}
    t_pp1 = {L: _median(by.get(("pp1", L)), L) for L in cfg.input_lens}
    v = _versions()
    ents = list({id(e): e for _, _, _, e, *_ in rows if e}.values())
    secs = sum(e.get("seconds", 0.0) for e in ents)
    out = ["# TTFT side-by-side: fixed chunks vs upstream dynamic chunking vs sglang-cpp plan (PP=2, CPU)", "",
           f"- date: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
           f"- machine: {cpu_model()} ({cpu_isa()}), {os.cpu_count()} cores ({platform.node()})",
           f"- versions: torch {v['torch']}, sglang {v['sglang']}, sglang-cpp {v['sglang-cpp']}",
           f"- model: `{cfg.model}`; context length {cfg.ctx or 'model default'}",
           f"- workload: random token ids, {cfg.num_requests} measured + {cfg.warmup} warmup request(s) per "
           f"length and server{f' (warmup requests of {cfg.warmup_len} tokens)' if cfg.warmup_len else ''}, max_new_tokens=1, concurrency 1, seed {cfg.seed}",
           f"- simulator cost model: {f'`{cal}`' if cal else 'none found'}{f' ({cal_err})' if cal_err else ''}",
           f"- command: `{command}`",
           f"- server time: {secs / 60:.1f} min over {len(ents)} servers (start-up, calibration and requests; "
           "the whole run is this plus a few seconds)", "",
           "| config | chunk | input len | median TTFT (ms) | p90 TTFT (ms) | ok | vs upstream dynamic | "
           "vs best fixed | PP2 eff. vs PP1-1core | sim predicted (ms) | measured / predicted |",
           "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for kind, chunk, L, ent, pred, note in rows:
        r = _rec(ent, L)
        med = r["median_ttft_ms"] if r else None
        if ent is None:
            ok = _cell(f"skipped: {note}")
        elif ent["status"] != "ok":
            ok = _cell(f"server failed: {ent['reason'].splitlines()[0]}")
        else:
            ok = f"{r['completed']}/{r['num_prompts']}" if r else "no result"
        name = label_of(kind, chunk, cfg.sigma) + (" **(best)**" if kind == "fixed" and best.get(L) == chunk else "")
        eff = "—" if kind == "pp1" or med is None or t_pp1[L] is None else f"{t_pp1[L] / (2 * med):.2f}"
        out.append(f"| {name} | {chunk} | {L} | {_f(med)} | {_f(r['p90_ttft_ms'] if r else None)} | {ok} | "
                   f"{_ratio(med, t_dyn[L])} | {_ratio(med, t_best.get(L))} | {eff} | {_f(pred)} | "
                   f"{_ratio(med, pred)} |")
    out += ["", "- vs upstream dynamic / vs best fixed: median TTFT divided by that config's median at the same "
            "length (< 1 is faster).",
            "- PP2 eff. vs PP1-1core: strong-scaling efficiency T_pp1 / (2 * T_pp2); 1.0 = perfect 2x speed-up.",
            "- sim predicted: `sglang_cpp.simulator` on the chunk sequence each policy produces, with the per-stage "
            "calibration models (free P2P, no host overhead); PP=1 sums the two stage models.",
            ("- upstream dynamic: SGLang's own profiling and fit at startup (`--upstream-profiling`)."
             if cfg.upstream_profiling else
             "- upstream dynamic: upstream's algorithm run by `SGLANG_CPP_POLICY=quadratic` (chunk-for-chunk equal to "
             "SGLang's `ChunkSizePredictor`, tests/test_server_e2e.py) on a, b, c fitted, as upstream fits them, to "
             "the calibration's fresh-prefill times at upstream's 128 profiling lengths (`compare-upstream-C=*.json`); "
             "upstream's own startup profiling is skipped because it alone would exceed this benchmark's time."),
            "- raw per-request results: the `.jsonl` next to this file; server logs under `compare-logs/`."]
    fails = [(k, c, e["reason"]) for k, c, L, e, *_ in rows if e and e["status"] != "ok"]
    if fails:
        out += ["", "## Failed servers", ""]
        for k, c, reason in dict.fromkeys(fails):
            out += [f"- {label_of(k, c, cfg.sigma)}:", "", "```", reason.strip()[-3000:], "```"]
    return "\n".join(out) + "\n"


def _upstream_json(cfg: CompareConfig, chunk: int, stages, log) -> str | None:
    """Upstream's a, b, c for base `chunk`, emulated from the calibration (see upstream.emulated_fit)."""
    if cfg.upstream_profiling:
        return None
    if stages is None:
        raise ValueError("no calibration to emulate upstream's profiling from: pass --profile, or "
                         "--upstream-profiling to let upstream profile at startup")
    from .costmodel import PipelineCost

    cost = stages[0] if len(stages) == 1 else PipelineCost(tuple(stages))
    path = Path(cfg.results).with_name(f"{Path(cfg.results).stem}-upstream-C={chunk}.json")
    a, b, c = write_upstream_json(path, cost, chunk, cfg.ctx or 8192)
    log(f"upstream dynamic at C={chunk}: a={a:.3e} b={b:.3e} c={c:.3e} (emulated from the calibration) -> {path}")
    return str(path)


def compare(cfg: CompareConfig, *, launch=None, log=_log, command: str = "") -> int:
    """The whole side-by-side; 0 when every server ran and every request succeeded."""
    if launch is None:
        from .server import launched as launch
    if not Path(cfg.model).exists():
        raise ValueError(f"--model {cfg.model} does not exist; build it (examples/cpu/setup.sh) or pass --model PATH")
    BenchConfig(tuple(cfg.input_lens), cfg.num_requests, cfg.warmup)  # validates the workload
    if not cfg.fixed_chunks or min(cfg.fixed_chunks) < 1:
        raise ValueError(f"--fixed-chunks {cfg.fixed_chunks}: give one or more chunk sizes >= 1")
    state = _load_state(cfg, log)
    lens = tuple(cfg.input_lens)
    fixed = {C: _run_server(cfg, "fixed", C, lens, state, launch, log) for C in cfg.fixed_chunks}
    best = {}
    for L in lens:
        cands = [(m, C) for C, e in fixed.items() if (m := _median(e, L)) is not None]
        best[L] = min(cands)[1] if cands else None
        log(f"best fixed chunk for {L} tokens: {best[L] or 'none (every fixed run failed)'}")
    groups: dict[int, list] = {}
    for L, C in best.items():
        if C is not None:
            groups.setdefault(C, []).append(L)
    done = {"plan": {C: _run_server(cfg, "plan", C, tuple(Ls), state, launch, log) for C, Ls in groups.items()}}
    if "calibration" not in state:  # the plan server's calibration (or --profile), pinned for a resumed run
        found = find_calibration(cfg, done["plan"])
        state["calibration"] = str(found) if found else None
        _save_json(cfg.state_path, state)
    cal, cal_err, stages = (Path(state["calibration"]) if state["calibration"] else None), "", None
    if cal is not None:
        try:
            from .costmodel import load_cost

            c = load_cost(cal)
            stages = list(getattr(c, "stages", None) or [c])
        except ValueError as exc:
            cal_err = f"unusable: {exc}"
    done["dynamic"] = {C: _run_server(cfg, "dynamic", C, tuple(Ls), state, launch, log,
                                      _upstream_json(cfg, C, stages, log)) for C, Ls in groups.items()}
    done["pp1"] = {C: _run_server(cfg, "pp1", C, tuple(Ls), state, launch, log) for C, Ls in groups.items()}

    def pred(kind, C, L):
        if stages is None:
            return None
        try:
            return predict_ttft(kind, C, L, stages, cfg)
        except ValueError as exc:
            log(f"simulator check {kind} C={C} L={L}: {exc}")
            return None

    rows = [("fixed", C, L, fixed[C], pred("fixed", C, L), "") for C in cfg.fixed_chunks for L in lens]
    for kind, runs in done.items():
        for L in lens:
            C = best[L]
            rows.append((kind, C if C else "—", L, runs.get(C), pred(kind, C, L) if C else None,
                         "no successful fixed-chunk run to take the base chunk from"))
    out = Path(cfg.results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_table(cfg, rows, best, cal, cal_err, command))
    log(f"wrote {out}")
    ents = list(fixed.values()) + [e for runs in done.values() for e in runs.values()]
    bad = any(e["status"] != "ok" or any_failed(e["records"]) for e in ents) or None in best.values()
    return 1 if bad else 0


def add_compare_args(p: argparse.ArgumentParser) -> None:
    a = p.add_argument
    a("--model-path", dest="model", default=DEFAULT_MODEL, help=f"model directory (default {DEFAULT_MODEL})")
    alias(p, "--model-path", "--model")
    a("--input-lens", type=parse_lens, default=(8192, 16384), help="default 8k,16k")
    a("--num-requests", type=int, default=2, help="measured requests per length and server")
    a("--warmup", type=int, default=1, help="unmeasured requests per length and server")
    a("--warmup-len", type=int, default=0, help="tokens per warmup request (default 0: the measured length)")
    a("--seed", type=int, default=0)
    a("--fixed-chunks", type=parse_ints, default=(512, 1024, 2048, 4096), help="the fixed-chunk sweep")
    a("--sigma", type=float, default=0.75, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR for upstream dynamic")
    a("--results", default=RESULTS, help=f"markdown table, state and .jsonl beside it (default {RESULTS}, "
                                          "under the working directory)")
    a("--context-length", type=int, default=None, help="server --context-length (default: the longest input + 16, rounded up to 1024, when it is > 8192)")
    a("--timeout-per-server", type=float, default=900.0,
      help="seconds a server may take to become healthy (the plan server calibrates at its first start)")
    a("--request-timeout", type=float, default=3600.0, help="seconds per request (PP=1 on one core is slow)")
    a("--profile", help="cost model for the plan server (SGLANG_CPP_PROFILE) and the simulator check "
                        "(default: the server calibrates; the check reads the newest calibration file)")
    a("--fresh", action="store_true", help="ignore the saved state of an earlier, interrupted run")
    a("--upstream-profiling", action="store_true",
      help="let upstream dynamic chunking run its own 128-prefill startup profiling (default: run upstream's "
           "algorithm through SGLANG_CPP_POLICY=quadratic on a, b, c fitted to the calibration at upstream's "
           "profiling lengths; its own profiling is 128 fresh prefills of up to 1.25*C tokens, about 330K "
           "tokens per stage at C=4096)")


def run_compare(args) -> int:
    import shlex

    cfg = CompareConfig(model=os.path.expanduser(args.model), input_lens=tuple(args.input_lens),
                        num_requests=args.num_requests, fixed_chunks=tuple(args.fixed_chunks), sigma=args.sigma,
                        results=args.results, context_length=args.context_length,
                        timeout_per_server=args.timeout_per_server, request_timeout=args.request_timeout,
                        profile=args.profile, warmup=args.warmup, warmup_len=args.warmup_len,
                        seed=args.seed, fresh=args.fresh, upstream_profiling=args.upstream_profiling)
    cmd = " ".join(shlex.quote(a) for a in ["sglang-cpp", *sys.argv[1:]]) if sys.argv else ""
    return compare(cfg, command=cmd)


