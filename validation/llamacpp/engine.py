"""llama.cpp as an :class:`~inference_engine.protocol.Engine`: the reference everything is measured against.

Built on llama-cpp-python's low-level API (``llama_cpp.llama_cpp``), because the high-level ``Llama`` cannot pass
the ``cb_eval`` graph callback that per-tensor capture needs, and because it hides the settings validation must pin
(KV cache type, flash attention, threads).

Two contexts share one loaded model:

* the *run* context serves ``prefill`` / ``decode`` (and so benchmarks). It has no callback, so llama.cpp runs as it
  normally does (fused kernels, whole graphs) and asks for one output row per call.
* the *capture* context is made on first ``capture`` with room for the whole prompt in one micro-batch and an output
  for every position, with a :class:`~validation.llamacpp.capture.GraphRecorder` as ``cb_eval``.

Validation defaults: F32 KV cache and flash attention off, the cleanest baseline (llama.cpp's own defaults are an
F16 cache and flash attention "auto"; pass ``kv_type="f16", flash_attn="auto"`` to benchmark those).

``extra_bufts`` (llama.cpp's ``use_extra_bufts``, on by default there) lets the CPU backend move quantized weights
into "extra" buffer types at load time: AMX tiles (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K on CPUs that report AMX) or
repacked interleaved layouts (CPU_REPACK: Q4_0, Q4_K, Q8_0, ... on AVX2), each with its own matmul kernels. We
default it off, for two reasons: (1) on machines that report AMX-INT8 but cannot run the tile kernels (this
project's build machine: the kernel grants the AMX permission, then ``ggml_backend_amx_mul_mat`` segfaults on any
batch of more than one token) llama.cpp would kill the process on the first prompt; (2) with it off every matmul
goes through ggml's plain path (activation quantized to the weight's ``vec_dot_type``, then ``ggml_vec_dot_*`` or
llamafile's sgemm), which is what our ``ggml`` numerics mode emulates (but for Q4_0 weights with rows a multiple of
8, which it multiplies as the repacked kernels do: float rounding apart here). Turn it on to benchmark llama.cpp's
fastest CPU path where it works; it is recorded in ``model_info``.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType
from llama_cpp import llama_cpp as ll

from inference_engine.backends.numerics import set_ggml_simd
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUF_MAGIC, GGUFFile, open_gguf
from inference_engine.store.digests import file_sha256
from validation.free_running import KV_F16_PLAIN
from validation.ggml_ctypes import check_layout
from validation.llamacpp.capture import GraphNode, GraphRecorder
from validation.llamacpp.library import (
    build_info,
    clear_log,
    init_backend,
    last_error,
    raise_if_interrupted,
    recent_log,
    set_llama_logging,
    simd_flavour,
)
from validation.llamacpp.probe import ensure_loadable

# bf16: for the bf16 precision class's variant (validation.precision): with flash attention on, ggml rounds Q to the
# cache's type for the dot products, as an engine that computes attention in bf16 does.
# (llama-cpp-python binds no GGML_TYPE_BF16 constant: ggml's enum value is gguf-py's GGMLQuantizationType.BF16, 30.)
KV_TYPES: dict[str, int] = {"f32": ll.GGML_TYPE_F32, "f16": ll.GGML_TYPE_F16,
                            "bf16": int(GGMLQuantizationType.BF16)}
FLASH_ATTN: dict[str, int] = {
    "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
}


def parse_kv_type(kv_type: str) -> str:
    key = str(kv_type).lower()
    if key not in KV_TYPES:
        raise GGUFParityError(f"unsupported KV cache type '{kv_type}'; supported: {', '.join(KV_TYPES)}")
    return key


def parse_flash_attn(flash_attn: bool | str | None) -> str:
    """True/False or "on"/"off"/"auto" (None means "auto", llama.cpp's default)."""
    if flash_attn is None:
        return "auto"
    if isinstance(flash_attn, bool):
        return "on" if flash_attn else "off"
    key = str(flash_attn).lower()
    if key not in FLASH_ATTN:
        raise GGUFParityError(f"unsupported flash attention setting '{flash_attn}'; supported: on, off, auto")
    return key


def check_model_path(path: Path) -> None:
    """The cheap file checks, with the same one-line messages as ``open_gguf``, before llama.cpp sees the file."""
    if not path.exists():
        raise GGUFParityError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFParityError(f"{path}: is a directory, expected a .gguf file")
    if path.stat().st_size == 0:
        raise GGUFParityError(f"{path}: file is empty, expected a .gguf file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFParityError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) <= 0:
        raise GGUFParityError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


class _LoadedModel:
    """One llama.cpp model in memory and how many engines compute with it: the reference and the variants that
    differ from it only in context settings (K/V type, attention kernel, threads) share it, and it is freed when
    the last of them closes. Loading is most of an engine's opening (Gemma 3 270M Q4_K_M: 1.0 s to load, 0.01 s for
    a context, 2 cores), and a context on a shared model computes what one on its own copy does."""

    def __init__(self, handle):
        self.handle = handle
        self.users = 1

    def share(self) -> _LoadedModel:
        self.users += 1
        return self

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.handle:
            ll.llama_model_free(self.handle)
            self.handle = None


class LlamaCppEngine:
    """The Engine protocol over llama.cpp (CPU), with per-tensor capture of its compute graph.

    ``sharing``: an open engine on the same file and model settings (``extra_bufts``) whose loaded model this one
    computes with instead of loading its own (:meth:`rounding_variants`, :meth:`variant` without a weight type);
    the model is freed when the last engine using it closes."""

    name = "llamacpp"

    def __init__(
        self,
        model_path: str | os.PathLike,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        n_batch: int = 512,
        kv_type: str = "f32",
        flash_attn: bool | str | None = False,
        extra_bufts: bool = False,
        verbose: bool = False,
        sharing: LlamaCppEngine | None = None,
    ):
        self._model = None
        self._loaded: _LoadedModel | None = None
        self._ctx = None
        self._batch = None
        self._capture: _RecordingContext | None = None  # capture's, sized for its prompt
        self._session: _RecordingContext | None = None  # the capture session's (capture_reset / capture_next)

        self.path = Path(model_path)
        self._n_ctx = _positive_int(n_ctx, "n_ctx")
        self.n_threads = _positive_int(n_threads if n_threads is not None else (os.cpu_count() or 1), "n_threads")
        self.n_batch = _positive_int(n_batch, "n_batch")
        self.kv_type = parse_kv_type(kv_type)
        self.flash_attn = parse_flash_attn(flash_attn)
        self.extra_bufts = bool(extra_bufts)
        self.verbose = verbose
        self._n_past = 0

        t0 = time.perf_counter()
        if sharing is not None:
            sharing._require_open()
            if (sharing.path, sharing.extra_bufts) != (self.path, self.extra_bufts):
                raise ValueError(f"an engine on {self.path} (extra_bufts={self.extra_bufts}) cannot share the model "
                                 f"of one on {sharing.path} (extra_bufts={sharing.extra_bufts})")
            self._loaded = sharing._loaded.share()
        else:
            self._loaded = _LoadedModel(self._load_model())
        self._model = self._loaded.handle
        t1 = time.perf_counter()
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._n_vocab = int(ll.llama_vocab_n_tokens(self._vocab))
        clear_log()
        self._ctx = self._new_context(self._n_ctx, self.n_batch, n_outputs_max=1)
        self.flash_attn_resolved = _resolved_flash_attn(self.flash_attn, recent_log())
        self._batch = ll.llama_batch_init(self.n_batch, 0, 1)
        t2 = time.perf_counter()
        self.load_timings: dict[str, float] = {"model_load_s": t1 - t0, "context_create_s": t2 - t1}

    def _load_model(self):
        """llama.cpp's model loaded from :attr:`path` (its handle), after our checks of the file."""
        set_llama_logging(self.verbose)
        init_backend()
        # Our ggml-numerics emulation follows the SIMD flavour this llama.cpp build runs (exp / SiLU last bits).
        set_ggml_simd(simd_flavour())
        check_layout()
        check_model_path(self.path)
        ensure_loadable(self.path)  # our validation, then llama.cpp's first load in a child (cached per file)
        params = ll.llama_model_default_params()
        params.use_extra_bufts = self.extra_bufts
        clear_log()
        model = ll.llama_model_load_from_file(str(self.path).encode(), params)
        try:
            raise_if_interrupted()
        except KeyboardInterrupt:
            if model:
                ll.llama_model_free(model)
            raise
        if not model:
            open_gguf(self.path)  # our reader's one-line reason (truncated file, bad tensor type...) where it has one
            reason = last_error() or "see its log with verbose=True"
            raise GGUFParityError(f"{self.path}: llama.cpp could not load this model ({reason})")
        return model

    # --- contexts -------------------------------------------------------------------------------------------------
    def _new_context(self, n_ctx: int, n_batch: int, n_outputs_max: int, recorder: GraphRecorder | None = None):
        p = ll.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_batch  # one micro-batch per llama_decode call: a chunk is computed as one graph
        p.n_seq_max = 1
        p.n_outputs_max = n_outputs_max  # compute buffers sized for the logits rows we ask for
        p.n_threads = self.n_threads
        p.n_threads_batch = self.n_threads
        p.type_k = KV_TYPES[self.kv_type]
        p.type_v = KV_TYPES[self.kv_type]
        p.flash_attn_type = FLASH_ATTN[self.flash_attn]
        if recorder is not None:
            p.cb_eval = recorder.callback
            p.cb_eval_user_data = None
        ctx = ll.llama_init_from_model(self._model, p)
        if ctx:
            try:
                raise_if_interrupted()
            except KeyboardInterrupt:
                ll.llama_free(ctx)
                raise
        if not ctx:
            raise GGUFParityError(
                f"{self.path}: llama.cpp could not create a context (n_ctx={n_ctx}, n_batch={n_batch}, "
                f"kv_type={self.kv_type}, flash_attn={self.flash_attn})"
            )
        return ctx

    def _new_recording_context(self, n_ctx: int, n_batch: int) -> _RecordingContext:
        """A context of ``n_ctx`` cells with the graph callback attached, and a batch of ``n_batch`` tokens."""
        recorder = GraphRecorder()
        ctx = self._new_context(n_ctx, n_batch, n_outputs_max=n_batch, recorder=recorder)
        return _RecordingContext(ctx, ll.llama_batch_init(n_batch, 0, 1), recorder, n_batch)

    def _record(self, graph: _RecordingContext, tokens: list[int], names: Iterable[str] | None,
                pos0: int) -> dict[str, np.ndarray]:
        """One ``llama_decode`` of ``tokens`` at positions ``pos0...`` in ``graph``'s context, logits for every one,
        recorded; then ``graph.n_past`` counts the positions its cache holds."""
        _fill_batch(graph.batch, tokens, pos0, all_logits=True, last_logits=True)
        graph.recorder.start(names)
        try:
            self._decode(graph.ctx, graph.batch)
        finally:
            graph.recorder.stop()
        graph.n_past = pos0 + len(tokens)
        return graph.recorder.tensors

    def _ensure_capture_context(self, n_tokens: int) -> _RecordingContext:
        if self._capture is None or self._capture.capacity < n_tokens:
            self._free_capture_context()
            self._capture = self._new_recording_context(n_tokens, n_tokens)
        return self._capture

    def _free_capture_context(self) -> None:
        if self._capture is not None:
            self._capture.free()
            self._capture = None

    # --- Engine protocol: identity ---------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        """The context the caller asked for (llama.cpp rounds its allocation up to a multiple of 256)."""
        return self._n_ctx

    @property
    def n_past(self) -> int:
        """Tokens in the KV cache: the position the next token gets."""
        return self._n_past

    @cached_property
    def sha256(self) -> str:
        return file_sha256(self.path)

    @cached_property
    def gguf(self) -> GGUFFile:
        """Our reader's view of the file (opened on first use: parsing a 262k-token vocabulary takes seconds)."""
        return open_gguf(self.path)

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as llama.cpp read it (as a string), or None."""
        self._require_open()
        buf = ctypes.create_string_buffer(1024)
        n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _quant_name(self) -> str:
        file_type = self.meta("general.file_type")
        try:
            return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
        except (TypeError, ValueError):
            return self.gguf.file_type_name

    @property
    def model_info(self) -> dict[str, Any]:
        self._require_open()
        desc = ctypes.create_string_buffer(256)
        ll.llama_model_desc(self._model, desc, len(desc))
        return {
            "engine": self.name,
            "file": str(self.path),
            "file_name": self.path.name,
            "file_size": self.path.stat().st_size,
            "sha256": self.sha256,
            "architecture": self.meta("general.architecture"),
            "model_type": desc.value.decode("utf-8", "replace"),
            "quant": self._quant_name(),
            "n_params": int(ll.llama_model_n_params(self._model)),
            "model_size": int(ll.llama_model_size(self._model)),
            "n_vocab": self.n_vocab,
            "n_layer": int(ll.llama_model_n_layer(self._model)),
            "n_embd": int(ll.llama_model_n_embd(self._model)),
            "n_ctx_train": int(ll.llama_model_n_ctx_train(self._model)),
            "n_ctx": self.n_ctx,
            "n_ctx_allocated": int(ll.llama_n_ctx(self._ctx)),
            "n_batch": self.n_batch,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "kv_type": self.kv_type,
            "flash_attn": self.flash_attn,
            "flash_attn_resolved": self.flash_attn_resolved,
            "extra_bufts": self.extra_bufts,
            "backend": "llama.cpp CPU",
            "numerics": "ggml",
            "load_timings": dict(self.load_timings),
            **build_info(),
        }

    # --- Engine protocol: tokens ------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """The model vocab's tokens of ``text``, special tokens (``<|im_start|>``) parsed as such.

        Equal to ``llama_cpp.Llama.tokenize(text.encode(), add_bos=add_bos, special=True)``.
        """
        self._require_open()
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_bos, True)
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    def detokenize(self, ids: Iterable[int], special: bool = True) -> str:
        """Text of ``ids`` as llama.cpp's ``common_detokenize`` gives it (special tokens rendered by default)."""
        return self.detokenize_bytes(ids, special).decode("utf-8", "replace")

    def detokenize_bytes(self, ids: Iterable[int], special: bool = True) -> bytes:
        self._require_open()
        tokens = self._check_ids(list(ids), allow_empty=True)
        arr = (ll.llama_token * max(len(tokens), 1))(*tokens)
        capacity = 16 * len(tokens) + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = ll.llama_detokenize(self._vocab, arr, len(tokens), buf, capacity, False, special)
            if n >= 0:
                return buf.raw[:n]
            capacity = -n

    # --- Engine protocol: running -----------------------------------------------------------------------------------
    def reset(self) -> None:
        self._require_open()
        ll.llama_memory_clear(ll.llama_get_memory(self._ctx), True)
        self._n_past = 0

    def rewind(self, n_past: int) -> bool:
        """Keep the first ``n_past`` positions (``llama_memory_seq_rm`` of the rest): the optional ``rewind`` of the
        Engine protocol. Refused (False, then the caller resets and prefills) where the result would not be what a
        fresh prefill leaves: a sliding-window model's cache has evicted positions a rewind would need back."""
        self._require_open()
        if not 0 <= n_past <= self._n_past or ll.llama_model_n_swa(self._model) > 0:
            return False
        if not ll.llama_memory_seq_rm(ll.llama_get_memory(self._ctx), 0, n_past, -1):
            return False
        self._n_past = n_past
        return True

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Append ``ids`` in chunks of ``n_batch``; only the very last position asks for logits."""
        self._require_open()
        tokens = self._check_ids(list(ids))
        self._check_room(len(tokens))
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            is_last = start + len(chunk) == len(tokens)
            _fill_batch(self._batch, chunk, self._n_past, all_logits=False, last_logits=is_last)
            self._decode(self._ctx, self._batch)
            self._n_past += len(chunk)
        return self._last_logits(self._ctx)

    def decode(self, token_id: int) -> np.ndarray:
        self._require_open()
        tokens = self._check_ids([token_id])
        self._check_room(1)
        _fill_batch(self._batch, tokens, self._n_past, all_logits=False, last_logits=True)
        self._decode(self._ctx, self._batch)
        self._n_past += 1
        return self._last_logits(self._ctx)

    # --- capture -------------------------------------------------------------------------------------------------
    def capture(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Fresh cache, one prefill of ``ids`` as a single micro-batch with logits for every position.

        Returns ``{graph name: float32 array}`` in evaluation order (see ``protocol.py`` for the shapes).
        ``names`` limits what is copied; names the graph does not produce are simply absent.
        The run context's KV cache is untouched.
        """
        return self._run_capture(ids, names).tensors

    def graph_nodes(self, ids: list[int]) -> list[GraphNode]:
        """Every node llama.cpp evaluates for a prefill of ``ids``, named or not, in order (for diagnostics)."""
        return list(self._run_capture(ids, names=()).nodes)

    def graph_names(self, ids: list[int]) -> list[str]:
        """The names ``capture`` returns for ``ids``, in evaluation order (each once)."""
        return list(dict.fromkeys(node.name for node in self.graph_nodes(ids) if node.kept))

    def capture_logits(self) -> np.ndarray:
        """``(n_tokens, n_vocab)`` logits of the last capture, as llama.cpp hands them out (``llama_get_logits``)."""
        self._require_open()
        if self._capture is None or not self._capture.n_past:
            raise GGUFParityError("no capture has run yet")
        n = self._capture.n_past
        ptr = ll.llama_get_logits(self._capture.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab)).copy()

    def _run_capture(self, ids: list[int], names: Iterable[str] | None) -> GraphRecorder:
        self._require_open()
        tokens = self._check_ids(list(ids))
        if len(tokens) > self.n_ctx:
            raise GGUFParityError(f"prompt of {len(tokens)} tokens does not fit the context of {self.n_ctx}")
        graph = self._ensure_capture_context(len(tokens))
        ll.llama_memory_clear(ll.llama_get_memory(graph.ctx), True)
        self._record(graph, tokens, names, 0)
        return graph.recorder

    # --- capture sessions: decode steps and long prompts on top of a prefix --------------------------------------
    def capture_reset(self) -> None:
        """Start (or restart) a capture session: an empty KV cache of ``n_ctx`` cells in a context of its own with
        micro-batches of ``n_batch`` tokens (``n_ubatch = n_batch``), the graph callback attached. The run context
        and :meth:`capture`'s context are untouched."""
        self._require_open()
        if self._session is None:
            self._session = self._new_recording_context(self._n_ctx, self.n_batch)
        ll.llama_memory_clear(ll.llama_get_memory(self._session.ctx), True)
        self._session.n_past = 0

    def capture_next(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Append ``ids`` (one micro-batch: at most ``n_batch`` tokens) to the capture session's KV cache in one
        ``llama_decode``, logits for every one of them, and return that graph's tensors (as :meth:`capture`). One
        token is llama.cpp's decode-step graph; a chunk after earlier chunks is its chunked prefill."""
        self._require_open()
        tokens = self._check_ids(list(ids))
        if len(tokens) > self.n_batch:
            raise GGUFParityError(f"capture_next takes one micro-batch of at most {self.n_batch} tokens, "
                                  f"got {len(tokens)}")
        if self._session is None:
            self.capture_reset()
        session = self._session
        assert session is not None
        if session.n_past + len(tokens) > self.n_ctx:
            raise GGUFParityError(f"{len(tokens)} more tokens after {session.n_past} do not fit the context "
                                  f"of {self.n_ctx} tokens")
        return self._record(session, tokens, names, session.n_past)

    def _free_session_context(self) -> None:
        if self._session is not None:
            self._session.free()
            self._session = None

    # --- llama.cpp against itself -------------------------------------------------------------------------------
    def rounding_variants(self) -> dict[str, LlamaCppEngine]:
        """llama.cpp computing the same model with rounding-level changes: ``{label: engine}`` (caller closes).

        * its other attention kernel: flash attention (llama.cpp's CPU default, "auto" -> on) and the plain KQ /
          softmax / KQV path compute the same attention with float32 sums in different orders, and flash attention
          over K/V in F16 (llama.cpp casts an F32 cache to F16 for it: with it on, an F32 and an F16 cache gave
          bit-identical logits, Gemma 3 270M IQ4_XS);
        * where the reference keeps its K/V in F32: the K/V cache in F16 through the plain path
          (:data:`KV_F16_PLAIN`), the same rounding of K and V as flash attention's through the other kernel.

        Comparing them with the reference measures how far llama.cpp's own output moves under a rounding-level
        change, which validation uses as a noise floor for free-running comparisons. Why two draws of it: on a model
        whose activations are re-quantized to 8 bits at every product, any last-bit change cascades, and how far one
        cascade moves a given position is luck. Measured on Gemma 3 270M IQ4_XS, the default prompt: flash attention
        moved position 7's top-1/top-2 gap (1.21) by 0.02, the F16 cache through the plain path by 1.19 (to 0.02),
        with the same KLD mean (1.44e-2 and 1.52e-2); one draw left a correct engine's flip there unexplained.
        Everything else (threads, batch, extra buffer types) is kept: other thread counts (SmolLM2) and batches of 8
        tokens (Gemma 3 IQ4_XS) gave bit-identical logits, no draw at all.
        """
        self._require_open()
        other = "on" if self.flash_attn_resolved == "off" else "off"
        settings = {f"flash attention {other}": (self.kv_type, other)}
        if self.kv_type == "f32":
            settings[KV_F16_PLAIN] = ("f16", "off")
        variants: dict[str, LlamaCppEngine] = {}
        try:
            for label, (kv_type, flash_attn) in settings.items():
                variants[label] = LlamaCppEngine(self.path, n_ctx=self._n_ctx, n_threads=self.n_threads,
                                                 n_batch=self.n_batch, kv_type=kv_type, flash_attn=flash_attn,
                                                 extra_bufts=self.extra_bufts, verbose=self.verbose, sharing=self)
        except BaseException:
            for opened in variants.values():
                opened.close()
            raise
        return variants

    def variant(self, *, weight_type: str | None = None, kv_type: str | None = None,
                flash_attn: bool | str | None = None) -> LlamaCppEngine:
        """llama.cpp on the same model with other settings (caller closes): ``kv_type``, ``flash_attn``, or every
        matrix converted to ``weight_type`` (F32 / F16 / BF16: a copy written once, :mod:`validation.gguf_rewrite`).
        What is not named is kept. The precision classes' noise floors are made of these
        (:mod:`validation.precision`)."""
        self._require_open()
        path, sharing = self.path, self
        if weight_type is not None:
            from validation.gguf_rewrite import weights_as

            path, sharing = weights_as(self.path, weight_type, self.sha256), None
        return LlamaCppEngine(path, n_ctx=self._n_ctx, n_threads=self.n_threads, n_batch=self.n_batch,
                              kv_type=self.kv_type if kv_type is None else kv_type,
                              flash_attn=self.flash_attn if flash_attn is None else flash_attn,
                              extra_bufts=self.extra_bufts, verbose=self.verbose, sharing=sharing)

    # --- helpers ------------------------------------------------------------------------------------------------
    def _check_ids(self, ids: list[int], allow_empty: bool = False) -> list[int]:
        if not ids and not allow_empty:
            raise GGUFParityError("no tokens given: a prompt needs at least one token")
        out = []
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < self.n_vocab:
                raise GGUFParityError(f"token id {t!r} is not in this model's vocabulary (0..{self.n_vocab - 1})")
            out.append(int(t))
        return out

    def _check_room(self, n_new: int) -> None:
        if self._n_past + n_new > self.n_ctx:
            raise GGUFParityError(
                f"{n_new} more tokens after {self._n_past} do not fit the context of {self.n_ctx} tokens "
                f"(reset() or a larger n_ctx)"
            )

    @staticmethod
    def _decode(ctx, batch) -> None:
        rc = ll.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc}")

    def _last_logits(self, ctx) -> np.ndarray:
        ptr = ll.llama_get_logits_ith(ctx, -1)
        if not ptr:
            raise RuntimeError("llama.cpp returned no logits")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _require_open(self) -> None:
        if self._model is None:
            raise GGUFParityError("this llama.cpp engine is closed")

    # --- lifetime -------------------------------------------------------------------------------------------
    def close(self) -> None:
        self._free_capture_context()
        self._free_session_context()
        if self._batch is not None:
            ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            ll.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            self._loaded.release()
            self._model = None

    def __enter__(self) -> LlamaCppEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"LlamaCppEngine({str(self.path)!r}, n_ctx={self._n_ctx}, n_threads={self.n_threads}, "
            f"n_batch={self.n_batch}, kv_type={self.kv_type!r}, flash_attn={self.flash_attn!r}, "
            f"extra_bufts={self.extra_bufts})"
        )


