"""The package layering, from the source: the engine never imports the harness or the reference side, validation
never imports the CLI, no package imports form a cycle, and no module imports form one either.

    bench_compare  (CLI, benchmarks, reports)  ->  validation  (llama.cpp adapter, diffs, results)  ->  inference_engine

Every ``import`` / ``from ... import`` in the tree counts, function-level ones included, and so do string module names
handed to ``importlib.import_module`` / ``find_spec``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("inference_engine", "validation", "bench_compare")
# package -> packages (first-party or third-party) it must never import
FORBIDDEN = {
    "inference_engine": {"bench_compare", "validation", "llama_cpp"},
    "validation": {"bench_compare"},
}
# (file, package) pairs allowed for now; empty: no exceptions.
PENDING: set[tuple[str, str]] = set()


def imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` of every import in ``path``: ``import a.b`` is ``("a.b", ())``, ``from a import b, c``
    is ``("a", ("b", "c"))`` (relative imports resolved against the file's package), an ``importlib`` string
    ``(name, ())``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.append((".".join(base + ([node.module] if node.module else [])), names))
            elif node.module:
                found.append((node.module, names))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "find_spec") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.append((node.args[0].value, ()))
    return found


def imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against its package)."""
    return {module for module, _ in imports(path)}


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_forbidden_imports():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for path in package_files(package):
            rel = path.relative_to(ROOT).as_posix()
            for module in imported_modules(path):
                top = module.split(".")[0]
                if top in forbidden and (rel, top) not in PENDING:
                    bad.append(f"{rel} imports {module}")
    assert not bad, "layering broken:\n" + "\n".join(bad)


LIBRARY_LOADERS = ("CDLL", "PyDLL", "LoadLibrary", "find_library", "load_library")


def loaded_libraries(path: Path) -> set[str]:
    """String names handed to a shared-library loader or locator (``ctypes.CDLL("libggml-cpu.so")``, ...)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {arg.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) in LIBRARY_LOADERS
            for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}


def test_engine_locates_no_llamacpp_library(tmp_path):
    """llama.cpp's libraries (libggml*, libllama) are located and loaded on the reference side only
    (``validation.ggml_libs``); the engine loads nothing but the C maths library."""
    bad = [f"{path.relative_to(ROOT).as_posix()} loads {name}" for path in package_files("inference_engine")
           for name in loaded_libraries(path) if "ggml" in name or "llama" in name]
    assert not bad, "\n".join(bad)
    sample = tmp_path / "sample.py"  # the checker itself sees each way of naming a library
    sample.write_text("ctypes.CDLL('libggml-cpu.so')\nctypes.util.find_library('llama')\nload_library('x')\n")
    assert loaded_libraries(sample) == {"libggml-cpu.so", "llama", "x"}


def test_no_cycle_between_packages():
    graph = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in package_files(package):
            graph[package].update(m.split(".")[0] for m in imported_modules(path)
                                  if m.split(".")[0] in PACKAGES and m.split(".")[0] != package)
    order, state = [], {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        if state.get(node) == "visiting":
            pytest.fail(f"package import cycle: {' -> '.join(trail + [node])}")
        state[node] = "visiting"
        for dep in sorted(graph[node]):
            visit(dep, trail + [node])
        state[node] = "done"
        order.append(node)

    for package in PACKAGES:
        visit(package, [])
    assert order.index("inference_engine") < order.index("validation") < order.index("bench_compare")


def test_the_checker_sees_imports(tmp_path):
    """The parser itself: plain, from, relative, function-level and importlib string imports are all found."""
    pkg = tmp_path / "inference_engine" / "sub"
    pkg.mkdir(parents=True)
    sample = pkg / "mod.py"
    sample.write_text("import os\nfrom .sibling import x\nfrom .. import errors\n"
                      "def f():\n    from validation.run import validate\n"
                      "    importlib.util.find_spec('llama_cpp')\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = imported_modules(sample)
    finally:
        ROOT = saved
    assert found == {"os", "inference_engine.sub.sibling", "inference_engine", "validation.run", "llama_cpp"}


# Module cycles allowed for now (each pair's edges are left out of the search); empty: no exceptions.
PENDING_CYCLES: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph() -> dict[str, set[str]]:
    """Each module of the three packages -> the modules of the three packages it imports. ``from a import b``
    imports the module ``a.b`` where there is one, else ``a``; a name below a module (``a.b.f``) is that module."""
    paths = {module_name(p): p for package in PACKAGES for p in package_files(package)}

    def known(name: str) -> str:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in paths.items():
        targets = [f"{module}.{n}" if f"{module}.{n}" in paths else module
                   for module, names in imports(path) for n in (names or ("",))]
        graph[name] = {t for t in map(known, targets) if t and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its first module repeated at the end), or None."""
    state: dict[str, str] = {}
    trail: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "visiting"
        trail.append(node)
        for dep in sorted(graph.get(node, ())):
            if frozenset({node, dep}) in PENDING_CYCLES:
                continue
            if state.get(dep) == "visiting":
                return trail[trail.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        trail.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_cycle_between_modules():
    """No module of the three packages imports itself back through others: every import counts, function-level
    and ``TYPE_CHECKING`` ones included (a shared piece belongs in a module both can import)."""
    cycle = find_cycle(module_graph())
    assert cycle is None, "module import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_a_cycle(tmp_path):
    """The graph and the search themselves: a cycle made of a function-level ``from package import module`` and a
    relative import is found and named; the same modules without the cycle give none."""
    pkg = tmp_path / "inference_engine" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "inference_engine" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from .two import f\n")
    (pkg / "two.py").write_text("import os\n\ndef f():\n    from inference_engine.sub import one\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        graph = module_graph()
        assert find_cycle(graph) == ["inference_engine.sub.one", "inference_engine.sub.two", "inference_engine.sub.one"]
        (pkg / "two.py").write_text("import os\n\ndef f():\n    from inference_engine import sub\n")
        assert find_cycle(module_graph()) is None
    finally:
        ROOT = saved
