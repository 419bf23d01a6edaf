"""IQ4_NL and IQ4_XS as llama.cpp multiplies them (ggml numerics).

IQ4_NL: llama.cpp repacks a model's IQ4_NL weight at load where its rows are a multiple of 8 (x86 with AVX2) and
multiplies it by the same gemv / gemm as a repacked Q4_0 (per block ``fma(float(values . y), d_w * d_y, acc)``);
``vec_dot`` elsewhere. Our one-token mat-vec takes the gemv's order for those weights where the kernels are compiled
for AVX2 or AVX-512, and a batch from ``KTILED_MIN_TOKENS`` on AVX-512 VNNI the gemm's (ktiles): llama.cpp's values
at every token count there. IQ4_XS: never repacked; its mat-vec and its register tiles are ``vec_dot``'s at every
token count.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from test_numba_kernels import random_activation, random_weight
from test_numba_q4_0 import GEMV_ORDER, VNNI, needs_x86, one_token

from inference_engine.backends.numba_kernels import dispatch
from inference_engine.backends.numba_kernels.types import iq4_nl


@needs_x86
@pytest.mark.parametrize("shape", [(8, 32), (40, 7 * 32), (64, 576), (37, 256), (12, 544)])
def test_iq4_nl_one_token_is_llamacpps_value(shape, rng, oracle):
    """Rows a multiple of 8 on AVX2 / AVX-512: the repacked gemv (ggml's mul_mat, weight in the CPU_REPACK buffer);
    other row counts: vec_dot (an odd block count included: its scalar last block)."""
    n_out, n_in = shape
    w, rows = random_weight(T.IQ4_NL, n_out, n_in, rng)
    repacked = GEMV_ORDER and n_out % iq4_nl.REPACKED_ROWS == 0
    for scale in (1e-3, 1.0, 50.0):
        x = random_activation(rng, 1, n_in, scale)
        reference = (oracle.mul_mat(T.IQ4_NL, rows, x, repacked=True)[0] if repacked
                     else oracle.matmul(T.IQ4_NL, rows, x)[0])
        np.testing.assert_array_equal(one_token(w, x), reference, err_msg=f"{shape}, scale {scale}")


@pytest.mark.skipif(not VNNI, reason="ktiles takes IQ4_NL on AVX-512 VNNI only (values + 128 saturate AVX2's pairs)")
def test_iq4_nl_every_token_count_is_llamacpps_repacked_value(rng, oracle):
    """dispatch.matmul, ggml numerics: one mat-vec per token below ktiles' threshold, ktiles from it; both the
    repacked gemv / gemm's values at every count."""
    w, rows = random_weight(T.IQ4_NL, 40, 3 * 256, rng)
    first = dispatch.KTILED_MIN_TOKENS["avx512_vnni"][T.IQ4_NL]
    for n_tokens in (1, 2, first, first + 1, 17):
        assert dispatch.int_kernel_for(w, n_tokens) == ("matvec" if n_tokens < first else "ktiled")
        x = random_activation(rng, n_tokens, w.n_in)
        np.testing.assert_array_equal(dispatch.matmul(w, x, "ggml"),
                                      oracle.mul_mat(T.IQ4_NL, rows, x, repacked=True), err_msg=str(n_tokens))


@needs_x86
def test_iq4_xs_every_token_count_is_vec_dot(rng, oracle):
    """IQ4_XS is never repacked: llama.cpp takes vec_dot at every token count. One mat-vec per token below
    TILED_MIN_TOKENS, the register tiles from there (a remainder below it by mat-vecs): vec_dot's values at every
    count."""
    w, rows = random_weight(T.IQ4_XS, 37, 3 * 256, rng)
    first = dispatch.TILED_MIN_TOKENS[T.IQ4_XS]
    for n_tokens in (1, first - 1, first, 4, 5, 9, 17):
        assert dispatch.int_kernel_for(w, n_tokens) == ("matvec" if n_tokens < first else "tiled")
        x = random_activation(rng, n_tokens, w.n_in)
        np.testing.assert_array_equal(dispatch.matmul(w, x, "ggml"), oracle.matmul(T.IQ4_XS, rows, x),
                                      err_msg=str(n_tokens))
