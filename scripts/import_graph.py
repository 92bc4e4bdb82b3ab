"""Print sglang-cpp's internal import graph (module -> modules it imports), its cycles, what the
offline core reaches, and every import against the wings' direction (docs/architecture.md). Static
(ast), so it sees lazy imports inside functions too.

Usage: python scripts/import_graph.py [--json]
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"sglang_cpp": ROOT / "sglang_cpp"}  # profiler/, tuning/ and cli/tune/ inside it, as pyproject installs them
# The wings, bottom up. A wing imports only itself and the wings in its BELOW set; every module sits in one.
SUPPORT = ("sglang_cpp", "sglang_cpp.envs", "sglang_cpp.args", "sglang_cpp.files", "sglang_cpp.machine")
WING_OF = {"sglang_cpp.core": "core", "sglang_cpp.whatif": "whatif", "sglang_cpp.plugin": "plugin",
           "sglang_cpp.bench": "bench", "sglang_cpp.cli": "cli",
           "sglang_cpp.profiler": "cli", "sglang_cpp.tuning": "tuning"}  # `profile`: a command family; tuning/:
# what `tune` (cli/tune/) computes, below the command line
BELOW = {"support": set(), "core": {"support"}, "whatif": {"support", "core"}, "plugin": {"support", "core"},
         "bench": {"support", "core", "whatif"}, "tuning": {"support", "core", "whatif"},
         "cli": {"support", "core", "whatif", "plugin", "bench", "tuning"}}
# Inside the plugin, sub-wings the same way: the shared modules (state, timing, decision_log, targets) at the
# bottom, compat (CPU and storage shims) and pd beside each other, serving above them, startup on top; the package
# itself and `hooks` (the registry's namespace) may import all of them.
PLUGIN_SUB_OF = {"sglang_cpp.plugin.compat": "compat", "sglang_cpp.plugin.pd": "pd",
                 "sglang_cpp.plugin.serving": "serving", "sglang_cpp.plugin.startup": "startup"}
PLUGIN_SHARED = ("sglang_cpp.plugin.state", "sglang_cpp.plugin.timing", "sglang_cpp.plugin.decision_log",
                 "sglang_cpp.plugin.targets")
PLUGIN_TOP = ("sglang_cpp.plugin", "sglang_cpp.plugin.hooks")
PLUGIN_BELOW = {"shared": set(), "compat": {"shared"}, "pd": {"shared"}, "serving": {"shared", "pd", "compat"},
                "startup": {"shared", "compat", "pd", "serving"},
                "top": {"shared", "compat", "pd", "serving", "startup"}}
PURE = ("core", "whatif")  # no torch, no sglang: they run anywhere numpy does
CORE = ("sglang_cpp.core.costmodel", "sglang_cpp.core.planner", "sglang_cpp.core.objective",
        "sglang_cpp.core.equal_time", "sglang_cpp.core.plan", "sglang_cpp.core.partition", "sglang_cpp.core.upstream",
        "sglang_cpp.core.policy", "sglang_cpp.core.batch_policy", "sglang_cpp.core.refine",
        "sglang_cpp.whatif.simulator", "sglang_cpp.whatif.analytic", "sglang_cpp.whatif.analytic_fit",
        "sglang_cpp.whatif.roofline", "sglang_cpp.whatif.serving_sim", "sglang_cpp.whatif.serving_result",
        "sglang_cpp.whatif.workload")
FORBIDDEN_FOR_CORE = ("sglang_cpp.plugin", "sglang_cpp.cli", "sglang_cpp.bench", "sglang_cpp.profiler",
                      "sglang_cpp.tuning", "torch", "sglang")


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in sorted(folder.rglob("*.py")):
            rel = f.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def _resolve(mod: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def imports_of(mod: str, path: Path, known: dict) -> set[str]:
    """Internal modules and the external top-level packages (torch, sglang) that `mod` imports."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, is_pkg, node.level, node.module) if node.level else (node.module or "")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            names = [node.value]  # importlib.import_module("sglang_cpp.x"): a dynamic import edge
        for n in names:
            while n and n not in known and "." in n and n.split(".")[0] == "sglang_cpp":
                n = n.rsplit(".", 1)[0]
            if n in known and n != mod:
                out.add(n)
            elif n.split(".")[0] in ("torch", "sglang"):
                out.add(n.split(".")[0])
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def reach(g: dict, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for n in g.get(m, ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def cycles(g: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in g:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def core_violations(g: dict) -> dict[str, list[str]]:
    """Core module -> forbidden modules it reaches (directly or through other internal modules)."""
    out = {}
    for m in CORE:
        bad = sorted(n for n in reach(g, m) if n in FORBIDDEN_FOR_CORE or n.startswith(
            tuple(f + "." for f in FORBIDDEN_FOR_CORE)))
        if bad:
            out[m] = bad
    return out


def wing(mod: str) -> str | None:
    """The wing `mod` belongs to (None: placed nowhere, itself a violation)."""
    if mod in SUPPORT:
        return "support"
    best = max((p for p in WING_OF if mod == p or mod.startswith(p + ".")), key=len, default=None)
    return WING_OF[best] if best else None


def plugin_wing(mod: str) -> str | None:
    """The plugin sub-wing `mod` belongs to (None: outside the plugin, or placed nowhere in it)."""
    if mod in PLUGIN_TOP:
        return "top"
    if mod in PLUGIN_SHARED:
        return "shared"
    return next((w for p, w in PLUGIN_SUB_OF.items() if mod == p or mod.startswith(p + ".")), None)


def _against(g: dict, mods, place, below: dict, where: str) -> list[str]:
    """The one direction check: each module of `mods` placed by `place` (None: nowhere), each import of one
    placed elsewhere than the module's own place or the places `below` it lists, reported."""
    out = []
    for m in sorted(mods):
        w = place(m)
        if w is None:
            out.append(f"{m}: in no {where} (place it in scripts/import_graph.py)")
            continue
        for n in sorted(g[m]):
            v = place(n) if n.startswith("sglang_cpp") else None
            if v is not None and v != w and v not in below[w]:
                out.append(f"{m} -> {n}: {w} imports {v}")
    return out


def plugin_violations(g: dict) -> list[str]:
    """Every import inside the plugin against its sub-wings' direction, and every plugin module in none."""
    mods = [x for x in g if x == "sglang_cpp.plugin" or x.startswith("sglang_cpp.plugin.")]
    return _against(g, mods, plugin_wing, PLUGIN_BELOW, "plugin sub-wing")


def wing_violations(g: dict) -> list[str]:
    """Every import that points up or sideways between wings, every module in no wing, and every torch or
    sglang a pure wing (core, whatif) reaches; [] when the layout holds."""
    out = _against(g, g, wing, BELOW, "wing")
    for m in sorted(g):
        if wing(m) in PURE:
            out += [f"{m} reaches {x}: {wing(m)} is pure" for x in sorted(reach(g, m) & {"torch", "sglang"})]
    return out


def _top_names(path: Path) -> set[str]:
    """The names a module binds at module level (inside if/try/with blocks too, never inside a function)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                names |= {x.id for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.If, ast.Try, ast.With)):
            todo += [c for f in ("body", "orelse", "finalbody") for c in getattr(n, f, [])]
            todo += [c for h in getattr(n, "handlers", []) for c in h.body]
    return names


def unresolved(folders=("sglang_cpp", "tests", "benchmarks", "examples", "scripts"), root: Path = ROOT) -> list[str]:
    """Every import of sglang-cpp, relative or absolute, lazy ones inside functions included, that names a module
    or a name that does not exist, or climbs above the package: after a module moves, the import that would
    fail only when its function runs (on a server, or on a GPU) is found here. `root`: the tree to read."""
    def module_file(dotted: str) -> Path | None:
        p = root.joinpath(*dotted.split("."))
        return p / "__init__.py" if (p / "__init__.py").exists() else p.with_suffix(".py") if p.with_suffix(".py").exists() else None

    out = []
    for f in sorted(p for d in folders for p in (root / d).rglob("*.py")):
        where = f.relative_to(root)
        parts = list(where.with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mod = ".".join(parts[:-1] if is_pkg else parts)
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.ImportFrom):
                if n.level:
                    depth = len(mod.split(".")) - (0 if is_pkg else 1)
                    if n.level - 1 >= depth:
                        out.append(f"{where}:{n.lineno}: relative import beyond the top-level package")
                        continue
                    target = _resolve(mod, is_pkg, n.level, n.module)
                else:
                    target = n.module or ""
                if not target.startswith("sglang_cpp"):
                    continue
                path = module_file(target)
                if path is None:
                    out.append(f"{where}:{n.lineno}: no module {target}")
                    continue
                have = _top_names(path)
                out += [f"{where}:{n.lineno}: {target} has no {a.name}" for a in n.names
                        if a.name != "*" and a.name not in have and module_file(f"{target}.{a.name}") is None]
            elif isinstance(n, ast.Import):
                out += [f"{where}:{n.lineno}: no module {a.name}" for a in n.names
                        if a.name.startswith("sglang_cpp") and module_file(a.name) is None]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the graph as JSON")
    a = ap.parse_args()
    g = graph()
    if a.json:
        print(json.dumps({m: sorted(v) for m, v in g.items()}, indent=1))
        return 0
    for m in sorted(g):
        print(f"{m} -> {', '.join(sorted(g[m])) or '-'}")
    cyc = cycles(g)
    print(f"\ncycles: {len(cyc)}")
    for c in cyc:
        print("  " + " <-> ".join(c))
    bad = core_violations(g)
    print(f"core importing plugin/CLI/torch/sglang: {bad or 'none'}")
    up = wing_violations(g)
    print(f"wing violations: {len(up)}")
    for v in up:
        print("  " + v)
    sub = plugin_violations(g)
    print(f"plugin sub-wing violations: {len(sub)}")
    for v in sub:
        print("  " + v)
    return 1 if bad or cyc or up or sub else 0


if __name__ == "__main__":
    sys.exit(main())
