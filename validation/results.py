"""Typed, versioned result records: what ``validate``, ``compare`` and ``bench`` write (in-process engines, and HTTP
engines through ``bench_compare.adapters``), and what ``report`` reads.

``bench`` prints llama-bench's own row format (``-o md|csv|json|jsonl``), rendered from its :class:`BenchResult`'s
typed rows (:class:`BenchRow`, one llama-bench result object each); ``bench --json FILE`` writes the record itself.

Each result is a dataclass with a ``kind`` and a ``schema_version`` (class constants written into the JSON) and one
provenance block (:func:`validation.provenance.provenance`). JSON is written from them (``to_dict``); ``report`` finds
the class of a file by its ``kind`` in :data:`RESULT_KINDS`. Files written before results carried a kind (schema
version 0) are upgraded on load by :func:`upgrade_legacy`, the only place that looks at which keys a file has.

The classes live here, on the reference side, because both ``validation`` (which writes validation results) and
``bench_compare`` (which writes compare and bench results and reads all of them) import this package.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from inference_engine.errors import GGUFParityError
from inference_engine.registries import Registry


@dataclass
class Result:
    """The common part: the kind and schema version (class constants) and the provenance of the run."""

    kind: ClassVar[str]
    schema_version: ClassVar[int]
    provenance: dict[str, Any] = field(default_factory=dict)  # {date, git, versions, machine}, see provenance.py
    backend: str = ""  # what ran: the backend (ours) and numerics mode, and the model file
    numerics: str = ""
    model: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: kind and schema_version first, then the fields, the provenance keys at top level."""
        body = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("provenance", "extra")}
        return {"kind": self.kind, "schema_version": self.schema_version, **body, **self.provenance,
                **getattr(self, "extra", {})}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Result:
        names = {f.name for f in fields(cls)} - {"provenance", "extra"}
        prov_keys = ("date", "git", "git_sha", "versions", "machine")
        known = {k: v for k, v in obj.items() if k in names}
        rest = {k: v for k, v in obj.items() if k not in names and k not in prov_keys
                and k not in ("kind", "schema_version")}
        made = cls(**known, provenance={k: obj[k] for k in prov_keys if k in obj})
        if hasattr(made, "extra"):
            made.extra = rest
        return made


@dataclass
class ValidationResult(Result):
    """``bench-compare validate``: every check between the engine under test and a reference."""

    kind: ClassVar[str] = "gguf-parity-validation"
    schema_version: ClassVar[int] = 1
    passed: bool = False
    checks: dict[str, bool | None] = field(default_factory=dict)
    mode: str = ""
    mode_reason: str = ""
    engine: str = ""
    against: str = ""
    prompt: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    first_failure: str | None = None
    tensors: list[dict[str, Any]] = field(default_factory=list)
    unmatched: dict[str, list[str]] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    logits: dict[str, Any] = field(default_factory=dict)
    teacher_forced: dict[str, Any] | None = None
    free_running: dict[str, Any] | None = None
    tokenizer: dict[str, Any] | None = None
    smoke: dict[str, Any] | None = None
    not_checked: dict[str, str] = field(default_factory=dict)  # check -> why the engine could not give it
    checks_run: list[str] = field(default_factory=list)  # the checks that ran (their verdicts are in ``checks``)
    precision: dict[str, Any] = field(default_factory=dict)  # class, where it came from, gate (validation.precision)
    capabilities: list[str] = field(default_factory=list)  # what the engine under test gives (protocol.CAPABILITIES)
    top_k: dict[str, Any] | None = None  # an engine that only generates: validation.top_k
    decode_steps: dict[str, Any] | None = None  # --decode-steps
    corpus_kld: dict[str, Any] | None = None  # --corpus-kld
    interrupted: str | None = None  # the check Ctrl-C stopped (decode_steps, corpus_kld); what finished is kept
    logit_lens: list[dict[str, Any]] | None = None  # --logit-lens (diagnostic)
    # --record-reference (mode "recorded": where, how many calls) / --against recording:DIR ("replayed": which)
    recording: dict[str, Any] | None = None
    engines: dict[str, Any] = field(default_factory=dict)
    engine_notes: list[str] = field(default_factory=list)  # what an outside engine did and did not provide
    extra: dict[str, Any] = field(default_factory=dict)  # sections this version does not know


