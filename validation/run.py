"""``validate``: hold one engine up against another, layer by layer, and say whether it passes.

The command ``bench-compare validate`` only parses flags and calls :func:`validate`; everything else is here so a
script or a test can run the same checks. The checks, all between *ours* and a *reference* engine (llama.cpp by
default, or our NumPy backend with ``against="numpy"``: any two engines, one code path):

1. tensors, teacher-forced (the gated mode): one prefill of the prompt on the reference with every intermediate
   captured, then one on ours with the reference's tensors forced in (``capture(ids, force=...)``): each of our
   tensors is our op(s) applied to the reference's inputs. :mod:`validation.diff` matches them by llama.cpp graph name
   and gates each on NMSE (threshold by numerics mode, see :mod:`validation.metrics`); the first failing tensor in
   graph order is named. A wrong op still gives a wrong output from the right inputs, but rounding differences can no
   longer compound from layer to layer, so the per-op threshold is meaningful for every tensor;
2. logits: the teacher-forced ``result_output`` at every prompt position: KLD mean/max, top-1, top-5 overlap;
3. free running (reported, and its logits gated against a noise floor): the same diff with each engine on its own
   values end to end, and the free-running logits next to how far the reference's logits move against *itself*
   (:mod:`validation.free_running`);
4. tokenizer parity on a corpus (built-in or JSONL);
5. greedy smoke: N tokens from each engine's own decode loop (:mod:`validation.smoke`);
6. optionally the logit lens per layer on the free-running captures (:mod:`validation.logit_lens`, diagnostic).

``free_running=True`` (``--free-running``) gates checks 1-2 on the free-running comparison instead (every tensor at
the per-op threshold, the strict logits thresholds), with the teacher-forced result reported beside it. An engine
under test whose ``capture`` takes no ``force`` (a plain :class:`~inference_engine.protocol.Engine`) is compared
free-running only, and the result says so (``mode``, ``mode_reason``).

The prompt is tokenized by the *reference* and the same ids go to both engines, so a tokenizer difference shows up in
check 4 and never disguises itself as a numerics difference in checks 1-3.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from inference_engine.backends import BACKENDS
from inference_engine.defaults import VALIDATE
from inference_engine.errors import GGUFParityError
from inference_engine.protocol import Engine, EngineCapabilityError
from inference_engine.registries import Registry
from validation.diff import diff_captures
from validation.free_running import (
    FREE_RUNNING_EXPLANATION,
    GAP_SHIFT_FACTOR,
    TEACHER_FORCED_EXPLANATION,
    free_running_logits,
    measure_self_noise,
)
from validation.metrics import THRESHOLDS, logit_metrics, logits_pass, thresholds_for
from validation.results import ValidationResult
from validation.smoke import greedy_smoke
from validation.tokenizer_parity import builtin_corpus, load_jsonl_corpus, tokenizer_parity

# --against: the reference engines, (options, model_path) -> Engine.
REFERENCES: Registry[Callable] = Registry("--against", {
    "llamacpp": "validation.run:open_llamacpp_reference",
    "numpy": "validation.run:open_numpy_reference",
}, listing="supported")
DEFAULT_MODEL = "smollm2-135m"
# Mixed prose, digits and punctuation: ~30 tokens, enough positions for per-position metrics and for RoPE to reach
# angles where a wrong base shows, short enough to keep a NumPy prefill with every tensor captured to seconds.
DEFAULT_PROMPT = ("The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon; "
                  "the capital of France is")
DEFAULT_SMOKE_TOKENS = 16
# Keys of the reference engine's model_info that identify its build (llama.cpp's), copied into "versions".
REFERENCE_BUILD_KEYS = ("llama_cpp_python", "llama_version", "ggml_version", "ggml_commit")
# The context each engine is created with (both engines' own default): prompt plus smoke tokens must fit in it.
DEFAULT_N_CTX = 2048
TEACHER_FORCED = "teacher_forced"
CORPUS_BUILTIN = "builtin"  # --corpus-kld with no file: the shipped public-domain text
DEFAULT_CORPUS_CTX = 512
FREE_RUNNING = "free_running"


@dataclass
class ValidateOptions:
    model: str = DEFAULT_MODEL
    backend: str = "numpy"
    numerics: str = "ggml"
    prompt: str | None = None
    against: str = "llamacpp"
    logit_lens: bool = False
    corpus: str | None = None
    smoke_tokens: int = DEFAULT_SMOKE_TOKENS
    threads: int | None = None
    # our K/V cache: F32 as the llama.cpp reference's (the defaults table's one exception, inference_engine.defaults)
    kv_type: str = VALIDATE.kv_type
    n_ctx: int = DEFAULT_N_CTX
    free_running: bool = False  # gate the free-running comparison instead of the teacher-forced one
    engine: str | None = None  # the engine under test when it is not ours:<backend> (its spec name, recorded)
    decode_steps: int = 0  # teacher-forced decode steps at each ``depth`` (0: not run); validation.decode_steps
    depth: str = "0"  # comma-separated prefix lengths for decode_steps
    corpus_kld: str | None = None  # a text file, or CORPUS_BUILTIN, for llama-perplexity-style KLD; None: not run
    ctx: int = DEFAULT_CORPUS_CTX  # window of the corpus KLD

    def check(self) -> None:
        """Reject bad choices before anything is loaded."""
        REFERENCES.validate(self.against)
        _choice("--backend", self.backend, tuple(BACKENDS))
        _choice("--numerics", self.numerics, tuple(THRESHOLDS))  # the modes with pass thresholds
        if self.smoke_tokens < 0:
            raise GGUFParityError(f"--smoke-tokens must be 0 or more, got {self.smoke_tokens}")
        if self.threads is not None and self.threads < 1:
            raise GGUFParityError(f"--threads must be 1 or more, got {self.threads}")
        if self.prompt is not None and not self.prompt.strip():
            raise GGUFParityError("--prompt is empty; give some text to run through both engines")
        if self.decode_steps < 0:
            raise GGUFParityError(f"--decode-steps must be 0 or more, got {self.decode_steps}")
        if self.decode_steps:
            self.depth_plan()
        if self.corpus_kld is not None and self.ctx < 4:
            raise GGUFParityError(f"--ctx must be at least 4, got {self.ctx}")
        if self.corpus_kld not in (None, CORPUS_BUILTIN):
            from validation.corpus_text import load_text

            load_text(self.corpus_kld)  # a missing, empty or non-UTF-8 file is a user error before any model loads

    def depth_plan(self):
        from validation.decode_steps import DepthPlan

        return DepthPlan.parse(self.depth, self.decode_steps)

    def context_needed(self) -> int:
        """The engines' context: the default, or more when decode steps at depth or the KLD windows need it."""
        needed = self.n_ctx
        if self.decode_steps:
            needed = max(needed, self.depth_plan().tokens_needed)
        if self.corpus_kld is not None:
            needed = max(needed, self.ctx)
        return needed


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise GGUFParityError(f"unknown {flag} '{value}'; supported: {', '.join(choices)}")


