"""Each op of the MLX backend against the NumPy reference backend (llama.cpp's CPU numerics, f32 mode).

The reference is checked against llama.cpp by its own tests; here the question is only whether MLX computes the
same op. Where MLX does the same float32 operations in the same order the result must be identical (the KV
cache's F16 rounding, embeddings, add, scale); where MLX sums in another order or in float32 instead of double, the tolerance
says how much that may move a value.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import TENSOR_TYPES
from gguf import GGMLQuantizationType as T

from inference_engine.backends import get_backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import quant_for

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")

pytestmark = pytest.mark.mlx

# mx.fast.rms_norm sums squares in float32, ggml in double: for 64..512 values of O(1) that moves the mean by a
# few float32 ulps, so the output by a few 1e-7 relative (measured 9.5e-7 absolute on unit-scale rows).
RMS_NORM_RTOL = 1e-5
# Attention: MLX scales q before q.k (ggml scales the scores) and sums in its own order; measured 6e-7 absolute on
# unit-scale inputs. 1e-5 is far below what a masking or head-grouping mistake produces (O(0.1)).
ATTENTION_ATOL = 1e-5
# exp and tanh: MLX's float32 implementations against correctly rounded ones: a few ulps.
ACTIVATION_RTOL = 1e-5
ACTIVATION_ATOL = 1e-6
# Matmul: the same exact weights, float32 sums in a different order (and MLX's quantized_matmul factors the bias
# out of each group): relative to the row norms, a few 1e-7 per product; 1e-5 of the output scale leaves room.
MATMUL_RTOL = 1e-5

MATRIX_TYPES = TENSOR_TYPES  # every type the fixtures write
# Every op test on MLX's CPU and, where MLX has one, on its GPU (Metal or CUDA), against the same bounds: on the GPU
# our f32 numerics are float32 too (MLX_ENABLE_TF32=0, inference_engine.backends.mlx.device).
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


@pytest.fixture(params=DEVICES)
def mlx_backend(request):
    # one per test: making it makes its device MLX's default (process-wide), so no test runs on another's device
    return get_backend("mlx", "f32", device=request.param)


@pytest.fixture(scope="module")
def ref():
    return get_backend("numpy", "f32")


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def weight(qtype: str, n_out: int, n_in: int, rng) -> TensorInfo:
    quant = quant_for(qtype)
    rows = quant.random_rows(n_out, n_in, rng)
    raw = {"F32": np.float32, "F16": np.float16}.get(qtype)
    return TensorInfo(f"test.{qtype}", quant.qtype, (n_out, n_in), rows.nbytes, rows.view(raw) if raw else rows)


def test_ggml_numerics_is_a_user_error():
    with pytest.raises(GGUFParityError, match="backend 'mlx' does not support numerics 'ggml'; supported: f32"):
        get_backend("mlx", "ggml")


def test_description_says_numerics_and_weight_forms(mlx_backend):
    text = mlx_backend.description
    assert "f32 numerics only" in text and f"MLX {mx.__version__}" in text
    kernels = mlx_backend.kernels  # our GGUF-block kernels: Metal / CUDA on a GPU, None on the CPU
    expected = f"GGUF blocks read by our {kernels.name} kernels" if kernels else "dequantized float32 (CPU)"
    assert f"Q2_K/Q3_K/Q6_K/IQ4_XS/IQ4_NL as {expected}, floats as float32" in text
    assert (kernels is None) == (mlx_backend.device == "cpu")
    assert mlx_backend.versions()["mlx"] == mx.__version__


@pytest.mark.parametrize("qtype", MATRIX_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_matmul(mlx_backend, ref, rng, qtype, n_tokens):
    t = weight(qtype, 96, 512, rng)
    x = rng.standard_normal((n_tokens, 512)).astype(np.float32)
    expected = ref.matmul(ref.load_matrix(t), x)
    got = mlx_backend.to_numpy(mlx_backend.matmul(mlx_backend.load_matrix(t), mx.array(x)))
    scale = np.abs(x).sum(axis=1, keepdims=True) * np.abs(quant_for(qtype).dequantize(np.asarray(t.raw))).max()
    assert got.shape == expected.shape
    assert np.all(np.abs(got - expected) <= MATMUL_RTOL * scale)


# (types of three matrices that multiply one input, the runs load_matrices makes of them): Q4_0 and Q4_K both
# transcode to 4-bit groups of 32 and stack; Q8_0 (8 bits) and Q6_K (no affine form) stay alone.
RUNS = [
    (("Q4_K", "Q4_K", "Q4_K"), [3]),
    (("Q4_K", "Q4_K", "Q6_K"), [2, None]),
    (("Q4_K", "Q4_0", "Q8_0"), [2, None]),
    (("Q8_0", "Q5_K", "Q5_K"), [None, 2]),
]


@pytest.mark.parametrize("types, runs", RUNS)
@pytest.mark.parametrize("n_tokens", [1, 5])
def test_matrices_loaded_together_multiply_as_runs(mlx_backend, ref, rng, types, runs, n_tokens):
    from inference_engine.backends.mlx.weights import FusedAffine

    ts = [weight(qtype, n_out, 512, rng) for qtype, n_out in zip(types, (128, 64, 96))]
    parts = mlx_backend.load_matrices(ts)
    made = mlx_backend._runs[tuple(map(id, parts))]
    assert [len(r.parts) if isinstance(r, FusedAffine) else None for r in made] == runs
    x = rng.standard_normal((n_tokens, 512)).astype(np.float32)
    together = [mlx_backend.to_numpy(y) for y in mlx_backend.matmul_many(parts, mx.array(x))]
    alone = [mlx_backend.to_numpy(mlx_backend.matmul(p, mx.array(x))) for p in parts]  # row slices of the stack
    for t, got, one in zip(ts, together, alone):
        expected = ref.matmul(ref.load_matrix(t), x)
        scale = np.abs(x).sum(axis=1, keepdims=True) * np.abs(quant_for(t.qtype).dequantize(np.asarray(t.raw))).max()
        assert got.shape == one.shape == expected.shape
        assert np.all(np.abs(got - expected) <= MATMUL_RTOL * scale)
        assert np.all(np.abs(one - expected) <= MATMUL_RTOL * scale)


@pytest.mark.parametrize("types, runs", RUNS[:2])
def test_biases_of_a_stacked_run_are_added_once(mlx_backend, ref, rng, types, runs):
    """Q/K/V biases (qwen2): a run whose parts all have one gets them end to end, one add on the stacked product;
    the values are the product plus the bias of each part, as the reference computes them."""
    ts = [weight(qtype, n_out, 512, rng) for qtype, n_out in zip(types, (128, 64, 96))]
    parts = mlx_backend.load_matrices(ts)
    biases = [rng.standard_normal(t.shape[0]).astype(np.float32) for t in ts]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    got = mlx_backend.matmul_many(parts, mx.array(x), [mx.array(b) for b in biases])
    assert len(mlx_backend._stacked_biases) == sum(n is not None for n in runs)
    for t, y, bias in zip(ts, got, biases):
        expected = ref.add(ref.matmul(ref.load_matrix(t), x), bias)
        scale = np.abs(x).sum() * np.abs(quant_for(t.qtype).dequantize(np.asarray(t.raw))).max()
        assert np.all(np.abs(mlx_backend.to_numpy(y) - expected) <= MATMUL_RTOL * scale)


def test_matrices_are_loaded_alone_when_fusing_is_off(rng):
    backend = get_backend("mlx", "f32", device="cpu")
    backend.fuse_matrices = False
    parts = backend.load_matrices([weight("Q4_K", 64, 256, rng), weight("Q4_K", 64, 256, rng)])
    assert backend._runs == {} and len(backend.matmul_many(parts, mx.ones((1, 256)))) == 2


@pytest.mark.parametrize("qtype", ["F32", "BF16", "Q8_0", "Q4_K", "Q6_K"])
def test_embedding_rows_are_exact(mlx_backend, ref, rng, qtype):
    t = weight(qtype, 40, 256, rng)
    ids = np.array([3, 0, 39, 3])
    got = mlx_backend.to_numpy(mlx_backend.embed(mlx_backend.load_embedding(t), ids))
    np.testing.assert_array_equal(got, ref.embed(ref.load_embedding(t), ids))


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(mlx_backend, ref, rng, with_weight):
    x = (rng.standard_normal((5, 3, 128)) * 3).astype(np.float32)
    w = rng.standard_normal(128).astype(np.float32) if with_weight else None
    got = mlx_backend.rms_norm(mx.array(x), None if w is None else mx.array(w), 1e-6)
    np.testing.assert_allclose(
        mlx_backend.to_numpy(got), ref.rms_norm(x, w, 1e-6), rtol=RMS_NORM_RTOL, atol=RMS_NORM_RTOL
    )


# RoPE: the same angles (ggml's repeated float32 product, the C library's cosf/sinf), but ggml and the reference
# contract ``x0*cos - x1*sin`` into one FMA while MLX rounds each product: at most one float32 rounding of a
# product, i.e. 2**-23 of max|x| (and 2**-22 leaves room for the FMA's own rounding). A wrong angle or pairing is
# O(max|x|).
ROPE_ULPS_OF_MAX = 2.0**-22


def assert_rope_close(got, expected, x):
    np.testing.assert_allclose(got, expected, rtol=0, atol=ROPE_ULPS_OF_MAX * np.abs(x).max())


@pytest.mark.parametrize("neox", [False, True], ids=["norm", "neox"])
@pytest.mark.parametrize("start", [0, 7, 3000])
@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope(mlx_backend, ref, rng, neox, start, n_dims):
    """Both pairings, a partial rotation (n_dims < head_dim) and far positions where angle rounding would show."""
    x = rng.standard_normal((6, 4, 64)).astype(np.float32)
    positions = np.arange(start, start + 6)
    got = mlx_backend.rope(mx.array(x), positions, n_dims, 10000.0, neox, freq_scale=0.5)
    expected = ref.rope(x, positions, n_dims, 10000.0, neox, freq_scale=0.5)
    assert_rope_close(mlx_backend.to_numpy(got), expected, x)
    np.testing.assert_array_equal(mlx_backend.to_numpy(got)[..., n_dims:], x[..., n_dims:])


def test_rope_with_frequency_factors(mlx_backend, ref, rng):
    x = rng.standard_normal((3, 2, 64)).astype(np.float32)
    factors = rng.uniform(1, 8, 32).astype(np.float32)
    positions = np.arange(10, 13)
    got = mlx_backend.rope(mx.array(x), positions, 64, 500000.0, False, freq_factors=factors)
    assert_rope_close(mlx_backend.to_numpy(got), ref.rope(x, positions, 64, 500000.0, False, freq_factors=factors), x)


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
@pytest.mark.parametrize("window", [0, 3])
@pytest.mark.parametrize("n_tokens,start", [(6, 0), (1, 8), (3, 5)])
def test_attention_through_the_cache(mlx_backend, ref, rng, kv_type, window, n_tokens, start):
    """GQA (4 query heads on 2 KV heads), causal and sliding-window masks, prefill and decode shapes, read back
    through each backend's own KV cache (with its F16 rounding)."""
    n_ctx, n_head, n_head_kv, d = 16, 4, 2, 32
    history_k = rng.standard_normal((start, n_head_kv, d)).astype(np.float32)
    history_v = rng.standard_normal((start, n_head_kv, d)).astype(np.float32)
    k = rng.standard_normal((n_tokens, n_head_kv, d)).astype(np.float32)
    v = rng.standard_normal((n_tokens, n_head_kv, d)).astype(np.float32)
    q = rng.standard_normal((n_tokens, n_head, d)).astype(np.float32)
    positions = np.arange(start, start + n_tokens)
    kv_len = start + n_tokens
    outs = []
    for b, arr in ((ref, np.asarray), (mlx_backend, mx.array)):
        kbuf, vbuf = b.kv_alloc(n_ctx, n_head_kv, d, kv_type), b.kv_alloc(n_ctx, n_head_kv, d, kv_type)
        if start:
            kbuf, vbuf = b.kv_store(kbuf, 0, arr(history_k)), b.kv_store(vbuf, 0, arr(history_v))
        kbuf, vbuf = b.kv_store(kbuf, start, arr(k)), b.kv_store(vbuf, start, arr(v))
        out = b.attention(arr(q), b.kv_view(kbuf, kv_len), b.kv_view(vbuf, kv_len), positions, kv_len, 0.17, window)
        outs.append(b.to_numpy(out))
        np.testing.assert_array_equal(
            np.asarray(b.to_numpy(b.kv_view(kbuf, kv_len)), dtype=np.float32),
            np.concatenate([history_k, k]).astype(kv_type.replace("f", "float")),
        )
    assert outs[1].shape == (n_tokens, n_head * d)
    np.testing.assert_allclose(outs[1], outs[0], atol=ATTENTION_ATOL, rtol=0)


