"""What machine and versions a measurement came from (every results file and profile records it)."""
from __future__ import annotations

import datetime as _dt
import os
import platform
from importlib import metadata
from pathlib import Path


def _cpuinfo(key: str) -> str | None:
    """The first /proc/cpuinfo value of `key` (None off Linux or when absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "cpu"


# On CPU everything we launch runs float32: AVX2 hosts have no bf16 GEMM kernels (a bf16 GEMM runs
# ~45x slower than fp32 there), and one dtype on every host keeps results and calibrations comparable.
CPU_DTYPE = "float32"


def cpu_flags() -> set[str]:
    return set((_cpuinfo("flags") or "").split())


def cpu_isa() -> str:
    """The widest vector ISA this CPU has, as written beside every timing we record."""
    flags = cpu_flags()
    for isa, need in (("AMX-BF16", "amx_bf16"), ("AVX512-BF16", "avx512_bf16"), ("AVX512", "avx512f"),
                      ("AVX2", "avx2")):
        if need in flags:
            return isa
    return platform.machine() or "unknown"


def native_bf16() -> bool:
    return bool(cpu_flags() & {"amx_bf16", "avx512_bf16"})


def cpu_dtype_warning(device: str, dtype: str, native: bool | None = None) -> str | None:
    """The warning a CPU server in bf16 on a host without native bf16 gets (None when fine)."""
    native = native_bf16() if native is None else native
    if device == "cpu" and dtype.replace("torch.", "") == "bfloat16" and not native:
        return (f"[sglang-cpp] this CPU ({cpu_isa()}) has no native bf16: bf16 GEMMs run ~45x slower than fp32 here. "
                "Launch with --dtype float32 (sglang-cpp's own launchers always do on CPU).")
    return None


def versions(*pkgs: str) -> dict:
    out = {}
    for pkg in pkgs or ("torch", "sglang", "sglang-cpp", "transformers", "numpy", "scipy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def machine_info() -> dict:
    return {"cpu": cpu_model(), "isa": cpu_isa(), "cores": os.cpu_count(), "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **versions()}


def source_commit() -> str:
    """The sglang-cpp commit the code ran from ('+ local changes' when a tracked Python file differs from it:
    a benchmark's own results files do not count), so a figure can be dated against later changes;
    'unknown' outside a git checkout (an installed wheel)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                "*.py"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (" + local changes" if dirty else "")


def provenance_lines(command: str, machine_extra: str = "") -> list[str]:
    """The date / machine (with ISA) / versions / commit / command lines every results file starts with."""
    info = machine_info()
    return [f"- date: {info['date']}",
            f"- machine: {info['cpu']} ({info['isa']}), {info['cores']} cores{machine_extra}",
            f"- versions: torch {info['torch']}, sglang {info['sglang']}, sglang-cpp {info['sglang-cpp']}",
            f"- commit: {source_commit()}",
            f"- command: `{command}`"]


def device_name(device: str) -> str:
    """The device as the calibration cache and `tune chunk`'s files name it: the GPU's name (spaces as _), or
    on CPU the model, the ISA (hosts of one CPU model differ: AVX2 only, or AVX-512 with bf16) and the cores."""
    import re

    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name().replace(" ", "_")
    name = f"{cpu_model()} {cpu_isa()}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") + f"_{os.cpu_count()}cpu"
