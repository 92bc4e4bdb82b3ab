"""What machine and versions a measurement came from (every results file and profile records it)."""
from __future__ import annotations

import datetime as _dt
import os
import platform
from importlib import metadata
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def versions(*pkgs: str) -> dict:
    out = {}
    for pkg in pkgs or ("torch", "sglang", "sglang-cpp", "transformers", "numpy", "scipy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def machine_info() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **versions()}
