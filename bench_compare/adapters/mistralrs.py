"""mistral.rs (the ``mistralrs`` Python package: a Rust engine) as an engine: ``--engine mistralrs:``.

``pip install 'gguf-parity[mistralrs]'`` (``mistralrs==0.9.5``, a CPU wheel). The engine loads the very GGUF under
test from its folder (``Runner(which=Which.GGUF(quantized_model_id=DIR, quantized_filename=FILE))``) and answers
chat requests. What its Python API gives, and so what this engine offers (:data:`CAPABILITIES`):

* greedy generation with the top-k log-probabilities of every generated position, each entry with its token id;
* the generated text (its message content, which drops the first token's leading space: ' Paris' is 'Paris');
* its own timings per request (``Usage.total_prompt_time_sec``: the prompt step, which also samples the first token;
  ``total_completion_time_sec``: every decode step after it), measured by mistral.rs in whole milliseconds;
* NOT logits, hidden states or any intermediate tensor: ``prefill`` / ``decode`` / ``capture`` raise
  :class:`EngineCapabilityError`.

Prompts go in as text, not ids. Log-probabilities come back only from chat requests, and a chat request takes
messages (text) that a chat template renders into the prompt. So :meth:`MistralRsEngine.generate` turns the ids
into text with the GGUF's own tokenizer (whose ids equal llama.cpp's), and the Runner is given a pass-through
template (:data:`PASS_THROUGH_TEMPLATE`: the message's content, nothing around it) so that the rendered prompt is
that text (with the GGUF's own chat template, a system prompt and role markers, SmolLM2's 5-token prompt became 35).
A BOS token at the head of the ids is written into the text as the BOS token's own text, which mistral.rs parses as
the special token (Gemma's ``<bos>`` became id 2). Two checks keep the ids honest: the text must tokenize back to the same ids under the GGUF's
tokenizer (:func:`~bench_compare.adapters.openai_http.check_text_round_trip`), and mistral.rs's own tokenizer
(``Runner.tokenize_text``) must give those ids too; after each request ``usage.prompt_tokens`` must equal their
number. Any mismatch is one line naming it: the engine would otherwise be measured on a different prompt.

Greedy means temperature 0 (mistral.rs's argmax path) with every other sampler and penalty sent neutral
(:data:`GREEDY_PARAMS`) and ``ignore_eos`` on, so a request generates exactly the asked number of tokens, as
llama.cpp's greedy loop here does. mistral.rs reports the chosen token as text, not as an id, so every request asks
for at least one top log-probability: under argmax the chosen token is the most probable entry, and its id is the
entry whose log-probability (and text) equals the chosen token's.

mistral.rs logs from Rust to the process's stdout and stderr file descriptors, which Python's ``sys.stdout``
redirection does not reach. Unless ``--engine-opt verbose=1`` (or ``GGUF_PARITY_MISTRALRS_VERBOSE=1``), file
descriptors 1 and 2 are pointed at a temporary file around the Runner's construction and around every request
(:func:`quiet_fds`), and what was captured is read back only to quote mistral.rs's own error.

Threads: mistral.rs 0.9.5's Runner takes no thread count. Its CPU kernels (candle) and its rayon pool read
``CANDLE_NUM_THREADS`` and ``RAYON_NUM_THREADS`` (each alone limited a run to one busy thread here, measured by CPU
time over wall time), and size themselves once per process; ``n_threads`` sets both before the first Runner of the
process, and ``model_info`` / ``settings`` record what is in effect (:func:`_threads_in_effect`).

Measured with mistralrs 0.9.5 here (docs/PLUGGING_IN.md): smollm2-135m (llama) and qwen2.5-coder-1.5b (qwen2), both
GPT-2 BPE vocabularies, run. GGUFs with a SentencePiece vocabulary (``tokenizer.ggml.model = llama``) load, but
mistral.rs reads that vocabulary as a Unigram model and tokenizes text differently: gemma3-270m's 'The capital of
France is' becomes 11 pieces ('T', 'he', 'c', ...) where the GGUF's tokenizer has 6, so the prompt check refuses
them. ``qwen2moe`` is refused at load ("Unknown normal-model GGUF architecture").
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterable, Iterator

from inference_engine.errors import GGUFParityError, one_line
from inference_engine.protocol import EngineCapabilityError, Generation, GenerationStep

PACKAGE = "mistralrs"
PINNED_VERSION = "0.9.5"
INSTALL_HINT = f"pip install 'gguf-parity[mistralrs]' ({PACKAGE}=={PINNED_VERSION})"
CAPABILITIES = frozenset({"top_logprobs", "text", "tokenize", "timings"})
NO_LOGITS = ("mistral.rs's Python API gives generated text and top-k log-probabilities, not logits or tensors "
             "(use generate(ids, n_tokens, top_k))")

# The chat template that renders a single user message as its content and nothing else: the prompt is the text of
# the ids (mistral.rs 0.9.5 reads a template only from a file whose name ends in .jinja).
PASS_THROUGH_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"

# Greedy with every sampler and penalty neutral. temperature 0 selects mistral.rs's argmax sampler; top_k is left
# unset (mistral.rs has no neutral number for it: unset is "no top-k filter"); a GGUF brings no generation_config
# defaults that could fill in the rest, and the rest is sent explicitly anyway.
GREEDY_PARAMS: dict[str, Any] = {
    "temperature": 0.0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}
# The request's ``model`` field: a Runner serves one model, addressed as "default".
MODEL_ID = "default"

VERBOSE_ENV = "GGUF_PARITY_MISTRALRS_VERBOSE"
# What sizes mistral.rs's CPU thread pools (candle's kernels and rayon), read once per process.
THREAD_ENV_VARS = ("CANDLE_NUM_THREADS", "RAYON_NUM_THREADS")
# mistral.rs keeps finished sequences' KV caches to serve later prompts that share a prefix (16 by default). A
# benchmark repeats the same prompt, and llama-bench times every prompt on a fresh cache, so it is off unless asked
# for (--engine-opt prefix_cache_n=N).
DEFAULT_PREFIX_CACHE_N = 0
# mistral.rs measures its prompt and completion steps in whole milliseconds (Duration::as_millis).
TIMING_RESOLUTION_S = 0.001
# Prompts whose text and ids were checked (detokenize, the GGUF tokenizer, mistral.rs's tokenizer) are remembered
# by their ids: a benchmark sends the same few prompts again and again, and the checks are not what it times.
CHECKED_PROMPTS_KEPT = 16
# Engine options this factory takes (``--engine-opt KEY=VALUE``); anything else is a user mistake.
OPTIONS = {
    "verbose": "1: let mistral.rs's own log lines through (also: GGUF_PARITY_MISTRALRS_VERBOSE=1)",
    "max_seqs": "sequences mistral.rs may run at once (its default 32; the harness sends one request at a time)",
    "prefix_cache_n": f"finished sequences kept for prefix reuse (default {DEFAULT_PREFIX_CACHE_N} here: off)",
}
# What every factory is handed by the harness (bench_compare.engines' factory signature), used or not.
HARNESS_OPTIONS = frozenset({"n_threads", "n_ctx", "numerics", "n_batch", "model", "kv_type"})


def unavailable() -> str | None:
    """Why ``--engine mistralrs:`` cannot run here (``engines list``), or None."""
    if importlib.util.find_spec(PACKAGE) is None:
        return f"needs mistral.rs's Python package: {INSTALL_HINT}"
    return None


def _import_mistralrs():
    try:
        import mistralrs
    except ImportError as exc:
        raise GGUFParityError(f"--engine mistralrs: needs the mistralrs package ({exc}): {INSTALL_HINT}") from None
    return mistralrs


def mistralrs_version() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def _verbose(option: Any) -> bool:
    value = option if option is not None else os.environ.get(VERBOSE_ENV, "0")
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise GGUFParityError(f"--engine-opt verbose must be 0 or 1, got '{value}'")


def _int_option(options: dict, key: str, default: int | None, minimum: int) -> int | None:
    value = options.get(key)
    if value is None:
        return default
    from bench_compare.cmd_bench import parse_positive_int  # only when given: a cold start need not import the CLI

    return parse_positive_int(value, f"--engine-opt {key}", minimum)


# --- mistral.rs's output --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_fds(log, enabled: bool = True) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``log`` (a binary file) for the block, then back; Python's own buffers are
    flushed on both sides so nothing of ours lands in the log or is reordered."""
    if not enabled:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


