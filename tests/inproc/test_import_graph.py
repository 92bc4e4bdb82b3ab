"""The layout: profile -> fit -> plan -> serve -> bench with no import cycles; wings (core, whatif, plugin,
bench, cli, over the support modules) that import only the wings below them; and an offline core and
what-if models that import neither the plugin, the CLI, torch nor sglang. Read statically
(scripts/import_graph.py); docs/architecture.md draws it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
    """The graph walk is not vacuous: the plugin reaches sglang and torch, the CLI reaches the planner through
    `tune` (sglang_cpp/cli/tune/, on sglang_cpp/tuning/) and no plugin module (the command line runs without SGLang;
    `tune chunk` plans as the plugin does through core's PlanConfig.from_server, not the plugin's sizer)."""
    ig = _graph_module()
    g = ig.graph()
    assert {"sglang", "torch"} <= ig.reach(g, "sglang_cpp.plugin.hooks")
    assert {"sglang_cpp.tuning.recommend", "sglang_cpp.core.objective"} <= ig.reach(g, "sglang_cpp.cli.tune")
    assert not {m for m in ig.reach(g, "sglang_cpp.cli") if m.startswith("sglang_cpp.plugin")}
    assert ig.cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_every_wing_imports_only_the_wings_below_it():
    ig = _graph_module()
    assert ig.wing_violations(ig.graph()) == []
    assert ig.cycles({w: set(b) for w, b in ig.BELOW.items()}) == []  # the wings themselves form a ladder
    assert all(w in ig.BELOW["cli"] for w in ig.BELOW if w != "cli")  # the CLI sits on top of all of them


def test_the_wing_check_fails_on_a_violation_it_is_given():
    """Test the test: an import pointing up, one sideways (plugin -> whatif), a pure wing reaching torch
    through a support module, and a module placed in no wing are each reported."""
    ig = _graph_module()
    g = {"sglang_cpp.core.plan": {"sglang_cpp.whatif.simulator"},
         "sglang_cpp.whatif.simulator": {"sglang_cpp.machine"},
         "sglang_cpp.machine": {"torch"},
         "sglang_cpp.plugin.hooks": {"sglang_cpp.whatif.simulator", "sglang_cpp.core.plan", "sglang_cpp.envs"},
         "sglang_cpp.bench.ttft": {"sglang_cpp.cli"},
         "sglang_cpp.cli": {"sglang_cpp.bench.ttft", "sglang_cpp.plugin.hooks"},
         "sglang_cpp.tuning.recommend": {"sglang_cpp.cli.common"},  # tuning/ sits below the command line
         "sglang_cpp.cli.common": set(),
         "sglang_cpp.stray": set()}
    bad = ig.wing_violations(g)
    assert "sglang_cpp.core.plan -> sglang_cpp.whatif.simulator: core imports whatif" in bad
    assert "sglang_cpp.plugin.hooks -> sglang_cpp.whatif.simulator: plugin imports whatif" in bad
    assert "sglang_cpp.bench.ttft -> sglang_cpp.cli: bench imports cli" in bad
    assert "sglang_cpp.whatif.simulator reaches torch: whatif is pure" in bad
    assert "sglang_cpp.core.plan reaches torch: core is pure" in bad
    assert any(v.startswith("sglang_cpp.stray: in no wing") for v in bad)
    assert "sglang_cpp.tuning.recommend -> sglang_cpp.cli.common: tuning imports cli" in bad
    assert not any(v.startswith("sglang_cpp.cli ->") for v in bad)  # the CLI may import every wing
    assert len(bad) == 7
    assert ig.wing("sglang_cpp.profiler.cli") == ig.wing("sglang_cpp.cli.tune.chunk_cmd") == "cli"
    assert ig.wing("sglang_cpp.tuning.fit") == "tuning"


def test_every_sglang_internal_the_plugin_uses_is_listed_in_one_place():
    """plugin/targets.py's TARGETS (hooked symbols) and INTERNALS (called symbols) are the whole SGLang
    surface; an import of anything else from sglang in the plugin fails here until it is listed."""
    import ast

    from sglang_cpp.plugin import INTERNALS, TARGETS

    used = set()
    for f in (ROOT / "sglang_cpp" / "plugin").rglob("*.py"):
        used |= sglang_uses(f.read_text())
    assert used == set(INTERNALS)
    assert all(t.startswith("sglang.srt.") for t in TARGETS)
    from sglang_cpp.plugin import hooks

    assert all(callable(getattr(hooks, fn)) for fn, _ in TARGETS.values())  # each hook named in hooks.py


def sglang_uses(source: str) -> set:
    """Every SGLang symbol a module reaches: `from sglang... import X`, `import sglang...` and
    `sys.modules["sglang..."]` (a lookup that needs no import statement)."""
    import ast

    used = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang."):
            used |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            used |= {a.name for a in node.names if a.name == "sglang" or a.name.startswith("sglang.")}
        elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, str) and node.slice.value.startswith("sglang")
              and ast.unparse(node.value) == "sys.modules"):
            used.add(node.slice.value)
    return used


def test_the_internals_scan_sees_every_way_of_reaching_sglang():
    src = ("import sglang\nimport sglang.srt.a as a\nimport sys\nm = sys.modules['sglang.srt.b']\n"
           "from sglang.srt.c import D\nimport os\nx = os.environ['sglang.srt.not_a_module']\n")
    assert sglang_uses(src) == {"sglang", "sglang.srt.a", "sglang.srt.b", "sglang.srt.c.D"}


def test_every_listed_internal_exists_in_the_pinned_sglang():
    """INTERNALS names real symbols of SGLang 0.5.23: after an upgrade a renamed one fails here, not in a
    server's first calibration."""
    import importlib

    from sglang_cpp.plugin import INTERNALS

    missing = []
    for name in INTERNALS:
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            missing.append(name)
    assert not missing, missing