# --- engines ----------------------------------------------------------------------------------------------------


def open_reference(options: ValidateOptions, model_path: Path) -> Engine:
    """The ``--against`` engine (:data:`REFERENCES`)."""
    return REFERENCES.get(options.against)(options, model_path)


def open_numpy_reference(options: ValidateOptions, model_path: Path) -> Engine:
    """Our NumPy backend as the reference (two of our engines, one code path)."""
    return _open_ours(model_path, "numpy", options)


def open_llamacpp_reference(options: ValidateOptions, model_path: Path) -> Engine:
    """llama.cpp, the cleanest reference: F32 KV cache, no flash attention."""
    from validation.llamacpp import LlamaCppEngine

    try:
        return LlamaCppEngine(str(model_path), n_ctx=options.n_ctx, n_threads=options.threads)
    except GGUFParityError:
        raise
    except Exception as exc:  # noqa: BLE001 - llama.cpp's own failures become one user-facing line
        raise GGUFParityError(f"{model_path}: llama.cpp cannot load this model ({_one_line(exc)})") from None


def open_ours(options: ValidateOptions, model_path: Path) -> Engine:
    return _open_ours(model_path, options.backend, options)


def _open_ours(model_path: Path, backend: str, options: ValidateOptions) -> Engine:
    from inference_engine.engine import OurEngine

    return OurEngine(str(model_path), backend=backend, numerics=options.numerics, n_ctx=options.n_ctx,
                     n_threads=options.threads, kv_type=options.kv_type)


