"""docs/ARCHITECTURE.md describes the tree as it is: every module of the three packages is named in it, and every
module it names exists."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("inference_engine", "validation", "bench_compare")
SOURCE_SUFFIXES = (".py", ".c", ".metal")


def tracked_sources(*where: str) -> list[str]:
    """The tracked sources under ``where`` (default: the three packages and the examples)."""
    try:
        out = subprocess.run(["git", "ls-files", *(where or (*PACKAGES, "examples"))], cwd=ROOT, capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("needs a git checkout")
    return [f for f in out.split() if f.endswith(SOURCE_SUFFIXES) and not f.endswith("__init__.py")]


def described(path: str, doc: str, globs: list[str]) -> bool:
    name = Path(path).name
    if re.search(rf"(?<![\w.]){re.escape(name)}\b", doc):
        return True
    if Path(path).parent.name == "models":  # "one file per architecture (llama, qwen2, ...)"
        return re.search(rf"\b{re.escape(Path(path).stem)}\b", doc) is not None
    return any(fnmatch.fnmatch(name, g) or fnmatch.fnmatch(path, "*" + g) for g in globs)


def test_every_module_is_in_the_architecture_doc():
    doc = DOC.read_text(encoding="utf-8")
    globs = [g for g in re.findall(r"[\w/]*\*[\w.*]*", doc) if "." in g]  # cmd_*.py, metal_kernels/*.metal
    missing = [f for f in tracked_sources() if not described(f, doc, globs)]
    assert not missing, "modules docs/ARCHITECTURE.md does not mention:\n" + "\n".join(missing)


def test_every_module_the_doc_names_exists():
    doc = DOC.read_text(encoding="utf-8")
    # the doc also maps the device scripts (.device/): a name that exists there is not stale
    names = {Path(f).name for f in tracked_sources() + tracked_sources(".device")} | {"__init__.py"}
    named = set(re.findall(r"(?<![\w*])([a-z][a-z0-9_]*\.py)\b", doc))
    stale = sorted(n for n in named if n not in names and not list((ROOT / "tests").rglob(n)))  # tests named too
    assert not stale, "docs/ARCHITECTURE.md names modules that are not in the tree: " + ", ".join(stale)
