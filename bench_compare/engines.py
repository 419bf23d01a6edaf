"""Make an engine from a spec string: ``ours:numpy``, ``ours:numba``, ``ours:mlx``, ``llamacpp``.

The benchmark runs llama.cpp with llama-bench's defaults (tools/llama-bench/llama-bench.cpp, 0.3.36):
F16 K and V caches and flash attention ``auto`` (llama.cpp resolves it to *on* for the CPU backend: it probes
whether the device supports the fused op, llama-context.cpp ``auto_fa``). The chunk size is 512 (llama-bench's
n_ubatch, the size llama.cpp computes a prefill in). Like llama-bench it loads with ``use_extra_bufts``
(``--repack``: quantized weights moved into AMX / repacked buffers) on, except where a probe in a child process shows
that this crashes (CPUs reporting AMX-INT8 with llama-cpp-python 0.3.36); see :mod:`bench_compare.extra_bufts`.
Our engine runs with its own defaults (``kv_type="f32"``). Every setting used is returned by
:func:`engine_settings` and recorded, the extra-buffer verdict and its reason included.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_engine.errors import GGUFParityError

OUR_BACKENDS = ("numpy", "numba", "mlx")
ENGINE_CHOICES = tuple(f"ours:{b}" for b in OUR_BACKENDS) + ("llamacpp",)
NUMERICS_CHOICES = ("f32", "ggml")

# llama-bench defaults (cmd_params_defaults in llama-bench.cpp): type_k = type_v = F16, flash_attn = AUTO.
LLAMA_BENCH_KV_TYPE = "f16"
LLAMA_BENCH_FLASH_ATTN = "auto"  # resolves to enabled on the CPU backend
LLAMACPP_EXTRA_BUFTS = True  # llama-bench's default; off only where bench_compare.extra_bufts' probe crashes
LLAMA_BENCH_N_BATCH = 512
OUR_DEFAULT_KV_TYPE = "f32"

# Where each backend lives, so its import can be timed on its own (cold start "imports" phase).
_BACKEND_MODULES = {
    "numpy": "inference_engine.backends.numpy_ref",
    "numba": "inference_engine.backends.numba_cpu",
    "mlx": "inference_engine.backends.mlx_backend",
}


@dataclass(frozen=True)
class EngineSpec:
    kind: str  # "ours" | "llamacpp"
    backend: str | None = None

    @property
    def name(self) -> str:
        return f"ours:{self.backend}" if self.kind == "ours" else "llamacpp"

    @property
    def is_reference(self) -> bool:
        return self.kind == "llamacpp"

    @property
    def backend_label(self) -> str:
        """The ``backend`` column of llama-bench's table: llama.cpp's CPU build prints ``CPU``."""
        return "CPU" if self.kind == "llamacpp" else str(self.backend)


def parse_engine_spec(text: str) -> EngineSpec:
    value = (text or "").strip().lower()
    if value in ("llamacpp", "llama.cpp", "llama_cpp", "llama-cpp"):
        return EngineSpec("llamacpp")
    if value.startswith("ours:"):
        backend = value.split(":", 1)[1]
        if backend in OUR_BACKENDS:
            return EngineSpec("ours", backend)
    raise GGUFParityError(f"unknown engine '{text}'; choose one of: {', '.join(ENGINE_CHOICES)}")


def check_numerics(numerics: str) -> str:
    if numerics not in NUMERICS_CHOICES:
        raise GGUFParityError(f"unknown numerics '{numerics}'; choose one of: {', '.join(NUMERICS_CHOICES)}")
    return numerics


def import_engine_modules(spec: EngineSpec) -> None:
    """Import what the engine needs (timed separately from loading the model in cold starts)."""
    if spec.kind == "llamacpp":
        _import("validation.llamacpp", "llama.cpp adapter (validation.llamacpp)")
        return
    _import("inference_engine.engine", "our engine (inference_engine.engine)")
    module = _BACKEND_MODULES[spec.backend]
    if importlib.util.find_spec(module) is not None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise GGUFParityError(_backend_import_message(spec.backend, exc)) from None


def _import(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise GGUFParityError(f"{what} is not available in this installation ({exc})") from None
        raise GGUFParityError(f"{what} cannot be imported: missing module '{exc.name}'") from None


def _backend_import_message(backend: str, exc: BaseException) -> str:
    hint = " (pip install 'gguf-parity[mlx]')" if backend == "mlx" else ""
    return f"backend '{backend}' cannot be imported{hint}: {exc}"


def llamacpp_extra_bufts(model_path: str | Path):
    """:class:`bench_compare.extra_bufts.Verdict` for llama.cpp on this model here (probed once per machine)."""
    if not LLAMACPP_EXTRA_BUFTS:
        from bench_compare.extra_bufts import Verdict

        return Verdict(False, "LLAMACPP_EXTRA_BUFTS is off", "configuration")
    from bench_compare import extra_bufts

    return extra_bufts.decide(model_path)


def engine_settings(spec: EngineSpec, *, n_threads: int | None, n_ctx: int, numerics: str,
                    n_batch: int = LLAMA_BENCH_N_BATCH, model: str | Path | None = None) -> dict[str, Any]:
    """The settings :func:`make_engine` uses for ``spec`` on ``model`` (a resolved path; recorded with every
    result). Without ``model`` llama.cpp's extra-buffer verdict is unknown and recorded as None."""
    if spec.kind == "llamacpp":
        bufts = (llamacpp_extra_bufts(model).settings() if model is not None
                 else {"extra_bufts": None, "extra_bufts_reason": "not decided (no model given)"})
        return {
            "engine": spec.name, "backend": "CPU", "numerics": "ggml", "n_threads": n_threads, "n_ctx": n_ctx,
            "n_batch": n_batch, "n_ubatch": n_batch, "type_k": LLAMA_BENCH_KV_TYPE,
            "type_v": LLAMA_BENCH_KV_TYPE, "flash_attn": LLAMA_BENCH_FLASH_ATTN,
            "flash_attn_note": "llama-bench default AUTO, which resolves to enabled on CPU",
            **bufts,
        }
    return {
        "engine": spec.name, "backend": spec.backend, "numerics": numerics, "n_threads": n_threads, "n_ctx": n_ctx,
        "n_batch": n_batch, "n_ubatch": n_batch, "type_k": OUR_DEFAULT_KV_TYPE, "type_v": OUR_DEFAULT_KV_TYPE,
        "flash_attn": False,
    }


