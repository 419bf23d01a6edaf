"""Where the MLX backend computes (``--device gpu|cpu``), which GPU that is, and float32 that stays float32.

**Devices.** MLX has one GPU backend per build: Metal on Apple silicon (``pip install -e ".[mlx]"``), CUDA on NVIDIA
(``".[cuda]"``: MLX's CUDA build), none in its Linux CPU build (``".[mlx]"`` on Linux). :func:`available` lists the
devices of this process, the GPU first when MLX has one (the default), then ``cpu``; :func:`select` makes the chosen
one MLX's default device for this process (MLX builds every op on its default device, so one process computes on
one device: the last MLX backend made chooses it) and returns a :class:`Placement`: the device, the GPU's name,
memory and architecture from ``mx.device_info`` (CUDA: ``device_name``, ``architecture`` such as ``sm_90``,
``total_memory``; Metal: ``device_name``, ``architecture``, ``memory_size``), and how float32 matrix products are
computed there. ``--device gpu`` where MLX has no GPU is one line naming what there is and what to install.

**float32 on the GPU: MLX_ENABLE_TF32.** MLX runs float32 matrix products at reduced precision where the hardware
has matrix units, unless the environment variable ``MLX_ENABLE_TF32`` is ``0`` (MLX's docs, "Numerical Precision").
In MLX 0.32's sources (``mlx/utils.h``: ``env::enable_tf32()``, default 1):

* CUDA: ``matmul`` through cuBLASLt with compute type ``CUBLAS_COMPUTE_32F_FAST_TF32`` (``CUBLAS_COMPUTE_32F`` when
  it is 0): inputs rounded to TF32's 10-bit mantissa, products summed in float32 (``gemms/cublas_gemm.cpp``); the
  same flag picks the TF32 tensor-core paths of grouped GEMMs and cuDNN convolutions. Float32 attention on CUDA
  (cuDNN's fused kernel takes float16/bfloat16 only) is MLX's unfused ``q @ k.T`` / softmax / ``@ v`` for a prompt,
  so it goes through the same cuBLASLt path. Matrix-vector products (one token) use MLX's own FMA kernel, and
  ``quantized_matmul`` with float32 activations MLX's FMA kernels (cutlass ``UniversalFMA<float>``): full float32
  either way. Seen on an H200 with the default: errors ~1e-2 on values ~20 in a float32 matmul test whose bound
  is 1e-5 relative.
* Metal: on GPUs with neural accelerators (``metal::is_nax_available()``) float32 ``matmul``,
  ``quantized_matmul`` and attention take the NAX kernels, at reduced precision, unless the flag is 0.

MLX reads the variable once, at its first float32 matrix product on the GPU (a function-local static), so it must
be in the environment before that (importing ``mlx.core`` reads nothing). Importing this module (the MLX backend
does, when it is imported) sets ``MLX_ENABLE_TF32=0`` unless the environment already names a value; child processes
inherit it. Our ``f32`` numerics are float32, so :func:`select` refuses the GPU when the value is not ``0`` (one
line: how to start the process), and checks what MLX actually does with one small product
(:func:`float32_matmul_error`): if this process ran a float32 product on the GPU before the variable was set (a
script that used MLX first), MLX keeps TF32 for the whole process, and the check refuses with the line that says
so. The check's error and the variable are recorded in every result's provenance (:meth:`Placement.as_dict`).

MLX is imported inside the functions only, so the package imports without MLX and a CPU-only run never loads it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.backends.base import DEVICES
from inference_engine.errors import GGUFParityError

TF32_ENV = "MLX_ENABLE_TF32"
# What the process's environment said before this module set its default (None: nothing), for the record.
TF32_GIVEN: str | None = os.environ.get(TF32_ENV)
os.environ.setdefault(TF32_ENV, "0")  # before MLX's first float32 product on a GPU (see the module docstring)

INSTALL_GPU = 'for NVIDIA GPUs install MLX\'s CUDA build (pip install -e ".[cuda]"), on Apple silicon ".[mlx]"'

# The check of float32 products: (M, K) @ (K, N) of standard normal values, full mantissas (TF32 rounds them).
PROBE_M, PROBE_K, PROBE_N = 64, 64, 64
# Any float32 product summed in any order stays within gamma_K = K*u / (1 - K*u) of sum |a||b| per element
# (Higham, Accuracy and Stability of Numerical Algorithms, 3.1; u = 2^-24, float32's unit roundoff). K = 64:
# 3.8e-6. TF32 keeps 11 significant bits of each input (relative 2^-11 = 4.9e-4): these inputs so rounded give a
# worst element 49x past the bound, where MLX's CPU build gives 0.04 of it: the bound tells the two apart.
_UNIT_ROUNDOFF = 2.0**-24
FLOAT32_BOUND = PROBE_K * _UNIT_ROUNDOFF / (1 - PROBE_K * _UNIT_ROUNDOFF)

_selected: Placement | None = None  # the placement of the last MLX backend made in this process


@dataclass(frozen=True)
class Placement:
    """Where an MLX backend computes. ``device``: ``gpu`` | ``cpu``; ``gpu_backend``: ``cuda`` | ``metal`` on the
    GPU, None on the CPU; ``name``, ``memory_bytes``, ``architecture``: what ``mx.device_info`` says of that
    device; ``float32_matmul_error``: :func:`float32_matmul_error` there, as a fraction of :data:`FLOAT32_BOUND`
    (at most 1: float32); ``tf32_env``: ``MLX_ENABLE_TF32`` as MLX reads it."""

    device: str
    gpu_backend: str | None
    name: str
    memory_bytes: int | None
    architecture: str | None
    float32_matmul_error: float
    tf32_env: str | None

    def label(self) -> str:
        """``NVIDIA H200, 139.8 GiB (CUDA sm_90)`` or ``CPU (MLX's CPU build)``: what reports print."""
        if self.device == "cpu":
            return f"CPU ({self.name})" if self.name else "CPU"
        memory = f", {self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else ""
        backend = {"cuda": "CUDA", "metal": "Metal"}.get(self.gpu_backend or "", self.gpu_backend or "GPU")
        arch = f" {self.architecture}" if self.architecture else ""
        return f"{self.name}{memory} ({backend}{arch})"

    def float32_note(self) -> str:
        return (
            f"float32 matmuls (MLX_ENABLE_TF32={self.tf32_env}; checked: error "
            f"{self.float32_matmul_error:.2g} of float32's bound)"
        )

    def as_dict(self) -> dict[str, Any]:
        """The record in results: every field, the label, and the float32 note."""
        return {
            "device": self.device,
            "gpu_backend": self.gpu_backend,
            "name": self.name,
            "memory_bytes": self.memory_bytes,
            "architecture": self.architecture,
            "label": self.label(),
            "float32_matmul": self.float32_note(),
            "float32_matmul_error": self.float32_matmul_error,
            "mlx_enable_tf32": self.tf32_env,
        }


def gpu_backend() -> str | None:
    """``cuda`` or ``metal``: the GPU backend of the installed MLX build, where it sees a GPU; None otherwise."""
    import mlx.core as mx

    if not mx.is_available(mx.gpu):
        return None
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "cuda"
    metal = getattr(mx, "metal", None)
    return "metal" if metal is not None and metal.is_available() else "gpu"


def available() -> tuple[str, ...]:
    """The devices MLX can compute on in this process, the default first: ``("gpu", "cpu")`` or ``("cpu",)``."""
    return ("gpu", "cpu") if gpu_backend() is not None else ("cpu",)


def no_gpu_reason() -> str:
    """Why ``--device gpu`` cannot run here, for the one-line refusal."""
    import mlx.core as mx

    return f"MLX {mx.__version__} here has no GPU (its CPU build); {INSTALL_GPU}"


def select(device: str) -> Placement:
    """Make ``device`` (``gpu`` | ``cpu``, one of :func:`available`) MLX's default device for this process, check
    that float32 products are float32 there, and return its :class:`Placement` (also kept for provenance:
    :func:`selected`). A device that is not available, or a GPU on which float32 would not be float32, is one line
    (:class:`GGUFParityError`)."""
    global _selected
    import mlx.core as mx

    if device not in DEVICES:
        raise GGUFParityError(f"unknown device '{device}'; supported: {', '.join(DEVICES)}")
    backend = gpu_backend()
    if device == "gpu" and backend is None:
        raise GGUFParityError(f"--device gpu: {no_gpu_reason()}; available: cpu")
    tf32 = os.environ.get(TF32_ENV)
    if device == "gpu" and not tf32_off(tf32):
        raise GGUFParityError(
            f"{TF32_ENV}={tf32} lets MLX round float32 matmuls on the GPU to TF32, which is not "
            f"our f32 numerics; start the process with {TF32_ENV}=0 (or without it)"
        )
    target = mx.gpu if device == "gpu" else mx.cpu
    mx.set_default_device(target)
    error = float32_matmul_error(target) / FLOAT32_BOUND
    if error > 1.0:
        raise GGUFParityError(
            f"MLX's float32 matmuls on this {device} are not float32 (error {error:.0f}x float32's bound): this "
            f"process ran MLX on the GPU before {TF32_ENV}=0 was set, and MLX keeps its first reading; start the "
            f"process with {TF32_ENV}=0, or make the MLX backend before anything else uses MLX"
        )
    info = _device_info(mx, target)
    memory = info.get("total_memory", info.get("memory_size"))
    _selected = Placement(
        device=device,
        gpu_backend=backend if device == "gpu" else None,
        name=str(info.get("device_name") or ("GPU" if device == "gpu" else "")),
        memory_bytes=int(memory) if memory else None,
        architecture=str(info["architecture"]) if info.get("architecture") else None,
        float32_matmul_error=error,
        tf32_env=tf32,
    )
    return _selected


def tf32_off(value: str | None) -> bool:
    """Whether MLX reads ``MLX_ENABLE_TF32=value`` as off: its ``env::get_var`` is C's ``atoi`` (``"0"``,
    ``"00"``, ``""``, ``"no"``: 0), default 1 when unset."""
    if value is None:
        return False
    digits = re.match(r"\s*([+-]?\d+)", value)
    return digits is None or int(digits.group(1)) == 0


def selected() -> Placement | None:
    """The placement of the last MLX backend made in this process (None: none was made)."""
    return _selected


def float32_matmul_error(device) -> float:
    """The largest error of one float32 matmul on ``device`` (an ``mx.Device``), per element as a fraction of
    ``sum |a||b|``, against the exact product (float64 of the same float32 inputs). At most
    :data:`FLOAT32_BOUND` for float32 in any summation order; TF32 is ~80x past it."""
    import mlx.core as mx

    a, b = probe_inputs()
    got = mx.matmul(mx.array(a), mx.array(b), stream=device)
    mx.eval(got)
    return product_error(a, b, np.asarray(got))


def probe_inputs() -> tuple[np.ndarray, np.ndarray]:
    """The check's float32 operands, ``(M, K)`` and ``(K, N)``, the same in every process."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((PROBE_M, PROBE_K)).astype(np.float32)
    b = rng.standard_normal((PROBE_K, PROBE_N)).astype(np.float32)
    return a, b


def product_error(a: np.ndarray, b: np.ndarray, got: np.ndarray) -> float:
    """``max |got - a@b| / (|a|@|b|)`` per element, ``a@b`` exact (float64 of the float32 inputs)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - a64 @ b64) / (np.abs(a64) @ np.abs(b64))))


def _device_info(mx, target) -> dict[str, Any]:
    """``mx.device_info`` (MLX >= 0.29), or ``mx.metal.device_info`` on older Metal builds; {} if neither."""
    try:
        return dict(mx.device_info(target))
    except (AttributeError, TypeError, ValueError, RuntimeError):
        metal = getattr(mx, "metal", None)
        if target == mx.gpu and metal is not None and hasattr(metal, "device_info"):
            return dict(metal.device_info())
        return {}
