"""``validate``: hold one engine up against another, layer by layer, and say whether it passes.

The command ``bench-compare validate`` only parses flags and calls :func:`validate`; everything else is here so a
script or a test can run the same checks. The checks, all between *ours* and a *reference* engine (llama.cpp by
default, or our NumPy backend with ``against="numpy"``: any two engines, one code path; or either one's answers
recorded by an earlier run, ``against="recording:DIR"``: :mod:`validation.recording`):

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

Which limits apply is the engine's precision class (:mod:`validation.precision`): ``ggml`` (an engine that claims
llama.cpp's own arithmetic: ours in ggml numerics) keeps the fixed strict gates above; ``f32`` / ``f16`` / ``bf16``
(``--precision``, the engine's declared ``precision``, for ours its ``--numerics``, for any other engine f32) take
every limit from llama.cpp's own variants for the class, and their free-running logits verdict is the logits gate.
Which checks run is decided by what the engine gives (``protocol.engine_capabilities``): an engine with neither
logits nor tensors that generates is checked by its top-k log-probabilities on its own greedy path
(:mod:`validation.top_k`); every check that could not run is listed in ``not_checked`` with the reason, and a run
with no check at all is refused.

The prompt is tokenized by the *reference* and the same ids go to both engines, so a tokenizer difference shows up in
check 4 and never disguises itself as a numerics difference in checks 1-3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from inference_engine.backends import BACKENDS, DEVICES
from inference_engine.defaults import VALIDATE
from inference_engine.errors import GGUFParityError, one_line
from inference_engine.protocol import Engine, EngineCapabilityError, capture_takes_force, engine_capabilities
from inference_engine.registries import NUMERICS, Registry
from validation.diff import diff_captures
from validation.free_running import (
    FREE_RUNNING_EXPLANATION,
    GAP_SHIFT_FACTOR,
    TEACHER_FORCED_EXPLANATION,
    decode_logits,
    free_running_logits,
    measure_self_noise,
)
from validation.metrics import THRESHOLD_TABLE, THRESHOLDS, Thresholds, logit_metrics, logits_pass, thresholds_for
from validation.precision import (
    DEFAULT_PLUGIN_PRECISION,
    capture_variants,
    open_variants,
    tensor_bands,
    variance_source,
)
from validation.progress import ProgressHook, silent
from validation.results import ValidationResult
from validation.smoke import greedy_smoke, token_text
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
DEFAULT_TOP_K = 5  # log-probabilities per generated position asked of an engine that gives top-k only
# --top-k given for an engine whose full logits are compared: it would change nothing, so it is refused.
TOP_K_UNUSED = ("--top-k is for engines that give top-k log-probabilities only; {engine} gives full logits, which "
                "are compared whole")
# Keys of the reference engine's model_info that identify its build (llama.cpp's), copied into "versions".
REFERENCE_BUILD_KEYS = ("llama_cpp_python", "llama_version", "ggml_version", "ggml_commit")
# The context each engine is created with (both engines' own default): prompt plus smoke tokens must fit in it.
DEFAULT_N_CTX = 2048
TEACHER_FORCED = "teacher_forced"
CORPUS_BUILTIN = "builtin"  # --corpus-kld with no file: the shipped public-domain text
DEFAULT_CORPUS_CTX = 512
FREE_RUNNING = "free_running"
GENERATED = "generated"  # an engine that only generates: its top-k log-probabilities on its own greedy path
# The capabilities (inference_engine.protocol.CAPABILITIES) at least one of which validate needs to check anything.
CHECKABLE = frozenset({"logits", "tensors", "top_logprobs", "text"})


@dataclass
class ValidateOptions:
    model: str = DEFAULT_MODEL
    backend: str = "numpy"
    numerics: str = "ggml"
    precision: str | None = None  # the class the engine is judged in (validation.precision); None: resolved
    # log-probabilities per position for engines that give top-k only (validation.top_k); None: DEFAULT_TOP_K
    top_k: int | None = None
    prompt: str | None = None
    against: str = "llamacpp"
    logit_lens: bool = False
    corpus: str | None = None
    smoke_tokens: int = DEFAULT_SMOKE_TOKENS
    threads: int | None = None
    device: str | None = None  # where our engine under test computes (gpu | cpu); None: its backend's default
    # our K/V cache: F32 as the llama.cpp reference's (the defaults table's one exception, inference_engine.defaults)
    kv_type: str = VALIDATE.kv_type
    n_ctx: int = DEFAULT_N_CTX
    free_running: bool = False  # gate the free-running comparison instead of the teacher-forced one
    engine: str | None = None  # the engine under test when it is not ours:<backend> (its spec name, recorded)
    decode_steps: int = 0  # teacher-forced decode steps at each ``depth`` (0: not run); validation.decode_steps
    depth: str = "0"  # comma-separated prefix lengths for decode_steps
    corpus_kld: str | None = None  # a text file, or CORPUS_BUILTIN, for llama-perplexity-style KLD; None: not run
    record_reference: str | None = None  # a directory: every reference answer is written there (validation.recording)
    ctx: int = DEFAULT_CORPUS_CTX  # window of the corpus KLD
    # told of the corpus KLD's windows and the decode steps as they finish (validation.progress; the CLI: a bar)
    progress: ProgressHook = field(default=silent, repr=False, compare=False)

    def check(self) -> None:
        """Reject bad choices before anything is loaded."""
        from validation.recording import parse_against

        if parse_against(self.against) is None:
            REFERENCES.validate(self.against)
        elif self.record_reference is not None:
            raise GGUFParityError("--record-reference records a reference that runs (--against "
                                  f"{' | '.join(REFERENCES)}), not a recording")
        _choice("--backend", self.backend, tuple(BACKENDS))
        if self.device is not None:
            _choice("--device", self.device, DEVICES)
            if self.engine is None:  # ours:<backend>: a device it cannot use here is one line now
                from inference_engine.backends import resolve_device

                resolve_device(self.backend, self.device)
        _choice("--numerics", self.numerics, tuple(n for n in THRESHOLDS if n in NUMERICS))
        if self.precision is not None:
            _choice("--precision", self.precision, tuple(THRESHOLDS))
        if self.top_k is not None and self.top_k < 1:
            raise GGUFParityError(f"--top-k must be 1 or more, got {self.top_k}")
        if self.top_k is not None and self.engine is None:
            raise GGUFParityError(TOP_K_UNUSED.format(engine=f"ours:{self.backend}"))
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
    """The ``--against`` engine (:data:`REFERENCES`), or a recorded one (``recording:DIR``,
    :mod:`validation.recording`)."""
    from validation.recording import RecordedEngine, Recording, parse_against

    recorded = parse_against(options.against)
    if recorded is not None:
        return RecordedEngine(Recording(recorded))
    return REFERENCES.get(options.against)(options, model_path)


def open_numpy_reference(options: ValidateOptions, model_path: Path) -> Engine:
    """Our NumPy backend as the reference, on the CPU, in ``--numerics``: in ggml numerics with llama.cpp's variants
    where ours can compute them (:mod:`validation.numpy_reference`)."""
    from validation.numpy_reference import open_numpy_reference as open_reference

    return open_reference(model_path, numerics=options.numerics, n_ctx=options.n_ctx, n_threads=options.threads,
                          kv_type=options.kv_type)


def open_llamacpp_reference(options: ValidateOptions, model_path: Path) -> Engine:
    """llama.cpp, the cleanest reference: F32 KV cache, no flash attention."""
    try:
        from validation.llamacpp import LlamaCppEngine
    except ImportError as exc:  # a llama-cpp-python that is missing or does not import here
        raise GGUFParityError(f"llama.cpp (llama-cpp-python) cannot be imported here ({one_line(exc)}); reinstall "
                              "it (pip install llama-cpp-python==0.3.36), validate against a recording made "
                              "where it runs (--record-reference DIR there, --against recording:DIR here), or "
                              "against our NumPy engine's emulation of it (--against numpy)") from None

    try:
        return LlamaCppEngine(str(model_path), n_ctx=options.n_ctx, n_threads=options.threads)
    except GGUFParityError:
        raise
    except Exception as exc:  # noqa: BLE001 - llama.cpp's own failures become one user-facing line
        raise GGUFParityError(f"{model_path}: llama.cpp cannot load this model ({one_line(exc)})") from None


def open_ours(options: ValidateOptions, model_path: Path) -> Engine:
    return _open_ours(model_path, options.backend, options, options.device)


def _open_ours(model_path: Path, backend: str, options: ValidateOptions, device: str | None) -> Engine:
    from inference_engine.engine import OurEngine

    return OurEngine(str(model_path), backend=backend, numerics=options.numerics, n_ctx=options.n_ctx,
                     n_threads=options.threads, kv_type=options.kv_type, device=device)


# --- the checks -------------------------------------------------------------------------------------------------


def validate(options: ValidateOptions, ours_opener: Callable | None = None,
             reference_opener: Callable | None = None) -> dict[str, Any]:
    """Resolve the model, open both engines, run every check; return the self-describing result dict.

    ``ours_opener`` / ``reference_opener`` are ``(options, model_path) -> Engine``; tests pass their own (a
    fault-injected engine); by default this module's :func:`open_ours` / :func:`open_reference`.
    User mistakes raise :class:`GGUFParityError`, before any work is done where they can be seen early.
    """
    from inference_engine.gguf.file import open_gguf
    from inference_engine.store.named_models import resolve_model

    options.check()
    options.n_ctx = options.context_needed()
    corpus_texts, corpus_source = _load_corpus(options.corpus)
    model_path = resolve_model(options.model)
    gguf = open_gguf(model_path)
    reference = (reference_opener or open_reference)(options, model_path)
    writer = None
    try:
        if options.record_reference is not None:
            from validation.recording import RecordingEngine, RecordingWriter

            writer = RecordingWriter(Path(options.record_reference))
            reference = RecordingEngine(reference, writer)
        ours = (ours_opener or open_ours)(options, model_path)
        try:
            result = validate_engines(ours, reference, gguf, options, corpus_texts, corpus_source)
        finally:
            _close(ours)
        if writer is not None:
            result["recording"] = _commit_recording(writer, result, options)
    except BaseException:
        if writer is not None:
            writer.discard()
        raise
    finally:
        _close(reference)
    return result


PROVENANCE_KEYS = ("date", "git", "git_sha", "versions", "machine")  # where the result dict keeps its provenance


def _commit_recording(writer, result: dict[str, Any], options: ValidateOptions) -> dict[str, Any]:
    """--record-reference: the recording moved into place, or (a run Ctrl-C stopped) discarded, and why."""
    from validation.recording import recorded_options

    if result.get("interrupted") or result.get("recording"):
        writer.discard()
        why = (result.get("recording") or {}).get("why") or \
            f"interrupted (Ctrl-C) during {result['interrupted']}: a recording must hold every call"
        return {"mode": "recorded", "written": False, "path": str(writer.final), "why": why}
    manifest = {"model": {"name": options.model, "sha256": result["model"]["sha256"]},
                "options": recorded_options(options, result["precision"]["class"]),
                "provenance": {k: result[k] for k in PROVENANCE_KEYS if k in result}, "against": options.against}
    return {"mode": "recorded", "written": True, **writer.commit(manifest)}


def supports_teacher_forcing(engine: Engine) -> bool:
    """Whether ``engine.capture`` takes ``force=`` (:func:`inference_engine.protocol.capture_takes_force`)."""
    return capture_takes_force(engine)


def supports_capture(engine: Engine) -> bool:
    """Whether the engine offers ``capture`` at all (a plugin may not: then only its logits are compared)."""
    return callable(getattr(engine, "capture", None))


def capture(engine: Engine, ids: list[int]) -> dict[str, np.ndarray]:
    """``engine.capture(ids)``, or for an engine without ``capture`` its logits at every position
    (``result_output``), one prefill of the first token then one decode per token."""
    if supports_capture(engine):
        return engine.capture(ids)
    return {"result_output": decode_logits(engine, ids)}


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
    from validation.recording import RecordedEngine, RecordingEngine, check_replay, record_smoke_paths

    precision, source = resolve_precision(ours, options)
    if isinstance(reference, RecordedEngine):  # a recording that cannot answer this run stops before it starts
        check_replay(reference.recording, options, precision, gguf.sha256)
    if isinstance(reference, RecordingEngine):
        reference.whole_captures(thresholds_for(precision).noise_floor)
    variants = _ReferenceVariants(reference, thresholds_for(precision))
    try:
        result = _validate_engines(ours, reference, gguf, options, corpus_texts, corpus_source, variants,
                                   {"class": precision, "source": source})
        if isinstance(reference, RecordingEngine) and not result["interrupted"]:
            try:
                record_smoke_paths(reference, variants.get()[0], result["prompt"]["ids"], options.smoke_tokens)
            except KeyboardInterrupt:  # the checks are done and kept; the recording is not whole
                result["recording"] = {"mode": "recorded", "written": False, "why": "interrupted (Ctrl-C) while "
                                       "walking the reference's greedy path for the smoke: a recording must hold "
                                       "every call"}
        if isinstance(reference, RecordedEngine):
            result["recording"] = {"mode": "replayed", **reference.recording.describe()}
        return result
    finally:
        variants.close()


def is_ours(options: ValidateOptions) -> bool:
    """Whether the engine under test is our own (``ours:<backend>``), whose ``--numerics`` is its precision."""
    return options.engine is None or options.engine.startswith("ours:")


def resolve_precision(ours: Engine, options: ValidateOptions) -> tuple[str, str]:
    """The precision class the engine is judged in, and where that came from: ``--precision``; else what the engine
    declares (``precision`` attribute or ``model_info["precision"]``); else for our engine its ``--numerics``; else
    :data:`DEFAULT_PLUGIN_PRECISION` (an engine that says nothing is not assumed to emulate llama.cpp's rounding)."""
    if options.precision is not None:
        return THRESHOLD_TABLE.validate(options.precision), "--precision"
    declared = getattr(ours, "precision", None)
    if declared is None:
        try:
            declared = dict(ours.model_info).get("precision")
        except Exception:  # noqa: BLE001 - provenance only; an engine whose model_info fails declares nothing
            declared = None
    if declared is not None:
        key = str(declared).lower()
        if key not in THRESHOLDS:
            raise GGUFParityError(f"engine {_name(ours)!r} declares precision {declared!r}; supported: "
                                  f"{', '.join(THRESHOLDS)}")
        return key, "declared by the engine"
    if is_ours(options):
        return options.numerics, "--numerics (our engine)"
    return DEFAULT_PLUGIN_PRECISION, (f"assumed: the engine declares none (--precision {' | '.join(THRESHOLDS)} "
                                      "to choose)")


class _ReferenceVariants:
    """The reference's variants for one precision class (:mod:`validation.precision`), opened once on first use
    and closed at the end."""

    def __init__(self, reference: Engine, thresholds: Thresholds):
        self.reference = reference
        self.thresholds = thresholds
        self._opened: tuple[dict[str, Engine], dict[str, str]] | None = None

    def get(self) -> tuple[dict[str, Engine], dict[str, str]]:
        """``({label: engine}, {label: why it could not be opened})``."""
        if self._opened is None:
            self._opened = open_variants(self.reference, self.thresholds)
        return self._opened

    def close(self) -> None:
        if self._opened is not None:
            for engine in self._opened[0].values():
                _close(engine)
            self._opened = None


def _validate_engines(ours: Engine, reference: Engine, gguf, options: ValidateOptions,
                      corpus_texts: list[str] | None, corpus_source: str,
                      variants: _ReferenceVariants, precision: dict[str, str]) -> dict[str, Any]:
    thresholds = variants.thresholds
    precision["gate"] = thresholds.gate
    precision["variance"] = variance_source(reference)  # whose variance the floors are made of (report.py's words)
    caps = engine_capabilities(ours)
    prompt = options.prompt if options.prompt is not None else DEFAULT_PROMPT
    ids = list(reference.tokenize(prompt, add_bos=True))
    if not ids:
        raise GGUFParityError(f"the prompt {prompt!r} tokenizes to zero tokens; give a longer prompt")
    needed = len(ids) + options.smoke_tokens
    if needed > min(ours.n_ctx, reference.n_ctx):
        raise GGUFParityError(f"prompt ({len(ids)} tokens) plus --smoke-tokens ({options.smoke_tokens}) needs a "
                              f"context of {needed}, more than the engines' {min(ours.n_ctx, reference.n_ctx)}")
    if options.top_k is not None and "logits" in caps:
        raise GGUFParityError(TOP_K_UNUSED.format(engine=_name(ours)))
    if not caps & CHECKABLE:
        raise GGUFParityError(f"engine {_name(ours)!r} offers {', '.join(sorted(caps)) or 'nothing'}: validate needs "
                              f"at least one of {', '.join(sorted(CHECKABLE))} (see docs/PLUGGING_IN.md)")
    result = ValidationResult(
        backend=options.backend, engine=options.engine or f"ours:{options.backend}", numerics=options.numerics,
        against=options.against, model=_model_identity(options.model, gguf),
        prompt={"text": prompt, "ids": ids, "n_tokens": len(ids)}, thresholds=thresholds.to_dict(),
        precision=precision, capabilities=sorted(caps))
    checks = result.checks
    not_checked: dict[str, str] = {}
    drift = 0.0
    if caps & {"logits", "tensors"}:  # Ctrl-C in these first checks: nothing finished, so nothing to report
        drift = _tensor_and_logit_checks(result, ours, reference, gguf, options, ids, variants, caps, not_checked)
    else:
        result.mode, result.mode_reason = GENERATED, (
            f"the engine under test ({_name(ours)}) gives no logits or tensors, only what it generates: its top-k "
            "log-probabilities per generated position are compared with llama.cpp's on the same path")
        result.first_failure, result.threshold = None, None
        for check in ("tensors", "logits"):
            what = "intermediate tensors" if check == "tensors" else "logits"
            not_checked[check] = f"{_name(ours)} gives no {what}"
            checks[check] = None
        result.logits = {"passed": None, "not_checked": not_checked["logits"]}
    _short_checks(result, not_checked, corpus_source, (
        ("smoke", lambda: _generated_checks(result, ours, reference, ids, options, variants, caps, not_checked,
                                            drift)),
        ("tokenizer", lambda: _tokenizer_check(result, ours, reference, corpus_texts, corpus_source, caps,
                                               not_checked))))
    result.not_checked = not_checked

    _long_checks(result, ours, reference, options, thresholds, variants, caps, not_checked)
    if not options.decode_steps and options.corpus_kld is None:
        not_checked["depth"] = _depth_not_checked(len(ids), options, caps)

    ran = [name for name, v in checks.items() if v is not None]
    if not ran:
        raise GGUFParityError(f"no check could run on {_name(ours)}: " + "; ".join(
            f"{k}: {v}" for k, v in not_checked.items()))
    # A check that did not run (None) does not fail the run; every check that ran must pass, and a run Ctrl-C
    # stopped did not pass (what it found is kept: a failure among its finished parts is a failure).
    result.passed = all(checks[name] for name in ran) and result.interrupted is None
    result.checks_run = ran
    result.engines = {"ours": _info(ours), "reference": _info(reference)}
    result.engine_notes = list(result.engines["ours"].get("notes") or [])
    result.provenance = provenance(options.backend)
    build = {k: v for k, v in result.engines["reference"].items() if k in REFERENCE_BUILD_KEYS}
    if build:
        result.provenance["versions"]["reference_build"] = build
    return result.to_dict()  # the typed, versioned record, as JSON


def _tensor_and_logit_checks(result: ValidationResult, ours: Engine, reference: Engine, gguf,
                             options: ValidateOptions, ids: list[int], variants: _ReferenceVariants,
                             caps: frozenset[str], not_checked: dict[str, str]) -> float:
    """Checks 1-3 of the module doc for an engine with logits or tensors; returns the drift margin for the smoke
    test (GAP_SHIFT_FACTOR x the largest margin of the reference's own flips)."""
    thresholds = variants.thresholds
    checks = result.checks
    mode, mode_reason = gated_mode(ours, options)
    captured_ref = reference.capture(ids)
    bands: dict[str, float] | None = None
    variant_logits: dict[str, np.ndarray] = {}
    if thresholds.noise_floor:
        engines, errors = variants.get()
        names = None if "tensors" in caps else ["result_output"]
        captured_variants = capture_variants(engines, ids, names, errors)
        variant_logits = {k: v["result_output"] for k, v in captured_variants.items() if "result_output" in v}
        band_table = tensor_bands({n: captured_ref[n] for n in (names or captured_ref) if n in captured_ref},
                                  captured_variants, thresholds)
        result.thresholds["bands"] = band_table
        bands = {name: b["band"] for name, b in band_table.items()}
        del captured_variants
    captured_free = capture(ours, ids)
    free_diff = diff_captures(captured_free, captured_ref, thresholds.tensor_nmse_max, bands)
    free_logits = _logits_check(captured_free, captured_ref, thresholds)
    if options.logit_lens:
        from validation.logit_lens import LogitLens, logit_lens

        result.logit_lens = logit_lens(LogitLens(gguf), captured_free, captured_ref)
    ours_free_logits = captured_free.get("result_output")
    del captured_free

    teacher = tf_diff = tf_logits = None
    if supports_teacher_forcing(ours):
        captured_forced = ours.capture(ids, force=captured_ref)
        tf_diff = diff_captures(captured_forced, captured_ref, thresholds.tensor_nmse_max, bands)
        tf_logits = _logits_check(captured_forced, captured_ref, thresholds)
        del captured_forced
        teacher = {"gated": mode == TEACHER_FORCED, "explanation": TEACHER_FORCED_EXPLANATION, **tf_diff.summary(),
                   "logits": tf_logits}

    free = {"gated": mode == FREE_RUNNING, "explanation": FREE_RUNNING_EXPLANATION, **free_diff.summary()}
    if ours_free_logits is None and getattr(ours, "partial_capture", False):
        free.update({"reference_self_kld": None, "logits": {"passed": None, "not_checked": "no result_output"}})
    else:
        free.update(_free_running_logits(reference, ids, captured_ref.get("result_output"), ours_free_logits,
                                         thresholds, variants, variant_logits))
    del captured_ref
    # Strict classes: the noise-floor verdict is a check of its own only beside a teacher-forced gate (when free
    # running is the gated mode its logits face the strict thresholds). Noise-floor classes: it is the logits gate.
    free["logits"]["gated"] = bool(free["logits"].get("gated")) and (mode == TEACHER_FORCED
                                                                      or thresholds.noise_floor)
    gated_diff, gated_logits = (tf_diff, tf_logits) if mode == TEACHER_FORCED else (free_diff, free_logits)
    if thresholds.noise_floor:
        gated_logits = free["logits"]
    if ours_free_logits is None and getattr(ours, "partial_capture", False):
        not_checked["logits"] = f"{_name(ours)} provided no result_output"
        gated_logits = {"passed": None, "not_checked": not_checked["logits"]}
    gated = gated_diff.to_dict()
    result.mode, result.mode_reason = mode, mode_reason
    result.threshold, result.first_failure = gated["threshold"], gated["first_failure"]
    result.tensors, result.unmatched, result.layers = gated["tensors"], gated["unmatched"], gated["layers"]
    result.logits, result.teacher_forced, result.free_running = gated_logits, teacher, free
    # without capture() only result_output exists on our side: the tensor check did not run
    checks["tensors"] = gated_diff.passed if "tensors" in caps else None
    if "tensors" not in caps:
        not_checked["tensors"] = (f"{_name(ours)} gives no intermediate tensors (no capture()): a bug whose effect "
                                  "at the output is within llama.cpp's own variance cannot be seen "
                                  "(validation.precision)")
    checks["logits"] = gated_logits["passed"]
    if mode == TEACHER_FORCED and not thresholds.noise_floor:
        # None in f32 numerics (reported, not gated), like the f32 logits themselves
        checks["free_running"] = free["logits"].get("passed")
    noise = free.get("reference_self_kld") or {}
    return GAP_SHIFT_FACTOR * float(noise.get("flip_margin_max") or 0.0)


def _generated_checks(result: ValidationResult, ours: Engine, reference: Engine, ids: list[int],
                      options: ValidateOptions, variants: _ReferenceVariants, caps: frozenset[str],
                      not_checked: dict[str, str], drift: float) -> None:
    """Greedy smoke (each engine's own decode loop) and, for an engine that only generates, top-k fidelity."""
    checks = result.checks
    if options.smoke_tokens <= 0:
        return
    if "logits" in caps:
        try:
            result.smoke = greedy_smoke(ours, reference, ids, options.smoke_tokens, variants.get()[0],
                                        drift_margin=drift).to_dict()
        except EngineCapabilityError as gap:
            not_checked["smoke"] = str(gap)
            result.smoke = {"skipped": str(gap), "passed": None}
        checks["smoke"] = result.smoke["passed"]
        return
    if not caps & {"top_logprobs", "text"}:
        return
    from validation.top_k import top_k_fidelity

    k = (options.top_k or DEFAULT_TOP_K) if "top_logprobs" in caps else 1
    try:
        top = top_k_fidelity(ours, reference, ids, options.smoke_tokens, k, variants.get()[0], drift_margin=drift)
    except EngineCapabilityError as gap:  # a recorded reference without llama.cpp's logits on this engine's path
        for name in ("top_k", "smoke"):
            not_checked[name] = str(gap)
            checks[name] = None
        result.smoke = {"skipped": str(gap), "passed": None}
        return
    result.top_k = top
    if "top_logprobs" in caps:
        checks["top_k"] = top["passed"]
    else:
        not_checked["top_k"] = f"{_name(ours)} gives text only, no log-probabilities"
    # the greedy smoke of a generating engine: its own tokens, each judged on llama.cpp's identical prefix
    disagreements = top["top1_disagreements"]
    first = disagreements[0] if disagreements else None
    result.smoke = {"tokens": options.smoke_tokens, "matched": first["position"] if first else top["generated"],
                    "passed": top["checks"]["top1"], "method": "the engine's greedy tokens, each against "
                    "llama.cpp's argmax on the same prefix (validation.top_k)",
                    "ours_ids": [p["token"] for p in top["positions"]],
                    "first_divergence": None if first is None else _smoke_divergence(first, reference)}
    checks["smoke"] = result.smoke["passed"]


def _smoke_divergence(position: dict[str, Any], reference: Engine) -> dict[str, Any]:
    """A top-k disagreement in the greedy smoke's terms (validation.smoke's divergence record)."""
    excused = position.get("excused_by") or []
    margin = position.get("margin")
    return {"step": position["position"], "reference_token": position["reference_top1"],
            "ours_token": position["server_top1"],
            "reference_text": token_text(reference, position["reference_top1"]),
            "ours_text": token_text(reference, position["server_top1"]),
            "margin": float("inf") if margin is None else margin, "near_tie": bool(position.get("near_tie")),
            "reference_variants_agreeing": position.get("variants_agreeing") or [],
            "within_reference_gap_shift": any(e.startswith("within") for e in excused),
            "within_reference_drift": any(e.startswith("a flip like") for e in excused), "excused_by": excused}


# Why a check after the one Ctrl-C stopped did not run (its name filled in).
_INTERRUPTED_BEFORE = "not run: interrupted (Ctrl-C) during {}"


def _short_checks(result: ValidationResult, not_checked: dict[str, str], corpus_source: str, stages) -> None:
    """The greedy smoke, then the tokenizer (``stages``: (name, run) pairs): Ctrl-C in one keeps the checks that
    finished before it (the tensors and logits at least), names it in ``result.interrupted`` and runs nothing after
    it. Where nothing had finished yet (an engine that only generates, stopped in its first check), the interrupt
    goes on up: there is nothing to report."""
    for name, run_stage in stages:
        if result.interrupted:
            _not_run(result, name, not_checked, _INTERRUPTED_BEFORE.format(result.interrupted), corpus_source)
            continue
        try:
            run_stage()
        except KeyboardInterrupt:
            if not any(v is not None for k, v in result.checks.items() if k != name):
                raise
            result.interrupted = name
            _not_run(result, name, not_checked, "interrupted (Ctrl-C) before it finished", corpus_source)


def _not_run(result: ValidationResult, name: str, not_checked: dict[str, str], why: str,
             corpus_source: str = "builtin") -> None:
    """A check that Ctrl-C stopped or kept from starting (smoke, tokenizer, decode_steps, corpus_kld): recorded as
    not checked, with why."""
    not_checked[name] = why
    result.checks[name] = None
    if name == "tokenizer":
        result.tokenizer = _tokenizer_skipped(corpus_source, why)
        return
    setattr(result, name, {"skipped": why, "passed": None})
    if name == "smoke" and "top_k" in result.checks:
        result.checks["top_k"] = None


def _tokenizer_check(result: ValidationResult, ours: Engine, reference: Engine, corpus_texts, corpus_source: str,
                     caps: frozenset[str], not_checked: dict[str, str]) -> None:
    skipped = None
    if corpus_texts is None:
        skipped = "no built-in corpus available"
    elif "tokenize" not in caps:
        skipped = not_checked["tokenizer"] = f"{_name(ours)} has no tokenizer of its own to compare"
    else:
        try:
            result.tokenizer = tokenizer_parity(ours, reference, corpus_texts, corpus_source).to_dict()
        except EngineCapabilityError as gap:
            skipped = not_checked["tokenizer"] = str(gap)
    if skipped is not None:
        result.tokenizer = _tokenizer_skipped(corpus_source if corpus_texts is not None else "builtin", skipped)
    result.checks["tokenizer"] = result.tokenizer["passed"]


def _tokenizer_skipped(source: str, why: str) -> dict[str, Any]:
    return {"source": source, "skipped": why, "passed": None, "cases": 0, "mismatches": 0, "first_mismatch": None,
            "special_tokens": None}


def _free_running_logits(reference: Engine, ids: list[int], ref_logits, ours_logits,
                         thresholds, variants: _ReferenceVariants,
                         variant_logits: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """The reference's noise floor (``reference_self_kld``) and our free-running logits judged against it."""
    if ref_logits is None or ours_logits is None:
        missing = " and ".join(side for side, x in (("ours", ours_logits), ("reference", ref_logits)) if x is None)
        return {"reference_self_kld": None,
                "logits": {"passed": False, "error": f"result_output missing from the {missing} capture"}}
    engines, errors = variants.get()
    noise = measure_self_noise(reference, ids, ref_logits, engines, variant_logits)
    noise.errors.update(errors)
    return {"reference_self_kld": noise.to_dict(),
            "logits": free_running_logits(ours_logits, ref_logits, noise, thresholds)}


def _long_checks(result: ValidationResult, ours: Engine, reference: Engine, options: ValidateOptions, thresholds,
                 variants: _ReferenceVariants, caps: frozenset[str], not_checked: dict[str, str]) -> None:
    """--decode-steps, then --corpus-kld: minutes each, so Ctrl-C in either keeps what finished (their depths,
    their windows), names the check in ``result.interrupted`` and runs nothing after it; after a short check Ctrl-C
    stopped, neither starts."""
    checks = result.checks
    if result.interrupted:  # Ctrl-C in a short check: the long ones are not started
        for name, asked in (("decode_steps", options.decode_steps), ("corpus_kld", options.corpus_kld is not None)):
            if asked:
                _not_run(result, name, not_checked, _INTERRUPTED_BEFORE.format(result.interrupted))
        return
    if options.decode_steps:
        try:
            result.decode_steps = _decode_steps(ours, reference, options, thresholds, variants)
        except KeyboardInterrupt:  # before its first depth began (its loop keeps finished depths itself)
            result.decode_steps = {"passed": None, "interrupted": True, "depths": [],
                                   "depths_planned": list(options.depth_plan().depths)}
        except EngineCapabilityError as gap:  # a recorded reference that lacks a tensor this engine taps
            result.decode_steps = {"passed": None, "skipped": str(gap)}
        checks["decode_steps"] = result.decode_steps["passed"]
        if result.decode_steps.get("skipped"):
            not_checked["decode_steps"] = result.decode_steps["skipped"]
        if result.decode_steps.get("interrupted"):
            result.interrupted = "decode_steps"
    if options.corpus_kld is not None:
        if result.interrupted:
            _not_run(result, "corpus_kld", not_checked, _INTERRUPTED_BEFORE.format(result.interrupted))
        elif "logits" in caps:
            try:
                result.corpus_kld = _corpus_kld(ours, reference, options, thresholds, variants)
            except KeyboardInterrupt:  # before its first window began
                result.corpus_kld = {"passed": None, "interrupted": True,
                                     "skipped": "interrupted (Ctrl-C) before its first window finished"}
            except EngineCapabilityError as gap:
                result.corpus_kld = {"passed": None, "skipped": str(gap)}
                not_checked["corpus_kld"] = str(gap)
            checks["corpus_kld"] = result.corpus_kld["passed"]
            if result.corpus_kld.get("interrupted"):
                result.interrupted = "corpus_kld"
        else:
            not_checked["corpus_kld"] = f"{_name(ours)} gives no logits: a full-vocabulary KLD needs every logit"
            result.corpus_kld = {"passed": None, "skipped": not_checked["corpus_kld"]}
            checks["corpus_kld"] = None


def _depth_not_checked(n_prompt: int, options: ValidateOptions, caps: frozenset[str]) -> str:
    """What a run without --decode-steps or --corpus-kld leaves out: every position past the prompt and the smoke's
    tokens. Why say it: a RoPE base 1% off in SmolLM2-135M stays within llama.cpp's own variance on the 31-token
    prompt (logits KLD mean 4.8e-3, limit 1.5e-2) and fails the decode steps' ``Qcur-0`` from depth 64 (README)."""
    ways = []
    if "tensors" in caps:
        ways.append("--decode-steps N --depth D compares every tensor at depth D")
    if "logits" in caps:
        ways.append(f"--corpus-kld compares the logits over windows of {options.ctx} tokens")
    deepest = n_prompt + options.smoke_tokens
    return (f"positions past {deepest} ({n_prompt} prompt tokens + up to {options.smoke_tokens} generated); errors "
            "that grow with position, as in RoPE, the K/V cache or sliding windows, show deeper"
            + (f": {'; '.join(ways)}" if ways else ""))


def _decode_steps(ours: Engine, reference: Engine, options: ValidateOptions, thresholds,
                  variants: _ReferenceVariants) -> dict[str, Any]:
    """Teacher-forced decode steps at each depth on the built-in long text (:mod:`validation.decode_steps`)."""
    from validation.corpus_text import BUILTIN_NAME, builtin_text
    from validation.decode_steps import supports_steps, validate_depths

    why = supports_steps(ours, reference)
    if why:
        return {"passed": None, "skipped": why}
    ids = list(reference.tokenize(builtin_text(), add_bos=True))
    variants = variants.get()[0] if thresholds.noise_floor else None
    out = validate_depths(ours, reference, ids, options.depth_plan(), thresholds, variants=variants,
                          progress=options.progress)
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
    return corpus_kld(ours, reference, ids, options.ctx, bos, thresholds, variants.get()[0], source,
                      progress=options.progress)


def _logits_check(ours: dict, reference: dict, thresholds) -> dict[str, Any]:
    missing = [side for side, cap in (("ours", ours), ("reference", reference)) if "result_output" not in cap]
    if missing:
        return {"passed": False, "error": f"result_output missing from the {' and '.join(missing)} capture"}
    a, b = np.asarray(ours["result_output"]), np.asarray(reference["result_output"])
    if a.shape != b.shape:
        return {"passed": False, "error": f"result_output shape mismatch: ours {a.shape} vs reference {b.shape}"}
    summary = logit_metrics(a, b)
    # noise-floor classes: reported; their logits gate is the free-running comparison against llama.cpp's variants
    summary["passed"] = None if thresholds.noise_floor else logits_pass(summary, thresholds)
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
        return {"error": one_line(exc)}


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
