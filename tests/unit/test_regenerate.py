"""Issue 59 item 2: `benchmarks/regenerate.py --check` keeps the simulated and analytic results files what this
checkout writes. The comparison leaves out provenance and host-timed figures only; CI runs the quick set here."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("regenerate", ROOT / "benchmarks" / "regenerate.py")
regenerate = importlib.util.module_from_spec(spec)
sys.modules["regenerate"] = regenerate  # its dataclasses look their module up
spec.loader.exec_module(regenerate)

COMMITTED = """# t
- date: 2026-11-28T00:00:00+00:00
- commit: abc1234
| policy | tok/s | sim wall (s) |
|---|---:|---:|
| a | 100 | 0.6 |
Planning time p50 3.1 ms
## Readings (added by hand)
- a reading
"""


def test_provenance_host_times_and_hand_readings_are_not_compared():
    fresh = COMMITTED.replace("2026-11-28T00:00:00", "2026-12-01T09:00:00").replace("abc1234", "def5678") \
        .replace("0.6 |", "0.7 |").replace("3.1 ms", "2.9 ms").split("## Readings")[0]
    args = ("^Planning time", ("sim wall (s)",))
    assert regenerate.first_difference(regenerate.figures(COMMITTED, *args), regenerate.figures(fresh, *args)) is None


def test_a_moved_figure_is_named_with_both_lines():
    fresh = COMMITTED.replace("| a | 100 |", "| a | 101 |")
    got = regenerate.first_difference(regenerate.figures(COMMITTED, "", ("sim wall (s)",)),
                                      regenerate.figures(fresh, "", ("sim wall (s)",)))
    assert got is not None and got[1].startswith("| a | 100 |") and got[2].startswith("| a | 101 |")
    short = "\n".join(COMMITTED.splitlines()[:5])  # the rerun writes a line the committed file lacks
    assert regenerate.first_difference(regenerate.figures(short), regenerate.figures(COMMITTED))[1] == \
        "<the committed file ends here>"


def test_the_quick_results_files_are_what_this_checkout_writes():
    """CI's check: every quick script (bursts, virtual PP, the analytic what-if, tuning-free analytic, the serving
    simulator, tune layout, the GPU-measured stages) rerun into a temporary folder matches its committed file."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "regenerate.py"), "--check", "--quick"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.count("matches this checkout") == sum(s.quick for s in regenerate.SCRIPTS) == 7