@dataclass
class CompareResult(Result):
    """``bench-compare compare``: interleaved measurements of one engine and llama.cpp, with ratios."""

    kind: ClassVar[str] = "gguf-parity-compare"
    schema_version: ClassVar[int] = 1
    ours: str = ""
    reference: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    # per test: {ratio, low, high, n, confidence, verdict, method} (bench_compare.intervals); absent in older files
    ratio_intervals: dict[str, dict[str, Any]] = field(default_factory=dict)
    ratio_orientation: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class HttpCompareResult(Result):
    """``bench-compare compare --engine openai:URL``: a serving benchmark over HTTP (TTFT, ITL, TPOT, E2E per side,
    ratios per test and metric; written by ``bench_compare.adapters.http_bench``)."""

    kind: ClassVar[str] = "http-compare"
    schema_version: ClassVar[int] = 1
    engine: str = ""
    reference: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sides: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    requests: dict[str, Any] = field(default_factory=dict)
    complete: bool = True
    ratios: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # "test metric" -> {ratio, low, high, n, confidence, verdict, method} over paired rounds; absent in older files
    ratio_intervals: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # http_overhead, error


@dataclass
class HttpValidateResult(Result):
    """``bench-compare validate --engine openai:URL``: top-k log-probability fidelity of an HTTP engine against
    llama.cpp in-process (written by ``bench_compare.adapters.http_fidelity``)."""

    kind: ClassVar[str] = "http-validate"
    schema_version: ClassVar[int] = 1
    passed: bool = False
    checks: dict[str, bool] = field(default_factory=dict)
    engine: str = ""
    reference: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # prompt, greedy, echo, positions, noise floor, notes


SAMPLES_OPTIONAL = ("samples_ns", "samples_ts")  # llama-bench's csv and md carry none


@dataclass
class BenchRow:
    """One llama-bench result object (one test on one engine), fields in llama-bench's ``test::get_fields()`` order
    (GPU-only fields left out, ``engine`` and ``numerics`` added), then the per-repetition samples.
    :func:`bench_compare.llamabench_format.make_record` fills it; the formats there print it."""

    build_commit: str
    build_number: int
    cpu_info: str
    gpu_info: str
    backends: str
    engine: str
    numerics: str
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    type_k: str
    type_v: str
    flash_attn: int
    n_prompt: int
    n_gen: int
    n_depth: int
    test_time: str
    avg_ns: int
    stddev_ns: int
    avg_ts: float
    stddev_ts: float
    samples_ns: list[int] = field(default_factory=list)
    samples_ts: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The llama-bench JSON object, keys in llama-bench's order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> BenchRow:
        """A row from llama-bench JSON (ours or llama-bench's own: its GPU-only fields are dropped; ``engine`` and
        ``numerics``, which llama-bench does not write, default to what it runs)."""
        names = [f.name for f in fields(cls)]
        # llama-bench does not write engine / numerics; gpu_info is GPU-only; n_depth came with llama-bench's -d
        defaults = {"engine": "llamacpp", "numerics": "ggml", "gpu_info": "", "n_depth": 0}
        given = {**defaults, **{k: v for k, v in obj.items() if k in names}} if isinstance(obj, dict) else {}
        missing = [n for n in names if n not in given and n not in SAMPLES_OPTIONAL]
        if missing:
            raise GGUFParityError(f"a bench row lacks {', '.join(missing)} (a llama-bench result object has them)")
        return cls(**given)


