"""The decode RoPE + F16 rows GPU kernel (``gpu_kernels/kernel_decode_rope.inc``, ``backends/mlx/rope_kernel.py``).

* Where a C++20 compiler exists: the kernel's own files compiled for the host with ``dialect_host.h`` and run for
  every thread of its grid: ``gq_f16_from_float`` against NumPy's float32 -> float16 on every F16 value, every tie
  between two of them and their float32 neighbours, the overflow and subnormal edges and random bit patterns; the
  kernel against NumPy's float32 rotation (NEOX and NORM pairs, every dimension or only some rotated, none, a query
  scale) bit for bit, and its F16 rows against NumPy's rounding.
* Where NVRTC is installed (no GPU needed): the CUDA text as MLX compiles it.
* The compiled decode step's wiring, with stand-ins for the two kernels (no GPU): each layer hands its q, k, v, RoPE
  settings, query scale and window to them and the logits stay the plain path's.
* On a GPU (marked ``gpu``): the kernel through MLX against the same references, and a compiled step with it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from inference_engine.backends import numerics as nx

# (D, DV, N_DIMS, NEOX, SCALE_Q) instantiated in the host build: NEOX and NORM pairs over the whole head, a partial
# rotation (phi3-style n_rot < head size), no RoPE (SmolLM3's NoPE layers), a query scale (gemma3), D != DV
VARIANTS = [(64, 64, 64, 1, 0), (64, 64, 64, 0, 0), (128, 128, 64, 1, 0), (128, 128, 32, 0, 0), (64, 64, 0, 1, 0),
            (64, 64, 64, 1, 1), (128, 64, 128, 1, 0)]
N_HEAD, N_KV = 6, 2
POSITIONS = 40  # rows of the angle tables

SHIM = r"""
#include "dialect_host.h"
#include "decode_rope.h"

extern "C" void host_f16_from_float(const float* x, int n, uint16_t* out) {
    for (int i = 0; i < n; ++i) out[i] = (uint16_t)gq_f16_from_float(x[i]);
}

template <int D, int DV, int N_DIMS, int NEOX, int SCALE_Q>
static void body(const float* q, const int* q_shape, const float* k, const int* k_shape, const float* v,
                 const int* v_shape, const float* rope_cos, const float* rope_sin, const int* pos,
                 const float* q_scale, float* q_out, uint16_t* k_bits, uint16_t* v_bits,
                 unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {
#include "kernel_decode_rope.inc"
}

template <int D, int DV, int N_DIMS, int NEOX, int SCALE_Q>
static void launch(const float* q, const float* k, const float* v, int n_head, int n_kv, const float* c,
                   const float* s, int p, float scale, float* q_out, uint16_t* k_bits, uint16_t* v_bits) {
    const int q_shape[2] = {n_head, D}, k_shape[2] = {n_kv, D}, v_shape[2] = {n_kv, DV};
    const int n = n_head * D + n_kv * D + n_kv * DV;
    gq_host_launch((unsigned int)((n + GQ_ROPE_THREADS - 1) / GQ_ROPE_THREADS), 1, GQ_ROPE_THREADS,
                   [&](unsigned int tid, unsigned int gx, unsigned int gy) {
        body<D, DV, N_DIMS, NEOX, SCALE_Q>(q, q_shape, k, k_shape, v, v_shape, c, s, &p, &scale, q_out, k_bits,
                                           v_bits, tid, gx, gy);
    });
}

extern "C" int host_decode_rope(const float* q, const float* k, const float* v, int n_head, int n_kv, int d, int dv,
                                int n_dims, int neox, int scale_q, const float* c, const float* s, int p,
                                float scale, float* q_out, uint16_t* k_bits, uint16_t* v_bits) {
%CASES%
    return 1;  // not instantiated
}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory, pytestconfig):
    from test_mlx_block_kernels import build_host_library

    cases = "\n".join(
        f"    if (d == {d} && dv == {dv} && n_dims == {n} && neox == {x} && scale_q == {sq}) {{ "
        f"launch<{d}, {dv}, {n}, {x}, {sq}>(q, k, v, n_head, n_kv, c, s, p, scale, q_out, k_bits, v_bits); "
        f"return 0; }}" for d, dv, n, x, sq in VARIANTS)
    return build_host_library(tmp_path_factory.mktemp("rope_kernel_host"), SHIM.replace("%CASES%", cases),
                              pytestconfig)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def f16_cases() -> np.ndarray:
    """float32 values whose F16 rounding has every kind of answer: each F16 value exactly, each tie between two
    neighbours (even and odd below), the float32 values just off each tie, overflow and underflow edges, infinities,
    zeros, NaN, and random bit patterns of every exponent."""
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    finite = np.sort(np.unique(halves[np.isfinite(halves)].astype(np.float32)))
    ties = ((finite[:-1].astype(np.float64) + finite[1:]) / 2).astype(np.float32)  # exact in float32
    near = np.concatenate([np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(-np.inf))])
    edges = np.array([65504, 65519.996, 65520, 65536, 1e9, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0000001,
                      2.0 ** -26, 6.1e-5, 1e-30, np.inf, 0.0, np.nan], dtype=np.float32)
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    out = np.concatenate([finite, ties, near, edges, bits])
    return np.concatenate([out, -out])


