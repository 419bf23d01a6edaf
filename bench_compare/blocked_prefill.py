"""A fused, register-blocked prefill kernel for Q4_1: the alternative to dequantize-a-tile + BLAS.

For a pair of rows and four tokens at a time, each weight block is unpacked once (nibbles -> floats, times the
block scale ``d``: exact, ``d`` is an f16 and the nibble 4 bits) and then used for all four tokens with two fused
multiply-adds each, the same arithmetic per weight and token as BLAS's ``sgemm``. The block constants ``m`` are
added afterwards with one small matmul over the block sums (``xs @ m.T``, :mod:`inference_engine.backends.numba_kernels.gemm`). Eight 16-lane accumulators (2 rows x
4 tokens) stay in registers.

It is kept because the choice between it and :func:`~inference_engine.backends.numba_kernels.dispatch.matmul_by_tiles`
is a measurement
(``python -m bench_compare.kernel_bench --only prefill``), not an assumption; see :mod:`.dispatch` for the
result and the choice made. Measurement-only: the engine never calls it (it lives here, beside
:mod:`bench_compare.kernel_bench`, for that reason).

Compiled per process, not cached: the kernels inline the engine's helpers, and Numba's cache checks only the file
defining a kernel, so a cached copy would time (and test) old arithmetic after a helper changed (the engine's own
kernels have :mod:`inference_engine.backends.numba_kernels.cache_stamp` for that).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import gemm
from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
    bshr,
    bto_f32,
    load_f16,
    vfma,
    vload,
    vmul,
    vsplat,
    vsum,
    vzero,
)

TOKEN_TILE = 4


@njit(parallel=True, fastmath=True)
def matmul_scaled_q4_1(w, xv, out):
    """``out[t, r] = sum_j d_j q_j xv[t, j]`` over the rows of a Q4_1 matrix (the ``m`` terms excluded)."""
    n, n_tokens, nb = w.shape[0], xv.shape[0], xv.shape[1] // 32
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        for t0 in range(0, n_tokens, TOKEN_TILE):
            ta, tb, tc = min(t0 + 1, n_tokens - 1), min(t0 + 2, n_tokens - 1), min(t0 + 3, n_tokens - 1)
            x0, x1, x2, x3 = xv[t0], xv[ta], xv[tb], xv[tc]
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            b0, b1, b2, b3 = vzero(), vzero(), vzero(), vzero()
            for blk in range(nb):
                o, e = 20 * blk, 32 * blk
                q, p = bload(w0, o + 4), bload(w1, o + 4)
                d, f = vsplat(load_f16(w0, o)), vsplat(load_f16(w1, o))
                lo0, hi0 = vmul(bto_f32(band(q, 15)), d), vmul(bto_f32(bshr(q, 4)), d)
                lo1, hi1 = vmul(bto_f32(band(p, 15)), f), vmul(bto_f32(bshr(p, 4)), f)
                xl, xh = vload(x0, e), vload(x0, e + 16)
                a0 = vfma(hi0, xh, vfma(lo0, xl, a0))
                b0 = vfma(hi1, xh, vfma(lo1, xl, b0))
                xl, xh = vload(x1, e), vload(x1, e + 16)
                a1 = vfma(hi0, xh, vfma(lo0, xl, a1))
                b1 = vfma(hi1, xh, vfma(lo1, xl, b1))
                xl, xh = vload(x2, e), vload(x2, e + 16)
                a2 = vfma(hi0, xh, vfma(lo0, xl, a2))
                b2 = vfma(hi1, xh, vfma(lo1, xl, b2))
                xl, xh = vload(x3, e), vload(x3, e + 16)
                a3 = vfma(hi0, xh, vfma(lo0, xl, a3))
                b3 = vfma(hi1, xh, vfma(lo1, xl, b3))
            out[t0, r0], out[t0, r1] = vsum(a0), vsum(b0)
            out[ta, r0], out[ta, r1] = vsum(a1), vsum(b1)
            out[tb, r0], out[tb, r1] = vsum(a2), vsum(b2)
            out[tc, r0], out[tc, r1] = vsum(a3), vsum(b3)


def matmul_blocked_q4_1(rows: np.ndarray, block_mins: np.ndarray, xv: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """``(T, N)`` for a Q4_1 matrix: the fused kernel plus the block constants ``xs @ m.T``."""
    out = np.empty((xv.shape[0], rows.shape[0]), np.float32)
    matmul_scaled_q4_1(rows, xv, out)
    constants = np.empty_like(out)
    gemm.matmul_t(np.ascontiguousarray(xs), block_mins, constants, 0)  # Numba's threads only, as in gemm.py
    out += constants
    return out
