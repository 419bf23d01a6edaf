"""Our Q8_0 / Q8_1 / Q8_K / F16 / BF16 activation conversions equal libggml's own, bit for bit."""

from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from inference_engine.errors import GGUFParityError
from inference_engine.quants import (
    Q8_QUANTIZERS,
    Q8_0Rows,
    fake_quantize,
    quantize_activation,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_K,
)

K = 512  # two Q8_K super-blocks, sixteen Q8_0 blocks


def random_rows(rng: np.random.Generator) -> np.ndarray:
    """Rows of very different character: normal at several scales, heavy tails, uniform, sparse."""
    rows = [
        rng.standard_normal(K),
        rng.standard_normal(K) * 1e-3,
        rng.standard_normal(K) * 1e4,
        rng.standard_cauchy(K),
        rng.uniform(-1, 1, K),
        np.where(rng.random(K) < 0.9, 0.0, rng.standard_normal(K)),
    ]
    return np.array(rows, dtype=np.float32)


def edge_rows() -> np.ndarray:
    """Zeros, huge and tiny magnitudes (normal and subnormal), mixed scales, +/- maxima of equal size."""
    rows = np.zeros((9, K), dtype=np.float32)
    rows[1, :] = np.linspace(-1, 1, K) * 3.0e38  # near FLT_MAX
    rows[2, :] = np.linspace(-1, 1, K) * 1.0e-30  # tiny but normal
    rows[3, :] = np.linspace(-1, 1, K) * 1.0e-40  # subnormal: 127/amax overflows to inf
    rows[4, :] = np.linspace(-1, 1, K)
    rows[4, ::37] = 1.0e30  # one huge value per few blocks next to O(1) values
    rows[5, :] = np.linspace(-1, 1, K) * 1e-4
    rows[5, 0], rows[5, 300] = -5.0, 5.0  # equal magnitudes, negative first: Q8_K keeps the first (negative)
    rows[6, :] = np.linspace(-1, 1, K)
    rows[6, 10], rows[6, 20] = 7.0, -7.0  # positive first
    rows[7, :256] = 0.0  # one all-zero super-block next to a normal one
    rows[7, 256:] = np.linspace(-2, 2, 256)
    rows[8, :] = -0.0  # negative zeros
    return rows


def tie_rows() -> np.ndarray:
    """Rows whose scaled values land exactly on .5: amax 127 (scale 1) and 63.5 (scale 2), tie values k + 0.5.

    x86's quantize_row_q8_0/q8_1 round those half to even; quantize_row_q8_0_ref's roundf would round away.
    """
    ties = (np.arange(K, dtype=np.float32) % 50 - 25) + np.float32(0.5)  # -24.5 .. 24.5
    a = ties.copy()
    a[::32] = 127.0  # every Q8_0 block and Q8_K super-block has max 127, first, positive
    b = ties / 2
    b[::32] = 63.5
    return np.stack([a, b]).astype(np.float32)


def all_rows(rng) -> np.ndarray:
    return np.concatenate([random_rows(rng), edge_rows(), tie_rows()])


@pytest.mark.parametrize("vdt", list(Q8_QUANTIZERS), ids=lambda t: t.name)
def test_q8_quantizers_equal_libggml_bit_for_bit(oracle, rng, vdt):
    quantize, rows_type = Q8_QUANTIZERS[vdt]
    x = all_rows(rng)
    with np.errstate(all="ignore"):
        ours = quantize(x)
    ref_bytes = oracle.quantize_rows(vdt, x)
    ref = rows_type.from_bytes(ref_bytes)
    for field in dataclasses.fields(ours):
        name = field.name
        np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name), err_msg=f"{vdt.name}.{name}")
    np.testing.assert_array_equal(ours.to_bytes(), ref_bytes)


