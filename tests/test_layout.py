"""The layout: profile -> fit -> plan -> serve -> bench with no import cycles, and an offline core
(cost model, planner, plan, partition, simulator, analytic model, upstream's algorithm) that imports
neither the plugin, the CLI, torch nor sglang. Read statically (scripts/import_graph.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_module():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycles():
    ig = _graph_module()
    assert ig.cycles(ig.graph()) == []


def test_core_imports_neither_plugin_nor_cli_nor_torch():
    ig = _graph_module()
    g = ig.graph()
    assert ig.core_violations(g) == {}
    assert set(ig.CORE) <= set(g)  # the core modules exist where the script looks


def test_the_checker_sees_a_violation():
    """The graph walk is not vacuous: the plugin reaches sglang and torch, the CLI reaches the plugin."""
    ig = _graph_module()
    g = ig.graph()
    assert {"sglang", "torch"} <= ig.reach(g, "sglang_cpp.plugin.hooks")
    assert "sglang_cpp.plugin.sizer" in ig.reach(g, "sglang_cpp.cli")
    assert ig.cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_every_sglang_internal_the_plugin_uses_is_listed_in_one_place():
    """plugin/targets.py's TARGETS (hooked symbols) and INTERNALS (called symbols) are the whole SGLang
    surface; an import of anything else from sglang in the plugin fails here until it is listed."""
    import ast

    from sglang_cpp.plugin import INTERNALS, TARGETS

    used = set()
    for f in (ROOT / "sglang_cpp" / "plugin").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang."):
                used |= {f"{node.module}.{a.name}" for a in node.names}
    assert used == set(INTERNALS)
    assert all(t.startswith("sglang.srt.") for t in TARGETS)
    from sglang_cpp.plugin import hooks

    assert all(callable(getattr(hooks, fn)) for fn, _ in TARGETS.values())  # each hook named in hooks.py
