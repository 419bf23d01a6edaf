"""Our engine: the Engine protocol (``inference_engine/protocol.py``) over a model, a backend and a KV cache.

``OurEngine("model.gguf", backend="numpy", numerics="f32")`` opens the file (memory-mapped), builds the model for
its architecture with every weight prepared by the backend, and preallocates the KV cache for ``n_ctx`` positions.
``prefill`` runs one batched pass over the prompt, ``decode`` one token; ``capture`` runs a fresh prefill with every
intermediate tapped under llama.cpp's graph names and logits for every position, as llama.cpp's capture does, and
with ``force=`` a teacher-forced one (each op fed another engine's tensors; see :meth:`OurEngine.capture`).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

import numpy as np

from inference_engine.backends import get_backend
from inference_engine.backends import numerics as nx
from inference_engine.backends.base import check_kv_type
from inference_engine.defaults import REFERENCE
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile, open_gguf
from inference_engine.gguf.validate import check_context, check_model
from inference_engine.kv_cache import KVCache
from inference_engine.models import build_model, check_runnable
from inference_engine.models.base import no_tap


class OurEngine:
    """The Engine protocol over one of our backends.

    ``model``: a path or an open :class:`GGUFFile`. ``backend``: ``numpy`` | ``numba`` | ``mlx``. ``numerics``:
    ``f32`` | ``ggml`` (see :mod:`inference_engine.backends.base`). ``n_ctx``: KV-cache positions, preallocated.
    ``n_threads``: handed to the backend (None: its default). ``kv_type``: ``f32`` | ``f16`` cache storage.
    ``device``: ``gpu`` | ``cpu`` (None: the backend's default, the GPU where MLX has one; the NumPy and Numba
    backends compute on the CPU only).
    ``load_timings`` records the seconds spent opening the file and preparing the weights (cold start).
    Defaults: the readable reference (:data:`inference_engine.defaults.REFERENCE`); the commands pass their own.
    """

    def __init__(
        self,
        model: str | os.PathLike | GGUFFile,
        backend: str = REFERENCE.backend,
        numerics: str = REFERENCE.numerics,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        kv_type: str = REFERENCE.kv_type,
        device: str | None = None,
    ):
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, (int, np.integer)) or n_ctx < 1:
            raise GGUFParityError(f"context size must be a positive integer, got {n_ctx!r}")
        check_kv_type(kv_type)
        t0 = time.perf_counter()
        self.gguf = model if isinstance(model, GGUFFile) else open_gguf(model)
        t1 = time.perf_counter()
        check_runnable(self.gguf)  # an architecture or tensor type we cannot run: say that first
        shape = check_model(self.gguf)  # every hyperparameter, shape and vocabulary problem, before any weight
        check_context(self.gguf.path, shape, int(n_ctx), 2 if kv_type == "f16" else 4, flag="context size")
        self.backend = get_backend(backend, numerics, n_threads, device)
        self.model = build_model(self.gguf, self.backend)
        self.cache = KVCache(self.backend, self.model.kv_layout(), int(n_ctx), kv_type)
        t2 = time.perf_counter()
        self.name = f"ours:{self.backend.name}"
        self.numerics = numerics
        self.kv_type = kv_type
        self.n_threads = n_threads
        self.load_timings: dict[str, float] = {"gguf_open_s": t1 - t0, "weights_ready_s": t2 - t1}
        self._async_steps: tuple[Any, Any] | None = None  # (the backend's step mode, its async steps), made on demand

    # --- identity -------------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.cache.n_ctx

    @property
    def n_past(self) -> int:
        return self.cache.n_past

    @cached_property
    def tokenizer(self):
        from inference_engine.tokenizer import GGUFTokenizer

        return GGUFTokenizer.from_gguf(self.gguf)

    @property
    def model_info(self) -> dict[str, Any]:
        f = self.gguf
        return {
            "engine": self.name,
            "file": str(f.path),
            "file_size": f.file_size,
            "sha256": f.sha256,  # computed on first access, then cached by the GGUFFile
            "arch": f.architecture,
            "name": f.metadata_value("general.name", f.path.stem),
            "quant": f.file_type_name,
            "n_params": f.n_params,
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
            "backend": self.backend.name,
            "backend_description": self.backend.description,
            "device": self.backend.device,
            "device_info": self.backend.device_info(),
            "numerics": self.numerics,
            "ggml_simd": nx.ggml_simd() if self.numerics == "ggml" else None,
            "kv_type": self.kv_type,
            "threads": self.n_threads,
            "versions": self.versions(),
        }

    def versions(self) -> dict[str, str]:
        import gguf

        from inference_engine import __version__

        out = {"inference_engine": __version__, "python": platform.python_version(), "gguf": _version_of(gguf)}
        out.update(self.backend.versions())
        return out

    # --- tokens ---------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=True)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(ids)

    # --- running --------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.cache.reset()

    def rewind(self, n_past: int) -> bool:
        """Keep the cache's first ``n_past`` positions as they were computed and forget the rest (the optional
        ``rewind`` of the Engine protocol); False when fewer are filled."""
        return self.cache.truncate(n_past)

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Append ``ids`` in one batched pass; logits ``(n_vocab,)`` of the last position."""
        logits = self._run(self._check_ids(ids, "prompt"))
        return logits[-1]

    def decode(self, token_id: int) -> np.ndarray:
        steps = self.async_steps()
        if steps is not None:  # the backend's own step (MLX: one compiled graph), read back at once
            self._check_ids([token_id], "token")
            return steps.decode(int(token_id)).logits()
        return self._run(self._check_ids([token_id], "token"))[-1]

    def async_steps(self):
        """The backend's generation steps over this engine's model and cache that are launched without waiting
        (:meth:`~inference_engine.backends.base.Backend.async_steps`), made once per step mode; None where the
        backend runs each step to completion (NumPy, Numba). :func:`~inference_engine.generate.generate_step` keeps
        the device busy with them."""
        mode = getattr(self.backend, "step_mode", None)
        if self._async_steps is None or self._async_steps[0] != mode:
            self._async_steps = (mode, self.backend.async_steps(self.model, self.cache))
        return self._async_steps[1]

    def capture(
        self,
        ids: list[int],
        names: Iterable[str] | None = None,
        force: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Fresh cache, one prefill of ``ids`` with every intermediate recorded (or only ``names``).

        Arrays follow ``protocol.py``: llama.cpp's graph names and shapes, token axis first; ``result_output``
        holds the logits of every position. The cache is left holding the prompt, as after ``prefill``.

        ``force`` (teacher forcing): ``{name: array}``, typically another engine's capture of the same ``ids``. At
        each tapped tensor whose name is in ``force`` we record *our* value, then continue with the forced one, so
        each recorded tensor is our op(s) applied to the other engine's inputs: a wrong op still gives a wrong
        output, while rounding differences no longer compound from layer to layer. Forced arrays are reshaped to
        our shape (the capture contract drops leading size-1 axes); a size mismatch is an error. The KV cache then
        holds the forced ``Kcur``/``Vcur``. Forced names we never tap are ignored.
        """
        self._check_ids(ids, "prompt")
        self.reset()
        return self.capture_next(ids, names, force)

    def capture_reset(self) -> None:
        """Start a capture session (:meth:`capture_next` appends to it): an empty cache."""
        self.reset()

    def capture_next(
        self,
        ids: list[int],
        names: Iterable[str] | None = None,
        force: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """As :meth:`capture`, but appends ``ids`` to what the cache already holds (no reset): one decode step (or one
        chunk of a long prompt) on top of a prefix, recorded, optionally teacher-forced. With ``force`` holding the
        other engine's ``Kcur-*`` / ``Vcur-*`` of each chunk, the cache ends up holding exactly its K/V."""
        tokens = self._check_ids(ids, "prompt")
        wanted = None if names is None else set(names)
        forced = _forced_arrays(force)
        captured: dict[str, np.ndarray] = {}
        backend = self.backend

        def tap(name: str, x):
            if wanted is None or name in wanted:
                captured[name] = np.array(backend.to_numpy(x), dtype=np.float32)
            value = forced.get(name)
            if value is None:
                return x
            if value.size != int(np.prod(x.shape)):
                raise GGUFParityError(
                    f"forced tensor {name} has shape {tuple(value.shape)}, which does not fit ours {tuple(x.shape)}"
                )
            # a copy: no op of ours may ever write into the caller's arrays (they are diffed afterwards)
            return backend.from_numpy(value.reshape(tuple(x.shape)).copy())

        self._run(tokens, tap=tap, all_logits=True)
        return captured

    def _run(self, tokens: np.ndarray, tap=None, all_logits: bool = False) -> np.ndarray:
        self.cache.check_room(len(tokens))
        positions = np.arange(self.cache.n_past, self.cache.n_past + len(tokens), dtype=np.int64)
        logits = self.model.forward(tokens, positions, self.cache, tap=tap or no_tap, all_logits=all_logits)
        self.cache.advance(len(tokens))
        return self.backend.to_numpy(logits)

    def _check_ids(self, ids: Iterable[int], what: str) -> np.ndarray:
        ids = list(ids)
        if not ids:
            raise GGUFParityError(f"empty {what}: at least one token is needed")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= int(t) < self.n_vocab:
                raise GGUFParityError(f"token id {t!r} is not in this model's vocabulary (0..{self.n_vocab - 1})")
        return np.asarray(ids, dtype=np.int64)

    def close(self) -> None:
        """Nothing to release beyond memory; kept for the protocol."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"OurEngine({self.gguf.path.name!r}, backend={self.backend.name!r}, numerics={self.numerics!r}, "
            f"n_ctx={self.n_ctx}, kv_type={self.kv_type!r})"
        )


def load_engine(
    model: str,
    backend: str = "numpy",
    numerics: str = "f32",
    n_ctx: int = 2048,
    n_threads: int | None = None,
    kv_type: str = "f32",
    progress: bool = True,
) -> OurEngine:
    """An engine for a model as users name it: a named model (fetched on first use) or a path to a .gguf."""
    from inference_engine.store.named_models import resolve_model

    return OurEngine(resolve_model(str(model), progress=progress), backend, numerics, n_ctx, n_threads, kv_type)


def _forced_arrays(force: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """``force`` as contiguous float32 NumPy arrays (what every backend's ``from_numpy`` accepts)."""
    if force is None:
        return {}
    if not isinstance(force, Mapping):
        raise GGUFParityError(f"force must map tensor names to arrays, got {type(force).__name__}")
    return {str(k): np.ascontiguousarray(v, dtype=np.float32) for k, v in force.items()}


def _version_of(module) -> str:
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(module.__name__)
    except PackageNotFoundError:
        return "unknown"
