"""Make an engine from a spec string: ``ours:numpy``, ``ours:numba``, ``ours:mlx``, ``llamacpp``.

The benchmark runs llama.cpp with llama-bench's defaults (tools/llama-bench/llama-bench.cpp, 0.3.36):
F16 K and V caches and flash attention ``auto`` (llama.cpp resolves it to *on* for the CPU backend: it probes
whether the device supports the fused op, llama-context.cpp ``auto_fa``). The chunk size is 512 (llama-bench's
n_ubatch, the size llama.cpp computes a prefill in). One default differs: llama-bench loads with
``use_extra_bufts`` (``--repack``) on, which moves quantized weights into AMX / repacked buffers; on CPUs that
report AMX-INT8 without being able to run the tile kernels (this project's build machine) that crashes the
process on the first batched prefill, so the adapter's default (off) is kept and recorded. Our engine runs with its
own defaults (``kv_type="f32"``). Every setting used is returned by :func:`engine_settings` and recorded.
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
LLAMACPP_EXTRA_BUFTS = False  # llama-bench: on; off here because AMX tile kernels crash on the build machine
LLAMA_BENCH_N_BATCH = 512
OUR_DEFAULT_KV_TYPE = "f32"

# Where each backend lives, so its import can be timed on its own (cold start "imports" phase).
_BACKEND_MODULES = {
    "numpy": "inference_engine.backends.numpy_ref",
    "numba": "inference_engine.backends.numba_cpu",
    "mlx": "inference_engine.backends.mlx_backend",
}


# Engines behind a spec scheme (``scheme:target``): the module:factory that opens them. A factory is
# ``open_engine(target, model, **options)`` (options: n_threads, n_ctx, numerics, n_batch and the user's
# ``--engine-opt KEY=VALUE`` pairs; it ignores the ones it does not use) returning an Engine.
ENGINE_SCHEMES: dict[str, str] = {
    "dump": "bench_compare.adapters.dump:open_engine",
    "cmd": "bench_compare.adapters.command:open_engine",
    "hf": "bench_compare.adapters.hf_transformers:open_engine",
}


@dataclass(frozen=True)
class EngineSpec:
    kind: str  # "ours" | "llamacpp" | "scheme" (an ENGINE_SCHEMES entry)
    backend: str | None = None  # ours: the backend; scheme: the scheme
    target: str = ""  # scheme: the text after the first ':' (case kept: paths, commands)

    @property
    def name(self) -> str:
        if self.kind == "scheme":
            return f"{self.backend}:{self.target}"
        return f"ours:{self.backend}" if self.kind == "ours" else "llamacpp"

    @property
    def is_reference(self) -> bool:
        return self.kind == "llamacpp"

    @property
    def backend_label(self) -> str:
        """The ``backend`` column of llama-bench's table: llama.cpp's CPU build prints ``CPU``."""
        return "CPU" if self.kind == "llamacpp" else str(self.backend)


def parse_engine_spec(text: str) -> EngineSpec:
    scheme, sep, target = (text or "").strip().partition(":")
    if sep and scheme.lower() in ENGINE_SCHEMES:
        return EngineSpec("scheme", scheme.lower(), target.strip())
    value = (text or "").strip().lower()
    if value in ("llamacpp", "llama.cpp", "llama_cpp", "llama-cpp"):
        return EngineSpec("llamacpp")
    if value.startswith("ours:"):
        backend = value.split(":", 1)[1]
        if backend in OUR_BACKENDS:
            return EngineSpec("ours", backend)
    raise GGUFParityError(f"unknown engine '{text}'; choose one of: {', '.join(ENGINE_CHOICES)}, "
                          + ", ".join(f"{scheme}:..." for scheme in ENGINE_SCHEMES))


def check_numerics(numerics: str) -> str:
    if numerics not in NUMERICS_CHOICES:
        raise GGUFParityError(f"unknown numerics '{numerics}'; choose one of: {', '.join(NUMERICS_CHOICES)}")
    return numerics


def import_engine_modules(spec: EngineSpec) -> None:
    """Import what the engine needs (timed separately from loading the model in cold starts)."""
    if spec.kind == "llamacpp":
        _import("validation.llamacpp", "llama.cpp adapter (validation.llamacpp)")
        return
    if spec.kind == "scheme":
        _scheme_factory(spec.backend)
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


def _scheme_factory(scheme: str):
    module, _, attr = ENGINE_SCHEMES[scheme].partition(":")
    return getattr(_import(module, f"the '{scheme}:' engine ({module})"), attr)


def _backend_import_message(backend: str, exc: BaseException) -> str:
    hint = " (pip install 'gguf-parity[mlx]')" if backend == "mlx" else ""
    return f"backend '{backend}' cannot be imported{hint}: {exc}"


def engine_settings(spec: EngineSpec, *, n_threads: int | None, n_ctx: int, numerics: str,
                    n_batch: int = LLAMA_BENCH_N_BATCH) -> dict[str, Any]:
    """The settings :func:`make_engine` uses for ``spec`` (recorded with every result)."""
    if spec.kind == "scheme":
        return {"engine": spec.name, "backend": spec.backend, "numerics": numerics, "n_threads": n_threads,
                "n_ctx": n_ctx, "n_batch": n_batch}
    if spec.kind == "llamacpp":
        return {
            "engine": spec.name, "backend": "CPU", "numerics": "ggml", "n_threads": n_threads, "n_ctx": n_ctx,
            "n_batch": n_batch, "n_ubatch": n_batch, "type_k": LLAMA_BENCH_KV_TYPE,
            "type_v": LLAMA_BENCH_KV_TYPE, "flash_attn": LLAMA_BENCH_FLASH_ATTN,
            "flash_attn_note": "llama-bench default AUTO, which resolves to enabled on CPU",
            "extra_bufts": LLAMACPP_EXTRA_BUFTS,
        }
    return {
        "engine": spec.name, "backend": spec.backend, "numerics": numerics, "n_threads": n_threads, "n_ctx": n_ctx,
        "n_batch": n_batch, "n_ubatch": n_batch, "type_k": OUR_DEFAULT_KV_TYPE, "type_v": OUR_DEFAULT_KV_TYPE,
        "flash_attn": False,
    }


def make_engine(spec: EngineSpec | str, model: str | Path, *, n_threads: int | None = None, n_ctx: int = 2048,
                numerics: str = "f32", n_batch: int = LLAMA_BENCH_N_BATCH, **options):
    """Construct the engine ``spec`` on ``model`` (a named model or a path). ``n_threads=None``: engine default.
    ``options`` (``--engine-opt`` pairs) go to a scheme's factory only."""
    if isinstance(spec, str):
        spec = parse_engine_spec(spec)
    check_numerics(numerics)
    from inference_engine.registry import resolve_model

    path = resolve_model(str(model), progress=False)
    import_engine_modules(spec)
    if spec.kind == "scheme":
        return _scheme_factory(spec.backend)(spec.target, str(path), n_threads=n_threads, n_ctx=n_ctx,
                                             numerics=numerics, n_batch=n_batch, **options)
    if spec.kind == "llamacpp":
        from validation.llamacpp import LlamaCppEngine

        try:
            return LlamaCppEngine(
                str(path), n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, kv_type=LLAMA_BENCH_KV_TYPE,
                flash_attn=LLAMA_BENCH_FLASH_ATTN, extra_bufts=LLAMACPP_EXTRA_BUFTS,
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
