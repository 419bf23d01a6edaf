"""``--device gpu|cpu`` for the MLX backend (inference_engine/backends/mlx/device.py): which devices MLX has here, the
placement recorded in results, and float32 matmuls that are float32 on the GPU (``MLX_ENABLE_TF32=0``).

The tests marked ``gpu`` run where MLX has a GPU (Metal, or CUDA with ``.[cuda]``) and are skipped elsewhere with
the reason (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inference_engine.backends import get_backend, resolve_device
from inference_engine.errors import GGUFParityError

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")

from inference_engine.backends.mlx import device  # noqa: E402  (after the skip: it imports nothing of MLX itself)
from validation.provenance import gpu_provenance, machine_label  # noqa: E402

pytestmark = pytest.mark.mlx

REPO = Path(__file__).resolve().parents[4]
TF32_MANTISSA_MASK = 0xFFFFE000  # float32 bits kept by TF32: sign, 8 exponent bits, 10 of the 23 mantissa bits


def tf32(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to TF32 (nearest, ties away: what tensor cores are given), as float32."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(TF32_MANTISSA_MASK)).view(np.float32)


def test_the_bound_tells_float32_from_tf32():
    """The check's bound sits between a float32 product (any summation order) and a TF32 one, with room."""
    a, b = device.probe_inputs()
    float32 = device.product_error(a, b, (a @ b).astype(np.float32)) / device.FLOAT32_BOUND
    pairwise = device.product_error(a, b, np.einsum("ik,kj->ij", a, b).astype(np.float32)) / device.FLOAT32_BOUND
    tf32_products = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)
    reduced = device.product_error(a, b, tf32_products.astype(np.float32)) / device.FLOAT32_BOUND
    assert float32 < 0.25 and pairwise < 0.25  # measured 0.04 .. 0.05
    assert reduced > 20  # measured 49


def test_importing_the_device_module_turns_tf32_off():
    if device.TF32_GIVEN is not None:
        pytest.skip(f"this test process was started with MLX_ENABLE_TF32={device.TF32_GIVEN}")
    assert os.environ[device.TF32_ENV] == "0"


@pytest.mark.parametrize(
    "value, off",
    [(None, False), ("0", True), ("00", True), ("", True), ("no", True), ("1", False), (" 2", False), ("-0", True)],
)
def test_the_variable_is_read_as_mlx_reads_it(value, off):
    assert device.tf32_off(value) is off  # C's atoi, default 1


def test_the_default_is_the_gpu_where_mlx_has_one():
    has_gpu = mx.is_available(mx.gpu)
    assert device.available() == (("gpu", "cpu") if has_gpu else ("cpu",))
    assert resolve_device("mlx") == ("gpu" if has_gpu else "cpu")
    assert resolve_device("numpy") == resolve_device("numba") == "cpu"


def test_the_cpu_placement_is_recorded():
    backend = get_backend("mlx", "f32", device="cpu")
    info = backend.device_info()
    assert backend.device == info["device"] == "cpu" and mx.default_device() == mx.cpu
    assert info["float32_matmul_error"] <= 1.0 and info["mlx_enable_tf32"] == os.environ[device.TF32_ENV]
    assert "CPU" in info["label"] and "float32 matmuls" in info["float32_matmul"]
    assert gpu_provenance() is None  # the engine computed on the CPU: no GPU in the result's machine block


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_cpu_backend_refuses_the_gpu_in_one_line(backend):
    with pytest.raises(GGUFParityError) as exc:
        resolve_device(backend, "gpu")
    assert str(exc.value) == (
        f"--device gpu: backend '{backend}' computes on the CPU only (a GPU: --backend mlx, "
        "where MLX has one); available: cpu"
    )


def test_an_unknown_device_is_one_line():
    with pytest.raises(GGUFParityError, match="unknown device 'tpu'; supported: gpu, cpu"):
        get_backend("mlx", "f32", device="tpu")


@pytest.mark.skipif(mx.is_available(mx.gpu), reason="MLX has a GPU here")
def test_mlx_without_a_gpu_refuses_it_naming_what_to_install():
    with pytest.raises(GGUFParityError) as exc:
        get_backend("mlx", "f32", device="gpu")
    text = str(exc.value)
    assert text.startswith(f"--device gpu: MLX {mx.__version__} here has no GPU") and text.endswith("available: cpu")
    assert '".[cuda]"' in text and "\n" not in text


def test_machine_label_names_the_gpu():
    machine = {"cpu_isa": "Intel Xeon, AVX-512", "gpu": {"label": "NVIDIA H200, 139.8 GiB (CUDA sm_90)"}}
    assert machine_label(machine) == "Intel Xeon, AVX-512; GPU NVIDIA H200, 139.8 GiB (CUDA sm_90)"
    assert machine_label({"cpu_isa": "AMD EPYC, AVX2", "gpu": None}) == "AMD EPYC, AVX2"


# --- on a GPU -------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_the_gpu_placement_names_the_card_and_its_memory():
    backend = get_backend("mlx", "f32")  # the default where MLX has a GPU
    info = backend.device_info()
    assert backend.device == "gpu" and mx.default_device() == mx.gpu
    assert info["gpu_backend"] in ("cuda", "metal") and info["name"] and info["memory_bytes"] > 0
    assert gpu_provenance() == info and info["label"] in machine_label({"cpu_isa": "x", "gpu": info})
    assert info["label"] in backend.description


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 64, 64), (5, 512, 96), (128, 4096, 256)])
def test_float32_matmuls_on_the_gpu_are_float32(shape):
    """What issue 30 saw fail on an H200 (TF32: errors ~1e-2 on values ~20): within float32's bound now, for the
    check's shape, test_matmul[5-F32]'s and a prefill-sized one."""
    get_backend("mlx", "f32", device="gpu")
    m, k, n = shape
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = np.asarray(mx.matmul(mx.array(a), mx.array(b)))
    bound = k * 2.0**-24 / (1 - k * 2.0**-24)  # gamma_k, as device.FLOAT32_BOUND for k
    assert device.product_error(a, b, got) <= bound


@pytest.mark.gpu
def test_the_gpu_is_refused_when_tf32_is_asked_for(monkeypatch):
    monkeypatch.setenv(device.TF32_ENV, "1")
    with pytest.raises(GGUFParityError, match="MLX_ENABLE_TF32=1 lets MLX round float32 matmuls on the GPU to TF32"):
        get_backend("mlx", "f32", device="gpu")


@pytest.mark.gpu
def test_a_process_that_used_tf32_first_is_refused():
    """MLX keeps its first reading of MLX_ENABLE_TF32: a process that ran a float32 matmul on the GPU with it on
    keeps TF32 even once it is 0; the check sees it and refuses (CUDA: cuBLASLt's TF32 path; a Metal GPU without
    neural accelerators has no TF32 path to see)."""
    if device.gpu_backend() != "cuda":
        pytest.skip("a TF32 path is certain on CUDA only")
    script = (
        "import os, mlx.core as mx\n"
        "x = mx.random.normal((256, 256)); mx.eval(x @ x)\n"
        "os.environ['MLX_ENABLE_TF32'] = '0'\n"
        "from inference_engine.backends import get_backend\n"
        "get_backend('mlx', 'f32', device='gpu')\n"
    )
    env = {**os.environ, "MLX_ENABLE_TF32": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0 and "are not float32" in proc.stderr, proc.stderr[-2000:]
