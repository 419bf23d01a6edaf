"""Every Numba kernel against the references: gguf-py / libggml dequantization and libggml's ``vec_dot``.

Error measure for dot products: ``|ours - reference| / sum_j |w_j * a_j|`` per output (``a`` = the activation as
the numerics sees it). Both sides add the same products in a different float32 order, so the difference is float
summation noise; a plain relative error means nothing where random weights make an output cancel to ~0.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels import dispatch
from inference_engine.backends.numba_kernels.ops import activations
from inference_engine.errors import GGUFParityError
from inference_engine.quants import quant_for

# Measured worst over every type (K = 256..1024, activation scales 1e-2..30): about 2 float32 epsilons (2.4e-7)
# of sum|w*a| for both the mat-vec and the tile + BLAS paths, against float64 (f32 numerics) and against
# libggml's own float32 sums (ggml numerics). 1e-6 (8 eps) leaves room for other shapes and summation orders
# while staying three orders of magnitude below the ~1e-3 effect of activation quantization.
SUM_TOL = 1e-6

# The ggml path must move outputs by clearly more than summation noise, or comparing it with libggml proves nothing.
# Expected gap per output ~ (relative activation rounding) / sqrt(K) of sum|w*a|: 8-bit quantization gives ~1e-4,
# F16 rounding (2**-12 relative) ~1e-5 at K = 512; 10 * SUM_TOL sits below both and far above the noise.
EMULATION_GAP_MIN = 10 * SUM_TOL

ALL_TYPES = list(dispatch.KERNELS)
FLOAT_TYPES = [T.F32, T.F16, T.BF16]
K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
N_OUT, N_IN = 33, 512  # odd: the two-rows-per-iteration kernels must handle a lone last row
TOKENS = [1, 3, dispatch.MATVEC_MAX_TOKENS + 5]  # mat-vec path (1, 3) and tile + BLAS path


def random_weight(qtype, n_out, n_in, rng):
    rows = quant_for(qtype).random_rows(n_out, n_in, rng)
    return dispatch.pack_matrix(f"test.{qtype.name}", qtype, rows, (n_out, n_in)), rows


def random_activation(rng, n_tokens, n_in, scale=1.0):
    return (rng.standard_normal((n_tokens, n_in)) * scale).astype(np.float32)


def dequantized(qtype, rows):
    return quant_for(qtype).dequantize(rows).astype(np.float64)


def summation_error(ours, reference, w, a):
    """max |ours - reference| / sum|w*a| over all outputs."""
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(w).T
    return float(np.max(np.abs(ours.astype(np.float64) - reference) / magnitude))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequant_is_bit_exact(qtype, rng, oracle):
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    out = np.full((N_OUT - 2, N_IN), np.nan, np.float32)
    w.kernels.dequant(w.rows, 2, out)  # rows 2.. (the prefill path starts tiles mid-matrix)
    np.testing.assert_array_equal(out, quant_for(qtype).dequantize(rows)[2:])
    np.testing.assert_array_equal(out[0], oracle.dequantize_row(qtype, rows[2]))


@pytest.mark.parametrize("n_tokens", TOKENS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_f32_numerics_is_dequantized_weight_times_x(qtype, n_tokens, rng):
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    wd = dequantized(qtype, rows)
    for scale in (1e-2, 1.0, 30.0):
        x = random_activation(rng, n_tokens, N_IN, scale)
        y = dispatch.matmul(w, x, "f32")
        assert y.shape == (n_tokens, N_OUT) and y.dtype == np.float32
        assert summation_error(y, x.astype(np.float64) @ wd.T, wd, x) <= SUM_TOL


@pytest.mark.parametrize("n_tokens", TOKENS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_ggml_numerics_matches_libggml_vec_dot(qtype, n_tokens, rng, oracle):
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    wd = dequantized(qtype, rows)
    for scale in (1e-2, 1.0, 30.0):
        x = random_activation(rng, n_tokens, N_IN, scale)
        y = dispatch.matmul(w, x, "ggml")
        reference = oracle.matmul(qtype, rows, x)  # quantize_row_<vec_dot_type> + ggml_vec_dot_<w>_<a>
        xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
        assert summation_error(y, reference, wd, xv) <= SUM_TOL


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16], ids=lambda t: t.name)
def test_ggml_numerics_is_not_f32_numerics(qtype, rng):
    """The emulation must change results (by the activation quantization), or the ggml test proves nothing."""
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 1, N_IN)
    gap = np.abs(dispatch.matmul(w, x, "ggml") - dispatch.matmul(w, x, "f32"))
    wd = dequantized(qtype, rows)
    assert np.max(gap / (np.abs(x) @ np.abs(wd).T)) > EMULATION_GAP_MIN


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_row_counts_and_threads_do_not_change_results(qtype, rng, threads):
    """Rows are independent: 1 or 2 threads, an odd count or a single row give bit-identical outputs."""
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 1, N_IN)
    with threads(1):
        one = dispatch.matmul(w, x, "ggml")
    with threads(2):
        two = dispatch.matmul(w, x, "ggml")
    np.testing.assert_array_equal(one, two)
    last = dispatch.pack_matrix("last", qtype, rows[-1:], (1, N_IN))
    np.testing.assert_array_equal(dispatch.matmul(last, x, "ggml"), one[:, -1:])


@pytest.mark.parametrize("qtype", FLOAT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n_in", [7, 100])
def test_float_types_take_any_row_length(qtype, n_in, rng, oracle):
    """F32/F16/BF16 rows need not be a multiple of 16: the tail goes through a scalar loop."""
    w, rows = random_weight(qtype, 5, n_in, rng)
    wd = dequantized(qtype, rows)
    x = random_activation(rng, 2, n_in)
    assert summation_error(dispatch.matmul(w, x, "f32"), x.astype(np.float64) @ wd.T, wd, x) <= SUM_TOL
    xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, 0)
    assert summation_error(dispatch.matmul(w, x, "ggml"), oracle.matmul(qtype, rows, x), wd, xv) <= SUM_TOL


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q6_K], ids=lambda t: t.name)
def test_small_tiles_cover_every_row(qtype, rng):
    """Tiles that do not divide the row count give the outputs of one big tile (up to BLAS's summation order)."""
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 6, N_IN)
    xv, xs = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
    whole = dispatch.matmul_by_tiles(w, xv, xs, "ggml", tile_rows=N_OUT)
    tiled = dispatch.matmul_by_tiles(w, xv, xs, "ggml", tile_rows=10)
    assert summation_error(tiled, whole, dequantized(qtype, rows), xv) <= SUM_TOL


