"""The residual add + RMSNorm GPU kernel (``gpu_kernels/kernel_add_rms_norm.inc``, ``backends/mlx/norm_kernel.py``).

* Where a C++20 compiler exists: the kernel's own files compiled for the host with ``dialect_host.h`` and run for
  every thread of its grid: the sum bit for bit NumPy's float32 add, the normed rows within the float32 error bound
  of the kernel's sums against a float64 reference (rows whose length is not a multiple of the threadgroup, of a
  SIMD group, or shorter than the threadgroup).
* Where NVRTC is installed (no GPU needed): the CUDA text as MLX compiles it.
* The layer's wiring, with a stand-in for the kernel on MLX's CPU build (no GPU): each pre-norm layer hands its
  residual add and ``ffn_norm`` to it where nothing taps, and the logits stay the plain path's.
* On a GPU (marked ``gpu``): the kernel through MLX against the same reference, and compiled steps with it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

EPS = 1e-6
SHAPES = [(1, 1536), (3, 576), (2, 100), (1, 2055), (2, 96)]  # rows x n: the 1.5B's and the 135M's widths; odd ones
F32_EPS = float(np.finfo(np.float32).eps)

SHIM = r"""
#include "dialect_host.h"
#include "add_rms_norm.h"

static void body(const float* a, const int* a_shape, const float* b, const float* w, const float* eps, float* residual,
                 float* normed, unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {
#include "kernel_add_rms_norm.inc"
}

extern "C" void host_add_rms_norm(const float* a, const float* b, const float* w, int rows, int n, float eps,
                                  float* residual, float* normed) {
    const int a_shape[2] = {rows, n};
    gq_host_launch((unsigned int)rows, 1, GQ_NORM_THREADS, [&](unsigned int tid, unsigned int gx, unsigned int gy) {
        body(a, a_shape, b, w, &eps, residual, normed, tid, gx, gy);
    });
}
"""


def error_bound(n: int, threads: int) -> float:
    """The kernel's largest relative error on an element of the normed row, in float32 epsilons, from its order of
    operations: a thread sums ceil(n / threads) squares one after another, its SIMD group's 32 sums are added (the
    host in lane order: at most 31 roundings), then the 8 groups' (7): the sum of squares is within that many eps;
    the scale, a square root of it, within half of it plus the mean's division, the eps's add, the square root and the
    reciprocal (4); the two products after it (2)."""
    sum_roundings = -(-n // threads) + 31 + 7
    return (0.5 * sum_roundings + 4 + 2) * F32_EPS


def reference(a: np.ndarray, b: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The sum in float32 (what the kernel must write bit for bit), its norm in float64 from that sum."""
    s = a + b
    s64 = s.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(s64 * s64, axis=1, keepdims=True) + np.float64(np.float32(eps)))
    return s, s64 * scale * w.astype(np.float64)


def case(rows: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, n)).astype(np.float32) * np.float32(3)
    b = rng.standard_normal((rows, n)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    return a, b, w


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory, pytestconfig):
    from test_mlx_block_kernels import build_host_library

    return build_host_library(tmp_path_factory.mktemp("norm_kernel_host"), SHIM, pytestconfig)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def host_threads() -> int:
    from test_mlx_block_kernels import KERNEL_DIR

    text = (KERNEL_DIR / "add_rms_norm.h").read_text()
    return int(text.split("#define GQ_NORM_THREADS ")[1].split()[0])


@pytest.mark.parametrize("rows, n", SHAPES)
def test_host_kernel_is_the_reference(host_kernel, rows, n):
    a, b, w = case(rows, n, seed=rows * 10_000 + n)
    total = np.full(a.shape, np.nan, dtype=np.float32)
    normed = np.full(a.shape, np.nan, dtype=np.float32)
    host_kernel.host_add_rms_norm(_ptr(a), _ptr(b), _ptr(w), rows, n, ctypes.c_float(EPS), _ptr(total), _ptr(normed))
    s, expected = reference(a, b, w, EPS)
    np.testing.assert_array_equal(total, s)
    assert np.all(np.abs(normed - expected) <= error_bound(n, host_threads()) * np.abs(expected))


