"""The decode-attention GPU kernel (``gpu_kernels/kernel_decode_attention.inc``, ``backends/mlx/attention_kernel.py``).

* Where a C++20 compiler exists: the kernels' own files compiled for the host with ``dialect_host.h`` and both
  passes run for every thread of their grids (SIMD groups and the barrier as in test_mlx_block_kernels.py), against
  the NumPy reference backend's attention over the same F16 cache: grouped heads, head sizes 64 and 128, positions
  in the first chunk of slots and past it (three chunks), sliding windows, a chunk the window leaves empty.
* Where NVRTC is installed (no GPU needed): the CUDA text as MLX compiles it.
* The compiled decode step's wiring: with the switch on and a kernel dialect, it calls the kernel with this
  layer's buffers, the step's position, the scale and the window, and its logits stay the plain path's.
* On a GPU (marked ``gpu``): the kernel through MLX against the same reference.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from inference_engine.backends.numpy_ref import NumpyBackend

# Attention over the same F16 keys and values: the kernels sum the scores and the weighted values in another order
# (per chunk of slots, then the chunks rescaled) and take float32 exponentials; measured ~1e-7 on unit-scale inputs.
# A wrong slot, head or window gives O(0.1).
ATTENTION_ATOL = 1e-5
# (head size, query heads per K/V head, sliding window) instantiated in the host build
VARIANTS = [(64, 1, 0), (64, 3, 0), (128, 2, 0), (128, 2, 5), (64, 1, 5), (64, 1, 140)]
N_KV = 2
N_CTX = 300  # three chunks of 128 slots, the last partial

SHIM = r"""
#include "dialect_host.h"
#include "gguf_blocks.h"
#include "decode_attention.h"

