"""The package layering, from the source: the engine never imports the harness or the reference side, validation
never imports the CLI, and no package imports form a cycle.

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


def imported_modules(path: Path) -> set[str]:
    """Absolute module names ``path`` imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                found.add(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                found.add(node.module)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "find_spec") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            found.add(node.args[0].value)
    return found


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