def test_f16_rounding_is_numpys(host_kernel):
    x = f16_cases()
    got = np.empty(len(x), dtype=np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = x.astype(np.float16)
    host_kernel.host_f16_from_float(_ptr(x), len(x), _ptr(got))
    nan = np.isnan(x)
    assert np.all(np.isnan(got.view(np.float16)[nan]))  # NaN stays NaN (payload bits: not compared)
    np.testing.assert_array_equal(got[~nan], expected[~nan].view(np.uint16))


def reference(q, k, v, cos, sin, p, n_dims, neox, q_scale):
    """NumPy in float32: q and k rotated as the MLX backend's rope (first of a pair x cos - x' sin, second x cos +
    x' sin), q times q_scale, k and v rounded to F16."""

    def rotate(x):
        x = x.copy()
        if n_dims:
            half = n_dims // 2
            c, s = cos[p], sin[p]
            if neox:
                x0, x1 = x[:, :half].copy(), x[:, half:n_dims].copy()
                x[:, :half], x[:, half:n_dims] = x0 * c - x1 * s, x1 * c + x0 * s
            else:
                x0, x1 = x[:, 0:n_dims:2].copy(), x[:, 1:n_dims:2].copy()
                x[:, 0:n_dims:2], x[:, 1:n_dims:2] = x0 * c - x1 * s, x1 * c + x0 * s
        return x

    qr = rotate(q)
    if q_scale is not None:
        qr = qr * np.float32(q_scale)
    return qr, rotate(k).astype(np.float16), v.astype(np.float16)


def case(d: int, dv: int, n_dims: int, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N_HEAD, d)).astype(np.float32)
    k = rng.standard_normal((N_KV, d)).astype(np.float32) * np.float32(30)  # F16's rounding at several exponents
    v = rng.standard_normal((N_KV, dv)).astype(np.float32)
    cos, sin = nx.rope_cos_sin(np.arange(POSITIONS), max(n_dims, 2), 10000.0)
    return q, k, v, np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32)


@pytest.mark.parametrize("d, dv, n_dims, neox, scale_q", VARIANTS)
@pytest.mark.parametrize("p", [0, 1, 17, POSITIONS - 1])
def test_host_kernel_is_the_reference_bit_for_bit(host_kernel, d, dv, n_dims, neox, scale_q, p):
    """The host build rounds each product and sum in float32 as NumPy does (x86-64 without FMA, ISO C++: no
    contraction), so every element is equal; on a GPU NVRTC may fuse a multiply-add (one rounding apart)."""
    q, k, v, cos, sin = case(d, dv, n_dims, seed=1000 * d + 10 * n_dims + p + neox)
    q_scale = 0.0625 if scale_q else None
    q_out = np.full(q.shape, np.nan, dtype=np.float32)
    k_bits = np.zeros(k.shape, dtype=np.uint16)
    v_bits = np.zeros(v.shape, dtype=np.uint16)
    assert host_kernel.host_decode_rope(_ptr(q), _ptr(k), _ptr(v), N_HEAD, N_KV, d, dv, n_dims, neox, scale_q,
                                        _ptr(cos), _ptr(sin), p, ctypes.c_float(q_scale or 1.0), _ptr(q_out),
                                        _ptr(k_bits), _ptr(v_bits)) == 0
    rq, rk, rv = reference(q, k, v, cos, sin, p, n_dims, neox, q_scale)
    np.testing.assert_array_equal(q_out, rq)
    np.testing.assert_array_equal(k_bits, rk.view(np.uint16))
    np.testing.assert_array_equal(v_bits, rv.view(np.uint16))