def test_kv_store_is_evaluated_with_the_next_result(mlx_backend):
    """Lazy writes: a store becomes a computed array at the next to_numpy / synchronize, not a growing graph."""
    buf = mlx_backend.kv_alloc(8, 1, 4, "f32")
    for i in range(8):
        buf = mlx_backend.kv_store(buf, i, mx.full((1, 1, 4), float(i)))
    assert mlx_backend._pending
    mlx_backend.synchronize(mx.array(0.0))
    assert not mlx_backend._pending
    np.testing.assert_array_equal(np.array(mlx_backend.kv_view(buf, 8))[:, 0, 0], np.arange(8, dtype=np.float32))


def test_activations_and_elementwise(mlx_backend, ref, rng):
    gate = (rng.standard_normal((4, 512)) * 4).astype(np.float32)
    up = rng.standard_normal((4, 512)).astype(np.float32)
    for op in ("swiglu", "geglu"):
        got = mlx_backend.to_numpy(getattr(mlx_backend, op)(mx.array(gate), mx.array(up)))
        np.testing.assert_allclose(got, getattr(ref, op)(gate, up), rtol=ACTIVATION_RTOL, atol=ACTIVATION_ATOL)
    np.testing.assert_array_equal(
        mlx_backend.to_numpy(mlx_backend.add(mx.array(gate), mx.array(up[0]))), ref.add(gate, up[0])
    )
    np.testing.assert_array_equal(
        mlx_backend.to_numpy(mlx_backend.scale(mx.array(gate), 25.298221281347036)),
        ref.scale(gate, 25.298221281347036),
    )