def test_host_kernel_rows_are_their_own(host_kernel):
    """Each threadgroup norms its own row: a row scaled by 1000 leaves the others' norms as they were."""
    a, b, w = case(3, 576, seed=5)
    outs = []
    for scale in (1.0, 1000.0):
        a2 = a.copy()
        a2[1] *= np.float32(scale)
        total, normed = np.empty_like(a), np.empty_like(a)
        host_kernel.host_add_rms_norm(_ptr(a2), _ptr(b), _ptr(w), 3, 576, ctypes.c_float(EPS), _ptr(total),
                                      _ptr(normed))
        outs.append(normed)
    np.testing.assert_array_equal(outs[0][[0, 2]], outs[1][[0, 2]])
    assert not np.allclose(outs[0][1], outs[1][1])


# --- with MLX --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nk():
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends.mlx import norm_kernel

    return norm_kernel


@pytest.mark.mlx
def test_kernel_text_for_each_dialect(nk):
    from test_mlx_block_kernels import assert_kernel_text

    from inference_engine.backends.mlx import block_kernels as bk

    for dialect in bk.DIALECTS:
        head = bk.own_header(dialect, *nk.HEADERS)
        assert "GQ_NORM_THREADS" in head and "GQ_SQRT" in head
        assert_kernel_text(dialect, head, bk.source(dialect, nk.KIND), "kernel_add_rms_norm.inc")
    assert nk.THREADS == host_threads() == 256


@pytest.mark.mlx
def test_supports_rows_of_one_shape_with_a_weight(nk):
    import mlx.core as mx

    x, w = mx.zeros((2, 8)), mx.ones((8,))
    assert nk.supports(x, x, w)
    assert not nk.supports(x, x, None)  # no weight: MLX's rms_norm
    assert not nk.supports(x, mx.zeros((8,)), w)  # a broadcast add
    assert not nk.supports(x, x, mx.ones((4,))) and not nk.supports(mx.zeros((1, 2, 8)), mx.zeros((1, 2, 8)), w)
    assert not nk.supports(x.astype(mx.float16), x.astype(mx.float16), w)