def test_shapes_and_user_errors(rng):
    w, _ = random_weight(T.Q8_0, 4, 64, rng)
    assert dispatch.matmul(w, random_activation(rng, 1, 64)[0]).shape == (4,)
    assert dispatch.matmul(w, np.zeros((2, 3, 64), np.float32)).shape == (2, 3, 4)
    with pytest.raises(GGUFParityError, match="expects activations"):
        dispatch.matmul(w, np.zeros((1, 63), np.float32))
    with pytest.raises(GGUFParityError, match="unknown numerics"):
        dispatch.matmul(w, np.zeros((1, 64), np.float32), "f64")
    with pytest.raises(GGUFParityError, match="no kernel for IQ2_XXS"):
        dispatch.pack_matrix("x", T.IQ2_XXS, np.zeros((4, 66), np.uint8), (4, 256))


@pytest.mark.parametrize("n_tokens", [1, 9, 20])
@pytest.mark.parametrize("n_rows, n_in", [(33, 512), (5, 100)])
def test_numba_gemm_matches_float64(n_tokens, n_rows, n_in, rng):
    """The prefill GEMM alternative: odd rows, token counts off the 8-token tile, rows not a multiple of 16."""
    from inference_engine.backends.numba_kernels import gemm

    w = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    x = random_activation(rng, n_tokens, n_in)
    out = np.full((n_tokens, n_rows + 3), np.nan, np.float32)
    gemm.matmul_t(x, w, out, 2)  # into columns 2 .. 2 + n_rows of a wider output
    assert np.all(np.isnan(out[:, :2])) and np.all(np.isnan(out[:, 2 + n_rows :]))
    reference = x.astype(np.float64) @ w.T.astype(np.float64)
    assert summation_error(out[:, 2 : 2 + n_rows], reference, w.astype(np.float64), x) <= SUM_TOL


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q6_K], ids=lambda t: t.name)
def test_tiles_with_numba_gemm_match_libggml(qtype, rng, oracle):
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 12, N_IN)
    xv, xs = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
    y = dispatch.matmul_by_tiles(w, xv, xs, "ggml", tile_gemm="numba")
    assert summation_error(y, oracle.matmul(qtype, rows, x), dequantized(qtype, rows), xv) <= SUM_TOL


def test_blocked_q4_1_matches_the_dequantized_product(rng):
    from bench_compare import blocked_prefill

    w, rows = random_weight(T.Q4_1, N_OUT, N_IN, rng)
    wd = dequantized(T.Q4_1, rows)
    x = random_activation(rng, 7, N_IN)  # not a multiple of the 4-token tile
    xv, xs = activations.prepare(x, "f32", "q8_1", 32)
    y = blocked_prefill.matmul_blocked_q4_1(w.rows, w.block_mins(), xv, xs)
    assert summation_error(y, x.astype(np.float64) @ wd.T, wd, x) <= SUM_TOL
