"""Self-describing results: one record per (test, engine), ratios, and the metadata of the run.

Every result JSON says what ran and where: git sha (and whether the tree was dirty), UTC date, package versions
(llama-cpp-python and the ggml build it carries included), machine, the model file (name, size, sha256,
architecture, quantization) and every setting. ``ratios`` are oriented so that *higher is better for ours*:
throughput ours / llama.cpp, time and memory llama.cpp / ours; each is the geometric mean of the per-repetition
ratios of the paired samples, and ``ratio_intervals`` holds its confidence interval and verdict
(:mod:`bench_compare.intervals`). A test with no pairs falls back to the ratio of the medians.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench_compare.intervals import DEFAULT_CONFIDENCE, RatioInterval, interval_of
from bench_compare.measure import Measurement
from bench_compare.timing import Stats, summarize
from validation.provenance import (  # noqa: F401  (re-exported: the harness reads them from here)
    cpu_isa_label,
    cpu_provenance,
    git_info,
    machine_info,
    package_versions,
    provenance,
    utc_now,
)

REFERENCE_ENGINE = "llamacpp"


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
        n_depth=m.test.n_depth, complete=m.complete, extra={"timing": m.timing} if m.timing else {},
    )


def ratio_of(ours: TestResult, reference: TestResult) -> float:
    """Higher is better for ours: ours/ref for throughput, ref/ours for times and memory (medians)."""
    a, b = ours.median, reference.median
    if ours.higher_is_better:
        return a / b if b else float("nan")
    return b / a if a else float("nan")


def paired_results(results: Iterable[TestResult], ours: str,
                   reference: str = REFERENCE_ENGINE) -> list[tuple[TestResult, TestResult]]:
    """(ours, reference) per test that both engines ran, in the order of the results."""
    by_key = {(r.test, r.engine): r for r in results if r.samples}
    return [(r, by_key[(test, reference)]) for (test, engine), r in by_key.items()
            if engine == ours and (test, reference) in by_key]


def compute_intervals(results: Iterable[TestResult], ours: str, reference: str = REFERENCE_ENGINE,
                      confidence: float = DEFAULT_CONFIDENCE) -> dict[str, RatioInterval]:
    """Each test's paired ratio with its interval and verdict (tests with no complete pair are left out)."""
    out: dict[str, RatioInterval] = {}
    for a, b in paired_results(results, ours, reference):
        interval = interval_of(a.samples, b.samples, a.higher_is_better, confidence)
        if interval is not None:
            out[a.test] = interval
    return out


def compute_ratios(results: Iterable[TestResult], ours: str, reference: str = REFERENCE_ENGINE) -> dict[str, float]:
    """Each test's ratio: the paired geometric mean of :func:`compute_intervals`, else the ratio of medians."""
    results = list(results)
    intervals = compute_intervals(results, ours, reference)
    return {a.test: intervals[a.test].ratio if a.test in intervals else ratio_of(a, b)
            for a, b in paired_results(results, ours, reference)}


# --- metadata (the provenance builder lives in validation.provenance) -------------------------------------------
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