def make_engine(spec: EngineSpec | str, model: str | Path, *, n_threads: int | None = None, n_ctx: int = 2048,
                numerics: str = "f32", n_batch: int = LLAMA_BENCH_N_BATCH):
    """Construct the engine ``spec`` on ``model`` (a named model or a path). ``n_threads=None``: engine default."""
    if isinstance(spec, str):
        spec = parse_engine_spec(spec)
    check_numerics(numerics)
    from inference_engine.registry import resolve_model

    path = resolve_model(str(model), progress=False)
    import_engine_modules(spec)
    if spec.kind == "llamacpp":
        from validation.llamacpp import LlamaCppEngine

        try:
            return LlamaCppEngine(
                str(path), n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, kv_type=LLAMA_BENCH_KV_TYPE,
                flash_attn=LLAMA_BENCH_FLASH_ATTN, extra_bufts=llamacpp_extra_bufts(path).enabled,
            )
        except GGUFParityError:
            raise
        except Exception as exc:  # llama_cpp raises ValueError / RuntimeError when it cannot load a file
            raise GGUFParityError(f"llama.cpp could not load {path}: {' '.join(str(exc).split())[:200]}") from None
    from inference_engine.engine import OurEngine

    return OurEngine(
        str(path), backend=spec.backend, numerics=numerics, n_ctx=n_ctx, n_threads=n_threads,
        kv_type=OUR_DEFAULT_KV_TYPE,
    )


# Fastest first: the default backend is the first one present in this installation.
BACKEND_PREFERENCE = ("numba", "numpy")


def default_backend() -> str:
    """``numba`` where its backend module exists (the fast CPU path), else ``numpy``."""
    for backend in BACKEND_PREFERENCE:
        if importlib.util.find_spec(_BACKEND_MODULES[backend]) is not None:
            return backend
    return "numpy"


def available_backends() -> list[str]:
    """Our backends whose Python package is importable here (mlx needs the optional ``mlx`` package)."""
    found = []
    for backend, package in (("numpy", "numpy"), ("numba", "numba"), ("mlx", "mlx")):
        if importlib.util.find_spec(package) is not None:
            found.append(backend)
    return found
