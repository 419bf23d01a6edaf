"""The register-tiled integer mat-mat kernels (inttiles): the mat-vec's outputs bit for bit, hence libggml's.

Each tile is 2 rows x 4 tokens (K-quants: blocks of 1 row x 8 tokens first) and the rows are grouped ``GROUP_ROWS`` per thread task, so the shapes here cover a
token count below, at and past the tile (1..9, and 13: not a multiple of 4), an odd last row and a last row group
shorter than the others (37 rows = 16 + 16 + 5).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_intdot import AVX2, assert_matches_libggml
from test_numba_kernels import dequantized, random_activation, random_weight

from inference_engine.backends.numba_kernels import dispatch, intdot, inttiles
from inference_engine.backends.numba_kernels.isa import int8
from inference_engine.backends.numba_kernels.ops import activations

TILED_TYPES = [t for t, k in dispatch.KERNELS.items() if k.matmul_tiled is not None]
N_OUT, N_IN = 2 * inttiles.GROUP_ROWS + 5, 512  # two full row groups and a short one ending in a lone row
# through the kernel itself: every remainder inside the 4-token tile, and the K-quants' 8-token blocks: one (8),
# one plus a 4-token tile and a remainder (13), two plus a remainder (19: on AVX-512 VNNI one 16-token block of
# row16z_*), a 16-token block, an 8-token block, a 4-token tile and a remainder (31: row16z, row8z_q4_k, tiles)
TOKEN_COUNTS = [*range(1, 10), 13, 19, 31]


def per_token_matvec(w, yq, yd, ya):
    out = np.full((yq.shape[0], w.n_out), np.nan, np.float32)
    for t in range(yq.shape[0]):
        w.kernels.matvec_int(w.rows, yq[t], yd[t], ya[t], out[t])
    return out


def test_the_quantized_types_of_the_real_models_have_tiled_kernels():
    """Qwen2.5-1.5B (Q4_K, Q6_K), SmolLM2 (Q4_1), Gemma 3 (Q4_K, Q6_K...), and Q4_0 / Q8_0 / Q5_*."""
    assert {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K} <= set(TILED_TYPES)


@pytest.mark.parametrize("qtype", TILED_TYPES, ids=lambda t: t.name)
def test_tiled_equals_the_matvec_bit_for_bit(qtype, rng):
    w, _ = random_weight(qtype, N_OUT, N_IN, rng)
    for n_tokens in TOKEN_COUNTS:
        for scale in (1e-3, 50.0):
            x = random_activation(rng, n_tokens, N_IN, scale)
            yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
            tiled = np.full((n_tokens, N_OUT), np.nan, np.float32)  # an output left unwritten stays NaN
            w.kernels.matmul_tiled(w.rows, yq, yd, ya, tiled)
            np.testing.assert_array_equal(tiled, per_token_matvec(w, yq, yd, ya), err_msg=f"T={n_tokens}")


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q4_1], ids=lambda t: t.name)
def test_tiled_results_do_not_depend_on_threads(qtype, rng, threads):
    w, _ = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 13, N_IN)
    with threads(1):
        one = dispatch.matmul_by_int_tiles(w, x)
    with threads(2):
        two = dispatch.matmul_by_int_tiles(w, x)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("qtype", TILED_TYPES, ids=lambda t: t.name)
def test_ggml_matmul_takes_the_tiled_path_and_is_libggml(qtype, rng, oracle, monkeypatch):
    """From TILED_MIN_TOKENS on, dispatch picks the tiled kernel on an int8 CPU; the result is libggml's. (7 tokens:
    from 8 on, the K-quants take llama.cpp's tiled mat-mul on AVX-512 VNNI, test_numba_ktiles.)"""
    monkeypatch.setattr(dispatch, "cpu_features", lambda: AVX2)
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    n_tokens = 7
    assert dispatch.int_kernel_for(w, n_tokens) == "tiled"
    called = []
    real = dispatch.matmul_by_int_tiles
    monkeypatch.setattr(dispatch, "matmul_by_int_tiles", lambda *a: called.append(1) or real(*a))
    x = random_activation(rng, n_tokens, N_IN)
    y = dispatch.matmul(w, x, "ggml")
    assert called
    xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
    assert_matches_libggml(y, oracle.matmul(qtype, rows, x), dequantized(qtype, rows), xv)