@dataclass
class BenchResult(Result):
    """``bench-compare bench``: llama-bench's tests on one engine. ``rows`` are llama-bench's result objects, in the
    order the tests ran; ``complete`` is False when Ctrl-C cut the run short (the last row may hold fewer samples
    than ``settings["reps"]``)."""

    kind: ClassVar[str] = "gguf-parity-bench"
    schema_version: ClassVar[int] = 1
    engine: str = ""
    build_commit: str = ""
    build_number: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[BenchRow] = field(default_factory=list)
    complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "rows": [row.to_dict() for row in self.rows]}

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> BenchResult:
        made = super().from_dict(obj)
        if not isinstance(made.rows, list):
            raise GGUFParityError("a bench result's rows must be a list of llama-bench result objects")
        made.rows = [row if isinstance(row, BenchRow) else BenchRow.from_dict(row) for row in made.rows]
        return made


# kind -> result class
RESULT_KINDS: Registry[type[Result]] = Registry("result kind", {
    ValidationResult.kind: ValidationResult,
    CompareResult.kind: CompareResult,
    HttpCompareResult.kind: HttpCompareResult,
    HttpValidateResult.kind: HttpValidateResult,
    BenchResult.kind: BenchResult,
}, base=Result)


def upgrade_legacy(obj: Any) -> dict[str, Any] | None:
    """A result file written before results carried ``kind`` (schema 0), with its kind filled in; None if it is
    not one. Compare files had ``kind`` from the start; validation files are recognised by their verdict and
    tensors or logits; bench files by being what ``bench -o json`` prints (and llama-bench's own ``-o json``): an
    array of llama-bench result objects."""
    if isinstance(obj, list) and obj and all(isinstance(row, dict) and {"avg_ns", "n_prompt", "n_gen"} <= set(row)
                                             for row in obj):
        first = obj[0]
        return {"kind": BenchResult.kind, "schema_version": 0, "engine": first.get("engine", "llamacpp"),
                "numerics": first.get("numerics", ""), "build_commit": first.get("build_commit", ""),
                "build_number": str(first.get("build_number", "")),
                "model": {"path": first.get("model_filename"), "model_type": first.get("model_type"),
                          "filename": os.path.basename(str(first.get("model_filename") or ""))},
                "rows": obj}
    if not isinstance(obj, dict) or "kind" in obj:
        return obj if isinstance(obj, dict) and obj.get("kind") in RESULT_KINDS else None
    if isinstance(obj.get("results"), list) and isinstance(obj.get("ratios"), dict):
        return {**obj, "kind": CompareResult.kind, "schema_version": 0}
    if "passed" in obj and (isinstance(obj.get("tensors"), list) or isinstance(obj.get("logits"), dict)):
        return {**obj, "kind": ValidationResult.kind, "schema_version": 0, **_legacy_validation_fields(obj)}
    return None


def _legacy_validation_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """An old validation file's fields in today's shapes: the model as an identity dict (it was once a bare name),
    the commit as ``git`` ``{sha, dirty}`` (once only the ``git_sha`` string), the engine named (once only its
    backend)."""
    out: dict[str, Any] = {}
    if not isinstance(obj.get("model"), dict):
        out["model"] = {"name": obj.get("model")}
    if not isinstance(obj.get("git"), dict) and isinstance(obj.get("git_sha"), str):
        sha = obj["git_sha"]
        out["git"] = {"sha": sha.removesuffix("-dirty"), "dirty": sha.endswith("-dirty")}
    if not obj.get("engine") and obj.get("backend"):
        out["engine"] = f"ours:{obj['backend']}"
    return out


def result_class(obj: dict[str, Any], source: str = "") -> type[Result]:
    """The class of a result object by its ``kind``; a newer schema than this version reads is one line."""
    cls = RESULT_KINDS.get(obj["kind"])
    version = obj.get("schema_version", 0)
    if isinstance(version, int) and version > cls.schema_version:
        raise GGUFParityError(f"{source}: {obj['kind']} schema version {version} is newer than this gguf-parity "
                              f"reads ({cls.schema_version}); upgrade gguf-parity")
    return cls
