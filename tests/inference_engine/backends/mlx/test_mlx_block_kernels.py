"""Our GPU kernels for Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS / IQ4_NL (``gpu_kernels/``,
``inference_engine/backends/mlx/block_kernels.py``).

Three levels:

* Everywhere: the NumPy twin of the blocks' index arithmetic (``block_index.py``) rebuilds every value of random
  blocks bit for bit as gguf-py (= libggml's dequantize_row) does, and its fields use each quant bit exactly once.
* Where a C++20 compiler exists: the very files the GPU kernels are made of (``gguf_blocks.h``, ``gguf_kernels.h``
  and the kernel bodies ``kernel_*.inc``) compiled for the host with ``dialect_host.h`` and run for every thread
  of their grids (a fiber per GPU thread, barriers and SIMD-group sums between them; ``test_host_dialect.py`` tests
  that stand-in): dequantization bit for bit, the mat-vec and the tiled mat-mul against float64 products. What
  this does not run: the two dialect files (Metal's and CUDA's macros and thread indices) and MLX's kernel calls.
* On a GPU (Metal, or MLX's CUDA build; marked ``gpu``, skipped with the reason elsewhere): the real kernels through
  MLX, against the same references, and the weights' size on the GPU.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fixtures.kept_files import kept_file
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from inference_engine.backends.mlx import block_index
from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import quant_for

KERNEL_DIR = Path(__file__).resolve().parents[4] / "inference_engine" / "backends" / "gpu_kernels"
KERNEL_TYPES = tuple(block_index.LAYOUTS)  # Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL
N_IN = 768  # three 256-value blocks per row
N_OUT = 70  # not a multiple of the mat-vec's 4 or 2 rows per threadgroup nor of the mat-mul's 64-row tiles
# SIMD groups per mat-vec row (its SPLIT): 1; 2 (3 blocks: one group walks two, the other one); 4 (one group idle)
MATVEC_SPLITS = (1, 2, 4)
MATVEC_TOKENS = (1, 3, 8)  # 8: the most the mat-vec takes (GQ_MAX_TOK)
MATMUL_TOKENS = (9, 70)  # 70: two token tiles, the second partial
# A float32 dot product of 768 terms summed in another order than float64's, with or without fused multiply-adds:
# at most n * 2^-24 of sum |w * x| in theory (4.6e-5 for n = 768); in practice a few 1e-7. 1e-5 is far below what
# a wrong index produces (a value from the wrong place: O(1) of the row's products).
DOT_RTOL = 1e-5


def random_rows(qtype: T, n_rows: int, rng: np.random.Generator, n_in: int = N_IN) -> np.ndarray:
    """Random blocks with f16 scales of random sign (negative scales and signed zeros covered)."""
    quant = quant_for(qtype)
    rows = quant.random_rows(n_rows, n_in, rng)
    blocks = rows.reshape(-1, quant.type_size)
    for off in quant.f16_scale_offsets:
        blocks[:, off + 1] ^= (rng.integers(0, 2, len(blocks)) * 0x80).astype(np.uint8)
    return rows


def assert_products_close(got: np.ndarray, rows: np.ndarray, qtype: T, x: np.ndarray) -> None:
    """``got (T, n_out)`` against ``x @ W.T`` in float64, each element within DOT_RTOL of its sum of |w * x|."""
    w = gguf_quants.dequantize(rows, qtype).astype(np.float64)
    expected = x.astype(np.float64) @ w.T
    bound = DOT_RTOL * (np.abs(x.astype(np.float64)) @ np.abs(w).T)
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= bound), np.max(np.abs(got - expected) / bound)


# --- the NumPy twin -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_twin_rebuilds_every_value_as_ggml(qtype):
    rows = random_rows(qtype, 32, np.random.default_rng(int(qtype)))
    got = block_index.values(rows, qtype)
    expected = gguf_quants.dequantize(rows, qtype)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


# The bytes of each type's block that hold quant bits (the rest are scales and f16 factors).
QUANT_BYTES = {T.Q2_K: range(16, 80), T.Q3_K: range(96), T.Q4_K: range(16, 144), T.Q5_K: range(16, 176),
               T.Q6_K: range(192), T.IQ4_XS: range(8, 136),
               T.IQ4_NL: [18 * t + 2 + j for t in range(8) for j in range(16)]}  # eight file blocks' qs[16]


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_twin_reads_each_quant_bit_once(qtype):
    owners = block_index.bit_owners(qtype).reshape(-1, 8)
    quant = np.zeros(len(owners), dtype=bool)
    quant[list(QUANT_BYTES[qtype])] = True
    assert np.all(owners[quant] == 1) and np.all(owners[~quant] == 0)


# --- the kernels' own code, compiled for the host -----------------------------------------------------------------

SHIM_COMMON = r"""
#include "dialect_host.h"
#include "gguf_blocks.h"

