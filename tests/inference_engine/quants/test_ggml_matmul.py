"""The ggml-numerics matmul against libggml's own quantize_row + vec_dot, for every weight type.

Error measure: ``|ours - ggml| / sum_j |w_j * a_j|`` per output. Both sides add the same exact products (the
activation quantized identically, bit for bit) in a different float32 order, so the difference is float
summation noise, bounded by a small multiple of float32 epsilon times that magnitude sum; a plain relative error
``|ours - ggml| / |ggml|`` is meaningless where random weights make an output cancel to ~0.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import F32Matmul, GGMLMatmul, fake_quantize, prepare_matmul, quant_for
from inference_engine.quants.matmul import llamacpp_activation_type
from validation.ggml_oracle import llamacpp_has_amx

# |ours - ggml| / sum|w*a|: float32 summation-order noise. Measured worst 7e-8 over all types, K = 256..2048,
# activation scales 1e-2..30 (about one float32 epsilon); 1e-6 leaves room for other shapes while staying
# four orders of magnitude below the ~1e-3 effect of activation quantization this emulation exists to capture.
GGML_MATMUL_TOL = 1e-6
# ||ours - ggml|| / ||ggml|| over a whole output block. Measured worst 3e-7 (same sweep as above).
GGML_MATMUL_NORM_TOL = 2e-6
# The f32 path must sit far from ggml (the emulation is not a no-op): at least this many times the ggml path's
# own error. Measured ratios: F16 ~750 (f16 activation rounding, ~2e-4), the rest 5e3..5e4 (~1e-3..1e-2).
F32_GAP_MIN_RATIO = 100
# ...and not absurdly far: 8-bit activation quantization moves a dot product by well under 5% in norm.
F32_GAP_MAX = 5e-2

# Rows are independent, but BLAS sums a lone row (gemv) in another order than a batch (gemm): float32 noise on
# K = 64 products, relative to the largest output.
BATCH_ORDER_TOL = 1e-6

ALL_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
N_OUT, N_IN, N_ROWS = 24, 1024, 3


def magnitude(weight: TensorInfo, x: np.ndarray) -> np.ndarray:
    """sum_j |w_j * a_j| per output, with the activation as ggml sees it."""
    quant = quant_for(weight.qtype)
    return np.abs(fake_quantize(x, quant.vec_dot_type)) @ np.abs(quant.dequantize(weight.raw)).T


@pytest.fixture
def case(rng, make_weight, oracle):
    def build(qtype, scale=1.0):
        weight = make_weight(qtype, N_OUT, N_IN, rng)
        x = (rng.standard_normal((N_ROWS, N_IN)) * scale).astype(np.float32)
        ref = oracle.matmul(qtype, quant_for(qtype).as_byte_rows(weight.raw), x)
        return weight, x, ref

    return build


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_ggml_matmul_equals_libggml_vec_dot(case, qtype, scale):
    weight, x, ref = case(qtype, scale)
    ours = GGMLMatmul(weight)(x)
    assert ours.shape == (N_ROWS, N_OUT) and ours.dtype == np.float32
    err = np.abs(ours - ref) / magnitude(weight, x)
    assert err.max() <= GGML_MATMUL_TOL, f"{qtype.name}: worst {err.max():.2e}"
    assert np.linalg.norm(ours - ref) / np.linalg.norm(ref) <= GGML_MATMUL_NORM_TOL


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_f32_path_differs_as_expected(case, qtype):
    weight, x, ref = case(qtype)
    f32 = F32Matmul(weight)(x)
    ggml = GGMLMatmul(weight)(x)
    if qtype == T.F32:  # F32 weights take F32 activations: both numerics are the same computation
        np.testing.assert_array_equal(f32, ggml)
        return
    ggml_err = np.linalg.norm(ggml - ref) / np.linalg.norm(ref)
    f32_gap = np.linalg.norm(f32 - ref) / np.linalg.norm(ref)
    assert f32_gap >= F32_GAP_MIN_RATIO * ggml_err, f"{qtype.name}: f32 {f32_gap:.2e} vs ggml {ggml_err:.2e}"
    assert f32_gap <= F32_GAP_MAX


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_block_min_split_is_needed(case, qtype):
    """Without the split (m * sum(d16*q) instead of m * f16(d*sum(q))) the result is visibly off ggml."""
    weight, x, ref = case(qtype)
    quant = quant_for(qtype)
    unsplit = fake_quantize(x, quant.vec_dot_type) @ quant.dequantize(weight.raw).T
    split = GGMLMatmul(weight)(x)
    unsplit_err = np.linalg.norm(unsplit - ref) / np.linalg.norm(ref)
    split_err = np.linalg.norm(split - ref) / np.linalg.norm(ref)
    assert unsplit_err > 10 * split_err


def test_f32_path_is_the_dequantized_matmul(rng, make_weight):
    weight = make_weight(T.Q6_K, 8, 256, rng)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    w = quant_for(T.Q6_K).dequantize(weight.raw)
    np.testing.assert_array_equal(F32Matmul(weight)(x), x @ w.T)


@pytest.mark.parametrize("numerics", ["f32", "ggml"])
def test_shapes(rng, make_weight, numerics):
    mm = prepare_matmul(make_weight(T.Q4_0, 8, 64, rng), numerics)
    assert mm.numerics == numerics
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    y = mm(x)
    assert y.shape == (2, 3, 8)
    # One row alone gives the same numbers up to summation order (BLAS uses gemv for one row, gemm for many).
    np.testing.assert_allclose(y[1, 2], mm(x[1, 2]), rtol=0, atol=BATCH_ORDER_TOL * np.abs(y[1, 2]).max())
    assert mm(x[0, 0]).shape == (8,)


def test_user_errors(rng, make_weight):
    weight = make_weight(T.Q8_0, 8, 64, rng)
    with pytest.raises(GGUFParityError, match="unknown numerics 'fast'; supported: f32, ggml"):
        prepare_matmul(weight, "fast")
    with pytest.raises(GGUFParityError, match=r"expects activations \(\.\.\., 64\)"):
        prepare_matmul(weight, "ggml")(np.zeros((1, 65), np.float32))
    norm = TensorInfo("norm", T.F32, (64,), 256, np.zeros(64, np.float32))
    with pytest.raises(GGUFParityError, match="must be 2-D"):
        prepare_matmul(norm, "f32")


@pytest.mark.parametrize(
    "qtype, shape, extra_bufts, amx, expected",
    [
        (T.F16, (64, 32), True, True, T.F32),  # AMX's F16 kernel reads float32 activations
        (T.F16, (64, 32), False, True, T.F16),  # extra buffers off: the ordinary CPU path
        (T.F16, (64, 32), True, False, T.F16),  # no AMX build
        (T.F16, (48, 32), True, True, T.F16),  # n_out not a multiple of 32: AMX refuses it
        (T.F16, (64, 24), True, True, T.F16),  # n_in not a multiple of 16
        (T.Q4_1, (64, 32), True, True, T.Q8_1),  # quantized types keep their vec_dot_type in AMX too
        (T.Q4_K, (64, 256), True, True, T.Q8_K),
        (T.BF16, (64, 32), True, True, T.BF16),  # no AMX kernel for BF16
    ],
)
def test_llamacpp_activation_type(qtype, shape, extra_bufts, amx, expected):
    assert llamacpp_activation_type(qtype, shape, extra_bufts, amx) == expected


def test_activation_type_override(rng, make_weight):
    weight = make_weight(T.F16, 32, 64, rng)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_array_equal(GGMLMatmul(weight, T.F32)(x), F32Matmul(weight)(x))
    assert not np.array_equal(GGMLMatmul(weight)(x), F32Matmul(weight)(x))
    with pytest.raises(GGUFParityError, match="cannot take Q8_0 activations"):
        GGMLMatmul(weight, T.Q8_0)


def test_extra_bufts_follows_the_installed_build(oracle, rng, make_weight):
    weight = make_weight(T.F16, 32, 64, rng)
    expected = T.F32 if llamacpp_has_amx() else T.F16
    assert prepare_matmul(weight, "ggml", extra_bufts=True, has_amx=llamacpp_has_amx()).vec_dot_type == expected
    assert prepare_matmul(weight, "ggml").vec_dot_type == T.F16
