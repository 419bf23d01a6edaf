"""The kernels' activation side against libggml's own ``from_float`` functions, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels.ops import activations as act

K = 512  # two Q8_K super-blocks, sixteen Q8_0 blocks
# f32 numerics: the block sums are 32 float32 additions in order; against a float64 sum they differ by float32
# rounding, at most ~32 * eps32 (4e-6) of the sum of magnitudes. 1e-5 of the block's largest |x| * 32 covers it.
BLOCK_SUM_TOL = 1e-5


def _activation_rows(rng, n_rows=6):
    """Rows at several magnitudes, with the cases the quantizers branch on: an all-zero block, ties in |max|."""
    scales = np.array([1e-3, 1e-2, 1.0, 30.0, 1e3, 1.0])[:n_rows, None]
    x = (rng.standard_normal((n_rows, K)) * scales).astype(np.float32)
    x[0, :32] = 0.0  # a zero Q8_0 block
    x[1, :256] = 0.0  # a zero Q8_K super-block
    x[2, 10], x[2, 20] = 7.0, -7.0  # equal magnitudes of both signs: Q8_K keeps the first
    return x


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def test_q8_0_matches_libggml(oracle, rng):
    x = _activation_rows(rng)
    qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], K // 32), np.float32)
    act.quantize_q8_0(x, qs, d)
    for t, row in enumerate(x):
        ref = oracle.quantize_row(T.Q8_0, row).reshape(-1, 34)
        np.testing.assert_array_equal(ref[:, 2:].view(np.int8).reshape(-1), qs[t])
        np.testing.assert_array_equal(_f16(ref[:, :2]).reshape(-1), d[t])


def test_q8_1_matches_libggml(oracle, rng):
    x = _activation_rows(rng)
    qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], K // 32), np.float32)
    s = np.empty_like(d)
    act.quantize_q8_1(x, qs, d, s)
    for t, row in enumerate(x):
        ref = oracle.quantize_row(T.Q8_1, row).reshape(-1, 36)
        np.testing.assert_array_equal(ref[:, 4:].view(np.int8).reshape(-1), qs[t])
        np.testing.assert_array_equal(_f16(ref[:, 0:2]).reshape(-1), d[t])
        np.testing.assert_array_equal(_f16(ref[:, 2:4]).reshape(-1), s[t])


def test_q8_K_matches_libggml(oracle, rng):
    x = _activation_rows(rng)
    qs, d = np.empty(x.shape, np.int8), np.empty((x.shape[0], K // 256), np.float32)
    bsums = np.empty((x.shape[0], K // 16), np.int16)
    act.quantize_q8_K(x, qs, d, bsums)
    for t, row in enumerate(x):
        ref = oracle.quantize_row(T.Q8_K, row).reshape(-1, 292)
        np.testing.assert_array_equal(np.ascontiguousarray(ref[:, :4]).view(np.float32).reshape(-1), d[t])
        np.testing.assert_array_equal(ref[:, 4:260].view(np.int8).reshape(-1), qs[t])
        np.testing.assert_array_equal(np.ascontiguousarray(ref[:, 260:]).view(np.int16).reshape(-1), bsums[t])


@pytest.mark.parametrize("vec_dot_type", [T.F16, T.BF16])
def test_float_roundings_match_libggml(oracle, rng, vec_dot_type):
    x = _activation_rows(rng)
    x[3, :4] = [np.inf, -np.inf, np.nan, 65520.0]  # overflow to inf and NaN handling
    xv, _ = act.prepare(x, "ggml", vec_dot_type.name.lower(), 0)
    for t, row in enumerate(x):
        raw = oracle.quantize_row(vec_dot_type, row)
        if vec_dot_type == T.F16:
            ref = raw.view(np.float16).astype(np.float32)
        else:
            ref = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(ref, xv[t])


@pytest.mark.parametrize("vec_dot_type, sub", [("q8_0", 32), ("q8_1", 32), ("q8_K", 16), ("q8_K", 32)])
def test_ggml_activation_is_the_dequantized_quantization(rng, vec_dot_type, sub):
    """xv is exactly q * d and xs the block constant ggml multiplies with (d * sum(q), or Q8_1's f16 s)."""
    x = _activation_rows(rng)
    xv, xs = act.prepare(x, "ggml", vec_dot_type, sub)
    block = 256 if vec_dot_type == "q8_K" else 32
    qs = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], K // block), np.float32)
    if vec_dot_type == "q8_0":
        act.quantize_q8_0(x, qs, d)
    elif vec_dot_type == "q8_1":
        s = np.empty_like(d)
        act.quantize_q8_1(x, qs, d, s)
    else:
        act.quantize_q8_K(x, qs, d, np.empty((x.shape[0], K // 16), np.int16))
    d_per_value = np.repeat(d, block, axis=1)
    np.testing.assert_array_equal(xv, qs.astype(np.float32) * d_per_value)
    if vec_dot_type == "q8_1":
        np.testing.assert_array_equal(xs, s)
    else:
        q_sums = qs.reshape(x.shape[0], -1, sub).astype(np.int64).sum(axis=2).astype(np.float32)
        np.testing.assert_array_equal(xs, d_per_value[:, ::sub] * q_sums)


def test_f32_numerics_leaves_the_activation_alone(rng):
    x = _activation_rows(rng)
    xv, xs = act.prepare(x, "f32", "q8_1", 32)
    assert xv is x
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float64)
    magnitude = np.abs(blocks).sum(axis=2)
    assert np.all(np.abs(xs - blocks.sum(axis=2)) <= BLOCK_SUM_TOL * magnitude)


@pytest.mark.parametrize("kind", act.INT_ACTIVATIONS)
def test_one_token_quantizer_is_the_first_row_of_quantize_int(kind, rng):
    """The decode fast path's one-call quantizer gives quantize_int's arrays, bit for bit, 1-D."""
    x = (rng.standard_normal((1, 512)) * 3).astype(np.float32)
    whole = act.quantize_int(x, kind)
    row = act.quantize_int_row(x[0], kind)
    for a, b in zip(row, whole):
        assert a.ndim == 1 and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b[0])


@pytest.mark.parametrize("kind", act.INT_ACTIVATIONS)
def test_quantize_int_splits_many_tokens_over_threads_with_the_same_bits(kind, rng):
    """From PARALLEL_TOKENS tokens on the tokens are quantized on several threads: each token's arrays are what it
    gets alone (one thread)."""
    import numba

    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    x = (rng.standard_normal((act.PARALLEL_TOKENS + 5, 512)) * rng.uniform(0.01, 30, (act.PARALLEL_TOKENS + 5, 1)))
    x = x.astype(np.float32)
    x[3] = 0.0  # an all-zero token: the quantizers' special case
    many = act.quantize_int(x, kind)
    for t in range(x.shape[0]):
        for a, b in zip(many, act.quantize_int(x[t : t + 1], kind), strict=True):
            np.testing.assert_array_equal(a[t : t + 1], b)


def test_one_token_quantizer_names_the_known_kinds():
    with pytest.raises(ValueError, match="q8_K"):
        act.quantize_int_row(np.zeros(256, np.float32), "q9_9")
