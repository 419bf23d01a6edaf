"""Typed, versioned result records: what ``validate`` and ``compare`` write (in-process engines, and HTTP engines
through ``bench_compare.adapters``), and what ``report`` reads.

(``bench`` writes llama-bench's own row format, unchanged, so that llama-bench tooling reads it; it has no record
here.)

Each result is a dataclass with a ``kind`` and a ``schema_version`` (class constants written into the JSON) and one
provenance block (:func:`validation.provenance.provenance`). JSON is written from them (``to_dict``); ``report`` finds
the class of a file by its ``kind`` in :data:`RESULT_KINDS`. Files written before results carried a kind (schema
version 0) are upgraded on load by :func:`upgrade_legacy`, the only place that looks at which keys a file has.

The classes live here, on the reference side, because both ``validation`` (which writes validation results) and
``bench_compare`` (which writes compare and bench results and reads all of them) import this package.
"""

from __future__ import annotations

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
    engines: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # optional sections (logit_lens)


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


# kind -> result class
RESULT_KINDS: Registry[type[Result]] = Registry("result kind", {
    ValidationResult.kind: ValidationResult,
    CompareResult.kind: CompareResult,
    HttpCompareResult.kind: HttpCompareResult,
    HttpValidateResult.kind: HttpValidateResult,
}, base=Result)


def upgrade_legacy(obj: Any) -> dict[str, Any] | None:
    """A result file written before results carried ``kind`` (schema 0), with its kind filled in; None if it is
    not one. Compare files had ``kind`` from the start; validation files are recognised by their verdict and
    tensors or logits."""
    if not isinstance(obj, dict) or "kind" in obj:
        return obj if isinstance(obj, dict) and obj.get("kind") in RESULT_KINDS else None
    if isinstance(obj.get("results"), list) and isinstance(obj.get("ratios"), dict):
        return {**obj, "kind": CompareResult.kind, "schema_version": 0}
    if "passed" in obj and (isinstance(obj.get("tensors"), list) or isinstance(obj.get("logits"), dict)):
        return {**obj, "kind": ValidationResult.kind, "schema_version": 0}
    return None


def result_class(obj: dict[str, Any], source: str = "") -> type[Result]:
    """The class of a result object by its ``kind``; a newer schema than this version reads is one line."""
    cls = RESULT_KINDS.get(obj["kind"])
    version = obj.get("schema_version", 0)
    if isinstance(version, int) and version > cls.schema_version:
        raise GGUFParityError(f"{source}: {obj['kind']} schema version {version} is newer than this gguf-parity "
                              f"reads ({cls.schema_version}); upgrade gguf-parity")
    return cls
