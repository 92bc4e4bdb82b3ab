"""Combine per-length `bench compare` results into results/compare.md: every length's table, the
regret of each fixed chunk across the lengths, and the issue-10 targets, met or missed by how much.

Each input is a markdown file written by `sglang-cpp bench compare --results FILE` (one length per run,
since a run at 16K or 32K takes about an hour on the 2-core CPU).

Usage: python benchmarks/compare_summary.py results/compare-8k.md results/compare-16k.md [...] \
           [--notes results/compare-notes.md] [--out results/compare.md]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROW = re.compile(r"^\| (?P<config>[^|]+?) \| (?P<chunk>[^|]+) \| (?P<L>\d+) \| (?P<med>[^|]+) \| (?P<p90>[^|]+) \| "
                 r"(?P<ok>[^|]+) \| (?P<vs_dyn>[^|]+) \| (?P<vs_best>[^|]+) \| (?P<eff>[^|]+) \| (?P<pred>[^|]+) \| "
                 r"(?P<ratio>[^|]+) \|$")


def _num(v: str) -> float | None:
    try:
        return float(v.strip())
    except ValueError:
        return None


def read(path: Path) -> tuple[list[dict], list[str]]:
    """(table rows, the file's provenance lines)."""
    rows, head = [], []
    for line in path.read_text().splitlines():
        if line.startswith("- ") and not rows:
            head.append(line)
        m = ROW.match(line)
        if m and m["L"].isdigit():
            d = m.groupdict()
            d["kind"] = ("fixed" if d["config"].startswith("fixed") else "plan" if "plan" in d["config"] else
                         "dynamic" if "dynamic" in d["config"] else "pp1")
            d["best"] = "**(best)**" in d["config"]
            d.update(L=int(d["L"]), med=_num(d["med"]), pred=_num(d["pred"]), eff=_num(d["eff"]),
                     chunk=d["chunk"].strip())
            rows.append(d)
    return rows, head


def summary(files: list[Path], notes: Path | None = None) -> str:
    per = {p: read(p) for p in files}
    rows = [r for rs, _ in per.values() for r in rs]
    lens = sorted({r["L"] for r in rows})
    plan = {L: next((r["med"] for r in rows if r["kind"] == "plan" and r["L"] == L), None) for L in lens}
    dyn = {L: min((r["med"] for r in rows if r["kind"] == "dynamic" and r["L"] == L and r["med"]), default=None)
           for L in lens}
    best = {L: min((r["med"] for r in rows if r["kind"] == "fixed" and r["L"] == L and r["med"]), default=None)
            for L in lens}
    out = ["# TTFT side by side at every measured length (PP=2, CPU)", "",
           "Combined by `python benchmarks/compare_summary.py " + " ".join(str(p) for p in files) + "`; each "
           "length's own table, command and provenance follow below.", "",
           "## The targets (issue 10, section 4)", "",
           "| input len | plan / best fixed (target <= 1.00) | plan / upstream dynamic (target <= 0.85 at 16K, 32K) | "
           "PP2 efficiency of the plan (target >= 0.85 at 32K) | worst sim error over the rows (target +-10%) |",
           "|---:|---:|---:|---:|---:|"]
    for L in lens:
        eff = next((r["eff"] for r in rows if r["kind"] == "plan" and r["L"] == L), None)
        errs = [r["med"] / r["pred"] - 1 for r in rows if r["L"] == L and r["med"] and r["pred"]]
        worst = max(errs, key=abs) if errs else None
        out.append(f"| {L} | {_r(plan[L], best[L])} | {_r(plan[L], dyn[L])} | {'—' if eff is None else f'{eff:.2f}'} | "
                   f"{'—' if worst is None else f'{worst:+.1%}'} |")
    chunks = sorted({int(r["chunk"]) for r in rows if r["kind"] == "fixed"})
    out += ["", "## Regret of one fixed chunk", "",
            "Median TTFT of fixed C divided by the plan's at the same length (— where C was not run); the last "
            "column is the worst over the lengths: what picking that one C for every length costs.", "",
            "| fixed C | " + " | ".join(f"{L} tokens" for L in lens) + " | worst |",
            "|---:|" + "---:|" * (len(lens) + 1)]
    for C in chunks:
        ratios = [next((r["med"] / plan[L] for r in rows if r["kind"] == "fixed" and r["L"] == L and
                        int(r["chunk"]) == C and r["med"] and plan[L]), None) for L in lens]
        got = [x for x in ratios if x is not None]
        out.append(f"| {C} | " + " | ".join("—" if x is None else f"{x:.3f}" for x in ratios) +
                   f" | {max(got):.3f} |" if got else f"| {C} | " + " | ".join("—" for _ in lens) + " | — |")
    if notes is not None:
        out += ["", notes.read_text().strip()]
    for p, (_, head) in per.items():
        out += ["", f"## {p.name}", "", *head, "", *[ln for ln in p.read_text().splitlines() if ln.startswith("|")]]
    return "\n".join(out) + "\n"


def _r(a, b) -> str:
    return "—" if a is None or not b else f"{a / b:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("results/compare.md"))
    ap.add_argument("--notes", type=Path, default=None, help="markdown included after the targets (what was "
                                                              "measured about the misses)")
    args = ap.parse_args()
    text = summary(args.files, args.notes)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