extern "C" void host_f16(const uint8_t* p, int n, float* out) {
    for (int k = 0; k < n; ++k) out[k] = gq_f16(p + 2 * k);  // into float32 memory: no conversion quiets a NaN
}
"""

SHIM_TYPE = r"""
#define GQ_TYPE {t}
#include "gguf_kernels.h"

template <int N_TOK, int SPLIT>
static void {t}_matvec_body(const uint8_t* w, const int* w_shape, const float* x, const int* x_shape, float* y,
                            unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {{
#include "kernel_matvec.inc"
}}

template <int N_TOK>
static void {t}_matvec_group_body(const uint8_t* w, const int* w_shape, const float* x, const int* x_shape, float* y,
                                  unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {{
#include "kernel_matvec_group.inc"
}}

static void {t}_matmul_body(const uint8_t* w, const int* w_shape, const float* x, const int* x_shape, float* y,
                            unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {{
#include "kernel_matmul.inc"
}}

static void {t}_dequantize_body(const uint8_t* w, const int* w_shape, float* y, unsigned int gq_tid,
                                unsigned int gq_group_x, unsigned int gq_group_y) {{
#include "kernel_dequantize.inc"
}}

template <int N_TOK, int SPLIT>
static void {t}_matvec_n(const uint8_t* w, const int* ws, const float* x, const int* xs, float* y) {{
    const unsigned int rows = GQ_MATVEC_WARPS / SPLIT;
    const unsigned int groups = ((unsigned int)ws[0] + rows - 1) / rows;
    gq_host_launch(groups, 1, 32 * GQ_MATVEC_WARPS, [&](unsigned int tid, unsigned int gx, unsigned int gy) {{
        {t}_matvec_body<N_TOK, SPLIT>(w, ws, x, xs, y, tid, gx, gy);
    }});
}}

template <int SPLIT>
static void {t}_matvec_split(const uint8_t* w, const int* ws, const float* x, const int* xs, float* y, int n_tok) {{
    static void (*const by_tokens[])(const uint8_t*, const int*, const float*, const int*, float*) = {{
        {t}_matvec_n<1, SPLIT>, {t}_matvec_n<2, SPLIT>, {t}_matvec_n<3, SPLIT>, {t}_matvec_n<4, SPLIT>,
        {t}_matvec_n<5, SPLIT>, {t}_matvec_n<6, SPLIT>, {t}_matvec_n<7, SPLIT>, {t}_matvec_n<8, SPLIT>}};
    by_tokens[n_tok - 1](w, ws, x, xs, y);
}}

extern "C" void {t}_matvec(const uint8_t* w, const float* x, float* y, int n_out, int n_in, int n_tok, int split) {{
    const int ws[2] = {{n_out, (int)GQ_ROW_BYTES(n_in)}};
    const int xs[2] = {{n_tok, n_in}};
    if (split == 1) {t}_matvec_split<1>(w, ws, x, xs, y, n_tok);
    if (split == 2) {t}_matvec_split<2>(w, ws, x, xs, y, n_tok);
    if (split == 4) {t}_matvec_split<4>(w, ws, x, xs, y, n_tok);
}}

template <int N_TOK>
static void {t}_matvec_group_n(const uint8_t* w, const int* ws, const float* x, const int* xs, float* y) {{
    gq_host_launch((unsigned int)ws[0], 1, GQ_GROUP_THREADS, [&](unsigned int tid, unsigned int gx, unsigned int gy) {{
        {t}_matvec_group_body<N_TOK>(w, ws, x, xs, y, tid, gx, gy);
    }});
}}

extern "C" void {t}_matvec_group(const uint8_t* w, const float* x, float* y, int n_out, int n_in, int n_tok) {{
    static void (*const by_tokens[])(const uint8_t*, const int*, const float*, const int*, float*) = {{
        {t}_matvec_group_n<1>, {t}_matvec_group_n<2>, {t}_matvec_group_n<3>, {t}_matvec_group_n<4>,
        {t}_matvec_group_n<5>, {t}_matvec_group_n<6>, {t}_matvec_group_n<7>, {t}_matvec_group_n<8>}};
    const int ws[2] = {{n_out, (int)GQ_ROW_BYTES(n_in)}};
    const int xs[2] = {{n_tok, n_in}};
    by_tokens[n_tok - 1](w, ws, x, xs, y);
}}

extern "C" void {t}_matmul(const uint8_t* w, const float* x, float* y, int n_out, int n_in, int n_tok) {{
    const int ws[2] = {{n_out, (int)GQ_ROW_BYTES(n_in)}};
    const int xs[2] = {{n_tok, n_in}};
    const unsigned int gx = ((unsigned int)n_out + GQ_TILE_ROWS - 1) / GQ_TILE_ROWS;
    const unsigned int gy = ((unsigned int)n_tok + GQ_TILE_TOKS - 1) / GQ_TILE_TOKS;
    gq_host_launch(gx, gy, GQ_TILE_THREADS, [&](unsigned int tid, unsigned int x_, unsigned int y_) {{
        {t}_matmul_body(w, ws, x, xs, y, tid, x_, y_);
    }});
}}

extern "C" void {t}_dequantize(const uint8_t* w, float* y, int n_out, int n_in) {{
    const int ws[2] = {{n_out, (int)GQ_ROW_BYTES(n_in)}};
    const unsigned int chunks = (unsigned int)n_out * (unsigned int)n_in / 8u;
    gq_host_launch((chunks + GQ_DEQ_THREADS - 1) / GQ_DEQ_THREADS, 1, GQ_DEQ_THREADS,
                   [&](unsigned int tid, unsigned int gx, unsigned int gy) {{
        {t}_dequantize_body(w, ws, y, tid, gx, gy);
    }});
}}
#undef GQ_TYPE
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory, pytestconfig):
    shim = SHIM_COMMON + "".join(SHIM_TYPE.format(t=qtype.name.lower()) for qtype in KERNEL_TYPES)
    return build_host_library(tmp_path_factory.mktemp("gpu_kernels_host"), shim, pytestconfig)


HOST_FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC")


def build_host_library(build: Path, shim: str, pytestconfig: pytest.Config | None = None) -> ctypes.CDLL:
    """``shim`` (C++ including the kernels' files) built for the host with ``dialect_host.h``'s fibers and
    barriers, loaded; skips where no C++20 compiler (or no ``<ucontext.h>``) is installed.

    A build (10-30 s here) is kept in pytest's cache (``fixtures.kept_files``) under what it is made of: the
    compiler's ``--version``, the flags, ``shim`` and every file of the kernels' folder."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (c++, g++ or clang++) to build the GPU kernels' shared code for the host")

    def make() -> Path:
        (build / "shim.cpp").write_text(shim)
        lib = build / "libgpu_kernels_host.so"
        cmd = [compiler, *HOST_FLAGS, f"-I{KERNEL_DIR}", "shim.cpp", "-o", lib]
        done = subprocess.run([str(c) for c in cmd], cwd=build, check=False, capture_output=True, text=True)
        if done.returncode != 0 and re.search(r"c\+\+20|ucontext\.h", done.stderr):
            pytest.skip(f"{compiler} has no C++20 or no <ucontext.h> (the host's GPU threads): {done.stderr[:200]}")
        assert done.returncode == 0, done.stderr
        return lib

    version = subprocess.run([compiler, "--version"], check=False, capture_output=True, text=True).stdout
    sources = [part for path in sorted(KERNEL_DIR.iterdir()) for part in (path.name.encode(), path.read_bytes())]
    inputs = [compiler.encode(), version.encode(), *(flag.encode() for flag in HOST_FLAGS), shim.encode(), *sources]
    return ctypes.CDLL(str(kept_file(pytestconfig, "gpu_kernels_host", ".so", inputs, make)))


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def test_f16_decoding_every_bit_pattern(host_kernels):
    """gq_f16 (bits -> float32 by integer code, no half type) for all 65536 halves, NaN payloads included."""
    halves = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(1 << 16, dtype=np.float32)
    host_kernels.host_f16(_ptr(halves), len(halves), _ptr(got))
    np.testing.assert_array_equal(got.view(np.uint32), halves.view(np.float16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_dequantize_kernel_equals_ggml_bit_for_bit(host_kernels, qtype):
    rows = random_rows(qtype, N_OUT, np.random.default_rng(int(qtype) + 1))
    out = np.full((N_OUT, N_IN), np.nan, dtype=np.float32)
    getattr(host_kernels, f"{qtype.name.lower()}_dequantize")(_ptr(rows), _ptr(out), N_OUT, N_IN)
    np.testing.assert_array_equal(out.view(np.uint32), gguf_quants.dequantize(rows, qtype).view(np.uint32))


@pytest.mark.parametrize("split", MATVEC_SPLITS)
@pytest.mark.parametrize("n_tok", MATVEC_TOKENS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_matvec_kernel_gives_the_products(host_kernels, qtype, n_tok, split):
    rng = np.random.default_rng(int(qtype) * 10 + n_tok + 1000 * split)
    rows = random_rows(qtype, N_OUT, rng)
    x = rng.standard_normal((n_tok, N_IN)).astype(np.float32)
    y = np.full((n_tok, N_OUT), np.nan, dtype=np.float32)
    getattr(host_kernels, f"{qtype.name.lower()}_matvec")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, N_IN, n_tok, split)
    assert_products_close(y, rows, qtype, x)


# Rows for the one-threadgroup-a-row mat-vec: 768 values (48 sub-blocks: 80 of its 128 threads idle), and 4,608 (288:
# threads 0-31 take three, the others two) so that a thread walks several sub-blocks, of different blocks
GROUP_N_INS = (N_IN, 4608)


@pytest.mark.parametrize("n_in", GROUP_N_INS)
@pytest.mark.parametrize("n_tok", MATVEC_TOKENS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_matvec_group_kernel_gives_the_products(host_kernels, qtype, n_tok, n_in):
    rng = np.random.default_rng(int(qtype) * 10 + n_tok + n_in)
    rows = random_rows(qtype, N_OUT, rng, n_in=n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    y = np.full((n_tok, N_OUT), np.nan, dtype=np.float32)
    getattr(host_kernels, f"{qtype.name.lower()}_matvec_group")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, n_in, n_tok)
    assert_products_close(y, rows, qtype, x)


@pytest.mark.parametrize("n_tok", MATMUL_TOKENS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_matmul_kernel_gives_the_products(host_kernels, qtype, n_tok):
    rng = np.random.default_rng(int(qtype) * 100 + n_tok)
    rows = random_rows(qtype, N_OUT, rng)
    x = rng.standard_normal((n_tok, N_IN)).astype(np.float32)
    y = np.full((n_tok, N_OUT), np.nan, dtype=np.float32)
    getattr(host_kernels, f"{qtype.name.lower()}_matmul")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, N_IN, n_tok)
    assert_products_close(y, rows, qtype, x)


# IQ4_NL's rows are whole 32-value blocks, read as blocks of 256: rows of 576 values (SmolLM2's width) end 64 values
# into their third block of 256, which the kernels must leave out past the row's end.
TAIL_N_IN = 576


@pytest.mark.parametrize("n_tok", MATVEC_TOKENS[:2] + MATMUL_TOKENS[:1])
def test_rows_ending_inside_a_block_of_256(host_kernels, n_tok):
    qtype = T.IQ4_NL
    rng = np.random.default_rng(n_tok)
    rows = random_rows(qtype, N_OUT, rng, n_in=TAIL_N_IN)
    assert rows.shape[1] == block_index.row_bytes(qtype, TAIL_N_IN) == 324
    name = qtype.name.lower()
    out = np.full((N_OUT, TAIL_N_IN), np.nan, dtype=np.float32)
    getattr(host_kernels, f"{name}_dequantize")(_ptr(rows), _ptr(out), N_OUT, TAIL_N_IN)
    np.testing.assert_array_equal(out.view(np.uint32), gguf_quants.dequantize(rows, qtype).view(np.uint32))
    x = rng.standard_normal((n_tok, TAIL_N_IN)).astype(np.float32)
    for split in (*MATVEC_SPLITS, "group") if n_tok <= 8 else (None,):
        y = np.full((n_tok, N_OUT), np.nan, dtype=np.float32)
        if split is None:
            getattr(host_kernels, f"{name}_matmul")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, TAIL_N_IN, n_tok)
        elif split == "group":
            getattr(host_kernels, f"{name}_matvec_group")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, TAIL_N_IN, n_tok)
        else:
            getattr(host_kernels, f"{name}_matvec")(_ptr(rows), _ptr(x), _ptr(y), N_OUT, TAIL_N_IN, n_tok, split)
        assert_products_close(y, rows, qtype, x)


def test_twin_reads_rows_ending_inside_a_block_of_256():
    rows = random_rows(T.IQ4_NL, 5, np.random.default_rng(3), n_in=TAIL_N_IN)
    got = block_index.values(rows, T.IQ4_NL)
    np.testing.assert_array_equal(got.view(np.uint32), gguf_quants.dequantize(rows, T.IQ4_NL).view(np.uint32))


# --- the sources MLX compiles: assembled the same way for both dialects -----------------------------------------


def test_shared_files_use_no_dialect_only_names():
    """The shared files (every file of gpu_kernels/ but the dialects') must compile under Metal, NVRTC and C++: no
    Metal-only ``uint`` / ``half`` / address spaces written out, no CUDA-only qualifiers (each dialect spells those
    through its macros)."""
    shared = sorted(p.name for p in KERNEL_DIR.iterdir() if not p.name.startswith("dialect_"))
    assert {"gguf_blocks.h", "kernel_matvec.inc", "decode_attention.h", "kernel_decode_attention.inc"} <= set(shared)
    for name in shared:
        code = re.sub(r"//[^\n]*", "", (KERNEL_DIR / name).read_text())  # comments may name anything
        for word in ("uint", "half", "device", "threadgroup", "thread", "__device__", "__shared__", "__syncthreads"):
            assert not re.search(rf"\b{word}\b", code), f"{name} uses '{word}'"


@pytest.fixture(scope="module")
def bk():
    """``block_kernels`` (it builds MLX kernels, so it needs MLX; the tests above do not)."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends.mlx import block_kernels

    return block_kernels


# A name each dialect's thread-index prelude (dialect_*_ids.inc) uses
DIALECT_IDS = {"metal": "threadgroup_position_in_grid", "cuda": "blockIdx"}


def assert_kernel_text(dialect, head: str, body: str, body_file: str) -> None:
    """A kernel as assembled for ``dialect``: the header holds the dialect's macros, the body its thread indices and
    the shared body ``body_file``."""
    assert (KERNEL_DIR / dialect.header_file).read_text() in head
    assert DIALECT_IDS[dialect.name] in body and (KERNEL_DIR / body_file).read_text() in body


@pytest.mark.mlx
@pytest.mark.parametrize("kind", ("matvec", "matvec_group", "matmul", "dequantize"))
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_kernel_text_for_each_dialect(bk, qtype, kind):
    for dialect in bk.DIALECTS:
        head, body = bk.header(dialect, qtype), bk.source(dialect, kind)
        assert_kernel_text(dialect, head, body, f"kernel_{kind}.inc")
        assert f"#define GQ_TYPE {qtype.name.lower()}" in head
        assert ("x_shape" in body) == (kind != "dequantize")  # MLX passes a shape only where the body names it


@pytest.mark.mlx
def test_launch_geometry_comes_from_the_kernels_text(bk):
    assert (bk.MATVEC_MAX_TOKENS, bk.MATVEC_WARPS) == (8, 4)
    assert [bk.matvec_split(256 * n) for n in (1, 3, 4, 6, 7, 8, 35)] == [1, 1, 2, 2, 2, 4, 4]
    assert all(bk.MATVEC_WARPS % split == 0 for _, split in bk.MATVEC_SPLITS)
    assert (bk.TILE_THREADS, bk.TILE_ROWS, bk.TILE_TOKS, bk.DEQ_THREADS) == (256, 64, 64, 256)
    # every kernel body is a block kernel's but the attention, RoPE and norm kernels' (their own modules)
    others = {"kernel_add_rms_norm"}
    assert bk.GROUP_THREADS == 128 and set(bk.KINDS) == {p.stem[len("kernel_"):] for p in KERNEL_DIR.glob("kernel_*.inc")
                                                         if not p.stem.startswith("kernel_decode_") and p.stem not in others}


# --- the CUDA dialect through NVRTC, where NVRTC is installed (it needs no GPU) ----------------------------------

# What MLX's CUDA default header gives the kernels that ours use (the real one, mlx/backend/cuda/device/utils.cuh,
# lives inside libmlx.so): the integer types of inputs (uint8_t, uint16_t, int32_t, as MLX's dtype_to_cuda_type names
# them) and the Shape of an input's shape argument.
NVRTC_STAND_IN = r"""
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef int int32_t;
struct Shape {
    int v[8];
    __device__ int operator[](int i) const { return v[i]; }
};
"""


def cuda_kernel_text(name: str, header: str, body: str, inputs: list[tuple[str, str]], template: dict,
                     output: str | list[str] = "y", output_types: list[str] | None = None) -> str:
    """The translation unit ``mx.fast.cuda_kernel`` compiles, as MLX 0.32's ``build_kernel``
    (mlx/backend/cuda/custom_kernel.cpp) writes it: header, then in ``mlx::core::cu`` a ``__global__`` function with
    ``const T* name`` per input (plus ``name_shape`` where the body names it), the outputs (``float`` unless
    ``output_types`` says), the template constants, the body."""
    outputs = [output] if isinstance(output, str) else output
    types = output_types or ["float"] * len(outputs)
    params = []
    for input_name, ctype in inputs:
        params.append(f"const {ctype}* {input_name}")
        if f"{input_name}_shape" in body:
            params.append(f"const __grid_constant__ Shape {input_name}_shape")
    constants = "".join(f"  constexpr int {k} = {v};\n" for k, v in template.items())
    return (
        f"{NVRTC_STAND_IN}{header}namespace mlx::core::cu {{\n__global__ void {name}(\n    "
        + ",\n    ".join([*params, *(f"{t}* {o}" for t, o in zip(types, outputs, strict=True))])
        + f") {{\n{constants}\n{body}\n}}\n}}  // namespace mlx::core::cu\n"
    )


def find_nvrtc() -> Path | None:
    """libnvrtc from NVIDIA's pip wheels (``nvidia-cuda-nvrtc``, which MLX's CUDA build installs) or CUDA_HOME."""
    import importlib.util

    roots = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) for p in spec.submodule_search_locations]
    if os.environ.get("CUDA_HOME"):
        roots.append(Path(os.environ["CUDA_HOME"]))
    for root in roots:
        found = sorted(root.glob("**/libnvrtc.so*"))
        if found:
            return found[0]
    return None


@pytest.fixture(scope="module")
def nvrtc():
    lib = find_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC here (pip install nvidia-cuda-nvrtc, or MLX's CUDA build, to compile the CUDA kernels)")
    return ctypes.CDLL(str(lib))


@pytest.mark.mlx
@pytest.mark.parametrize("kind", ("matvec", "matvec_group", "matmul", "dequantize"))
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_cuda_kernels_compile_with_nvrtc(bk, nvrtc, qtype, kind):
    """The CUDA dialect compiles as MLX compiles it (NVRTC, ``--device-as-default-execution-space``, sm_90's
    virtual architecture): the CUDA-only lines are at least valid CUDA where no GPU can run them."""
    inputs = [("w", "uint8_t")] + ([] if kind == "dequantize" else [("x", "float")])
    name = f"gguf_{qtype.name.lower()}_{kind}"
    text = cuda_kernel_text(
        name, bk.header(bk.CUDA, qtype), bk.source(bk.CUDA, kind), inputs,
        {"N_TOK": 3, "SPLIT": 2} if kind == "matvec" else {"N_TOK": 3} if kind == "matvec_group" else {}
    )
    compile_with_nvrtc(nvrtc, text, name)


def compile_with_nvrtc(nvrtc, text: str, name: str) -> None:
    """``text`` compiled by NVRTC as MLX compiles a custom kernel (``--device-as-default-execution-space``, sm_90's
    virtual architecture): no error, no warning."""
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None) == 0
    options = [b"--device-as-default-execution-space", b"--gpu-architecture=compute_90"]
    result = nvrtc.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    assert result == 0, log.value.decode(errors="replace")
    assert "warning" not in log.value.decode(errors="replace"), log.value.decode(errors="replace")


# --- on a GPU: the real kernels ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dialect(bk):
    """The dialect of this machine's MLX GPU, with the GPU as MLX's default device for these tests."""
    import mlx.core as mx

    if not mx.is_available(mx.gpu):
        pytest.skip(f"MLX {mx.__version__} has no GPU here: our kernels run on Metal or CUDA only")
    before = mx.default_device()
    mx.set_default_device(mx.gpu)
    yield bk.gpu_dialect()
    mx.set_default_device(before)


def gpu_matrix(qtype: T, rows: np.ndarray, dialect, matvec: str = "simd"):
    from inference_engine.backends.mlx.weights import BlockMatrix

    quant = quant_for(qtype)
    n_in = rows.shape[1] // quant.type_size * quant.block_size
    return BlockMatrix(TensorInfo("w", qtype, (rows.shape[0], n_in), rows.nbytes, rows), dialect, matvec)


@pytest.mark.gpu
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_gpu_dequantize_is_exact(dialect, qtype):
    rows = random_rows(qtype, N_OUT, np.random.default_rng(int(qtype) + 200))
    w = gpu_matrix(qtype, rows, dialect)
    assert w.blocks.nbytes == rows.nbytes  # the GGUF size on the GPU
    got = np.array(w.dequantized())
    np.testing.assert_array_equal(got.view(np.uint32), gguf_quants.dequantize(rows, qtype).view(np.uint32))


@pytest.mark.gpu
@pytest.mark.parametrize("n_tok", MATVEC_TOKENS + MATMUL_TOKENS + (300,))
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_gpu_products(dialect, qtype, n_tok):
    import mlx.core as mx

    rng = np.random.default_rng(int(qtype) + 7 * n_tok)
    rows = random_rows(qtype, N_OUT, rng)
    x = rng.standard_normal((n_tok, N_IN)).astype(np.float32)
    got = np.array(gpu_matrix(qtype, rows, dialect)(mx.array(x)))
    assert_products_close(got, rows, qtype, x)


@pytest.mark.gpu
@pytest.mark.parametrize("n_in", GROUP_N_INS + (TAIL_N_IN,))
@pytest.mark.parametrize("n_tok", MATVEC_TOKENS)
@pytest.mark.parametrize("qtype", KERNEL_TYPES, ids=lambda t: t.name)
def test_gpu_matvec_one_threadgroup_a_row(dialect, qtype, n_tok, n_in):
    import mlx.core as mx

    if n_in == TAIL_N_IN and qtype != T.IQ4_NL:
        pytest.skip("rows ending inside a block of 256: IQ4_NL's only")
    rng = np.random.default_rng(int(qtype) + 13 * n_tok + n_in)
    rows = random_rows(qtype, N_OUT, rng, n_in=n_in)
    x = rng.standard_normal((n_tok, n_in)).astype(np.float32)
    got = np.array(gpu_matrix(qtype, rows, dialect, matvec="group")(mx.array(x)))
    assert_products_close(got, rows, qtype, x)


@pytest.mark.gpu
@pytest.mark.parametrize("n_tok", (1, 70))
def test_gpu_rows_ending_inside_a_block_of_256(dialect, n_tok):
    import mlx.core as mx

    rng = np.random.default_rng(40 + n_tok)
    rows = random_rows(T.IQ4_NL, N_OUT, rng, n_in=TAIL_N_IN)
    w = gpu_matrix(T.IQ4_NL, rows, dialect)
    assert (w.n_in, w.blocks.nbytes) == (TAIL_N_IN, rows.nbytes)
    got = np.array(w.dequantized())
    np.testing.assert_array_equal(got.view(np.uint32), gguf_quants.dequantize(rows, T.IQ4_NL).view(np.uint32))
    x = rng.standard_normal((n_tok, TAIL_N_IN)).astype(np.float32)
    assert_products_close(np.array(w(mx.array(x))), rows, T.IQ4_NL, x)


@pytest.mark.gpu
@pytest.mark.parametrize("n_blocks", (4, 8))  # rows split over 2 and 4 SIMD groups (block_kernels.matvec_split)
@pytest.mark.parametrize("qtype", (T.Q4_K, T.Q6_K), ids=lambda t: t.name)
def test_gpu_matvec_of_long_rows(dialect, bk, qtype, n_blocks):
    import mlx.core as mx

    assert bk.matvec_split(256 * n_blocks) > 1
    rng = np.random.default_rng(int(qtype) + 11 * n_blocks)
    rows = random_rows(qtype, N_OUT, rng, n_in=256 * n_blocks)
    x = rng.standard_normal((3, 256 * n_blocks)).astype(np.float32)
    got = np.array(gpu_matrix(qtype, rows, dialect)(mx.array(x)))
    assert_products_close(got, rows, qtype, x)