# --- the checks -------------------------------------------------------------------------------------------------


def validate(options: ValidateOptions, ours_opener: Callable | None = None,
             reference_opener: Callable | None = None) -> dict[str, Any]:
    """Resolve the model, open both engines, run every check; return the self-describing result dict.

    ``ours_opener`` / ``reference_opener`` are ``(options, model_path) -> Engine``; tests pass their own (a
    fault-injected engine); by default this module's :func:`open_ours` / :func:`open_reference`.
    User mistakes raise :class:`GGUFParityError`, before any work is done where they can be seen early.
    """
    from inference_engine.gguf_file import open_gguf
    from inference_engine.model_cache import resolve_model

    options.check()
    options.n_ctx = options.context_needed()
    corpus_texts, corpus_source = _load_corpus(options.corpus)
    model_path = resolve_model(options.model)
    gguf = open_gguf(model_path)
    reference = (reference_opener or open_reference)(options, model_path)
    try:
        ours = (ours_opener or open_ours)(options, model_path)
        try:
            return validate_engines(ours, reference, gguf, options, corpus_texts, corpus_source)
        finally:
            _close(ours)
    finally:
        _close(reference)


def supports_teacher_forcing(engine: Engine) -> bool:
    """Whether ``engine.capture`` takes ``force=`` (see ``inference_engine/protocol.py``)."""
    try:
        return "force" in inspect.signature(engine.capture).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def supports_capture(engine: Engine) -> bool:
    """Whether the engine offers ``capture`` at all (a plugin may not: then only its logits are compared)."""
    return callable(getattr(engine, "capture", None))


def capture(engine: Engine, ids: list[int]) -> dict[str, np.ndarray]:
    """``engine.capture(ids)``, or for an engine without ``capture`` its logits at every position
    (``result_output``), one prefill of the first token then one decode per token."""
    if supports_capture(engine):
        return engine.capture(ids)
    engine.reset()
    rows = [np.asarray(engine.prefill(list(ids[:1])), dtype=np.float32)]
    rows += [np.asarray(engine.decode(int(t)), dtype=np.float32) for t in ids[1:]]
    engine.reset()
    return {"result_output": np.stack(rows)}


def gated_mode(ours: Engine, options: ValidateOptions) -> tuple[str, str]:
    """Which comparison the tensor and logits checks gate, and why."""
    if not supports_capture(ours):
        return FREE_RUNNING, (f"the engine under test ({getattr(ours, 'name', type(ours).__name__)}) has no "
                              "capture(), so only its logits at every position (by decoding), the tokenizer and the "
                              "greedy smoke test are compared; no per-tensor check")
    if options.free_running:
        return FREE_RUNNING, "--free-running: the free-running comparison is gated at the per-op thresholds"
    if not supports_teacher_forcing(ours):
        return FREE_RUNNING, (f"the engine under test ({getattr(ours, 'name', type(ours).__name__)}) cannot be "
                              "teacher-forced (its capture() takes no force=), so the free-running comparison is gated")
    return TEACHER_FORCED, ("the engine under test takes force=, so every tensor is gated given the reference's "
                            "inputs; free-running drift is reported under free_running")


def validate_engines(ours: Engine, reference: Engine, gguf, options: ValidateOptions,
                     corpus_texts: list[str] | None = None, corpus_source: str = "builtin") -> dict[str, Any]:
    """All checks between two open engines on one model file (the library core; no model loading here)."""
    variants = _ReferenceVariants(reference)
    try:
        return _validate_engines(ours, reference, gguf, options, corpus_texts, corpus_source, variants)
    finally:
        variants.close()


