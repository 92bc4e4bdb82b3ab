"""Issue 59 item 2: rerun every simulated or analytic results script, and with --check fail when a committed table
differs from what this checkout produces.

Each script writes its file into a temporary folder; the rerun is compared with the committed file line by line,
leaving out the provenance lines (date, machine, versions, commit, command: they name the run, not the figures) and
lines that hold a time measured on the host (a planning time). The committed file may go on past the script's last
line (readings added by hand); every line the script writes must match, in order. The first differing line is named
with both versions. Pure numpy scripts: the figures do not depend on the host.

CI runs `--check --quick` (the scripts that finish within about 2 minutes together on an AVX2 host, README's test
command); `--check` alone reruns every script here (results/stream.md alone takes about 30 minutes). Without --check
the committed files are rewritten: the way to land a change to core/ or whatif/ that moves a figure.

Usage: python benchmarks/regenerate.py [--check] [--quick] [--only NAME[,NAME...]]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Script:
    name: str  # benchmarks/<name>.py
    results: str  # its committed file, relative to the repository root
    quick: bool  # in CI's --check --quick (seconds, not minutes)
    args: tuple = ()
    volatile: str = ""  # a regex for the lines that hold a time measured on this host
    volatile_columns: tuple = ()  # table columns (by header) that hold one: their cells are not compared


SCRIPTS = (  # the quick ones take about a minute together on a 2-core AMD EPYC; stream.md about 30 minutes
    Script("bursts", "results/bursts.md", True, volatile=r"^Planning time of the"),
    Script("virtual_pp", "results/virtual_pp.md", True),
    Script("analytic_whatif", "results/analytic_whatif.md", True),
    Script("tuning_free_analytic", "results/tuning_free_analytic.md", True),
    Script("serving_papers", "results/serving_sim.md", True, volatile_columns=("sim wall (s)",)),
    Script("tune_layout", "results/tune_layout.md", True),
    Script("measured_stages", "results/gpu-h200/measured_stages.md", True, args=("--folder", "results/gpu-h200")),
    Script("stream", "results/stream.md", False),
)
PROVENANCE = re.compile(r"^- (date|machine|versions|commit|command|lscpu flags of note|raw records): ")


def figures(text: str, volatile: str = "", columns: tuple = ()) -> list[str]:
    """The lines that carry figures: everything but the provenance lines and the host-timed ones (whole lines
    matching `volatile`, and the cells of table columns headed by one of `columns`)."""
    vol = re.compile(volatile) if volatile else None
    out, masked = [], set()
    for ln in text.splitlines():
        if PROVENANCE.match(ln) or (vol and vol.search(ln)):
            continue
        if not ln.startswith("|"):
            masked = set()  # a table ends with its rows
        else:
            cells = ln.split("|")
            if any(c.strip() in columns for c in cells):
                masked = {i for i, c in enumerate(cells) if c.strip() in columns}
            elif masked and not set(ln) <= set("|-: "):
                ln = "|".join("~" if i in masked else c for i, c in enumerate(cells))
        out.append(ln.rstrip())
    return out


def first_difference(committed: list[str], fresh: list[str]) -> tuple[int, str, str] | None:
    """(index, committed line, fresh line) of the first line the rerun writes differently; None when every line it
    writes is the committed file's (which may go on with readings added by hand)."""
    for i, line in enumerate(fresh):
        have = committed[i] if i < len(committed) else "<the committed file ends here>"
        if have != line:
            return i, have, line
    return None


def rerun(s: Script, out: Path) -> Path:
    """Run the script with its results path in `out`; its results file (and raw records beside it)."""
    target = out / Path(s.results).name
    cmd = [sys.executable, str(ROOT / "benchmarks" / f"{s.name}.py"), "--results", str(target), *s.args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"regenerate: benchmarks/{s.name}.py failed (exit {done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files; rewrite nothing")
    ap.add_argument("--quick", action="store_true", help="only the scripts CI reruns (seconds each)")
    ap.add_argument("--only", default="", help="comma-separated script names")
    args = ap.parse_args()
    only = {n for n in args.only.split(",") if n}
    unknown = only - {s.name for s in SCRIPTS}
    if unknown:
        ap.error(f"--only {','.join(sorted(unknown))}: not one of {', '.join(s.name for s in SCRIPTS)}")
    chosen = [s for s in SCRIPTS if (not only or s.name in only) and (not args.quick or s.quick)]
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in chosen:
            t0 = time.monotonic()
            fresh_path = rerun(s, Path(tmp))
            took = time.monotonic() - t0
            if not args.check:
                for f in Path(tmp).glob(Path(s.results).stem + ".*"):
                    shutil.copy(f, ROOT / Path(s.results).parent / f.name)
                print(f"{s.results}: rewritten ({took:.0f} s)")
                continue
            committed = figures((ROOT / s.results).read_text(), s.volatile, s.volatile_columns)
            diff = first_difference(committed, figures(fresh_path.read_text(), s.volatile, s.volatile_columns))
            if diff is None:
                print(f"{s.results}: matches this checkout ({took:.0f} s)")
            else:
                i, have, got = diff
                failed.append(s.results)
                print(f"{s.results}: differs from what this checkout writes, at figure line {i + 1}:\n"
                      f"  committed: {have}\n  rerun:     {got}\n  (python benchmarks/regenerate.py --only {s.name} "
                      "rewrites it)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
