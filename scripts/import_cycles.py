"""Check that slashrt's modules import each other without cycles.

Usage: python3 scripts/import_cycles.py [PACKAGE_DIR]   (default: slashrt, run from the repo root)

Builds two import graphs of the package's modules from their source (ast, nothing is
imported): "module-level" (imports run at import time, not those under `if TYPE_CHECKING:`)
and "all imports" (every import statement anywhere, function-level ones included). For each
it prints the sizes of its strongly connected components of more than one module, then each
component. A function-level import counts: a lazy import still makes its module depend on the
other one, so a lower layer importing a higher one inside a function is a cycle too.
Exits 1 if either graph has a cycle, else 0.

A module is a `.py` file or a C extension (built or not: those setup.py names, e.g.
`slashrt._native`), so that `from slashrt import _native` depends on the extension, not on the
package. Importing `a.b.c` also runs the packages' `__init__`s; that implicit edge is not
counted (every module would depend on the root package, which re-exports the public API), so a
lazy import of a module whose package `__init__` imports higher layers (`slashrt.spark`'s does)
is a dependency on that module alone here.

The layering the code follows (low to high, roughly; a module imports only modules below it,
lazily or not, and a lazy import is only for start-up time or an optional dependency):

    errors, _version, _schema, _buffer, _logging, _kernels (+ _native), _batch, progress/*,
    ssb/crdt, ssb/partitions, ssb/epochs
    snapshot/{state_format,storage,operators,alignment,commit,coordinator,published,restart,
              stop,loops}            per-operator state and checkpoint machinery, no operators
    transport/*; _operator (Operator, Context); _dataflow (the description users build:
                         Dataflow, Stream, the window assigners Sliding and Tumbling)
    ops/* (nodes), snapshot/channel_state, spark/_protocol (the ingest wire protocol),
    scheduler/*, ssb/graph_window, ssb/partitioned
    _inputs (PerExecutor, Ingest, an array's shares per executor), connectors/*
    _plan (build_plan, per_source)
    snapshot/runtime, snapshot/rescale   one executor's checkpoints, and resharing them
    _runtime             one executor's run (run_async, execute)
    snapshot/cluster_agent, snapshot/cluster, spark/_endpoint
    cluster/*            its helpers (_job, _control, _liveness, _progress, ...) low; then agent,
                         _zygote (forks agents), coordinator
    _run                 slashrt.run: one executor or a cluster (imports the cluster lazily)
    slashrt (the package), spark/*, testing/*, examples/*, bench/*, _cli_run, cli
"""

import ast
import collections
import os
import re
import sys


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> path of its source (None for an extension module)."""
    mods = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            if f.endswith(".py"):
                m = p[:-3].replace(os.sep, ".")
                mods[m[: -len(".__init__")] if m.endswith(".__init__") else m] = p
            elif f.endswith((".so", ".pyd")):
                mods[os.path.join(d, f.split(".")[0]).replace(os.sep, ".")] = None
    setup = os.path.join(os.path.dirname(os.path.abspath(root)), "setup.py")
    if os.path.exists(setup):
        mods.update(dict.fromkeys(re.findall(r'Extension\(\s*"([\w.]+)"', open(setup).read())))
    return mods


def _type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _module_level(body):
    """Import statements run at import time: at top level, or under a module-level if/try/with
    (but not `if TYPE_CHECKING:`), never inside a function or class body."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)) and not _type_checking(node):
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    yield from _module_level(child.body if isinstance(child, ast.ExceptHandler) else [child])


def edges(mods: dict, toponly: bool) -> dict[str, set[str]]:
    def resolve(name):
        while name and name not in mods:
            name = name.rsplit(".", 1)[0] if "." in name else ""
        return name or None

    graph = collections.defaultdict(set)
    for m, path in mods.items():
        if path is None:
            continue
        tree = ast.parse(open(path).read(), path)
        pkg = m if path.endswith("__init__.py") else m.rsplit(".", 1)[0]
        nodes = _module_level(tree.body) if toponly else ast.walk(tree)
        for n in nodes:
            targets = []
            if isinstance(n, ast.Import):
                targets = [resolve(a.name) for a in n.names]
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - n.level + 1] + ([n.module] if n.module else []))
                targets = [resolve(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else resolve(base) for a in n.names]
            graph[m].update(t for t in targets if t and t != m)
    return graph


def sccs(graph: dict) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's, iterative)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def main() -> int:
    mods = modules(sys.argv[1] if len(sys.argv) > 1 else "slashrt")
    cyclic = False
    for toponly in (True, False):
        graph = edges(mods, toponly)
        components = sccs(graph)
        print("module-level" if toponly else "all imports", [len(c) for c in components])
        for c in components:
            print("  ", c)
            members = set(c)
            for m in c:
                print("      ", m, "->", sorted(graph[m] & members))
        cyclic |= bool(components)
    return 1 if cyclic else 0


if __name__ == "__main__":
    sys.exit(main())
