"""The Metal kernels for Q2_K / Q3_K / Q6_K.

Two levels:

* Everywhere a C++ compiler exists: the kernels' decoding helpers (metal_kernels/kquant16_decode.metal, written in
  the part of the Metal Shading Language that is also C++) are compiled for the host with a few typedefs and must
  reproduce gguf-py's dequantization (= libggml's dequantize_row) bit for bit, and the 32-lane dot product the
  matvec kernel runs must give the row's dot product.
* On Apple silicon (``mx.metal.is_available()``): the real kernels through ``mx.fast.metal_kernel`` against the
  exact fallback (dequantized float32 weights). Skipped elsewhere, with that reason.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import quant_for

KERNEL_TYPES = (T.Q2_K, T.Q3_K, T.Q6_K)
N_ROWS, N_COLS = 24, 768  # three 256-value blocks per row
# A float32 dot product of 768 terms in another order (32 lanes, then their sum) against float64: relative to
# sum |w*x|, a few 1e-7.
DOT_RTOL = 1e-5
# Matvec on the GPU against float32 matmul of the dequantized weight: the same bound.
MATVEC_RTOL = 1e-5

SHIM = r"""
// Host build of the Metal decoding helpers: the MSL names they use, in C++.
#include <cstdint>
typedef unsigned int uint;
typedef _Float16 half;
#define device
#include "kquant16_decode.metal"

#define EXPORT(prefix, BYTES)                                                                    \
extern "C" void prefix##_values(const uint8_t* rows, int n_blocks, float* out) {                \
    for (int b = 0; b < n_blocks; ++b)                                                          \
        for (uint i = 0; i < KQ_QK; ++i) out[b * KQ_QK + i] = prefix##_value(rows + b * BYTES, i); \
}                                                                                               \
extern "C" float prefix##_row_dot(const uint8_t* row, const float* x, int n_blocks) {           \
    float lanes[32] = {0};                                                                      \
    for (int b = 0; b < n_blocks; ++b)                                                          \
        for (uint lane = 0; lane < 32; ++lane)                                                  \
            lanes[lane] += prefix##_dot8(row + b * BYTES, lane, x + b * KQ_QK + 8 * lane);      \
    float acc = 0.0f;                                                                           \
    for (uint lane = 0; lane < 32; ++lane) acc += lanes[lane];                                  \
    return acc;                                                                                 \
}
EXPORT(q2_k, Q2_K_BYTES)
EXPORT(q3_k, Q3_K_BYTES)
EXPORT(q6_k, Q6_K_BYTES)
"""


def random_rows(qtype: T, rng: np.random.Generator) -> np.ndarray:
    """Random blocks with f16 scales of random sign (so that signed zeros and negative scales are covered)."""
    quant = quant_for(qtype)
    rows = quant.random_rows(N_ROWS, N_COLS, rng)
    blocks = rows.reshape(-1, quant.type_size)
    for off in quant.f16_scale_offsets:
        blocks[:, off + 1] ^= (rng.integers(0, 2, len(blocks)) * 0x80).astype(np.uint8)
    return rows


@pytest.fixture(scope="module")
def host_helpers(tmp_path_factory):
    import inference_engine.backends

    kernel_dir = Path(inference_engine.backends.__file__).parent / "metal_kernels"
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the Metal decoding helpers for the host")
    build = tmp_path_factory.mktemp("metal_host")
    (build / "shim.cpp").write_text(SHIM)
    lib = build / "libkquant16.so"
    cmd = [
        compiler,
        "-std=c++17",
        "-O1",
        "-fno-strict-aliasing",
        "-shared",
        "-fPIC",
        f"-I{kernel_dir}",
        str(build / "shim.cpp"),
        "-o",
        str(lib),
    ]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0 and "_Float16" in done.stderr:
        pytest.skip(f"{compiler} has no _Float16 (the host stand-in for Metal's half)")
    assert done.returncode == 0, done.stderr
    return ctypes.CDLL(str(lib))


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_decoding_helpers_equal_ggml_bit_for_bit(host_helpers, qtype):
    rng = np.random.default_rng(int(qtype))
    rows = random_rows(qtype, rng)
    n_blocks = rows.size // quant_for(qtype).type_size
    out = np.empty(n_blocks * 256, dtype=np.float32)
    fn = getattr(host_helpers, f"{qtype.name.lower()}_values")
    fn(rows.ctypes.data_as(ctypes.c_void_p), n_blocks, out.ctypes.data_as(ctypes.c_void_p))
    expected = gguf_quants.dequantize(rows, qtype).reshape(-1)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_matvec_lane_split_gives_the_row_dot(host_helpers, qtype):
    rng = np.random.default_rng(int(qtype) + 100)
    rows = random_rows(qtype, rng)
    x = rng.standard_normal(N_COLS).astype(np.float32)
    w = gguf_quants.dequantize(rows, qtype).astype(np.float64)
    fn = getattr(host_helpers, f"{qtype.name.lower()}_row_dot")
    fn.restype = ctypes.c_float
    n_blocks = N_COLS // 256
    for r in range(N_ROWS):
        row = np.ascontiguousarray(rows[r])
        got = fn(row.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p), n_blocks)
        expected = w[r] @ x
        assert abs(got - expected) <= DOT_RTOL * np.abs(w[r] * x).sum()


# --- on Apple silicon: the real kernels -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def metal():
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends.mlx import metal as metal_module

    if not metal_module.metal_available():
        pytest.skip("Metal is not available here (MLX CPU build): the Metal kernels run only on Apple silicon")
    return mx


@pytest.mark.mlx
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_metal_dequantize_is_exact(metal, qtype):
    from inference_engine.backends.mlx.weights import MetalBlockMatrix

    rows = random_rows(qtype, np.random.default_rng(int(qtype) + 200))
    w = MetalBlockMatrix(TensorInfo("w", qtype, (N_ROWS, N_COLS), rows.nbytes, rows))
    got = np.array(w.dequantized())
    np.testing.assert_array_equal(got.view(np.uint32), gguf_quants.dequantize(rows, qtype).view(np.uint32))


@pytest.mark.mlx
@pytest.mark.parametrize("n_tokens", [1, 3, 8, 9])  # 9: past MATVEC_MAX_TOKENS, the dequantize-then-matmul path
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_metal_matvec_matches_fallback(metal, qtype, n_tokens):
    mx = metal
    from inference_engine.backends.mlx.weights import DenseMatrix, MetalBlockMatrix

    rng = np.random.default_rng(int(qtype) + n_tokens)
    n_out = 37  # not a multiple of the kernel's rows per threadgroup
    rows = quant_for(qtype).random_rows(n_out, N_COLS, rng)
    t = TensorInfo("w", qtype, (n_out, N_COLS), rows.nbytes, rows)
    x = rng.standard_normal((n_tokens, N_COLS)).astype(np.float32)
    got = np.array(MetalBlockMatrix(t)(mx.array(x)))
    expected = np.array(DenseMatrix(t)(mx.array(x)))
    scale = np.abs(x).sum(axis=1, keepdims=True) * np.abs(gguf_quants.dequantize(rows, qtype)).max()
    assert got.shape == (n_tokens, n_out)
    assert np.all(np.abs(got - expected) <= MATVEC_RTOL * scale)