def test_ties_round_half_to_even_as_the_simd_quantizers_do(oracle):
    x = tie_rows()
    q = quantize_q8_0(x)
    scaled = x.reshape(2, -1, 32) * (np.float32(127) / np.abs(x.reshape(2, -1, 32)).max(axis=-1, keepdims=True))
    is_tie = np.abs(scaled - np.trunc(scaled)) == 0.5
    assert is_tie.sum() > 400  # the construction really produces ties
    np.testing.assert_array_equal(q.qs[is_tie], np.rint(scaled[is_tie]))  # half to even, not away from zero
    assert np.any(np.rint(scaled[is_tie]) != np.trunc(scaled[is_tie]) + np.sign(scaled[is_tie]))
    k = quantize_q8_K(x)  # iscale = -127/127 = -1 (and -2): ties again, half to even via nearest_int
    np.testing.assert_array_equal(k.qs.reshape(2, -1, 32)[is_tie], -np.rint(scaled[is_tie]))
    # The portable quantize_row_q8_0_ref (libggml-base) rounds these differently: the x86 one is what runs.
    ref_fn = oracle._fn(oracle.base, "quantize_row_q8_0_ref")
    portable = np.zeros((2, 16 * 34), np.uint8)
    for row, out in zip(x, portable):
        ref_fn(row.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(K))
    assert not np.array_equal(Q8_0Rows.from_bytes(portable).qs, q.qs)


def test_q8_1_sum_uses_the_float32_scale_before_f16_rounding(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = quantize_q8_1(x)
    d32 = np.abs(x.reshape(4, 2, 32)).max(axis=-1) / np.float32(127)
    expected = (d32 * q.qs.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(q.s, expected)
    np.testing.assert_array_equal(q.d, d32.astype(np.float16).astype(np.float32))


def test_q8_K_bsums_are_sums_of_16_quants(rng):
    q = quantize_q8_K(rng.standard_normal((3, 512)).astype(np.float32))
    np.testing.assert_array_equal(q.bsums, q.qs.reshape(3, 2, 16, 16).astype(np.int32).sum(-1))
    assert q.qs.shape == (3, 2, 256) and q.d.shape == (3, 2) and q.d.dtype == np.float32


@pytest.mark.parametrize("vdt", [T.F16, T.BF16], ids=lambda t: t.name)
def test_f16_bf16_rounding_equals_libggml(oracle, rng, vdt):
    x = np.concatenate([all_rows(rng).ravel(), np.array([np.inf, -np.inf, np.nan, 65520.0, 1e-8], np.float32)])
    with np.errstate(all="ignore"):
        ours = fake_quantize(x, vdt)
    ref_bits = oracle.quantize_row(vdt, x).view(np.uint16)
    if vdt == T.F16:
        ours_bits = ours.astype(np.float16).view(np.uint16)
    else:
        ours_bits = (ours.view(np.uint32) >> 16).astype(np.uint16)
        np.testing.assert_array_equal(ours.view(np.uint32) & 0xFFFF, 0)
    np.testing.assert_array_equal(ours_bits, ref_bits)


@pytest.mark.parametrize("vdt", [T.Q8_0, T.Q8_1, T.Q8_K], ids=lambda t: t.name)
def test_fake_quantize_is_what_libggml_dequantizes(oracle, rng, vdt):
    x = random_rows(rng)
    ours = fake_quantize(x, vdt)
    assert ours.shape == x.shape and ours.dtype == np.float32
    _, rows_type = Q8_QUANTIZERS[vdt]
    ref = rows_type.from_bytes(oracle.quantize_rows(vdt, x))
    np.testing.assert_array_equal(ours, (ref.qs * ref.d[..., None]).reshape(x.shape))


def test_fake_quantize_f32_is_identity(rng):
    x = rng.standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_array_equal(fake_quantize(x, T.F32), x)


def test_quantizers_keep_leading_axes(rng):
    x = rng.standard_normal((2, 3, 256)).astype(np.float32)
    q = quantize_q8_0(x)
    assert q.qs.shape == (2, 3, 8, 32) and q.d.shape == (2, 3, 8)
    assert fake_quantize(x, T.Q8_K).shape == x.shape
    assert quantize_activation(x, T.Q8_K).to_bytes().shape == (2, 3, 292)


def test_bad_row_length_and_unknown_type_are_user_errors():
    with pytest.raises(GGUFParityError, match="multiple of 256"):
        quantize_q8_K(np.zeros((1, 100), np.float32))
    with pytest.raises(GGUFParityError, match="unsupported activation type Q4_0"):
        fake_quantize(np.zeros((1, 32), np.float32), T.Q4_0)
