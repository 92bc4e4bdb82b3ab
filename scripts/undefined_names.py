"""Names a module loads but neither defines nor imports (a NameError waiting for the one path that runs it).

Why: the plugin's server-only paths (calibration, the overhead probe) run in no unit test; a name left behind
when a function moves to another module fails only on a server. A cheap static check, pyflakes' first rule.
Usage: python scripts/undefined_names.py FILE.py [...]   (exit 1 and one line per file with such names)
"""
import ast, builtins, sys
def check(path):
    src=open(path).read(); tree=ast.parse(src)
    defined=set(dir(builtins))|{"__file__","__name__","__doc__"}
    for node in ast.walk(tree):
        if isinstance(node,(ast.FunctionDef,ast.AsyncFunctionDef,ast.ClassDef)): defined.add(node.name)
        if isinstance(node,ast.Import):
            for a in node.names: defined.add((a.asname or a.name).split('.')[0])
        if isinstance(node,ast.ImportFrom):
            for a in node.names: defined.add(a.asname or a.name)
        if isinstance(node,(ast.Assign,ast.AnnAssign,ast.AugAssign)):
            for t in (node.targets if isinstance(node,ast.Assign) else [node.target]):
                for n in ast.walk(t):
                    if isinstance(n,ast.Name): defined.add(n.id)
        if isinstance(node,ast.arg): defined.add(node.arg)
        if isinstance(node,(ast.For,ast.comprehension)):
            for n in ast.walk(node.target):
                if isinstance(n,ast.Name): defined.add(n.id)
        if isinstance(node,ast.ExceptHandler) and node.name: defined.add(node.name)
        if isinstance(node,ast.With):
            for it in node.items:
                if it.optional_vars is not None:
                    for n in ast.walk(it.optional_vars):
                        if isinstance(n,ast.Name): defined.add(n.id)
        if isinstance(node, ast.NamedExpr): defined.add(node.target.id)
        if isinstance(node, ast.Global): defined.update(node.names)
    used={n.id for n in ast.walk(tree) if isinstance(n,ast.Name) and isinstance(n.ctx,ast.Load)}
    return sorted(used-defined)
if __name__ == "__main__":
    bad = 0
    for p in sys.argv[1:]:
        u = check(p)
        if u:
            print(p, u)
            bad = 1
    sys.exit(bad)
