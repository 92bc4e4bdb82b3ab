"""README's CLI section runs as written (issue 47 item 7): every `sglang-cpp` command in it, but those marked
"(a server)", runs from the repository root on the shipped inputs and exits 0. A README example that stops working
fails here."""
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


@pytest.mark.parametrize("command", OFFLINE, ids=[" ".join(c.split()[1:3]) + f" #{i}" for i, c in enumerate(OFFLINE)])
def test_a_readme_command_runs_as_written(command, tmp_path, monkeypatch, capsys):
    from sglang_cpp.cli import main as cli_main

    argv = shlex.split(command.split("#")[0])[1:]
    # inputs are named from the repository root; outputs (trace.json, fit.png, tune chunk's JSON) land in tmp
    argv = [str(ROOT / a) if a.startswith(("examples/", "results/")) else a for a in argv]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLANG_CPP_CACHE_DIR", str(tmp_path / "cache"))  # tune chunk's default folder
    assert cli_main(argv) == 0, capsys.readouterr().err[-2000:]