# --- with MLX --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rk():
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends.mlx import rope_kernel

    return rope_kernel


@pytest.mark.mlx
def test_kernel_text_for_each_dialect(rk):
    from test_mlx_block_kernels import assert_kernel_text

    from inference_engine.backends.mlx import block_kernels as bk

    for dialect in bk.DIALECTS:
        head = bk.own_header(dialect, *rk.HEADERS)
        assert "gq_f16_from_float" in head
        assert_kernel_text(dialect, head, bk.source(dialect, rk.KIND), "kernel_decode_rope.inc")
    assert rk.THREADS == 256


@pytest.mark.mlx
def test_supports_one_token_and_even_rotations_within_the_head(rk):
    assert rk.supports({"n_dims": 64}, (1, 6, 64)) and rk.supports(None, (1, 6, 64))
    assert rk.supports({"n_dims": 32}, (1, 6, 64))
    assert not rk.supports({"n_dims": 64}, (3, 6, 64))  # a prefill
    assert not rk.supports({"n_dims": 33}, (1, 6, 64)) and not rk.supports({"n_dims": 128}, (1, 6, 64))


@pytest.mark.mlx
def test_cuda_text_compiles_with_nvrtc(rk):
    from test_mlx_block_kernels import compile_with_nvrtc, cuda_kernel_text, find_nvrtc

    from inference_engine.backends.mlx import block_kernels as bk

    lib = find_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC here (pip install nvidia-cuda-nvrtc, or MLX's CUDA build, to compile the CUDA kernels)")
    inputs = [("q", "float"), ("k", "float"), ("v", "float"), ("rope_cos", "float"), ("rope_sin", "float"),
              ("pos", "int32_t"), ("q_scale", "float")]
    for d, dv, n_dims, neox, scale_q in VARIANTS:
        text = cuda_kernel_text("decode_rope_f16", bk.own_header(bk.CUDA, *rk.HEADERS), bk.source(bk.CUDA, rk.KIND),
                                inputs, {"D": d, "DV": dv, "N_DIMS": n_dims, "NEOX": neox, "SCALE_Q": scale_q},
                                output=["q_out", "k_bits", "v_bits"], output_types=["float", "uint16_t", "uint16_t"])
        compile_with_nvrtc(ctypes.CDLL(str(lib)), text, "decode_rope_f16")


@pytest.mark.mlx
@pytest.mark.parametrize("arch", ["llama", "gemma3", "smollm3"])  # NORM pairs; q scale + windows; NoPE layers
def test_a_compiled_step_hands_rope_and_attention_to_the_kernels(tiny_model, monkeypatch, rk, arch):
    """With both switches on and a kernel dialect (stood in for here: no GPU), each layer of a compiled decode step
    gives the RoPE kernel its q, k, v, RoPE settings and query scale, writes the F16 rows it returns and hands them to
    the attention kernel; stand-ins computing what the kernels compute leave the logits the plain path's."""
    import mlx.core as mx
    from test_mlx_steps import DECODE, PROMPT, STEP_REL_TOL, rel

    from inference_engine.backends.mlx import attention_kernel as ak
    from inference_engine.backends.mlx import block_kernels as bk
    from inference_engine.backends.mlx.steps import StepPositions, rope_key
    from inference_engine.engine import OurEngine

    path = tiny_model(arch, "Q8_0")
    calls = []

    def run(kernels: bool):
        e = OurEngine(path, backend="mlx", numerics="f32", n_ctx=64, kv_type="f16")
        b = e.backend

        def rope_stand_in(dialect, q, k, v, tables, pos, rope, q_scale):
            calls.append((dialect, rope, q_scale))
            if rope is not None:
                at = StepPositions(pos, mx.arange(tables[0].shape[0]), {rope_key(**rope): tables})
                q, k = b.rope(q, at, **rope), b.rope(k, at, **rope)
            if q_scale is not None:
                q = b.scale(q, q_scale)
            return q, k.astype(mx.float16), v.astype(mx.float16)

        def attention_stand_in(dialect, q, k_buffer, v_buffer, pos, scale, window, n_keys):
            slots = mx.arange(k_buffer.shape[1])[None, :]
            visible = slots <= pos[:, None]
            if window:
                visible = mx.logical_and(visible, (pos[:, None] - slots) < window)
            return b.masked_attention(q, k_buffer.transpose(1, 0, 2), v_buffer.transpose(1, 0, 2), visible, scale)

        monkeypatch.setattr(b, "attention_kernel", kernels)
        monkeypatch.setattr(b, "rope_kernel", kernels)
        if kernels:
            monkeypatch.setattr(b, "kernels", bk.CUDA)  # the weights were prepared without it (MLX's CPU forms)
            monkeypatch.setattr(rk, "rope_f16", rope_stand_in)
            monkeypatch.setattr(ak, "decode_attention", attention_stand_in)
        return np.stack([e.prefill(PROMPT)] + [e.decode(t) for t in DECODE]), e

    plain, _ = run(False)
    assert calls == []
    got, e = run(True)
    settings = e.model.settings
    assert len(calls) == e.model.hp.n_layer and {c[0] for c in calls} == {bk.CUDA}  # traced once: a call a layer
    assert [c[1] for c in calls] == [s.rope for s in settings] and [c[2] for c in calls] == [s.q_scale for s in settings]
    assert "its RoPE and F16 rows one kernel of ours" in e.backend.description
    assert rel(got, plain) <= STEP_REL_TOL


def test_off_by_default_and_only_beside_the_attention_kernel(tiny_model):
    """ROPE_KERNEL_DEFAULTS: nowhere yet; decode_attention answers None without our kernels (the CPU)."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends import mlx_backend

    assert mlx_backend.ROPE_KERNEL_DEFAULTS == {}
    b = mlx_backend.MLXBackend(device="cpu")
    b.rope_kernel = b.attention_kernel = True
    assert b.decode_attention(None, 0, None, None, None, None, None, 1.0) is None


@pytest.mark.gpu
@pytest.mark.parametrize("d, dv, n_dims, neox, scale_q", VARIANTS)
def test_gpu_kernel_is_the_reference(rk, d, dv, n_dims, neox, scale_q):
    """On a GPU NVRTC may fuse x cos - x' sin into one multiply-add: within two float32 roundings of |x| + |x'|, and
    the F16 rows equal or one F16 step apart where that moved a value across a tie."""
    import mlx.core as mx

    from inference_engine.backends.mlx import block_kernels as bk

    if not mx.is_available(mx.gpu) or bk.gpu_dialect() is None:
        pytest.skip(f"MLX {mx.__version__} has no GPU here: our kernels run on Metal or CUDA only")
    for p in (0, 17, POSITIONS - 1):
        q, k, v, cos, sin = case(d, dv, n_dims, seed=7 * d + n_dims + p)
        q_scale = 0.0625 if scale_q else None
        rope = {"n_dims": n_dims, "neox": bool(neox)} if n_dims else None
        got = rk.rope_f16(bk.gpu_dialect(), mx.array(q[None]), mx.array(k[None]), mx.array(v[None]),
                          (mx.array(cos), mx.array(sin)), mx.array([p], dtype=mx.int32), rope, q_scale)
        rq, rkk, rv = reference(q, k, v, cos, sin, p, n_dims, neox, q_scale)
        bound = 4 * np.finfo(np.float32).eps * np.abs(q).max(axis=1, keepdims=True) * np.float32(q_scale or 1)
        assert np.all(np.abs(np.array(got[0])[0] - rq) <= bound)
        step = np.abs(np.array(got[1])[0].view(np.uint16).astype(np.int32) - rkk.view(np.uint16).astype(np.int32))
        assert step.max() <= 1
        np.testing.assert_array_equal(np.array(got[2])[0].view(np.uint16), rv.view(np.uint16))


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "smollm3"])
def test_gpu_compiled_steps_with_the_rope_kernel(tiny_model, arch):
    """On a GPU, compiled steps with the RoPE kernel (and the attention kernel) against the same steps without it:
    the same F16 cache but where a fused multiply-add moved a K value across an F16 tie (test_mlx_steps' band)."""
    from test_mlx_steps import F16_STEP_REL_TOL, engine, logits_rows, rel

    path = tiny_model(arch, "Q8_0")
    rows = []
    for on in (False, True):
        e = engine(path, "compiled", kv_type="f16")
        e.backend.attention_kernel, e.backend.rope_kernel = True, on
        rows.append(logits_rows(e))
    assert rel(rows[1], rows[0]) <= F16_STEP_REL_TOL