# Set by the first engine of this process: what sizes mistral.rs's thread pools from then on.
_PROCESS_THREADS: dict[str, Any] = {}
# What the last engine loaded in this process read from mistral.rs's load log (dtype, K/V cache type, tokenizer).
_LAST_LOG_FACTS: dict[str, str] = {}


def _set_threads(n_threads: int | None) -> None:
    """Before the process's first Runner: ``n_threads`` into :data:`THREAD_ENV_VARS` (None: the environment as it
    is, mistral.rs's default being every CPU)."""
    if _PROCESS_THREADS:
        return
    if n_threads is not None:
        for var in THREAD_ENV_VARS:
            os.environ[var] = str(int(n_threads))
    _PROCESS_THREADS.update({var: os.environ.get(var) for var in THREAD_ENV_VARS})


def _threads_in_effect() -> dict[str, Any]:
    """The thread count mistral.rs runs with in this process, and where it comes from."""
    values = {v for v in _PROCESS_THREADS.values() if v}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not values:
        return {"threads": cpus, "threads_source": "mistral.rs's default (every usable CPU); the Runner takes no "
                                                   "thread count"}
    shown = ", ".join(f"{var}={_PROCESS_THREADS.get(var)}" for var in THREAD_ENV_VARS if _PROCESS_THREADS.get(var))
    threads = min(int(v) for v in values) if all(v.isdigit() for v in values) else None
    return {"threads": threads, "threads_source": f"{shown} (set before the process's first Runner; the Runner "
                                                  "takes no thread count, its pools are sized once per process)"}


