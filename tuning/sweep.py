"""`sglang-cpp tune sweep`: the blog's chunk-tuning recipe, automated and measured on a live server.

Recipe (one fresh server per configuration, TTFT of prompts of the target length, lower is better):
  1. fixed chunks (SGLANG_CPP_POLICY=off): find the best --chunked-prefill-size C*;
  2. the sglang-cpp plan policy at base C* (its startup calibration is cached per device);
  3. upstream dynamic chunking at base 2*C* (clamped to the input length) for each sigma: upstream's
     algorithm through SGLANG_CPP_POLICY=quadratic, on the a, b, c upstream's own fit would get from that
     calibration at its profiling lengths (--upstream-profiling: let upstream profile at startup).
When the base covers the whole prompt, dynamic chunking never predicts (one chunk) and sigma has no
effect: that server runs once and its result stands for every sigma. The run time is dominated by the
prompts themselves: a server per configuration, `--num-requests` prompts of `--input-len` tokens each
(see results/sweep.md for a measured run on the 2-core CPU).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..bench import BenchConfig, _log, run_ttft
from ..server import ServerSpec, launched, reported_calibration
from . import config_from_args, save_figure


@dataclass(frozen=True)
class SweepConfig:
    """Every field is a flag of `sglang-cpp tune sweep`."""

    model: str
    pp_size: int = 2
    input_len: int = 8000
    fixed: tuple = (1024, 2048, 4096, 8192)
    sigmas: tuple = (0.6, 0.85)
    num_requests: int = 1
    warmup_len: int = 512
    plan: bool = True
    profile: str | None = None
    calib_max_len: int = 2048
    context_length: int | None = None
    device: str = "cpu"
    png: str | None = None
    out: str | None = None
    log_dir: str | None = None
    timeout_per_server: float = 900.0
    request_timeout: float = 3600.0
    seed: int = 0
    upstream_profiling: bool = False

    def __post_init__(self):
        from ..upstream import check_sigma

        object.__setattr__(self, "fixed", tuple(int(c) for c in self.fixed))
        object.__setattr__(self, "sigmas", tuple(check_sigma(s, "--sigmas") for s in self.sigmas))
        for name in ("pp_size", "input_len", "num_requests"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)} must be >= 1")
        if not self.fixed or min(self.fixed) < 1:
            raise ValueError(f"--fixed {self.fixed!r}: give chunk sizes >= 1, e.g. 1024,2048,4096,8192")
        if self.warmup_len < 0 or self.calib_max_len < 0:
            raise ValueError("--warmup-len and --calib-max-len must be >= 0 (0 disables)")
        if self.context_length is not None and self.context_length <= self.input_len:
            raise ValueError(f"--context-length {self.context_length} must exceed --input-len {self.input_len}")
        if self.profile and not Path(self.profile).is_file():
            raise ValueError(f"--profile {self.profile} does not exist; write one with `sglang-cpp tune chunk`")

    def ctx(self) -> int | None:
        """--context-length, else one just above the input when the model's own is too short."""
        if self.context_length:
            return self.context_length
        try:
            hf = json.loads((Path(self.model).expanduser() / "config.json").read_text())
            mpe = int(hf["max_position_embeddings"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return None if self.input_len < mpe else -(-(self.input_len + 64) // 1024) * 1024


def _spec(cfg: SweepConfig, C: int, dynamic: bool, env: dict) -> ServerSpec:
    return ServerSpec(str(Path(cfg.model).expanduser()), pp_size=cfg.pp_size, chunk_size=C, dynamic=dynamic,
                      device=cfg.device, env=env, context_length=cfg.ctx())


def measure(cfg: SweepConfig, name: str, kind: str, spec: ServerSpec, log=_log, **info) -> dict:
    """Start, warm up, bench, tear down. A failure becomes a row of the table, never an exception."""
    ent = {"name": name, "kind": kind, "chunk_size": spec.chunk_size, "env": dict(spec.env), **info,
           "status": "failed", "ttft_ms": None, "ttfts_ms": []}
    t0 = time.time()
    log(f"{name}: starting server (pp={spec.pp_size}, C={spec.chunk_size}, dynamic={spec.dynamic}, env={spec.env})")
    try:
        with launched(spec, timeout=cfg.timeout_per_server, log_dir=cfg.log_dir) as srv:
            log(f"{name}: healthy after {time.time() - t0:.0f} s")
            sub = lambda m: log(f"{name}: {m}")  # noqa: E731
            if cfg.warmup_len:  # short, unmeasured: connections and kernels, not a full-length prompt
                run_ttft(srv.base_url, BenchConfig((min(cfg.warmup_len, cfg.input_len),), 1, 0, 1,
                                                   cfg.seed + 10**6, 0, f"{name} warmup", cfg.request_timeout), log=sub)
            rec = run_ttft(srv.base_url, BenchConfig((cfg.input_len,), cfg.num_requests, 0, 1, cfg.seed, 0, name,
                                                     cfg.request_timeout), log=sub)[0]
            ent["calibration"] = reported_calibration(srv.log())
        ok = [t * 1e3 for t, e in zip(rec["ttfts"], rec["errors"]) if not e]
        if rec["median_ttft_ms"] is None or not ok:
            ent["reason"] = "; ".join(e for e in rec["errors"] if e) or "no successful request"
        else:
            ent.update(status="ok", ttft_ms=float(rec["median_ttft_ms"]), ttfts_ms=ok)
    except Exception as exc:  # a server that cannot start goes into the table, not up the stack
        ent["reason"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ent["seconds"] = round(time.time() - t0, 1)
    log(f"{name}: " + (f"TTFT {ent['ttft_ms']:.1f} ms" if ent["status"] == "ok" else f"FAILED: {ent['reason']}")
        + f" ({ent['seconds']:.0f} s)")
    return ent


def _plan_row(cfg: SweepConfig, best: int, log) -> dict:
    env = {"SGLANG_CPP_POLICY": "plan"}
    if cfg.profile:
        env["SGLANG_CPP_PROFILE"] = str(Path(cfg.profile).resolve())
    elif cfg.calib_max_len:
        env["SGLANG_CPP_CALIB_MAX_LEN"] = str(cfg.calib_max_len)  # short startup calibration, cached per device
    return measure(cfg, f"sglang-cpp plan C={best}", "plan", _spec(cfg, best, True, env), log, sigma=None)


def _upstream_env(cfg: SweepConfig, base: int, log, plan: dict | None = None) -> dict:
    """Upstream's algorithm: its own startup profiling (--upstream-profiling), else policy quadratic on
    a, b, c fitted to the calibration at upstream's profiling lengths (the profiling itself, 128 fresh
    prefills of up to 1.25*C tokens, would dwarf the sweep on a slow CPU)."""
    if cfg.upstream_profiling:
        return {"SGLANG_CPP_POLICY": "off"}
    from ..compare import write_upstream_json
    from ..costmodel import load_cost

    reported = (plan or {}).get("calibration")
    cal = Path(cfg.profile) if cfg.profile else (Path(reported) if reported else None)
    if cal is None:
        raise ValueError("no calibration to emulate upstream's fit from: run the plan server (drop --no-plan), "
                         "pass --profile, or use --upstream-profiling")
    path = Path(cfg.out or "sweep.json").with_name(f"sweep-upstream-C={base}.json")
    a, b, c = write_upstream_json(path, load_cost(cal), base, cfg.ctx() or 8192)
    log(f"upstream fit at C={base} emulated from {cal.name}: a={a:.3e} b={b:.3e} c={c:.3e}")
    return {"SGLANG_CPP_POLICY": "quadratic", "SGLANG_CPP_PROFILE": str(path.resolve())}


def sweep(cfg: SweepConfig, log=_log) -> list[dict]:
    rows = [measure(cfg, f"fixed C={C}", "fixed", _spec(cfg, C, False, {"SGLANG_CPP_POLICY": "off"}), log,
                    sigma=None) for C in cfg.fixed]
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        log("every fixed-chunk server failed; no base chunk for the dynamic and plan runs")
        return rows
    best = min(ok, key=lambda r: (r["ttft_ms"], r["chunk_size"]))["chunk_size"]
    base = min(2 * best, cfg.input_len)
    log(f"best fixed C*={best}; dynamic chunking at base {base} (2*C*, clamped to the input length)")
    plan = _plan_row(cfg, best, log) if cfg.plan else None  # first: its calibration feeds the upstream fit
    first = None
    try:
        up_env = _upstream_env(cfg, base, log, plan)
    except (ValueError, OSError) as exc:
        up_env = None
        log(f"dynamic runs skipped: {exc}")
    for s in cfg.sigmas:
        name = f"dynamic C={base} sigma={s:g}"
        if up_env is None:
            rows.append({"name": name, "kind": "dynamic", "chunk_size": base, "sigma": s, "env": {},
                         "status": "failed", "ttft_ms": None, "ttfts_ms": [], "reason": "no upstream fit"})
            continue
        env = {**up_env, "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": str(s)}
        if base >= cfg.input_len and first is not None:  # one chunk: sigma never used, same server
            rows.append({**first, "name": name, "sigma": s, "env": env,
                         "note": f"same as {first['name']}: base >= input, one chunk, sigma unused", "seconds": 0.0})
            continue
        rows.append(measure(cfg, name, "dynamic", _spec(cfg, base, True, env), log, sigma=s))
        if first is None and rows[-1]["status"] == "ok":
            first = rows[-1]
    return rows + ([plan] if plan else [])


def best_row(rows: list[dict]) -> dict | None:
    ok = [r for r in rows if r["status"] == "ok"]
    return min(ok, key=lambda r: r["ttft_ms"]) if ok else None


def render_table(cfg: SweepConfig, rows: list[dict]) -> str:
    best = best_row(rows)
    head = f"{'configuration':<34} {'C':>6} {'sigma':>6} {'TTFT (ms)':>12} {'vs best':>8}  note"
    lines = [f"TTFT of a {cfg.input_len}-token prompt, PP={cfg.pp_size}, median of {cfg.num_requests} "
             f"request(s); lower is better", head, "-" * len(head)]
    for r in rows:
        sig = "-" if r.get("sigma") is None else f"{r['sigma']:g}"
        if r["status"] == "ok":
            t, rel = f"{r['ttft_ms']:.1f}", f"{r['ttft_ms'] / best['ttft_ms']:.2f}x"
        else:
            t, rel = "FAILED", "-"
        note = r.get("note") or r.get("reason") or ("<- best" if r is best else "")
        lines.append(f"{r['name']:<34} {r['chunk_size']:>6} {sig:>6} {t:>12} {rel:>8}  {note}")
    if best:
        lines.append(f"fastest: {best['name']} ({best['ttft_ms']:.1f} ms); env {best['env']}")
    return "\n".join(lines)


def plot_bars(cfg: SweepConfig, rows: list[dict], path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_row(rows)
    colors = {"fixed": "tab:gray", "dynamic": "tab:orange", "plan": "tab:blue"}
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    for i, r in enumerate(rows):
        if r["status"] != "ok":
            ax.text(i, 0, "failed", ha="center", va="bottom", rotation=90, color="red")
            continue
        ax.bar(i, r["ttft_ms"], color=colors.get(r["kind"], "tab:green"),
               edgecolor="black" if r is best else "none", linewidth=2)
        ax.text(i, r["ttft_ms"], f"{r['ttft_ms']:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TTFT (ms), lower is better")
    ax.set_title(f"{Path(cfg.model).name}: PP={cfg.pp_size}, {cfg.input_len}-token prompt (best outlined)")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _floats(text: str) -> tuple:
    try:
        return tuple(float(t) for t in str(text).split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated numbers, e.g. 0.6,0.85") from None


def add_args(p: argparse.ArgumentParser) -> None:
    from ..args import alias, parse_ints, parse_len

    d = SweepConfig(model="")
    p.add_argument("--model-path", dest="model", required=True, help="model folder for `python -m sglang.launch_server`")
    p.add_argument("--pp-size", type=int, default=d.pp_size)
    p.add_argument("--input-len", type=parse_len, default=d.input_len, help="prompt tokens (SmolLM2 serves < 8192)")
    p.add_argument("--fixed-chunks", dest="fixed", type=parse_ints, default=d.fixed, help="fixed chunk sizes to try")
    p.add_argument("--sigmas", type=_floats, default=d.sigmas, help="SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR values")
    p.add_argument("--num-requests", type=int, default=d.num_requests, help="measured requests per server")
    p.add_argument("--warmup-len", type=parse_len, default=d.warmup_len, help="one unmeasured short request (0: none)")
    p.add_argument("--no-plan", dest="plan", action="store_false", help="skip the sglang-cpp plan server")
    p.add_argument("--profile", default=None, help="SGLANG_CPP_PROFILE for the plan server (else startup calibration)")
    p.add_argument("--calib-max-len", type=parse_len, default=d.calib_max_len,
                   help="SGLANG_CPP_CALIB_MAX_LEN for the plan server without --profile (0: server default)")
    p.add_argument("--context-length", type=parse_len, default=None,
                   help="server --context-length (default: the model's, raised when --input-len needs it)")
    p.add_argument("--device", default=d.device, help="server --device")
    p.add_argument("--plot", dest="png", default=None, help="bar chart of TTFT per configuration")
    alias(p, "--model-path", "--model")
    alias(p, "--fixed-chunks", "--fixed")
    alias(p, "--plot", "--png")
    p.add_argument("--out", default=None, help="results JSON")
    p.add_argument("--log-dir", default=None, help="server logs (default: a temp folder)")
    p.add_argument("--timeout-per-server", type=float, default=d.timeout_per_server, help="seconds to become healthy")
    p.add_argument("--request-timeout", type=float, default=d.request_timeout)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--upstream-profiling", action="store_true",
                   help="dynamic runs use upstream's own startup profiling (slow on CPU) instead of policy "
                        "quadratic on a fit emulated from the plan server's calibration")


def run(args, log=_log) -> int:
    cfg = config_from_args(SweepConfig, args)
    t0 = time.time()
    rows = sweep(cfg, log)
    print(render_table(cfg, rows))
    if cfg.png:
        print(f"wrote {plot_bars(cfg, rows, cfg.png)}")
    if cfg.out:
        p = Path(cfg.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        best = best_row(rows)
        p.write_text(json.dumps({"config": asdict(cfg), "rows": rows, "best": best and best["name"],
                                 "minutes": round((time.time() - t0) / 60, 2),
                                 "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")},
                                indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v)))
        print(f"wrote {p}")
    log(f"sweep finished in {(time.time() - t0) / 60:.1f} min")
    if best_row(rows) is None:
        return 2
    return 1 if any(r["status"] != "ok" for r in rows) else 0


__all__ = ["SweepConfig", "sweep", "measure", "render_table", "plot_bars", "best_row", "add_args", "run"]
