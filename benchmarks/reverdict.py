"""Re-derive the 'plan C=X: median <= 1.01x the best fixed' verdicts of `bench compare` results files from
their own tables (each row's TTFT per request), with the one rule (`bench.report.verdict`: a tie is never
met). Issue 46 item 8: reports written before that rule said "met" for a plan inside the best fixed chunk's
spread. Rewrites the verdict cells in place and prints every change.

Usage: python benchmarks/reverdict.py results/tuning_free_compare*.md ...
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from sglang_cpp.bench.report import verdict

ROW = re.compile(r"^\| (?P<label>[^|]+?) \| (?P<vals>[0-9.]+(?: / [0-9.]+)*) \|")
TARGET = re.compile(r"^\| plan C=(?P<c>\d+): median <= (?P<lim>[0-9.]+)x the best fixed \| (?P<ratio>[0-9.]+) \| (?P<v>[^|]+) \|$")
BEST = re.compile(r"^Best fixed chunk: C=(?P<c>\d+)")


def reverdict(text: str) -> tuple[str, list[str]]:
    out, changes, rows, best = [], [], {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            rows, best = {}, None
        m = None if TARGET.match(line) else ROW.match(line)
        if m:
            label = m["label"].strip()
            c = re.search(r"C=(\d+)", label)
            if c:
                kind = "plan" if "plan" in label else ("fixed" if label.startswith("fixed") else None)
                if kind:
                    rows[kind, int(c[1])] = [float(v) for v in m["vals"].split(" / ")]
        m = BEST.match(line)
        if m:
            best = int(m["c"])
        m = TARGET.match(line)
        if m and best is not None and ("plan", int(m["c"])) in rows and ("fixed", best) in rows:
            want = verdict(float(m["ratio"]), float(m["lim"]), rows["plan", int(m["c"])], rows["fixed", best])
            if want != m["v"].strip():
                changes.append(f"plan C={m['c']} vs fixed C={best}: {m['v'].strip()} -> {want}")
                line = line[:m.start("v")] + want + " |"
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else ""), changes


def main(paths: list[str]) -> int:
    for p in map(Path, paths):
        text, changes = reverdict(p.read_text())
        for c in changes:
            print(f"{p}: {c}")
        if changes:
            p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