# --- the engine -----------------------------------------------------------------------------------------------------
class MistralRsEngine:
    """mistral.rs on a GGUF: greedy generation with top-k log-probabilities, text and timings (no logits)."""

    capabilities = CAPABILITIES
    name = "mistralrs"

    def __init__(self, model_path: str | os.PathLike, *, n_threads: int | None = None, max_seqs: int | None = None,
                 prefix_cache_n: int = DEFAULT_PREFIX_CACHE_N, verbose: bool = False):
        mistralrs = _import_mistralrs()
        from inference_engine.gguf.file import check_reference_file, open_gguf
        from inference_engine.tokenizer import GGUFTokenizer

        self._runner = None
        self._max_seq_len: int | None = None
        self.path = Path(model_path)
        check_reference_file(self.path)  # what every engine of the harness refuses before it reads a file
        self._gguf = open_gguf(self.path)
        self.architecture = self._gguf.raw_architecture
        self.tokenizer = GGUFTokenizer.from_gguf(self._gguf)
        self.verbose = bool(verbose)
        self.max_seqs = max_seqs
        self.prefix_cache_n = int(prefix_cache_n)
        self.requested_threads = n_threads
        self._checked: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self.last_usage: dict[str, Any] = {}  # the last request's token counts, as mistral.rs reported them
        self._log = tempfile.TemporaryFile(prefix="gguf-parity-mistralrs-")
        _set_threads(n_threads)
        runner_kwargs: dict[str, Any] = {"prefix_cache_n": self.prefix_cache_n}
        if max_seqs is not None:
            runner_kwargs["max_seqs"] = int(max_seqs)
        t0 = time.perf_counter()
        # the template file is read while the Runner is built, then removed
        with tempfile.TemporaryDirectory(prefix="gguf-parity-mistralrs-") as folder:
            template = Path(folder) / "passthrough.jinja"
            template.write_text(PASS_THROUGH_TEMPLATE)
            try:
                with self._mistralrs_call():
                    self._runner = mistralrs.Runner(
                        which=mistralrs.Which.GGUF(quantized_model_id=str(self.path.parent),
                                                   quantized_filename=self.path.name),
                        jinja_explicit=str(template), **runner_kwargs)
                    self._max_seq_len = self._runner.max_sequence_length()
            except GGUFParityError as exc:
                self.close()
                raise GGUFParityError(f"mistral.rs {mistralrs_version()} cannot load {self.path.name} (architecture "
                                      f"'{self.architecture}'): {exc}") from None
            except BaseException:
                self.close()
                raise
        self.load_timings = {"runner_s": time.perf_counter() - t0}
        self._log_facts = self._read_log_facts()
        _LAST_LOG_FACTS.update(self._log_facts)

    # --- calls into Rust --------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _mistralrs_call(self) -> Iterator[None]:
        """Around every call into mistral.rs: its output kept out of ours (unless verbose) and its failures (Python
        exceptions and Rust panics, which pyo3 raises as ``PanicException``, a BaseException) as one line quoting
        mistral.rs's own message."""
        self._log.seek(0)
        self._log.truncate()
        try:
            with quiet_fds(self._log, enabled=not self.verbose):
                yield
        except (KeyboardInterrupt, SystemExit, GeneratorExit, GGUFParityError):
            raise
        except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException derives from BaseException
            message = one_line(str(exc)) or self._last_log_line() or type(exc).__name__
            raise GGUFParityError(message) from None

    def _read_log(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")

    def _last_log_line(self) -> str:
        import re

        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in self._read_log().splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(("stack backtrace", "note:")) and
                 not re.match(r"^\d+:|^at ", ln)]
        return one_line(lines[-1]) if lines else ""

    def _read_log_facts(self) -> dict[str, str]:
        """What mistral.rs said about how it runs this model, from its load log (empty when verbose: not captured)."""
        import re

        text = re.sub(r"\x1b\[[0-9;]*m", "", self._read_log()) if not self.verbose else ""
        facts = {}
        for key, pattern in (("dtype", r"DType selected is (\w+)"), ("kv_cache", r"Using (\w+) KV cache"),
                             ("tokenizer", r"GGUF tokenizer model is `(\w+)`, kind: `(\w+)`")):
            m = re.search(pattern, text)
            if m:
                facts[key] = "/".join(m.groups())
        return facts

    # --- identity -----------------------------------------------------------------------------------------------
    @property
    def model_info(self) -> dict[str, Any]:
        return {
            "engine": self.name, "file": str(self.path), "sha256": self._gguf.sha256,
            "architecture": self.architecture, "backend": "mistral.rs CPU (candle)",
            "numerics": "mistral.rs's own (activations in the dtype it selects: "
                        f"{self._log_facts.get('dtype', 'not recorded')}; K/V cache "
                        f"{self._log_facts.get('kv_cache', 'not recorded')})",
            # the precision class validate judges it in: the dtype mistral.rs says it computes in
            **({"precision": self._log_facts["dtype"].lower()} if "dtype" in self._log_facts else {}),
            "n_ctx": self.n_ctx, **_threads_in_effect(), "max_seqs": self.max_seqs or "mistral.rs default (32)",
            "prefix_cache_n": self.prefix_cache_n, "mistralrs_tokenizer": self._log_facts.get("tokenizer"),
            "versions": {PACKAGE: mistralrs_version()}, "capabilities": sorted(CAPABILITIES),
            "timing_resolution_s": TIMING_RESOLUTION_S, "not_available": NO_LOGITS,
        }

    @property
    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

    @property
    def n_ctx(self) -> int:
        return int(self._max_seq_len or self._gguf.arch_value("context_length") or 0)

    # --- tokens: the GGUF's own tokenizer (ids equal llama.cpp's) -------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """mistral.rs's own tokenizer (``Runner.tokenize_text``, special tokens added as its tokenizer adds them
        when ``add_bos``): what validate's tokenizer parity holds up against llama.cpp's."""
        with self._mistralrs_call():
            return [int(t) for t in self._runner.tokenize_text(text, bool(add_bos), None)]

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def prompt_text(self, ids: list[int]) -> str:
        """The message content whose rendering mistral.rs tokenizes into exactly ``ids`` (checked; see the module
        docstring); one line when there is none."""
        key = tuple(ids)
        if key in self._checked:
            self._checked.move_to_end(key)
            return self._checked[key]
        from bench_compare.adapters.openai_http import check_text_round_trip

        tok = self.tokenizer
        lead_bos = tok.bos_id is not None and ids[0] == tok.bos_id and tok.add_bos
        content = (tok.token_text(tok.bos_id) if lead_bos else "") + check_text_round_trip(tok, list(ids), lead_bos)
        with self._mistralrs_call():
            theirs = list(self._runner.tokenize_text(content, False, None))
        if theirs != list(ids):
            at = next((i for i, (a, b) in enumerate(zip(theirs, ids)) if a != b), min(len(theirs), len(ids)))
            got = repr(tok.decode(theirs[at:at + 1], special=True)) if at < len(theirs) else "nothing"
            want = repr(tok.decode(list(ids[at:at + 1]), special=True)) if at < len(ids) else "nothing"
            raise GGUFParityError(
                f"mistral.rs tokenizes this {self.architecture} model's text differently from the GGUF's tokenizer "
                f"(llama.cpp's ids): {len(ids)} ids became {len(theirs)}, the first difference at position {at} "
                f"(mistral.rs {got}, the GGUF {want}; it reads the vocabulary as "
                f"{self._log_facts.get('tokenizer', '?')}), so it cannot be given llama.cpp's prompt")
        self._checked[key] = content
        if len(self._checked) > CHECKED_PROMPTS_KEPT:
            self._checked.popitem(last=False)
        return content

    # --- generation -------------------------------------------------------------------------------------------------
    def generate(self, ids: list[int], n_tokens: int, top_k: int = 0) -> Generation:
        """Greedy continuation of ``ids`` (as given: no BOS added), exactly ``n_tokens`` steps (end-of-generation
        tokens do not stop it), each with its ``top_k`` most probable ``(id, log-probability)`` pairs."""
        import mistralrs

        ids = [int(i) for i in ids]
        if not ids:
            raise GGUFParityError("mistralrs: generate needs at least one prompt token")
        if int(n_tokens) < 1 or int(top_k) < 0:
            raise GGUFParityError(f"mistralrs: generate needs n_tokens >= 1 and top_k >= 0 (got {n_tokens}, {top_k})")
        content = self.prompt_text(ids)
        request = mistralrs.ChatCompletionRequest(
            model=MODEL_ID, messages=[{"role": "user", "content": content}], max_tokens=int(n_tokens),
            logprobs=True, top_logprobs=max(int(top_k), 1), ignore_eos=True, **GREEDY_PARAMS)
        with self._mistralrs_call():
            response = self._runner.send_chat_completion_request(request)
        return self._generation(response, ids, int(n_tokens), int(top_k))

    def _generation(self, response, ids: list[int], n_tokens: int, top_k: int) -> Generation:
        usage = response.usage
        self.last_usage = {"prompt_tokens": int(usage.prompt_tokens),
                           "completion_tokens": int(usage.completion_tokens),
                           "finish_reason": response.choices[0].finish_reason}
        if int(usage.prompt_tokens) != len(ids):
            raise GGUFParityError(f"mistral.rs computed on {usage.prompt_tokens} prompt tokens where {len(ids)} were "
                                  "sent (its prompt is not the ids given)")
        choice = response.choices[0]
        positions = list(choice.logprobs.content or []) if choice.logprobs is not None else []
        if len(positions) != n_tokens:
            raise GGUFParityError(f"mistral.rs returned {len(positions)} generated positions where {n_tokens} were "
                                  f"asked for (finish reason '{choice.finish_reason}')")
        steps: list[GenerationStep] = []
        for index, position in enumerate(positions):
            top = [(int(t.token), float(t.logprob)) for t in position.top_logprobs]
            steps.append({"token": self._chosen_id(position, index), "top_logprobs": top[:top_k]})
        return {
            "steps": steps,
            "text": choice.message.content or "",
            "timings": {"prompt_s": round(float(usage.total_prompt_time_sec), 3),
                        "generation_s": round(float(usage.total_completion_time_sec), 3)},
        }

    @staticmethod
    def _chosen_id(position, index: int) -> int:
        """The chosen token's id: the top entry with its log-probability (argmax: the first), text breaking a tie."""
        same = [t for t in position.top_logprobs if t.logprob == position.logprob]
        if len(same) > 1:
            same = [t for t in same if t.bytes == position.token] or same
        if not same:
            raise GGUFParityError(f"mistral.rs chose token {position.token!r} at generated position {index}, which "
                                  "is not among its own top log-probabilities (not a greedy choice)")
        return int(same[0].token)

    # --- what it cannot do ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Nothing to reset: every request starts from its own prompt (prefix reuse is off unless asked for)."""

    def prefill(self, ids: list[int]):
        raise EngineCapabilityError(f"{self.name}: {NO_LOGITS}")

    def decode(self, token_id: int):
        raise EngineCapabilityError(f"{self.name}: {NO_LOGITS}")

    def capture(self, ids: list[int], names: Iterable[str] | None = None):
        raise EngineCapabilityError(f"{self.name}: {NO_LOGITS}")

    def close(self) -> None:
        self._runner = None  # mistral.rs frees the model when the Runner is collected
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None

    def __enter__(self) -> MistralRsEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the factory ----------------------------------------------------------------------------------------------------
