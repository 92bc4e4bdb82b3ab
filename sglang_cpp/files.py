"""Results on disk: atomic JSON (state, profiles, per-device files), matplotlib figures, and the one
reader of the plugin's decision logs.

One home for each, so an interrupted run never leaves a half-written file, every figure is saved the
same way, headless, and every tool reads a decision log alike.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

_MISSING = object()


def save_json(path, doc, indent: int = 1) -> Path:
    """Write `doc` to `path` atomically (temp file, then rename); parents are created. A folder at `path` is
    one line naming it (ValueError), not the temp file's rename error."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{path} is a folder: give a file name for the JSON (e.g. {p / 'out.json'})")
    p.parent.mkdir(parents=True, exist_ok=True)
    # a temp name of its own: two servers on one node sharing a cache must not write the same temp file
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(doc, indent=indent))
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def finite(doc):
    """`doc` with every non-finite float (an unbounded bandwidth, an undefined ratio) as None: strict JSON
    has no Infinity or NaN, and other tools' parsers refuse them."""
    if isinstance(doc, float):
        return doc if doc == doc and doc not in (float("inf"), float("-inf")) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def dumps(doc, **kw) -> str:
    """Strict JSON of `doc` (`finite`): what every --json output prints."""
    return json.dumps(finite(doc), allow_nan=False, **kw)


def device_file_name(model, pp: int, tp, device_name, dtype, **extra) -> str:
    """The per-device file name (a profile from `tune chunk`, a calibration in the cache), key=value pairs
    joined by commas the way SGLang's fused-MoE tuners name their configs."""
    parts = {"model": Path(str(model or "model").rstrip("/")).name, "pp": int(pp), "tp": tp or 1,
             "device_name": device_name or "unknown", "dtype": dtype or "unknown", **extra}
    return ",".join(f"{k}={re.sub(r'[^A-Za-z0-9_.,=-]+', '_', str(v)).strip('_') or 'unknown'}"
                    for k, v in parts.items()) + ".json"


def tuned_path(meta: dict, folder=None) -> Path:
    """The one name of a tuned profile: `sglang-cpp tune chunk` writes it, the plugin looks for its server's at
    startup. In `folder`, by default SGLANG_CPP_CACHE_DIR/tuned (SGLang's fused-MoE tuner likewise writes per-device
    configs the server reads), named by the model, PP and TP size, device and dtype of `meta`."""
    from .envs import CACHE_DIR

    name = device_file_name(meta.get("model"), meta["pp"], meta.get("tp"), meta.get("device_name"), meta.get("dtype"))
    return Path(folder or Path(CACHE_DIR.get()) / "tuned") / name


def load_json(path, default=_MISSING):
    """The JSON document at `path`; `default` when it is missing or unreadable, if one is given."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        if default is _MISSING:
            raise
        return default


def iter_events(paths, *events: str, strict: bool = False):
    """(path, line number, record) for each record of the plugin's decision logs (JSON lines), in file
    order, of the named events (every event when none is named). A line that is not JSON is skipped, or
    with `strict` (a fit's samples) an error, except a last line without its newline: what a crash or a
    kill mid-write leaves. A file that cannot be read is an error naming SGLANG_CPP_DECISION_LOG."""
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ValueError(f"decision log {path}: cannot read it ({exc.strerror or exc}); start the server with "
                             "SGLANG_CPP_DECISION_LOG=/tmp/cpp-{rank}.jsonl and send requests") from None
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                if not strict or (n == len(lines) and not text.endswith("\n")):
                    continue
                raise ValueError(f"decision log {path} line {n} is not JSON ({getattr(exc, 'msg', exc)}); "
                                 "delete the line (a crash can leave a partial last line)") from None
            if isinstance(rec, dict) and (not events or rec.get("event") in events):
                yield path, n, rec


def read_events(paths, *events: str, strict: bool = False) -> list[dict]:
    """The records of `iter_events`: the one reader of decision logs (the fit, the serving simulator's
    decode fit, the runner's step costs, the benchmarks and the tests)."""
    return [rec for _, _, rec in iter_events(paths, *events, strict=strict)]


def update_section(path, title: str, body: str, head: str = "# Reliability") -> Path:
    """Replace (or append) the `## title` section of a markdown results file, keeping the others, so
    several benchmark scripts can each own one section of one file."""
    p = Path(path)
    text = p.read_text() if p.exists() else head + "\n"
    marker = f"## {title}\n"
    new = f"{marker}\n{body.rstrip()}\n"
    if marker in text:
        start = text.index(marker)
        nxt = text.find("\n## ", start + len(marker))
        text = text[:start] + new + (text[nxt:] if nxt >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + new
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 110) -> Path:
    """Write a figure as PNG (parents created) and close it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=dpi)
    pyplot().close(fig)
    return p
