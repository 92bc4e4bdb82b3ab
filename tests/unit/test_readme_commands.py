"""README's CLI section runs as written (issue 47 item 7, issue 59 test 1): every `sglang-cpp` command in it, but
those marked "(a server)", runs as written on the shipped inputs, exits 0 and prints what its kind promises. A README
example that stops working fails here."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The `sglang-cpp` commands of README's CLI code block, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## CLI\n+```bash\n(.*?)```", text, re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("sglang-cpp ")]


COMMANDS = readme_commands()
OFFLINE = [c for c in COMMANDS if "(a server" not in c]


def test_the_cli_section_has_commands_and_says_which_need_a_server():
    assert len(COMMANDS) >= 20 and len(OFFLINE) >= 14
    assert all("--base-url" not in c and "tune sweep" not in c for c in OFFLINE)


# what each kind of command must print (stdout and stderr together), besides exiting 0 with no traceback
SAYS = {
    "plan": r"chunk",
    "simulate": r"TTFT",
    "tune fit": r"t\(L,x\)|R\^2",
    "tune chunk": r"wrote .*tuned",
    "tune partition": r"SGLANG_PP_LAYER_PARTITION=[0-9,]+ python -m sglang.launch_server",
    "tune layout": r"\*\*best\*\*.*\n(.*\n)*Winner's launch line",
    "tune analytic": r"efficiency [0-9.]+ of peak",
    "bench ttft": r"SIMULATED",
    "simulate-serve": r"(?i)ttft",
}
OUTPUT_FLAGS = ("--trace", "--plot", "--json", "--out", "--out-dir", "--output-file")


def _kind(argv: list[str]) -> str:
    return " ".join(argv[:2]) if argv[0] in ("tune", "bench") else argv[0]


@pytest.mark.parametrize("command", OFFLINE, ids=[" ".join(c.split()[1:3]) + f" #{i}" for i, c in enumerate(OFFLINE)])
def test_a_readme_command_runs_as_written(command, tmp_path):
    """Issue 59 test 1: the command as README writes it, in a subprocess, from a folder that holds the repository's
    `examples/` and `results/` as the root does (so its relative paths are README's, and the files it writes land
    in that folder, not in the checkout): exit 0, no traceback, the output its kind promises, and every file a flag
    names written."""
    import os
    import subprocess
    import sys

    for name in ("examples", "results"):
        (tmp_path / name).symlink_to(ROOT / name)
    argv = shlex.split(command.split("#")[0])[1:]
    env = {**os.environ, "SGLANG_CPP_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "sglang_cpp.cli", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out[-2000:]
    assert re.search(SAYS[_kind(argv)], out), (SAYS[_kind(argv)], out[-2000:])
    switch = ("--json",) if _kind(argv) in ("plan", "simulate") else ()  # there --json prints JSON, naming no file
    named = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS and a not in switch]
    for path in named:
        assert (tmp_path / path).exists() and ((tmp_path / path).is_dir() or (tmp_path / path).stat().st_size > 0), path
    if _kind(argv) == "tune chunk":  # its tuned file goes where SGLANG_CPP_CACHE_DIR says, and it says where
        (tuned,) = (tmp_path / "cache" / "tuned").glob("*.json")
        assert str(tuned) in out