def _check_options(options: dict) -> None:
    unknown = sorted(set(options) - set(OPTIONS) - HARNESS_OPTIONS)
    if unknown:
        raise GGUFParityError(f"--engine mistralrs: unknown --engine-opt {', '.join(unknown)}; it takes "
                              f"{', '.join(OPTIONS)}")


def open_engine(target: str, model: str, **options) -> MistralRsEngine:
    """mistral.rs (Rust) on the same GGUF: greedy text and top-k log-probabilities, no logits.

    Factory for ``--engine mistralrs:`` (``engines.ENGINE_SCHEMES['mistralrs']``); the target names another GGUF
    (a named model or a path), empty for ``--model``'s. Options: ``n_threads`` (-t), and ``--engine-opt`` ``verbose``,
    ``max_seqs``, ``prefix_cache_n``; numerics, n_ctx and n_batch are mistral.rs's own."""
    from inference_engine.store.named_models import resolve_model

    _check_options(options)
    path = Path(resolve_model(target, progress=False)) if target else Path(model)
    return MistralRsEngine(
        path, n_threads=options.get("n_threads"), max_seqs=_int_option(options, "max_seqs", None, 1),
        prefix_cache_n=_int_option(options, "prefix_cache_n", DEFAULT_PREFIX_CACHE_N, 0),
        verbose=_verbose(options.get("verbose")))


