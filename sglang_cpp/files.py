"""Writing results: atomic JSON (state, profiles, per-device files) and matplotlib figures.

One home for both, so an interrupted run never leaves a half-written file and every figure is saved
the same way, headless.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

_MISSING = object()


def save_json(path, doc, indent: int = 1) -> Path:
    """Write `doc` to `path` atomically (temp file, then rename); parents are created."""
    p = Path(path)
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


def device_file_name(model, pp: int, tp, device_name, dtype, **extra) -> str:
    """The per-device file name (a profile from `tune chunk`, a calibration in the cache), key=value pairs
    joined by commas the way SGLang's fused-MoE tuners name their configs."""
    parts = {"model": Path(str(model or "model").rstrip("/")).name, "pp": int(pp), "tp": tp or 1,
             "device_name": device_name or "unknown", "dtype": dtype or "unknown", **extra}
    return ",".join(f"{k}={re.sub(r'[^A-Za-z0-9_.,=-]+', '_', str(v)).strip('_') or 'unknown'}"
                    for k, v in parts.items()) + ".json"


def load_json(path, default=_MISSING):
    """The JSON document at `path`; `default` when it is missing or unreadable, if one is given."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        if default is _MISSING:
            raise
        return default


def read_events(paths, event: str) -> list[dict]:
    """The `event` records of the plugin's decision logs (JSONL), in file order; a partial last line
    (a crash or a kill mid-write) is skipped."""
    out = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == event:
                out.append(rec)
    return out


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
