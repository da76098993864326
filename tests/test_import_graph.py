"""The package's import graph has no cycles.

Every module of ``dflash2_trt`` is parsed with ``ast`` (nothing is imported), every import
statement is collected, at module level and inside functions alike, relative imports are
resolved against the importing module, and ``from pkg import name`` counts as an edge to
``pkg.name`` when that is a module of the package (and to ``pkg`` itself, whose
``__init__`` runs first). A cycle is a strongly connected component of more than one module
(or a module that imports itself); the test lists each one.

The same graph checks two more rules: no module outside ``dflash2_trt/testing/`` imports it (and
``assets/`` does not reach it through another module), and no ``from M import _name`` takes a private
name from another module of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "dflash2_trt"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> file, for every .py file under the package."""
    mods = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _enclosing_package_chain(name: str) -> list[str]:
    """``a.b.c`` -> ``['a', 'a.b', 'a.b.c']``: importing a module runs its packages first."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> set of package modules it imports (anywhere in its body)."""
    mods = _modules(root, package)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    targets.update(_enclosing_package_chain(alias.name))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _resolve_relative(mod, is_pkg, node.level, node.module)
                else:
                    base = node.module or ""
                chain = _enclosing_package_chain(base)
                names_a_non_module = False
                for alias in node.names:
                    if f"{base}.{alias.name}" in mods:
                        targets.add(f"{base}.{alias.name}")
                    else:
                        names_a_non_module = True
                if names_a_non_module or not _encloses(base, mod):
                    targets.update(chain)
                else:
                    targets.update(c for c in chain if c != base)
        for t in targets:
            # A module's enclosing packages are already being imported when it runs, so
            # ``from . import sibling`` (or ``import pkg.sibling``) inside a package is no
            # edge to the package: its ``__init__`` importing this module is the normal
            # shape. Taking a *name* from the enclosing ``__init__`` (``from .. import
            # __version__``) is an edge: that name must exist before this module can run.
            if t not in mods or t == mod:
                continue
            if _encloses(t, mod) and not _takes_names_from(tree, mod, is_pkg, t, mods):
                continue
            graph[mod].add(t)
    return graph


def _encloses(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def _takes_names_from(tree: ast.AST, mod: str, is_pkg: bool, package: str, mods) -> bool:
    """Does ``mod`` take a non-module name from its enclosing ``package``?"""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve_relative(mod, is_pkg, node.level, node.module) if node.level else node.module
            if base == package and any(f"{base}.{a.name}" not in mods for a in node.names):
                return True
    return False


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:
        nonlocal counter
        # Iterative to stay clear of the recursion limit on a big graph.
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1 or node in graph[node]:
                    out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def _describe(comp: list[str], graph: dict[str, set[str]]) -> str:
    members = set(comp)
    edges = [f"    {a} -> {b}" for a in comp for b in sorted(graph[a] & members)]
    return f"  cycle of {len(comp)}: " + ", ".join(comp) + "\n" + "\n".join(edges)


def test_the_walker_sees_a_cycle_it_is_shown(tmp_path):
    # The detector itself: a package with a two-module circle through a function-level
    # relative import and a ``from pkg import module`` edge, and a clean leaf.
    pkg = tmp_path / "pkgx"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "leaf.py").write_text("import os\n")
    graph = import_graph(pkg, "pkgx")
    assert graph["pkgx.a"] == {"pkgx.sub", "pkgx.sub.b"}
    assert graph["pkgx.sub.b"] == {"pkgx.a"}
    assert cycles(graph) == [["pkgx.a", "pkgx.sub.b"]]
    (pkg / "sub" / "b.py").write_text("import os\n")
    assert cycles(import_graph(pkg, "pkgx")) == []
    # A package whose __init__ imports its submodule, which takes a sibling module through
    # the package, is no circle; taking a name the __init__ defines is one.
    (pkg / "sub" / "__init__.py").write_text("from .b import f\nVALUE = 1\n")
    (pkg / "sub" / "b.py").write_text("from . import c\ndef f():\n    return c\n")
    (pkg / "sub" / "c.py").write_text("")
    graph = import_graph(pkg, "pkgx")
    assert graph["pkgx.sub.b"] == {"pkgx.sub.c"}
    assert cycles(graph) == []
    (pkg / "sub" / "c.py").write_text("from . import VALUE\n")
    assert cycles(import_graph(pkg, "pkgx")) == [["pkgx.sub", "pkgx.sub.b", "pkgx.sub.c"]]


def test_the_package_has_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50, "the walker found too few modules; is ROOT right?"
    found = cycles(graph)
    if found:
        pytest.fail(
            f"{len(found)} import cycle(s) in {PACKAGE}/:\n"
            + "\n".join(_describe(c, graph) for c in found)
        )