def test_weight_forms_follow_the_type():
    from inference_engine.backends.mlx.block_kernels import DIALECTS
    from inference_engine.backends.mlx.weights import AffineMatrix, BlockMatrix, DenseMatrix, matrix_form

    for dialect in (None, *DIALECTS):  # the CPU, Metal, CUDA
        for qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K):
            assert matrix_form(qtype, dialect) is AffineMatrix
        for qtype in (T.Q2_K, T.Q3_K, T.Q6_K, T.IQ4_XS, T.IQ4_NL):
            assert matrix_form(qtype, dialect) is (DenseMatrix if dialect is None else BlockMatrix)
        for qtype in (T.F32, T.F16, T.BF16):
            assert matrix_form(qtype, dialect) is DenseMatrix
        # MLXBackend.block_kernel_types: Q4_K / Q5_K in their blocks on a GPU; types our kernels lack stay affine
        asked = frozenset({T.Q4_K, T.Q5_K, T.Q8_0})
        assert matrix_form(T.Q4_K, dialect, asked) is (AffineMatrix if dialect is None else BlockMatrix)
        assert matrix_form(T.Q5_K, dialect, asked) is (AffineMatrix if dialect is None else BlockMatrix)
        assert matrix_form(T.Q8_0, dialect, asked) is AffineMatrix


