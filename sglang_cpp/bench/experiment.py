"""One resumable runner of server configurations, with two presets and a tuning-free mode.

`bench compare` and `tune sweep` are the same experiment: a fixed-chunk sweep on fresh PP servers, the
best fixed chunk C* per length, then the sglang-cpp plan at C*, upstream dynamic chunking at
dynamic_base*C* for each sigma, and optionally PP=1 on one core at C*. The presets only differ in
their defaults. State is saved after every server, so an interrupted run resumes where it stopped.

With --plan-chunks (the tuning-free mode) there is no sweep to hand the plan its answer: the plan server
runs at each of those --chunked-prefill-size values beside the fixed chunks, interleaved (fixed and plan
alternate within a round, --rounds rounds), so a drifting host drifts under every row alike.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..files import load_json, save_json
from .report import median
from .server import ServerSpec, reported_calibration
from .ttft import BenchConfig, _log, any_failed, run_ttft, write_jsonl

DEFAULT_MODEL = "~/.cache/sglang-cpp/models/smollm2-135m"


@dataclass(frozen=True)
class ExperimentConfig:
    """Every field is a flag (field `foo_bar` is `--foo-bar`); everything but fresh, results, plot, json and
    the timeouts keys the resumable state."""

    model: str = DEFAULT_MODEL
    pp_size: int = 2
    input_lens: tuple = (8192, 16384)
    fixed_chunks: tuple = (512, 1024, 2048, 4096)
    sigmas: tuple = (0.75,)
    dynamic_base: int = 1  # upstream dynamic chunking's base chunk = dynamic_base * C*, clamped to the input
    plan: bool = True
    pp1: bool = True
    num_requests: int = 2
    warmup: int = 1
    warmup_len: int = 0  # tokens per warmup request; 0: the measured length
    seed: int = 0
    profile: str | None = None  # SGLANG_CPP_PROFILE for the plan server; else it calibrates
    calib_max_len: int = 0  # plan server's SGLANG_CPP_CALIB_MAX_LEN; 0: the longest input, no budget cut
    context_length: int | None = None
    device: str = "cpu"
    upstream_profiling: bool = False  # True: upstream profiles at startup (128 fresh prefills; slow on CPU)
    results: str = "results/compare.md"  # relative to the working directory, never inside a package
    plot: str | None = None
    json: str | None = None  # also write the rows as strict JSON here
    timeout_per_server: float = 900.0
    request_timeout: float = 3600.0
    fresh: bool = False
    plan_chunks: tuple = ()  # the tuning-free mode: the plan at each of these C beside the fixed chunks
    rounds: int = 3  # tuning-free mode: interleaved rounds, each starting every configuration once

    def __post_init__(self):
        from ..core.upstream import check_sigma

        object.__setattr__(self, "model", os.path.expanduser(str(self.model)))
        object.__setattr__(self, "sigmas", tuple(check_sigma(s, "--sigmas") for s in self.sigmas))
        if self.plan_chunks and min(self.plan_chunks) < 1:
            raise ValueError(f"--plan-chunks {self.plan_chunks}: give --chunked-prefill-size values >= 1")
        for name in ("pp_size", "num_requests", "dynamic_base", "rounds"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if not self.fixed_chunks or min(self.fixed_chunks) < 1:
            raise ValueError(f"--fixed-chunks {self.fixed_chunks}: give chunk sizes >= 1, e.g. 1024,2048,4096")
        if self.warmup < 0 or self.warmup_len < 0 or self.calib_max_len < 0:
            raise ValueError("--warmup, --warmup-len and --calib-max-len must be >= 0")
        if self.context_length is not None and self.context_length <= max(self.input_lens):
            raise ValueError(f"--context-length {self.context_length} must exceed the longest input "
                             f"{max(self.input_lens)}")
        if self.profile and not Path(self.profile).is_file():
            raise ValueError(f"--profile {self.profile} does not exist; write one with `sglang-cpp tune chunk`")
        BenchConfig(tuple(self.input_lens), self.num_requests, self.warmup)  # validates the workload

    @property
    def ctx(self) -> int | None:
        """--context-length, else the longest input plus room for the output, rounded up to 1K, when the
        model's own context is too short (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 lets SGLang accept it)."""
        if self.context_length:
            return self.context_length
        hf = load_json(Path(self.model) / "config.json", default={})
        need = max(self.input_lens) + 16
        mpe = hf.get("max_position_embeddings") if isinstance(hf, dict) else None
        return -(-need // 1024) * 1024 if isinstance(mpe, int) and need > mpe else None

    @property
    def state_path(self) -> Path:
        return Path(self.results).with_suffix(".state.json")

    def params(self) -> dict:
        keep = ("model", "pp_size", "input_lens", "num_requests", "warmup", "warmup_len", "seed", "sigmas",
                "dynamic_base", "profile", "calib_max_len", "device", "upstream_profiling")
        return json.loads(json.dumps({k: getattr(self, k) for k in keep} | {"ctx": self.ctx}))  # as stored


PRESETS = {
    "compare": ExperimentConfig(),
    # the blog's tuning recipe: one target length, dynamic chunking at twice the best fixed chunk
    "sweep": ExperimentConfig(input_lens=(8000,), fixed_chunks=(1024, 2048, 4096, 8192), sigmas=(0.6, 0.85),
                              dynamic_base=2, pp1=False, num_requests=1, warmup_len=512,
                              results="results/sweep.md"),
}


@dataclass(frozen=True)
class Run:
    """One server configuration; its key names it in the state file."""

    kind: str  # fixed | plan | dynamic | pp1
    chunk: int
    lens: tuple
    sigma: float | None = None
    round: int | None = None  # the tuning-free mode's round

    @property
    def key(self) -> str:
        return f"{self.kind}:C={self.chunk}:L={','.join(map(str, self.lens))}" + (
            f":sigma={self.sigma:g}" if self.sigma is not None else "") + (
            f":round={self.round}" if self.round is not None else "")

    def label(self) -> str:
        if self.kind == "dynamic":
            return f"upstream dynamic (sigma={self.sigma:g}, C={self.chunk})"
        return {"fixed": f"fixed C={self.chunk}", "plan": f"sglang-cpp plan (C={self.chunk})",
                "pp1": f"PP=1 on 1 core (fixed C={self.chunk})"}[self.kind]


def server_spec(cfg: ExperimentConfig, run: Run, upstream_json: str | None = None,
                decision_log: str | None = None) -> ServerSpec:
    """upstream_json: for a dynamic run, upstream's algorithm (policy quadratic) on these a, b, c
    instead of upstream's own startup profiling. decision_log: the plugin's JSONL (its `step` events)."""
    env = {"SGLANG_CPP_POLICY": "plan" if run.kind == "plan" else "off"}
    if decision_log:
        env["SGLANG_CPP_DECISION_LOG"] = decision_log
    if run.kind == "dynamic":
        env["SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"] = str(run.sigma)
        if upstream_json:
            env.update(SGLANG_CPP_POLICY="quadratic", SGLANG_CPP_PROFILE=str(Path(upstream_json).resolve()))
    if run.kind == "plan" and cfg.profile:
        env["SGLANG_CPP_PROFILE"] = str(Path(cfg.profile).resolve())
    elif run.kind == "plan":  # calibrate exactly the lengths measured, with no budget cut
        env.update(SGLANG_CPP_CALIB_MAX_LEN=str(cfg.calib_max_len or -(-max(cfg.input_lens) // 64) * 64),
                   SGLANG_CPP_CALIB_BUDGET_S="0")
    if run.kind == "pp1":
        return ServerSpec(cfg.model, pp_size=1, chunk_size=run.chunk, cores="0", env=env,
                          context_length=cfg.ctx, device=cfg.device)
    return ServerSpec(cfg.model, pp_size=cfg.pp_size, chunk_size=run.chunk, dynamic=run.kind in ("dynamic", "plan"),
                      env=env, context_length=cfg.ctx, device=cfg.device)


class Runner:
    """Starts each configuration on a fresh server, benches it, tears it down, and records the result
    (a failure too, with its reason) in the state file before the next."""

    def __init__(self, cfg: ExperimentConfig, launch, log=_log):
        self.cfg, self.launch, self.log = cfg, launch, log
        self.state = self._load()

    def _load(self) -> dict:
        p, cfg = self.cfg.state_path, self.cfg
        doc = None if cfg.fresh else load_json(p, default=None)
        if isinstance(doc, dict) and doc.get("params") == cfg.params() and isinstance(doc.get("runs"), dict):
            self.log(f"resuming from {p} ({sum(e.get('status') == 'ok' for e in doc['runs'].values())} runs done)")
            return doc
        if doc is not None:
            self.log(f"{p} was written with other parameters or is unreadable: starting over")
        Path(cfg.results).with_suffix(".jsonl").unlink(missing_ok=True)  # a new run's records, not appended to old
        return {"params": cfg.params(), "runs": {}}

    def save(self) -> None:
        save_json(self.cfg.state_path, self.state)

    def run(self, run: Run, upstream_json: str | None = None) -> dict:
        ent = self.state["runs"].get(run.key)
        if ent and ent["status"] == "ok":
            self.log(f"{run.key}: done in an earlier run, skipped")
            return ent
        cfg, log = self.cfg, self.log
        log_dir = str(Path(cfg.results).with_name(f"{Path(cfg.results).stem}-logs"))
        dec = None
        if cfg.plan_chunks:  # the tuning-free mode: every server logs its steps' costs
            dec = str(Path(log_dir).resolve() / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", run.key) + "-dec_{rank}.jsonl"))
            for old in Path(log_dir).glob(Path(dec).name.replace("{rank}", "*")):
                old.unlink()
        spec, t0 = server_spec(cfg, run, upstream_json, dec), time.time()
        log(f"{run.key}: starting server (pp={spec.pp_size}, chunk={run.chunk}, dynamic={spec.dynamic}, env={spec.env})")
        try:
            with self.launch(spec, timeout=cfg.timeout_per_server, log_dir=log_dir) as srv:
                log(f"{run.key}: healthy at {srv.base_url} after {time.time() - t0:.0f} s")
                bcfg = BenchConfig(run.lens, cfg.num_requests, cfg.warmup, 1, cfg.seed, 0, run.label(),
                                   cfg.request_timeout, cfg.warmup_len)
                recs = run_ttft(srv.base_url, bcfg, log=lambda m: log(f"{run.key}: {m}"))
                ent = {"status": "ok", "records": recs, "log": str(getattr(srv, "log_path", "")),
                       "calibration": reported_calibration(srv.log())}
        except Exception as exc:  # a server that cannot start goes into the table, not up the stack
            ent = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            log(f"{run.key}: FAILED: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        ent["seconds"] = round(time.time() - t0, 1)
        if dec and ent["status"] == "ok":
            logs = sorted(Path(log_dir).glob(Path(dec).name.replace("{rank}", "*")))
            ent["steps"], ent["forwards"] = log_costs(logs)
        self.state["runs"][run.key] = ent
        self.save()
        if ent["status"] == "ok":
            write_jsonl(ent["records"], Path(cfg.results).with_suffix(".jsonl"))
            log(f"{run.key}: finished in {ent['seconds']:.0f} s")
        return ent


def log_costs(paths) -> tuple[dict, dict]:
    """(steps, forwards) from a server's decision logs, read once. steps: per stage, its chunk steps' count
    and the medians of what a step cost beyond forward and waits (loop_ms), of the plugin's own hooks in it
    (plugin_ms) and of the forward (plugin/serving/steps.py). forwards: per stage, every single-request extend
    forward as [rid, prefix, chunk, ms] (plugin/serving/forwards.py), which the report prices on the served model."""
    import numpy as np

    from ..files import read_events

    steps: dict = {}
    forwards: dict = {}
    for e in read_events(paths, "step", "forward"):
        if e["event"] == "step":
            steps.setdefault(str(e["pp_rank"]), []).append(e)
        elif (len(e.get("rids") or ()) == 1 and e["chunk"][0] > 0 and e.get("ms") is not None
              and not e.get("host_loaded") and not e.get("replay")):  # what online refinement fits too
            forwards.setdefault(str(e["pp_rank"]), []).append(
                [str(e["rids"][0]), int(e["prefix"][0]), int(e["chunk"][0]), round(float(e["ms"]), 3)])
    return ({s: {"steps": len(v), "loop_ms": round(float(np.median([e["loop_ms"] for e in v])), 3),
                 "plugin_ms": round(float(np.median([e["plugin_ms"] for e in v])), 3),
                 "forward_ms": round(float(np.median([e["forward_ms"] for e in v])), 3)}
             for s, v in sorted(steps.items())}, forwards)


def calibration_stages(cfg: ExperimentConfig, runner: Runner, plan_ents: list) -> tuple[Path | None, list | None, str]:
    """--profile, else the cost-model file the plan server reported in its log (never a guess by mtime);
    pinned in the state so a resumed run uses the same one. Returns (path, stage models, error)."""
    if "calibration" not in runner.state:
        found = cfg.profile or next((e["calibration"] for e in plan_ents if e and e.get("calibration")), None)
        runner.state["calibration"] = str(found) if found else None
        runner.save()
    if not runner.state["calibration"]:
        return None, None, ""
    cal = Path(runner.state["calibration"])
    try:
        from ..core.profile_io import load_cost

        c = load_cost(cal)
        return cal, list(getattr(c, "charged", None) or [c]), ""  # each stage with its per-chunk overhead
    except ValueError as exc:
        return cal, None, f"unusable: {exc}"


def upstream_json(cfg: ExperimentConfig, base: int, stages) -> tuple[str | None, str]:
    """(profile holding upstream's a, b, c for base chunk `base`, emulated from the calibration; message)."""
    from ..core.costmodel import PipelineCost
    from ..core.upstream import emulated_fit

    cost = stages[0] if len(stages) == 1 else PipelineCost(tuple(stages))
    a, b, c = emulated_fit(cost, base, cfg.ctx or 8192)
    path = Path(cfg.results).with_name(f"{Path(cfg.results).stem}-upstream-C={base}.json")
    save_json(path, {"format": "sglang-cpp-profile", "samples": [], "upstream": {"a": a, "b": b, "c": c},
                     "note": "upstream's fit emulated from the calibration at its own profiling lengths"})
    return str(path), f"upstream dynamic at C={base}: a={a:.3e} b={b:.3e} c={c:.3e} (emulated) -> {path}"


def experiment(cfg: ExperimentConfig, *, launch=None, log=_log, command: str = "") -> int:
    """The whole experiment; writes the results table. 0 when every server ran and every request succeeded."""
    from .report import Row, predict_ttft, write_report

    if launch is None:
        from .server import launched as launch
    if not Path(cfg.model).exists():
        raise ValueError(f"--model-path {cfg.model} does not exist; build it (examples/cpu/setup.sh) or pass a model folder")
    runner, lens = Runner(cfg, launch, log), tuple(cfg.input_lens)
    if cfg.plan_chunks:
        return tuning_free(cfg, runner, command)
    fixed = {C: runner.run(Run("fixed", C, lens)) for C in cfg.fixed_chunks}
    best, groups = {}, {}
    for L in lens:
        cands = [(m, C) for C, e in fixed.items() if (m := median(e, L)) is not None]
        best[L] = min(cands)[1] if cands else None
        log(f"best fixed chunk for {L} tokens: {best[L] or 'none (every fixed run failed)'}")
        if best[L] is not None:
            groups.setdefault(best[L], []).append(L)
    runs: list[tuple[Run, dict | None, str]] = []  # (run, entry or None when skipped, note)
    if cfg.plan:
        runs += [(r, runner.run(r), "") for r in (Run("plan", C, tuple(Ls)) for C, Ls in groups.items())]
    cal, stages, cal_err = calibration_stages(cfg, runner, [e for _, e, _ in runs])
    for C, Ls in groups.items():
        base = min(cfg.dynamic_base * C, max(Ls))
        up, why = (None, "upstream's own startup profiling") if cfg.upstream_profiling else (
            upstream_json(cfg, base, stages) if stages else (None, "no calibration to emulate upstream's fit from: "
                                                               "run the plan server, pass --profile, or --upstream-profiling"))
        log(why)
        first = None
        for s in cfg.sigmas:
            r = Run("dynamic", base, tuple(Ls), s)
            if up is None and not cfg.upstream_profiling:
                runs.append((r, None, why))
            elif first is not None and base >= max(Ls):  # one chunk: sigma never used, same server
                runs.append((r, first, f"same server as sigma={cfg.sigmas[0]:g}: base >= input, one chunk"))
            else:
                runs.append((r, runner.run(r, up), ""))
                first = runs[-1][1] if runs[-1][1]["status"] == "ok" else None
    if cfg.pp1:
        runs += [(r, runner.run(r), "") for r in (Run("pp1", C, tuple(Ls)) for C, Ls in groups.items())]

    def pred(run: Run, L: int):
        try:
            return predict_ttft(cfg, run, L, stages) if stages else None
        except ValueError as exc:
            log(f"simulator check {run.key}: {exc}")
            return None

    rows = [Row(Run("fixed", C, lens), L, fixed[C], pred(Run("fixed", C, lens), L), "") for C in cfg.fixed_chunks
            for L in lens]
    rows += [Row(r, L, e, pred(r, L), note) for r, e, note in runs for L in r.lens]
    rows += [Row(Run(k, 0, (L,)), L, None, None, "no successful fixed-chunk run to take the base chunk from")
             for L in lens if best[L] is None for k in ("plan", "pp1") if getattr(cfg, k)]
    out = write_report(cfg, rows, best, cal, cal_err, command)
    log(f"wrote {out}")
    ents = list(fixed.values()) + [e for _, e, _ in runs]
    bad = any(e is None or e["status"] != "ok" or any_failed(e["records"]) for e in ents)
    return 1 if bad or None in best.values() else 0



def interleaved(cfg: ExperimentConfig) -> list[Run]:
    """One round's order: fixed and plan alternate (fixed C1, plan C1', fixed C2, ...), the rest after."""
    lens = tuple(cfg.input_lens)
    fixed = [Run("fixed", C, lens) for C in cfg.fixed_chunks]
    plan = [Run("plan", C, lens) for C in cfg.plan_chunks]
    return [r for pair in zip(fixed + [None] * len(plan), plan + [None] * len(fixed)) for r in pair if r]


def tuning_free(cfg: ExperimentConfig, runner: Runner, command: str = "") -> int:
    """The plan at several C beside the fixed chunks, interleaved over cfg.rounds rounds; 0 when every
    server ran and every request succeeded."""
    from dataclasses import replace

    from .report import write_tuning_free

    order = interleaved(cfg)
    ents: dict[str, list] = {r.key: [] for r in order}
    for i in range(cfg.rounds):  # rounds outside, configurations inside: the interleaving
        for r in order:
            ents[r.key].append(runner.run(replace(r, round=i)))
    cal, stages, cal_err = calibration_stages(cfg, runner, [e for r in order if r.kind == "plan" for e in ents[r.key]])
    out = write_tuning_free(cfg, order, ents, stages, cal, cal_err, command)
    runner.log(f"wrote {out}")
    bad = any(e["status"] != "ok" or any_failed(e["records"]) for es in ents.values() for e in es)
    return 1 if bad else 0