def _reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_the_shipped_assets_do_not_import_the_test_helpers():
    # The shipped trained pairs (and their registry) stand on their own: dflash2_trt/testing may
    # import dflash2_trt/assets, never the reverse, directly or through another module.
    graph = import_graph()
    assets = {m for m in graph if m == f"{PACKAGE}.assets" or m.startswith(f"{PACKAGE}.assets.")}
    assert f"{PACKAGE}.assets.registry" in assets
    reached = sorted(m for m in _reachable(graph, assets) if m.startswith(f"{PACKAGE}.testing"))
    assert not reached, f"dflash2_trt/assets reaches the test helpers: {reached}"
    assert f"{PACKAGE}.assets.registry" in graph[f"{PACKAGE}.testing.tiny"]


def imports_of_the_test_helpers(graph: dict[str, set[str]], package: str = PACKAGE) -> list[tuple[str, str]]:
    """(importer, test-helper module) for every module outside ``PACKAGE/testing/`` that imports one inside it."""
    def in_testing(m: str) -> bool:
        return m == f"{package}.testing" or m.startswith(f"{package}.testing.")

    return sorted((m, t) for m, targets in graph.items() if not in_testing(m) for t in targets if in_testing(t))


def test_shipped_code_does_not_import_the_test_helpers(tmp_path):
    # dflash2_trt/testing is for the tests (and scripts); no other module of the package imports it, at module
    # level or inside a function: an installed package must work without it.
    pkg = tmp_path / "pkgz"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text("")
    (pkg / "testing" / "fixtures.py").write_text("from .. import shipped\n")
    (pkg / "shipped.py").write_text("def f():\n    from .testing.fixtures import X\n    return X\n")
    graph = import_graph(pkg, "pkgz")
    assert imports_of_the_test_helpers(graph, "pkgz") == [("pkgz.shipped", "pkgz.testing"),
                                                ("pkgz.shipped", "pkgz.testing.fixtures")]
    (pkg / "shipped.py").write_text("import os\n")
    assert imports_of_the_test_helpers(import_graph(pkg, "pkgz"), "pkgz") == []

    graph = import_graph()
    assert f"{PACKAGE}.testing.fixtures" in graph, "the walker found no dflash2_trt/testing; is ROOT right?"
    found = [e for e in imports_of_the_test_helpers(graph) if e not in TEST_HOOK_IMPORTS]
    assert not found, "shipped modules import dflash2_trt/testing:\n" + "\n".join(f"  {m} -> {t}" for m, t in found)
    for importer in {m for m, _ in TEST_HOOK_IMPORTS}:
        # inside the hook's function only: importing the shipped module never needs dflash2_trt/testing
        tree = ast.parse(_modules()[importer].read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not any("testing" in (getattr(n, "module", None) or "") or any("testing" in a.name for a in n.names)
                       for n in top), f"{importer} imports dflash2_trt/testing at module level"


# The one exception, a test hook: the python-backend Triton model runs a TensorRT engine on the CPU stand-in of TensorRT
# when DFLASH2_TRT_TENSORRT_STANDIN=1 (the stub is another process; docs/trt-session.md §8). Imported inside
# serving.tensorrt_standin_hook only, after the environment variable was checked.
TEST_HOOK_IMPORTS = {(f"{PACKAGE}.deploy.triton.serving", f"{PACKAGE}.testing"),
                     (f"{PACKAGE}.deploy.triton.serving", f"{PACKAGE}.testing.tensorrt_standin")}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(root: Path = ROOT, package: str = PACKAGE) -> set[tuple[str, str, str]]:
    """(importer, module, name) for every ``from M import _name`` where M is another module of the
    package, and every ``m._name`` where ``m`` is another module of the package bound by an import
    (``import M as m``, ``from pkg import m``). ``import M as _alias`` and dunders such as
    ``__version__`` are not private names."""
    mods = _modules(root, package)
    out = set()
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}   # local name -> package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in mods:
                        aliases[a.asname] = a.name
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_relative(mod, is_pkg, node.level, node.module) if node.level else node.module
                for a in node.names:
                    if f"{base}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                if base not in mods or base == mod:
                    continue
                for a in node.names:
                    if _private(a.name) and f"{base}.{a.name}" not in mods:
                        out.add((mod, base, a.name))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                    and aliases.get(node.value.id, mod) != mod):
                out.add((mod, aliases[node.value.id], node.attr))
    return out