class _ReferenceVariants:
    """The reference's rounding variants, opened once on first use (noise floor, then smoke) and closed at the end."""

    def __init__(self, reference: Engine):
        self.reference = reference
        self._opened: tuple[dict[str, Engine], dict[str, str]] | None = None

    def get(self) -> tuple[dict[str, Engine], dict[str, str]]:
        """``({label: engine}, {label: why it could not be opened})``."""
        if self._opened is None:
            self._opened = _rounding_variants(self.reference)
        return self._opened

    def close(self) -> None:
        if self._opened is not None:
            for engine in self._opened[0].values():
                _close(engine)
            self._opened = None


def _validate_engines(ours: Engine, reference: Engine, gguf, options: ValidateOptions,
                      corpus_texts: list[str] | None, corpus_source: str,
                      variants: _ReferenceVariants) -> dict[str, Any]:
    thresholds = thresholds_for(options.numerics)
    prompt = options.prompt if options.prompt is not None else DEFAULT_PROMPT
    ids = list(reference.tokenize(prompt, add_bos=True))
    if not ids:
        raise GGUFParityError(f"the prompt {prompt!r} tokenizes to zero tokens; give a longer prompt")
    needed = len(ids) + options.smoke_tokens
    if needed > min(ours.n_ctx, reference.n_ctx):
        raise GGUFParityError(f"prompt ({len(ids)} tokens) plus --smoke-tokens ({options.smoke_tokens}) needs a "
                              f"context of {needed}, more than the engines' {min(ours.n_ctx, reference.n_ctx)}")
    mode, mode_reason = gated_mode(ours, options)

    captured_ref = reference.capture(ids)
    captured_free = capture(ours, ids)
    free_diff = diff_captures(captured_free, captured_ref, thresholds.tensor_nmse_max)
    free_logits = _logits_check(captured_free, captured_ref, thresholds)
    lens = None
    if options.logit_lens:
        from validation.logit_lens import LogitLens, logit_lens

        lens = logit_lens(LogitLens(gguf), captured_free, captured_ref)
    ours_free_logits = captured_free.get("result_output")
    del captured_free

    teacher = None
    if supports_teacher_forcing(ours):
        captured_forced = ours.capture(ids, force=captured_ref)
        tf_diff = diff_captures(captured_forced, captured_ref, thresholds.tensor_nmse_max)
        tf_logits = _logits_check(captured_forced, captured_ref, thresholds)
        del captured_forced
        teacher = {"gated": mode == TEACHER_FORCED, "explanation": TEACHER_FORCED_EXPLANATION, **tf_diff.summary(),
                   "logits": tf_logits}

    free = {"gated": mode == FREE_RUNNING, "explanation": FREE_RUNNING_EXPLANATION, **free_diff.summary()}
    if ours_free_logits is None and getattr(ours, "partial_capture", False):
        free.update({"reference_self_kld": None, "logits": {"passed": None, "not_checked": "no result_output"}})
    else:
        free.update(_free_running_logits(reference, ids, captured_ref.get("result_output"), ours_free_logits,
                                         thresholds, variants))
    # The noise-floor gate is a check of its own only beside a teacher-forced gate; when free running is the gated
    # mode, its logits face the strict thresholds (``logits``) and the noise-floor verdict is for the reader.
    free["logits"]["gated"] = bool(free["logits"].get("gated")) and mode == TEACHER_FORCED
    del captured_ref

    gated_diff, gated_logits = (tf_diff, tf_logits) if mode == TEACHER_FORCED else (free_diff, free_logits)
    not_checked: dict[str, str] = {}
    if ours_free_logits is None and getattr(ours, "partial_capture", False):
        not_checked["logits"] = f"{_name(ours)} provided no result_output"
        gated_logits = {"passed": None, "not_checked": not_checked["logits"]}
    gated = gated_diff.to_dict()
    result = ValidationResult(
        mode=mode,
        mode_reason=mode_reason,
        backend=options.backend,
        engine=options.engine or f"ours:{options.backend}",
        numerics=options.numerics,
        against=options.against,
        model=_model_identity(options.model, gguf),
        prompt={"text": prompt, "ids": ids, "n_tokens": len(ids)},
        thresholds=thresholds.to_dict(),
        threshold=gated["threshold"],
        first_failure=gated["first_failure"],
        tensors=gated["tensors"],
        unmatched=gated["unmatched"],
        layers=gated["layers"],
        logits=gated_logits,
        teacher_forced=teacher,
        free_running=free,
        logit_lens=lens,
    )
    checks = result.checks
    # without capture() only result_output exists on our side: the tensor check did not run
    checks["tensors"] = gated_diff.passed if supports_capture(ours) else None
    checks["logits"] = gated_logits["passed"]
    if mode == TEACHER_FORCED:
        # None in f32 numerics (reported, not gated), like the f32 logits themselves
        checks["free_running"] = free["logits"].get("passed")

    if corpus_texts is None:
        result.tokenizer = {"source": "builtin", "skipped": "no built-in corpus available", "passed": None,
                            "cases": 0, "mismatches": 0, "first_mismatch": None, "special_tokens": None}
    else:
        try:
            result.tokenizer = tokenizer_parity(ours, reference, corpus_texts, corpus_source).to_dict()
        except EngineCapabilityError as gap:
            not_checked["tokenizer"] = str(gap)
            result.tokenizer = {"source": corpus_source, "skipped": str(gap), "passed": None, "cases": 0,
                                "mismatches": 0, "first_mismatch": None, "special_tokens": None}
    checks["tokenizer"] = result.tokenizer["passed"]

    if options.smoke_tokens > 0:
        noise = free.get("reference_self_kld") or {}
        drift = GAP_SHIFT_FACTOR * float(noise.get("flip_margin_max") or 0.0)
        try:
            result.smoke = greedy_smoke(ours, reference, ids, options.smoke_tokens, variants.get()[0],
                                        drift_margin=drift).to_dict()
        except EngineCapabilityError as gap:
            not_checked["smoke"] = str(gap)
            result.smoke = {"skipped": str(gap), "passed": None}
        checks["smoke"] = result.smoke["passed"]
    result.not_checked = not_checked

    if options.decode_steps:
        result.decode_steps = _decode_steps(ours, reference, options, thresholds)
        checks["decode_steps"] = result.decode_steps["passed"]
    if options.corpus_kld is not None:
        result.corpus_kld = _corpus_kld(ours, reference, options, thresholds, variants)
        checks["corpus_kld"] = result.corpus_kld["passed"]

    # A check that did not run (None) does not fail the run; every check that ran must pass.
    result.passed = all(v for v in checks.values() if v is not None)
    result.engines = {"ours": _info(ours), "reference": _info(reference)}
    result.engine_notes = list(result.engines["ours"].get("notes") or [])
    result.provenance = provenance(options.backend)
    build = {k: v for k, v in result.engines["reference"].items() if k in REFERENCE_BUILD_KEYS}
    if build:
        result.provenance["versions"]["reference_build"] = build
    return result.to_dict()  # the typed, versioned record, as JSON