def test_each_count_below_the_tiles_takes_the_mat_vec_and_floats_no_integer_path(rng):
    w, _ = random_weight(T.Q3_K, 8, 256, rng)
    assert [dispatch.int_kernel_for(w, n) for n in (1, 3, 4, 7)] == ["matvec", "matvec", "tiled", "tiled"]
    # (from 8 tokens, ktiles on AVX-512 VNNI: test_numba_ktiles)
    f16, _ = random_weight(T.F16, 8, 256, rng)
    assert dispatch.int_kernel_for(f16, 64) == ""
    q4k, _ = random_weight(T.Q4_K, 8, 256, rng)
    assert dispatch.int_kernel_for(q4k, 1) == "matvec"


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)  # thresholds 3, 2, 4
@pytest.mark.parametrize("n_tokens", [4, 5, 6, 7, 9, 14])
def test_tiled_dispatch_splits_the_remainder_exactly(qtype, n_tokens, rng):
    """matmul_by_int_tiles sends a last tile of fewer than TILED_MIN_TOKENS tokens through the mat-vec: same bits."""
    w, _ = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, n_tokens, N_IN)
    yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
    np.testing.assert_array_equal(dispatch.matmul_by_int_tiles(w, x), per_token_matvec(w, yq, yd, ya))


@pytest.mark.parametrize("qtype", TILED_TYPES, ids=lambda t: t.name)
def test_each_tiled_type_has_a_measured_threshold(qtype, rng):
    """int_kernel_for switches from one mat-vec per token to the tile at the type's TILED_MIN_TOKENS (12 rows: a Q4_0
    weight llama.cpp does not repack, which on AVX-512 VNNI takes one mat-vec per token below ktiles, test_numba_q4_0)."""
    w, _ = random_weight(qtype, 12, 256, rng)
    first = dispatch.TILED_MIN_TOKENS[qtype]
    assert 2 <= first <= inttiles.TILE_TOKENS
    assert dispatch.int_kernel_for(w, first - 1) == "matvec"
    assert dispatch.int_kernel_for(w, first) == "tiled"


@njit(cache=False)
def _vector_min_terms(bsums, words):
    pairs = intdot.bsum_pairs(bsums)
    vec = np.zeros((bsums.shape[0], 8), np.int32)
    for t in range(bsums.shape[0]):
        int8.istore(vec[t], 0, int8.kmin_pairs(pairs[t], 0, words[t, 0], words[t, 1]))
    return vec


def _scalar_min_terms(bsums, words):
    """ggml's four ``min_j * bsum32_j + min_j+1 * bsum32_j+1`` in plain integers: mins are the bytes of the words."""
    mins = words.astype("<u4").view(np.uint8).reshape(-1, 8).astype(np.int64)  # mins 0..7 per token
    bsum32 = bsums.astype(np.int64).reshape(-1, 8, 2).sum(axis=2)  # (n, 8)
    prod = mins * bsum32
    return prod[:, 0::2] + prod[:, 1::2]


def test_kmin_pairs_are_the_scalar_min_products_at_the_extremes(rng):
    """The per-token pair sums + ``kmin_pairs`` (one ``vpmaddwd``) give the scalar integers, lanes 4..7 zero,
    with Q8_K's block sums at their bounds (+-16 x 127) and 6-bit mins at 63."""
    n = 64
    bsums = rng.integers(-16 * 127, 16 * 127 + 1, (n, 16)).astype(np.int16)
    bsums[0], bsums[1] = 16 * 127, -16 * 127
    words = rng.integers(0, 1 << 32, (n, 2), dtype=np.uint64).astype(np.uint32) & np.uint32(0x3F3F3F3F)
    words[:2] = 0x3F3F3F3F
    vec = _vector_min_terms(bsums, words)
    np.testing.assert_array_equal(vec[:, :4], _scalar_min_terms(bsums, words))
    assert not vec[:, 4:].any()


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_k_quant_long_rows_equal_the_matvec(qtype, rng):
    """Rows of 7 super-blocks through the 16-token kernels (AVX-512 VNNI) and the 8-token ones: the mat-vec's
    outputs bit for bit (the float state of each output carried over many super-blocks)."""
    n_in = 7 * 256
    w, _ = random_weight(qtype, 2 * inttiles.GROUP_ROWS + 3, n_in, rng)
    for n_tokens in (16, 31):
        x = random_activation(rng, n_tokens, n_in)
        yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
        tiled = np.full((n_tokens, w.n_out), np.nan, np.float32)
        w.kernels.matmul_tiled(w.rows, yq, yd, ya, tiled)
        np.testing.assert_array_equal(tiled, per_token_matvec(w, yq, yd, ya), err_msg=f"T={n_tokens}")