@pytest.mark.mlx
def test_cuda_text_compiles_with_nvrtc(nk):
    from test_mlx_block_kernels import compile_with_nvrtc, cuda_kernel_text, find_nvrtc

    from inference_engine.backends.mlx import block_kernels as bk

    lib = find_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC here (pip install nvidia-cuda-nvrtc, or MLX's CUDA build, to compile the CUDA kernels)")
    inputs = [("a", "float"), ("b", "float"), ("w", "float"), ("eps", "float")]
    text = cuda_kernel_text("add_rms_norm", bk.own_header(bk.CUDA, *nk.HEADERS), bk.source(bk.CUDA, nk.KIND),
                            inputs, {}, output=["residual", "normed"])
    compile_with_nvrtc(ctypes.CDLL(str(lib)), text, "add_rms_norm")


@pytest.mark.mlx
@pytest.mark.parametrize("arch", ["llama", "gemma3", "phi3"])  # ffn_inp; gemma's sa_out after its sandwich norm; phi3
def test_each_layer_hands_its_add_and_norm_to_the_kernel(tiny_model, monkeypatch, nk, arch):
    """With the switch on and a kernel dialect (stood in for here: no GPU), every layer's residual add and ffn_norm
    go to the kernel where nothing taps (prefill and compiled decode steps alike), and so does each pre-norm layer's
    last add with the next layer's attn_norm (the last layer's with the output norm); a stand-in computing what the
    kernel computes leaves the logits the plain path's."""
    import mlx.core as mx
    from test_mlx_steps import STEP_REL_TOL, engine, logits_rows, rel

    from inference_engine.backends.mlx import block_kernels as bk

    path = tiny_model(arch, "Q8_0")
    calls = []

    def run(on: bool):
        e = engine(path, "compiled")
        b = e.backend

        def stand_in(dialect, a, x, weight, eps):
            calls.append((dialect, id(weight), eps, a.shape))
            total = a + x
            return total, mx.fast.rms_norm(total, weight, eps)

        monkeypatch.setattr(b, "norm_kernel", on)
        if on:
            monkeypatch.setattr(b, "kernels", bk.CUDA)  # the weights were prepared without it (MLX's CPU forms)
            monkeypatch.setattr(nk, "add_rms_norm", stand_in)
        return logits_rows(e), e

    plain, _ = run(False)
    assert calls == []
    got, e = run(True)
    n_layer, layers = e.model.hp.n_layer, e.model.layers
    norms = {id(layer.ffn_norm) for layer in layers}
    chained = arch != "phi3"  # phi3's layer is not a pre-norm layer: its norms are not chained
    if chained:
        norms |= {id(layer.attn_norm) for layer in layers[1:]} | {id(e.model.output_norm)}
    assert {c[0] for c in calls} == {bk.CUDA} and {c[1] for c in calls} == norms
    assert {c[2] for c in calls} == {float(e.model.hp.rms_eps)}
    # the prompt's prefill once or twice a layer (the last layer's on its output row only: llama.cpp's
    # inp_out_ids), then the decode steps' single rows
    assert sum(c[3][0] > 1 for c in calls) == (2 if chained else 1) * (n_layer - 1)
    assert len(calls) > (2 if chained else 1) * n_layer
    assert "a residual add and the RMSNorm after it one kernel of ours" in e.backend.description
    assert e.backend.switches["norm_kernel"] is True
    assert rel(got, plain) <= STEP_REL_TOL


@pytest.mark.mlx
def test_a_tapped_forward_runs_the_two_ops(tiny_model, monkeypatch, nk):
    """A tap may replace the sum (teacher forcing), so a tapped forward never hands the add and norm to the kernel,
    and still taps ffn_inp and ffn_norm."""
    from inference_engine.backends.mlx import block_kernels as bk
    from inference_engine.engine import OurEngine

    e = OurEngine(tiny_model("llama", "Q8_0"), backend="mlx", n_ctx=64)
    monkeypatch.setattr(e.backend, "norm_kernel", True)
    monkeypatch.setattr(e.backend, "kernels", bk.CUDA)
    monkeypatch.setattr(nk, "add_rms_norm", lambda *a: pytest.fail("a tapped forward used the kernel"))
    seen = []

    def tap(name, value):
        seen.append(name)
        return value

    e.model.forward(np.array([3, 4, 5]), np.arange(3), e.cache, tap=tap)
    assert "ffn_inp-0" in seen and "ffn_norm-0" in seen


def test_off_by_default_and_the_ops_without_gpu_kernels(tiny_model):
    """NORM_KERNEL_DEFAULTS: nowhere yet; switched on where the backend has no kernels (the CPU), the add and norm
    are MLX's ops."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    import mlx.core as mx

    from inference_engine.backends import mlx_backend

    assert mlx_backend.NORM_KERNEL_DEFAULTS == {}
    b = mlx_backend.MLXBackend(device="cpu")
    b.norm_kernel = True
    x, y, w = mx.array([[1.0, -2.0, 3.0]]), mx.array([[0.5, 0.5, 0.5]]), mx.array([1.0, 2.0, 0.5])
    total, normed = b.add_rms_norm(x, y, w, EPS)
    assert np.array_equal(np.array(total), np.array(x + y))
    assert np.array_equal(np.array(normed), np.array(mx.fast.rms_norm(x + y, w, EPS)))
    assert b.switches["norm_kernel"] is False


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n", SHAPES)
def test_gpu_kernel_is_the_reference(nk, rows, n):
    """On a GPU the SIMD sums run as a butterfly (log2 32 = 5 roundings, fewer than the host's 31) and NVRTC may
    fuse a multiply-add: within the host's bound."""
    import mlx.core as mx

    from inference_engine.backends.mlx import block_kernels as bk

    if not mx.is_available(mx.gpu) or bk.gpu_dialect() is None:
        pytest.skip(f"MLX {mx.__version__} has no GPU here: our kernels run on Metal or CUDA only")
    a, b, w = case(rows, n, seed=rows * 10_000 + n)
    total, normed = nk.add_rms_norm(bk.gpu_dialect(), mx.array(a), mx.array(b), mx.array(w), EPS)
    s, expected = reference(a, b, w, EPS)
    np.testing.assert_array_equal(np.array(total), s)
    assert np.all(np.abs(np.array(normed) - expected) <= error_bound(n, nk.THREADS) * np.abs(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_gpu_compiled_steps_with_the_norm_kernel(tiny_model, arch):
    """On a GPU, compiled steps with the norm kernel against the same steps without it (the squares summed in
    another order: test_mlx_steps' band for two float32 paths)."""
    from test_mlx_steps import STEP_REL_TOL, engine, logits_rows, rel

    path = tiny_model(arch, "Q8_0")
    rows = []
    for on in (False, True):
        e = engine(path, "compiled")
        e.backend.norm_kernel = on
        rows.append(logits_rows(e))
    assert rel(rows[1], rows[0]) <= STEP_REL_TOL