def _resolved_flash_attn(setting: str, log: list[str]) -> str:
    """What "auto" became: llama.cpp decides at context creation and says so only in its log
    (``resolve_fused_ops: Flash Attention enabled`` / ``... not supported, set to disabled``)."""
    if setting != "auto":
        return setting
    for line in log:
        if "Flash Attention" in line and "resolve_fused_ops" in line:
            return "off" if "disabled" in line else "on"
    return "auto"


@dataclass
class _RecordingContext:
    """A llama.cpp context of its own with the graph callback attached (capture's, or a capture session's): its
    recorder, a batch of ``capacity`` tokens, and ``n_past``, the positions its KV cache holds after a recording."""

    ctx: Any
    batch: Any
    recorder: GraphRecorder
    capacity: int
    n_past: int = 0

    def free(self) -> None:
        """The batch and the context; the recorder goes with this object (the context held its function pointer)."""
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)


def _fill_batch(batch, tokens: list[int], pos0: int, all_logits: bool, last_logits: bool) -> None:
    """One sequence (id 0), consecutive positions from ``pos0``; which rows ask for logits."""
    n = len(tokens)
    batch.n_tokens = n
    for i, tok in enumerate(tokens):
        batch.token[i] = tok
        batch.pos[i] = pos0 + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = all_logits
    batch.logits[n - 1] = all_logits or last_logits
