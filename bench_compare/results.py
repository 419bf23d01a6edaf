"""Self-describing results: one record per (test, engine), ratios, and the metadata of the run.

Every result JSON says what ran and where: git sha (and whether the tree was dirty), UTC date, package versions
(llama-cpp-python and the ggml build it carries included), machine, the model file (name, size, sha256,
architecture, quantization) and every setting. ``ratios`` are oriented so that *higher is better for ours*:
throughput ours / llama.cpp, time and memory llama.cpp / ours.
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_compare.measure import Measurement
from bench_compare.timing import Stats, summarize

COMPARE_KIND = "gguf-parity-compare"
SCHEMA_VERSION = 1
REFERENCE_ENGINE = "llamacpp"

_PACKAGES = ("gguf-parity", "numpy", "gguf", "llama-cpp-python", "numba", "mlx", "tokenizers", "sentencepiece")


@dataclass
class TestResult:
    """Samples of one test on one engine, in the unit the test reports (t/s, ms or MiB)."""

    test: str
    kind: str
    engine: str
    unit: str
    higher_is_better: bool
    samples: list[float]
    samples_ns: list[int] | None = None
    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0
    complete: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    __test__ = False  # not a pytest test class

    def stats(self) -> Stats:
        return summarize(self.samples)

    @property
    def median(self) -> float:
        return self.stats().median

    def to_dict(self) -> dict[str, Any]:
        s = self.stats()
        d: dict[str, Any] = {
            "test": self.test, "kind": self.kind, "engine": self.engine, "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "median": s.median, "p95": s.p95, "min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev,
            "n": s.n, "samples": list(self.samples),
            "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": self.n_depth, "complete": self.complete,
        }
        if self.samples_ns is not None:
            d["samples_ns"] = list(self.samples_ns)
        if self.extra:
            d["extra"] = self.extra
        return d


def from_measurement(m: Measurement) -> TestResult:
    return TestResult(
        test=m.test.name, kind=m.test.kind, engine=m.engine, unit=m.unit, higher_is_better=m.higher_is_better,
        samples=m.samples, samples_ns=list(m.samples_ns), n_prompt=m.test.n_prompt, n_gen=m.test.n_gen,
        n_depth=m.test.n_depth, complete=m.complete,
    )


def ratio_of(ours: TestResult, reference: TestResult) -> float:
    """Higher is better for ours: ours/ref for throughput, ref/ours for times and memory (medians)."""
    a, b = ours.median, reference.median
    if ours.higher_is_better:
        return a / b if b else float("nan")
    return b / a if a else float("nan")


def compute_ratios(results: Iterable[TestResult], ours: str, reference: str = REFERENCE_ENGINE) -> dict[str, float]:
    by_key = {(r.test, r.engine): r for r in results if r.samples}
    ratios: dict[str, float] = {}
    for (test, engine), r in by_key.items():
        if engine != ours:
            continue
        ref = by_key.get((test, reference))
        if ref is not None:
            ratios[test] = ratio_of(r, ref)
    return ratios


# --- metadata ---------------------------------------------------------------------------------------------------
def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def git_info(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit of the checkout this package runs from (``unknown`` outside a git checkout)."""
    cwd = Path(repo) if repo else Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"sha": "unknown", "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return {"sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": "unknown", "dirty": None}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions.update(ggml_build())
    return versions


def ggml_build() -> dict[str, str | None]:
    """The ggml build inside llama-cpp-python (``ggml_version`` / ``ggml_commit`` from libggml-base)."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.origin:
            return {"ggml": None, "ggml_commit": None}
        lib_dir = Path(spec.origin).parent / "lib"
        names = [p for p in lib_dir.glob("libggml-base.*") if p.suffix in (".so", ".dylib", ".dll")]
        if not names:
            return {"ggml": None, "ggml_commit": None}
        lib = ctypes.CDLL(str(names[0]))
        lib.ggml_version.restype = ctypes.c_char_p
        lib.ggml_commit.restype = ctypes.c_char_p
        return {"ggml": lib.ggml_version().decode(), "ggml_commit": lib.ggml_commit().decode()}
    except (OSError, AttributeError):
        return {"ggml": None, "ggml_commit": None}


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": _memory_total(),
    }
    info.update(cpu_provenance())
    return info


def cpu_provenance() -> dict[str, Any]:
    """The CPU's name and instruction set, recorded next to every figure (a ratio measured on AVX-512 says little
    about an AVX2 machine): ``cpu``, ``isa`` (``"AVX2"``, ``"AVX-512 + VNNI + AMX"``), ``isa_flags`` and
    ``cpu_isa`` (``"AMD EPYC, AVX2"``, what reports print). Shared by every result builder."""
    from inference_engine.cpu_features import cpu_features

    features = cpu_features().as_dict()
    return {"cpu": features["cpu"], "isa": features["isa"], "isa_flags": features["isa_flags"],
            "cpu_isa": cpu_isa_label(features)}


def cpu_isa_label(machine: dict[str, Any]) -> str:
    """``"AMD EPYC, AVX2"`` from a result's ``machine`` block (older results without ``isa``: the CPU alone)."""
    if machine.get("cpu_isa"):
        return str(machine["cpu_isa"])
    cpu, isa = machine.get("cpu") or machine.get("processor") or "?", machine.get("isa")
    return f"{cpu}, {isa}" if isa else str(cpu)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
            if out.returncode == 0:
                return out.stdout.strip()
        except OSError:
            pass
    return platform.processor() or "unknown"


def _memory_total() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def model_description(gguf_file) -> dict[str, Any]:
    """What llama-bench reports about a model, from the GGUF alone (same for every engine).

    ``size_bytes`` is the sum of tensor bytes (llama.cpp's ``llama_model_size``), ``n_params`` the number of
    weights (``llama_model_n_params``); ``file_bytes`` is the file on disk.
    """
    d = gguf_file.describe()
    tensor_bytes = sum(t.n_bytes for t in gguf_file.tensors.values())
    return {
        "path": str(gguf_file.path),
        "filename": gguf_file.path.name,
        "name": d["name"],
        "architecture": d["architecture"],
        "quant": d["quant"],
        "n_params": d["n_params"],
        "size_bytes": tensor_bytes,
        "file_bytes": d["size_bytes"],
        "sha256": gguf_file.sha256,
        "context_length": gguf_file.arch_value("context_length"),
        "model_type": model_type_label(d["architecture"], d["n_params"], d["quant"]),
    }


def model_type_label(architecture: str, n_params: int, quant: str) -> str:
    """A ``model_type`` like llama-bench's ``llama 7B Q4_0``, with the size from the actual parameter count
    (llama.cpp labels by layer count and calls SmolLM2-135M "256M")."""
    if n_params >= 1_000_000_000:
        size = f"{n_params / 1e9:.1f}B".replace(".0B", "B")
    else:
        size = f"{round(n_params / 1e6)}M"
    return f"{architecture} {size} {quant}"


def run_metadata(gguf_file, settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "date": utc_now(),
        "git": git_info(),
        "versions": package_versions(),
        "machine": machine_info(),
        "model": model_description(gguf_file),
        "settings": settings,
    }