def test_no_private_name_is_imported_across_files(tmp_path):
    pkg = tmp_path / "pkgy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("__version__ = '1'\n")
    (pkg / "a.py").write_text("from . import __version__\nfrom .b import _hidden, shown\nfrom . import b as _b\n")
    (pkg / "b.py").write_text("_hidden = 1\nshown = 2\n")
    assert private_imports(pkg, "pkgy") == {("pkgy.a", "pkgy.b", "_hidden")}
    (pkg / "a.py").write_text("from . import b as bb\nimport pkgy.b as b2\n\ndef f():\n    return bb._hidden, b2._other, "
                              "bb.shown, bb.__doc__\n")
    assert private_imports(pkg, "pkgy") == {("pkgy.a", "pkgy.b", "_hidden"), ("pkgy.a", "pkgy.b", "_other")}

    found = sorted(private_imports())
    assert not found, "private names imported across files (make them public or move them):\n" + "\n".join(
        f"  {imp}: from {m} import {n}" for imp, m, n in found)


ENGINE = f"{PACKAGE}.engine"
BACKENDS = (f"{ENGINE}.standin", f"{ENGINE}.trtllm")
ABOVE = (f"{ENGINE}.plan", f"{ENGINE}.build", f"{ENGINE}.run")


def _under(m: str, pkg: str) -> bool:
    return m == pkg or m.startswith(pkg + ".")


def layering_violations(graph: dict[str, set[str]], engine: str = ENGINE) -> list[tuple[str, str, str]]:
    """(importer, imported, rule) for every edge that points up or sideways in the engine package: a backend
    (``engine/standin``, ``engine/trtllm``) importing the commands above it (``plan``, ``build``, ``run``) or the
    other backend; a shared engine module (any other module of ``engine/``) importing a backend or a command."""
    backends = (f"{engine}.standin", f"{engine}.trtllm")
    above = (f"{engine}.plan", f"{engine}.build", f"{engine}.run")
    out = []
    for m, targets in graph.items():
        if not _under(m, engine) or m == engine:
            continue
        mine = next((b for b in backends if _under(m, b)), None)
        for t in sorted(targets):
            if any(_under(t, a) for a in above) and not any(_under(m, a) for a in above):
                out.append((m, t, "imports a command above it"))
            elif mine is not None and any(_under(t, b) for b in backends if b != mine):
                out.append((m, t, "imports the other backend"))
            elif mine is None and not any(_under(m, a) for a in above) and any(_under(t, b) for b in backends):
                out.append((m, t, "a shared engine module imports a backend"))
    return out


def test_the_engine_layers_point_down_only():
    # The rule itself, on a made-up graph: every kind of wrong edge is named, the allowed ones are not.
    e = "p.engine"
    g = {f"{e}.standin.build": {f"{e}.format", f"{e}.plan"}, f"{e}.standin.verify": {f"{e}.trtllm.toolchain"},
         f"{e}.format": {f"{e}.standin.engine"}, f"{e}.build": {f"{e}.standin.build", f"{e}.trtllm.build", f"{e}.plan"},
         f"{e}.trtllm.build": {f"{e}.trtllm.command", f"{e}.verify"}}
    assert layering_violations(g, e) == [(f"{e}.standin.build", f"{e}.plan", "imports a command above it"),
                                         (f"{e}.standin.verify", f"{e}.trtllm.toolchain", "imports the other backend"),
                                         (f"{e}.format", f"{e}.standin.engine", "a shared engine module imports a backend")]

    graph = import_graph()
    assert all(b in graph for b in BACKENDS) and all(a in graph for a in ABOVE), "engine layout not found"
    found = layering_violations(graph)
    assert not found, "engine imports that point up or sideways:\n" + "\n".join(f"  {m} -> {t}: {r}" for m, t, r in found)


NETWORK = ROOT / "trtllm" / "network"


def network_binding_problems(root: Path = NETWORK) -> list[str]:
    """The per-backend network package takes its TensorRT-LLM names once, at import time inside
    ``backend.using``: only ``common.py`` may touch ``backend``, and no module may import inside a function (that
    import would run later, outside the window, and bind whatever backend ``auto`` picks), except the plugin
    library loader ``dflash2_trt.plugins``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if rel != "common.py":
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                    if any(n == "backend" or n.endswith(".backend") for n in names):
                        out.append(f"{rel}:{node.lineno}: imports the backend module (only common.py may)")
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and
                                                        (node.level or node.module != f"{PACKAGE}.plugins")):
                        out.append(f"{rel}:{node.lineno}: imports inside {fn.name}()")
    return out


def test_the_network_package_binds_its_backend_at_import_only(tmp_path):
    (tmp_path / "common.py").write_text("from dflash2_trt.trtllm import backend\napi = backend.current()\n")
    (tmp_path / "drafter.py").write_text("from .common import api\n\ndef f():\n    from .common import api\n")
    (tmp_path / "io.py").write_text("from dflash2_trt.trtllm import backend as b\n\ndef g():\n"
                                    "    from dflash2_trt.plugins import load_library\n")
    assert network_binding_problems(tmp_path) == ["drafter.py:4: imports inside f()",
                                                  "io.py:1: imports the backend module (only common.py may)"]
    assert (NETWORK / "common.py").is_file()
    found = network_binding_problems()
    assert not found, "\n".join(found)
