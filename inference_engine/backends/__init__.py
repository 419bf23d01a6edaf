"""Backends by name: ``get_backend("numpy" | "numba" | "mlx", numerics, n_threads, device)``.

Each backend lives in its own module and is imported only when asked for, so a missing optional library (numba,
mlx) only matters to someone who picks that backend, and then as one line saying what to install. A new backend is
one module with a :class:`Backend` subclass plus one line: ``BACKENDS.register("name", "module:Class",
needs="package", install="pip install package")`` (``gpu=True`` for one that may compute on a GPU: it then says
which devices it has here, :meth:`Backend.devices`).
"""

from __future__ import annotations

import importlib.util

from inference_engine.backends.base import DEVICES, KV_TYPES, Backend, choose_device, cpu_only_reason
from inference_engine.errors import GGUFParityError
from inference_engine.registries import NUMERICS, Registry, check_numerics

__all__ = ["BACKENDS", "DEVICES", "KV_TYPES", "NUMERICS", "Backend", "backend_names", "backend_numerics",
           "backend_unavailable", "get_backend", "resolve_device"]

# name -> "module:class"; ``needs``: the third-party package the module imports, ``install``: what to run without it.
BACKENDS: Registry[type[Backend]] = Registry("backend", {
    "numpy": "inference_engine.backends.numpy_ref:NumpyBackend",
    "numba": "inference_engine.backends.numba_cpu:NumbaBackend",
    "mlx": "inference_engine.backends.mlx_backend:MLXBackend",
}, base=Backend, listing="supported", meta={
    "numpy": {"needs": "numpy", "install": "pip install numpy", "help": "NumPy reference ops"},
    "numba": {"needs": "numba", "install": "pip install numba", "help": "Numba CPU kernels, the fast CPU path"},
    "mlx": {"needs": "mlx", "install": "pip install 'gguf-parity[mlx]' (NVIDIA GPUs: 'gguf-parity[cuda]')",
            "help": "MLX: Metal on Apple silicon, CUDA on NVIDIA, or its CPU build", "gpu": True,
            "numerics": ("f32",)},
})


def backend_numerics(name: str) -> tuple[str, ...] | None:
    """The numerics a backend computes in, where it has fewer than all (MLX: f32 only), else None; read from the
    registry, without importing the backend."""
    try:
        return BACKENDS.info(BACKENDS.validate(name)).get("numerics")
    except GGUFParityError:
        return None  # an unknown backend: refused, naming the known ones, where it is loaded


def backend_names() -> tuple[str, ...]:
    return BACKENDS.names()


def backend_module(name: str) -> str:
    """The module a backend lives in (imported on its own in cold starts)."""
    return str(BACKENDS.target(name)).partition(":")[0]


def backend_unavailable(name: str) -> str | None:
    """Why backend ``name`` cannot be used here (its module or its library is not installed), or None.

    Answers without importing the backend (``find_spec`` only), so ``engines list`` stays fast."""
    module = backend_module(name)
    if importlib.util.find_spec(module) is None:
        return f"{module} is not part of this installation"
    needs = BACKENDS.info(name).get("needs")
    if needs and importlib.util.find_spec(needs) is None:
        return f"needs the {needs} package: {BACKENDS.info(name).get('install', 'pip install ' + needs)}"
    return None


def get_backend_class(name: str) -> type[Backend]:
    """The backend's class, imported now; missing libraries raise :class:`GGUFParityError`."""
    key = BACKENDS.validate(name)
    info = BACKENDS.info(key)
    needs, install = info.get("needs", ""), info.get("install", "")
    try:
        return BACKENDS.get(key)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if needs and missing.split(".")[0] == needs:
            raise GGUFParityError(f"backend '{name}' needs the {needs} package: {install}") from None
        raise
    except GGUFParityError as exc:
        if "no module named" in str(exc):
            raise GGUFParityError(
                f"backend '{name}' is not part of this installation ({backend_module(key)} missing)") from None
        raise
    except ImportError as exc:  # the package is there but its native library would not load
        raise GGUFParityError(f"backend '{name}' could not load {needs}: {exc}") from None


def get_backend(name: str = "numpy", numerics: str = "f32", n_threads: int | None = None,
                device: str | None = None) -> Backend:
    """A ready backend on ``device`` (``gpu`` | ``cpu``; None: the backend's default, the GPU where MLX has one);
    unknown names / numerics / devices, a device the backend cannot use here and missing libraries raise
    :class:`GGUFParityError`. The device is handed to the constructor only when it is not the backend's default,
    so a CPU-only backend keeps the two-argument constructor."""
    BACKENDS.validate(name)
    check_numerics(numerics)
    if n_threads is not None and n_threads < 1:
        raise GGUFParityError(f"--threads must be at least 1, got {n_threads}")
    cls = get_backend_class(name)
    device = cls.check_device(device)
    chosen = {} if device == cls.devices()[0] else {"device": device}
    return cls(numerics=numerics, n_threads=n_threads, **chosen)


def resolve_device(name: str, device: str | None = None) -> str:
    """The device backend ``name`` computes on for ``--device device`` (None: its default), checked as
    :func:`get_backend` checks it, without building the backend. A backend registered without ``gpu=True`` is
    CPU-only and answers without being imported."""
    key = BACKENDS.validate(name)
    if not BACKENDS.info(key).get("gpu"):
        return choose_device(device, ("cpu",), lambda: cpu_only_reason(key))
    return get_backend_class(key).check_device(device)