// N_CHUNKS: a template constant on the GPU, a parameter here (one build for every key block)
template <int D, int GROUP, int WINDOW>
static void chunks(const float* q, const uint16_t* k, const int* k_shape, const uint16_t* v, const int* pos,
                   const float* scale, float* part_o, float* part_m, float* part_l, const int N_CHUNKS,
                   unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {
#include "kernel_decode_attention.inc"
}

template <int D>
static void combine(const float* part_o, const float* part_m, const float* part_l, float* o, const int N_CHUNKS,
                    unsigned int gq_tid, unsigned int gq_group_x, unsigned int gq_group_y) {
#include "kernel_decode_attention_combine.inc"
}

template <int D, int GROUP, int WINDOW>
static void launch(const float* q, const uint16_t* k, const uint16_t* v, int n_head, int n_kv, int n_ctx, int p,
                   float scale, float* o) {
    const int k_shape[3] = {n_kv, n_ctx, D};
    const int n_chunks = (n_ctx + GQ_ATTN_CHUNK - 1) / GQ_ATTN_CHUNK;
    std::vector<float> part_o((size_t)n_head * n_chunks * D, NAN), part_m((size_t)n_head * n_chunks, NAN),
        part_l((size_t)n_head * n_chunks, NAN);
    gq_host_launch((unsigned int)n_chunks, (unsigned int)n_head, GQ_ATTN_THREADS,
                   [&](unsigned int tid, unsigned int gx, unsigned int gy) {
        chunks<D, GROUP, WINDOW>(q, k, k_shape, v, &p, &scale, part_o.data(), part_m.data(), part_l.data(), n_chunks,
                                 tid, gx, gy);
    });
    gq_host_launch((unsigned int)n_head, 1, GQ_ATTN_THREADS, [&](unsigned int tid, unsigned int gx, unsigned int gy) {
        combine<D>(part_o.data(), part_m.data(), part_l.data(), o, n_chunks, tid, gx, gy);
    });
}

extern "C" int host_decode_attention(const float* q, const uint16_t* k, const uint16_t* v, int n_head, int n_kv,
                                     int n_ctx, int d, int window, int p, float scale, float* o) {
    const int group = n_head / n_kv;
%CASES%
    return 1;  // not instantiated
}
"""


@pytest.fixture(scope="module")
def host_kernel(tmp_path_factory, pytestconfig):
    from test_mlx_block_kernels import build_host_library

    cases = "\n".join(
        f"    if (d == {d} && group == {g} && window == {w}) {{ launch<{d}, {g}, {w}>(q, k, v, n_head, n_kv, n_ctx, "
        f"p, scale, o); return 0; }}" for d, g, w in VARIANTS)
    return build_host_library(tmp_path_factory.mktemp("attention_kernel_host"), SHIM.replace("%CASES%", cases),
                              pytestconfig)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def case(d: int, group: int, seed: int):
    """q (n_head, d) float32 and a head-major F16 cache (n_kv, n_ctx, d) of unit-scale values."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((N_KV * group, d)).astype(np.float32)
    k = rng.standard_normal((N_KV, N_CTX, d)).astype(np.float16)
    v = rng.standard_normal((N_KV, N_CTX, d)).astype(np.float16)
    return q, k, v


def reference(q, k, v, p: int, scale: float, window: int) -> np.ndarray:
    """The NumPy reference backend's attention of the query at position ``p`` over the cache's first p + 1 slots."""
    out = NumpyBackend().attention(q[None], k.transpose(1, 0, 2)[: p + 1], v.transpose(1, 0, 2)[: p + 1],
                                   np.array([p]), p + 1, scale, window)
    return out.reshape(q.shape)


@pytest.mark.parametrize("d, group, window", VARIANTS)
@pytest.mark.parametrize("p", [0, 2, 3, 37, 127, 128, 200, N_CTX - 1])  # the first chunk, its end, the next ones
def test_host_kernel_is_the_reference_attention(host_kernel, d, group, window, p):
    q, k, v = case(d, group, seed=1000 * d + 10 * group + p)
    scale = float(np.float32(1.0) / np.sqrt(np.float32(d)))
    o = np.full(q.shape, np.nan, dtype=np.float32)
    assert host_kernel.host_decode_attention(_ptr(q), _ptr(k.view(np.uint16)), _ptr(v.view(np.uint16)), q.shape[0],
                                             N_KV, N_CTX, d, window, p, ctypes.c_float(scale), _ptr(o)) == 0
    np.testing.assert_allclose(o, reference(q, k, v, p, scale, window), rtol=0, atol=ATTENTION_ATOL)


def test_host_kernel_reads_no_slot_past_the_position(host_kernel):
    """Slots after the position hold anything (another sequence's rows, NaN): the result does not change."""
    q, k, v = case(64, 1, seed=5)
    p, scale = 9, 0.125
    out = []
    for poison in (False, True):
        kk, vv = k.copy(), v.copy()
        if poison:
            kk[:, p + 1:], vv[:, p + 1:] = np.nan, np.inf
        o = np.empty(q.shape, dtype=np.float32)
        host_kernel.host_decode_attention(_ptr(q), _ptr(kk.view(np.uint16)), _ptr(vv.view(np.uint16)), q.shape[0],
                                          N_KV, N_CTX, 64, 0, p, ctypes.c_float(scale), _ptr(o))
        out.append(o)
    np.testing.assert_array_equal(out[0], out[1])


# --- with MLX --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ak():
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    from inference_engine.backends.mlx import attention_kernel

    return attention_kernel


@pytest.mark.mlx
def test_kernel_text_for_each_dialect(ak):
    from test_mlx_block_kernels import assert_kernel_text

    from inference_engine.backends.mlx import block_kernels as bk

    for dialect in bk.DIALECTS:
        head = bk.own_header(dialect, *ak.HEADERS)
        assert "gq_f16_bits" in head
        for kernel_pass in ak.PASSES:
            assert_kernel_text(dialect, head, bk.source(dialect, kernel_pass), f"kernel_{kernel_pass}.inc")
    assert (ak.THREADS, ak.CHUNK, ak.MAX_DIM) == (128, 128, 256)


@pytest.mark.mlx
def test_supports_one_f16_token_of_whole_groups(ak):
    import mlx.core as mx

    f16 = mx.zeros((2, 16, 64), dtype=mx.float16)
    assert ak.supports((1, 6, 64), f16, f16)
    assert not ak.supports((2, 6, 64), f16, f16)  # a prefill
    assert not ak.supports((1, 5, 64), f16, f16)  # 5 query heads over 2 K/V heads
    assert not ak.supports((1, 6, 64), f16.astype(mx.float32), f16.astype(mx.float32))  # an F32 cache
    f16_80 = mx.zeros((2, 16, 80), dtype=mx.float16)
    assert not ak.supports((1, 6, 80), f16_80, f16_80)  # not a multiple of 32


@pytest.mark.mlx
def test_cuda_text_compiles_with_nvrtc(ak):
    from test_mlx_block_kernels import compile_with_nvrtc, cuda_kernel_text, find_nvrtc

    from inference_engine.backends.mlx import block_kernels as bk

    lib = find_nvrtc()
    if lib is None:
        pytest.skip("no NVRTC here (pip install nvidia-cuda-nvrtc, or MLX's CUDA build, to compile the CUDA kernels)")
    inputs = [("q", "float"), ("k", "uint16_t"), ("v", "uint16_t"), ("pos", "int32_t"), ("scale", "float")]
    head = bk.own_header(bk.CUDA, *ak.HEADERS)
    text = cuda_kernel_text("decode_attention_f16", head, bk.source(bk.CUDA, ak.PASSES[0]), inputs,
                            {"D": 128, "GROUP": 6, "WINDOW": 0, "N_CHUNKS": 4}, output=["part_o", "part_m", "part_l"])
    compile_with_nvrtc(ctypes.CDLL(str(lib)), text, "decode_attention_f16")
    inputs = [("part_o", "float"), ("part_m", "float"), ("part_l", "float")]
    text = cuda_kernel_text("decode_attention_combine_f16", head, bk.source(bk.CUDA, ak.PASSES[1]), inputs,
                            {"D": 128, "N_CHUNKS": 4}, output="o")
    compile_with_nvrtc(ctypes.CDLL(str(lib)), text, "decode_attention_combine_f16")


@pytest.mark.mlx
def test_a_compiled_step_hands_its_attention_to_the_kernel(tiny_model, monkeypatch, ak):
    """With the switch on and a kernel dialect (stood in for here: no GPU), each layer of a compiled decode step calls
    the kernel with its own buffers, the step's position, the scale and the window; a stand-in computing the masked
    attention over the visible slots leaves the logits the plain path's."""
    import mlx.core as mx
    from test_mlx_steps import DECODE, PROMPT, STEP_REL_TOL, rel

    from inference_engine.engine import OurEngine

    path = tiny_model("gemma3", "Q8_0")  # sliding-window and global layers
    calls = []

    def run(kernel: bool) -> tuple[np.ndarray, OurEngine]:
        e = OurEngine(path, backend="mlx", numerics="f32", n_ctx=64, kv_type="f16")
        b = e.backend

        def stand_in(dialect, q, k_buffer, v_buffer, pos, scale, window, n_keys):
            calls.append((dialect, k_buffer.shape, scale, window, n_keys))
            slots = mx.arange(k_buffer.shape[1])[None, :]
            visible = slots <= pos[:, None]
            if window:
                visible = mx.logical_and(visible, (pos[:, None] - slots) < window)
            return b.masked_attention(q, k_buffer.transpose(1, 0, 2), v_buffer.transpose(1, 0, 2), visible, scale)

        monkeypatch.setattr(b, "attention_kernel", kernel)  # on by default on CUDA: off here for the plain path
        if kernel:
            monkeypatch.setattr(b, "kernels", "a dialect")
            monkeypatch.setattr(ak, "decode_attention", stand_in)
        return np.stack([e.prefill(PROMPT)] + [e.decode(t) for t in DECODE]), e

    plain, _ = run(False)
    assert calls == []
    got, e = run(True)
    hp = e.model.hp
    assert len(calls) == hp.n_layer  # traced once: one call per layer
    assert {c[0] for c in calls} == {"a dialect"} and {c[1] for c in calls} == {(hp.n_head_kv, 64, hp.head_dim_k)}
    assert sorted({c[3] for c in calls}) == [0, hp.sliding_window]
    assert {c[4] for c in calls} == {64}  # the step's block of key slots: all 64 of this cache
    assert rel(got, plain) <= STEP_REL_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("d, group, window", VARIANTS)
def test_gpu_kernel_is_the_reference_attention(ak, d, group, window):
    import mlx.core as mx

    from inference_engine.backends.mlx import block_kernels as bk

    if not mx.is_available(mx.gpu) or bk.gpu_dialect() is None:
        pytest.skip(f"MLX {mx.__version__} has no GPU here: our kernels run on Metal or CUDA only")
    for p in (0, 3, 37, 128, 200, N_CTX - 1):
        q, k, v = case(d, group, seed=7 * d + group + p)
        scale = float(np.float32(1.0) / np.sqrt(np.float32(d)))
        got = ak.decode_attention(bk.gpu_dialect(), mx.array(q[None]), mx.array(k), mx.array(v),
                                  mx.array([p], dtype=mx.int32), scale, window)
        np.testing.assert_allclose(np.array(got).reshape(q.shape), reference(q, k, v, p, scale, window), rtol=0,
                                   atol=ATTENTION_ATOL)