def test_block_matrices_of_one_type_stack_into_one_product():
    """fuse_runs stacks consecutive block matrices of one type and width (a layer's Q and K in Q4_K, with V in
    Q6_K alone), each part's blocks a row slice of the stacked rows, the file's bytes unchanged."""
    from inference_engine.backends.mlx.block_kernels import CUDA
    from inference_engine.backends.mlx.weights import BlockMatrix, FusedBlocks, fuse_runs

    rng = np.random.default_rng(5)
    shapes = [(T.Q4_K, 512), (T.Q4_K, 256), (T.Q6_K, 256), (T.Q4_K, 128)]
    rows = [quant_for(qtype).random_rows(n_out, 512, rng) for qtype, n_out in shapes]
    parts = [BlockMatrix(TensorInfo(f"w{i}", qtype, (n_out, 512), r.nbytes, r), CUDA)
             for i, ((qtype, n_out), r) in enumerate(zip(shapes, rows))]
    runs = fuse_runs(parts)
    assert [type(r) for r in runs] == [FusedBlocks, BlockMatrix, BlockMatrix]
    stacked = runs[0]
    assert stacked.bounds == [(0, 512), (512, 768)] and (stacked.n_out, stacked.n_in) == (768, 512)
    np.testing.assert_array_equal(np.array(stacked.blocks), np.concatenate(rows[:2]))
    for part, r in zip(parts, rows):
        np.testing.assert_array_equal(np.array(part.blocks), r)