def _free_running_logits(reference: Engine, ids: list[int], ref_logits, ours_logits,
                         thresholds, variants: _ReferenceVariants) -> dict[str, Any]:
    """The reference's noise floor (``reference_self_kld``) and our free-running logits judged against it."""
    if ref_logits is None or ours_logits is None:
        missing = " and ".join(side for side, x in (("ours", ours_logits), ("reference", ref_logits)) if x is None)
        return {"reference_self_kld": None,
                "logits": {"passed": False, "error": f"result_output missing from the {missing} capture"}}
    engines, errors = variants.get()
    noise = measure_self_noise(reference, ids, ref_logits, engines)
    noise.errors.update(errors)
    return {"reference_self_kld": noise.to_dict(),
            "logits": free_running_logits(ours_logits, ref_logits, noise, thresholds)}


def _decode_steps(ours: Engine, reference: Engine, options: ValidateOptions, thresholds) -> dict[str, Any]:
    """Teacher-forced decode steps at each depth on the built-in long text (:mod:`validation.decode_steps`)."""
    from validation.corpus_text import BUILTIN_NAME, builtin_text
    from validation.decode_steps import supports_steps, validate_depths

    why = supports_steps(ours, reference)
    if why:
        return {"passed": None, "skipped": why}
    ids = list(reference.tokenize(builtin_text(), add_bos=True))
    out = validate_depths(ours, reference, ids, options.depth_plan(), thresholds)
    out["text"] = BUILTIN_NAME
    return out