def test_no_module_loads_a_name_it_neither_defines_nor_imports():
    """A function moved to another module leaves its callers' name behind (plugin/startup/calibrate.py used `cap_at`
    after it moved to core/calib_grid.py, a NameError on the server's calibration path only): every module of the
    package, the benchmarks, the examples and the tests is checked statically (pyflakes' undefined-name rule;
    it found a `psutil` only an exception path of a deployment test loaded)."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("undefined_names", root / "scripts" / "undefined_names.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    files = [p for d in ("sglang_cpp", "benchmarks", "examples", "tests", "scripts") for p in sorted((root / d).rglob("*.py"))]
    assert len(files) > 100
    assert {str(p.relative_to(root)): u for p in files if (u := mod.check(str(p)))} == {}
    assert mod.check(__file__) == []
    bad = root / "tests" / "_tmp_undefined.py"
    try:
        bad.write_text("def f():\n    return cap_at(1)\n")
        assert mod.check(str(bad)) == ["cap_at"]  # the check sees the case it was written for
    finally:
        bad.unlink()


def test_loading_the_unit_test_modules_imports_neither_torch_nor_sglang():
    """tests/unit runs where numpy does: loading its modules (and the shared tests/conftest.py) in a fresh
    interpreter imports neither torch nor SGLang. This checks what the modules import when loaded, not what a
    test imports inside its body when it runs; a unit test file that imports torch at its top is caught here."""
    import subprocess
    import sys

    code = ("import sys, importlib.util, pathlib\n"
            "sys.path[:0] = ['tests', 'tests/unit']\n"
            "import conftest\n"
            "for p in sorted(pathlib.Path('tests/unit').glob('*.py')):\n"
            "    spec = importlib.util.spec_from_file_location('u_' + p.stem, p)\n"
            "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
            "print(sorted(m for m in ('torch', 'sglang') if m in sys.modules), len(list(pathlib.Path('tests/unit').glob('test_*.py'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    heavy, n = out.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert heavy == "[]" and int(n) >= 15, out.stdout
    code_bad = code.replace("import conftest\n", "import conftest\nimport torch\n")
    bad = subprocess.run([sys.executable, "-c", code_bad], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.stdout.strip().splitlines()[-1].startswith("['torch']")  # the check sees an import when there is one


def test_the_plugin_sub_wings_import_only_the_ones_below():
    """plugin/ is grouped by when its code runs: startup/ (once, at the sizer's install) over serving/ (every
    step) over pd/ and compat/, with the shared modules (state, timing, decision_log, targets) at the bottom and
    `hooks` on top; an import against that direction, or a plugin module in no sub-wing, is reported."""
    ig = _graph_module()
    assert ig.plugin_violations(ig.graph()) == []
    g = {"sglang_cpp.plugin.serving.sizer": {"sglang_cpp.plugin.startup.profiles"},
         "sglang_cpp.plugin.compat.cpu": {"sglang_cpp.plugin.pd.ring"},
         "sglang_cpp.plugin.startup.install": {"sglang_cpp.plugin.serving.sizer", "sglang_cpp.plugin.state"},
         "sglang_cpp.plugin.stray": set()}
    bad = ig.plugin_violations(g)
    assert bad == ["sglang_cpp.plugin.compat.cpu -> sglang_cpp.plugin.pd.ring: compat imports pd",
                   "sglang_cpp.plugin.serving.sizer -> sglang_cpp.plugin.startup.profiles: serving imports startup",
                   "sglang_cpp.plugin.stray: in no plugin sub-wing (place it in scripts/import_graph.py)"]


def test_every_import_of_sglang_cpp_resolves_lazy_ones_included(tmp_path):
    """An import inside a function runs only when the function does (on a server, or on a GPU): every import of
    sglang-cpp, relative or absolute, names a module and a name that exist and climbs no higher than the
    package. Checked on a small tree whose module imports a name and a module that are not there, one dot too
    many, and a name bound only inside a function."""
    ig = _graph_module()
    assert ig.unresolved() == []
    for d in ("sglang_cpp", "sglang_cpp/plugin", "sglang_cpp/plugin/startup"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "sglang_cpp/plugin/state.py").write_text("ACTIVE = None\ndef f():\n    LOCAL = 1\n")
    (tmp_path / "sglang_cpp/plugin/startup/m.py").write_text(
        "def f():\n    from .. import state\n    from ..state import ACTIVE, LOCAL\n"
        "    from . import nothere\n    from ..nowhere import x\n    from .... import envs\n")
    assert ig.unresolved(("sglang_cpp",), root=tmp_path) == [
        "sglang_cpp/plugin/startup/m.py:3: sglang_cpp.plugin.state has no LOCAL",
        "sglang_cpp/plugin/startup/m.py:4: sglang_cpp.plugin.startup has no nothere",
        "sglang_cpp/plugin/startup/m.py:5: no module sglang_cpp.plugin.nowhere",
        "sglang_cpp/plugin/startup/m.py:6: relative import beyond the top-level package"]
