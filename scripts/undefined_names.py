"""Names a module loads but neither defines nor imports (a NameError waiting for the one path that runs it).

Why: the plugin's server-only paths (calibration, the overhead probe) run in no unit test; a name left behind
when a function moves to another module fails only on a server. pyflakes' undefined-name rule, scope-aware,
on its own (its other rules are style, not this check's business).
Usage: python scripts/undefined_names.py FILE.py [...]   (exit 1 and one line per file with such names)
"""
from __future__ import annotations

import ast
import sys

from pyflakes import checker, messages


def check(path: str) -> list[str]:
    """The names `path` loads without defining or importing them, sorted."""
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    found = checker.Checker(tree, filename=path).messages
    return sorted({m.message_args[0] for m in found if isinstance(m, messages.UndefinedName)})


if __name__ == "__main__":
    bad = 0
    for p in sys.argv[1:]:
        u = check(p)
        if u:
            print(p, u)
            bad = 1
    sys.exit(bad)