def _corpus_kld(ours: Engine, reference: Engine, options: ValidateOptions, thresholds,
                variants: _ReferenceVariants) -> dict[str, Any]:
    """llama-perplexity's KLD statistics, ours and the reference's own variants (:mod:`validation.corpus_kld`)."""
    from validation.corpus_kld import corpus_kld
    from validation.corpus_text import load_text

    text, source = load_text(None if options.corpus_kld == CORPUS_BUILTIN else options.corpus_kld)
    ids = list(reference.tokenize(text, add_bos=True))
    with_bos = list(reference.tokenize("", add_bos=True))
    bos = with_bos[0] if with_bos else None
    return corpus_kld(ours, reference, ids, options.ctx, bos, thresholds, variants.get()[0], source)


def _rounding_variants(reference: Engine) -> tuple[dict[str, Engine], dict[str, str]]:
    """The reference's own rounding-level variants (llama.cpp: flash attention toggled) when it offers any, and
    why they could not be opened when that failed."""
    make = getattr(reference, "rounding_variants", None)
    if not callable(make):
        return {}, {}
    try:
        return dict(make()), {}
    except Exception as exc:  # noqa: BLE001 - the noise floor is diagnostic; report, never sink the run
        return {}, {"rounding variants": _one_line(exc)}


def _logits_check(ours: dict, reference: dict, thresholds) -> dict[str, Any]:
    missing = [side for side, cap in (("ours", ours), ("reference", reference)) if "result_output" not in cap]
    if missing:
        return {"passed": False, "error": f"result_output missing from the {' and '.join(missing)} capture"}
    a, b = np.asarray(ours["result_output"]), np.asarray(reference["result_output"])
    if a.shape != b.shape:
        return {"passed": False, "error": f"result_output shape mismatch: ours {a.shape} vs reference {b.shape}"}
    summary = logit_metrics(a, b)
    summary["passed"] = logits_pass(summary, thresholds)
    return summary


def _load_corpus(corpus: str | None) -> tuple[list[str] | None, str]:
    if corpus is not None:
        return load_jsonl_corpus(corpus), str(corpus)
    try:
        return builtin_corpus(), "builtin"
    except ImportError:
        return None, "builtin"


# --- identity ---------------------------------------------------------------------------------------------------


def _model_identity(name_or_path: str, gguf) -> dict[str, Any]:
    d = gguf.describe()
    return {"name": name_or_path, "path": str(gguf.path), "sha256": gguf.sha256, "architecture": d["architecture"],
            "quant": d["quant"], "n_params": d["n_params"], "size_bytes": d["size_bytes"]}


def _info(engine: Engine) -> dict[str, Any]:
    try:
        return dict(engine.model_info)
    except Exception as exc:  # noqa: BLE001 - provenance must never sink a finished validation
        return {"error": _one_line(exc)}


def provenance(backend: str | None = None) -> dict[str, Any]:
    """What every result records (:func:`validation.provenance.provenance`), plus ``git_sha`` as one string."""
    from validation.provenance import git_sha_label
    from validation.provenance import provenance as build

    made = build()
    return {**made, "git_sha": git_sha_label(made["git"])}


def _name(engine: Engine) -> str:
    return str(getattr(engine, "name", type(engine).__name__))


def _close(engine: Engine | None) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def _one_line(exc: BaseException) -> str:
    return (" ".join(str(exc).split()) or type(exc).__name__)[:200]