def _kv_cache_type() -> dict[str, str]:
    """The K/V cache type mistral.rs said it uses, from the last engine loaded in this process."""
    kv = _LAST_LOG_FACTS.get("kv_cache")
    return {"type_k": kv, "type_v": kv} if kv else {}


def settings(target: str, *, n_threads: int | None = None, n_batch: int | None = None,
             **options) -> dict[str, Any]:
    """What ``--engine mistralrs:`` runs with (recorded with every result)."""
    _check_options(options)
    threads = (_threads_in_effect() if _PROCESS_THREADS else
               {"threads": n_threads, "threads_source": f"{' and '.join(THREAD_ENV_VARS)} set before the first "
                                                        "Runner (the Runner takes no thread count)"}
               if n_threads is not None else {"threads": None, "threads_source": "mistral.rs's default"})
    return {
        "backend": "mistral.rs CPU (candle)", "numerics": "mistral.rs's own", "mistralrs": mistralrs_version(),
        "max_seqs": _int_option(options, "max_seqs", None, 1) or "mistral.rs default (32)",
        "prefix_cache_n": _int_option(options, "prefix_cache_n", DEFAULT_PREFIX_CACHE_N, 0),
        "sampling": "greedy (temperature 0, top_p 1, min_p 0, penalties neutral, ignore_eos)",
        "prompt": "text through a pass-through chat template, checked to tokenize to the given ids",
        "timings": "the engine's own (Usage: prompt step, completion steps; whole milliseconds)",
        "n_ubatch": n_batch, "n_batch_note": "mistral.rs batches a prompt its own way (the Runner takes no batch "
                                             "size): n_batch / n_ubatch are the harness's request only",
        **_kv_cache_type(), **threads,
    }


def import_modules(target: str) -> None:
    """What a cold start imports before it loads the model: the mistralrs extension and our tokenizer."""
    _import_mistralrs()
    import inference_engine.tokenizer  # noqa: F401


open_engine.unavailable = unavailable  # type: ignore[attr-defined]
open_engine.settings = settings  # type: ignore[attr-defined]
open_engine.import_modules = import_modules  # type: ignore[attr-defined]
