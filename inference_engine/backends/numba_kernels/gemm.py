"""A register-blocked float32 ``x @ w.T`` in Numba, for the dequantized tiles of the prefill path.

Why not BLAS: NumPy's OpenBLAS keeps its own thread pool. Alternating Numba's threads (dequantizing a tile,
the other ops) with OpenBLAS's threads on the same two cores stalls both: measured here, a 512-token prefill of
SmolLM2 on 2 threads ran at 161-173 tok/s with BLAS tiles and 401-419 tok/s with this kernel (Gemma 3: 197-199
against 405-417). On one thread BLAS is faster (1.4-2x per core), so the dispatcher uses it there.

Blocking: two weight rows by eight tokens per inner loop (16 accumulators of 16 lanes in registers); each weight
vector is loaded once per eight tokens, each activation vector once per two rows. Threads take blocks of
``ROW_BLOCK`` rows; inside a block the eight activation rows of a token tile stay in L1 while the block's weight
rows (in L2) pass by. Rows that do not divide by two and token counts that do not divide by eight reuse the last
row / token (the duplicate result is written twice).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import vfma, vload, vsum, vzero

TOKEN_TILE = 8
ROW_BLOCK = 32


@njit(parallel=True, fastmath=True, cache=True)
def matmul_t(x, w, out, r_out):
    """``out[:, r_out + j] = x @ w[j]``: x (T, K), w (R, K) float32 C-contiguous, out (T, N) float32."""
    n_tokens, k = x.shape
    n_rows = w.shape[0]
    k16 = k - k % 16
    for blk in prange((n_rows + ROW_BLOCK - 1) // ROW_BLOCK):
        t = np.empty(TOKEN_TILE, np.int64)
        for t0 in range(0, n_tokens, TOKEN_TILE):
            for i in range(TOKEN_TILE):
                t[i] = min(t0 + i, n_tokens - 1)
            x0, x1, x2, x3 = x[t[0]], x[t[1]], x[t[2]], x[t[3]]
            x4, x5, x6, x7 = x[t[4]], x[t[5]], x[t[6]], x[t[7]]
            for r0 in range(blk * ROW_BLOCK, min((blk + 1) * ROW_BLOCK, n_rows), 2):
                r1 = min(r0 + 1, n_rows - 1)
                w0, w1 = w[r0], w[r1]
                a0, a1, a2, a3, a4, a5, a6, a7 = (
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                )
                b0, b1, b2, b3, b4, b5, b6, b7 = (
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                    vzero(),
                )
                for e in range(0, k16, 16):
                    u, v = vload(w0, e), vload(w1, e)
                    xe = vload(x0, e)
                    a0, b0 = vfma(u, xe, a0), vfma(v, xe, b0)
                    xe = vload(x1, e)
                    a1, b1 = vfma(u, xe, a1), vfma(v, xe, b1)
                    xe = vload(x2, e)
                    a2, b2 = vfma(u, xe, a2), vfma(v, xe, b2)
                    xe = vload(x3, e)
                    a3, b3 = vfma(u, xe, a3), vfma(v, xe, b3)
                    xe = vload(x4, e)
                    a4, b4 = vfma(u, xe, a4), vfma(v, xe, b4)
                    xe = vload(x5, e)
                    a5, b5 = vfma(u, xe, a5), vfma(v, xe, b5)
                    xe = vload(x6, e)
                    a6, b6 = vfma(u, xe, a6), vfma(v, xe, b6)
                    xe = vload(x7, e)
                    a7, b7 = vfma(u, xe, a7), vfma(v, xe, b7)
                ra = (vsum(a0), vsum(a1), vsum(a2), vsum(a3), vsum(a4), vsum(a5), vsum(a6), vsum(a7))
                rb = (vsum(b0), vsum(b1), vsum(b2), vsum(b3), vsum(b4), vsum(b5), vsum(b6), vsum(b7))
                for i in range(TOKEN_TILE):
                    sa, sb = ra[i], rb[i]
                    for e in range(k16, k):  # rows that are not a multiple of 16 long (float weights only)
                        sa += w0[e] * x[t[i], e]
                        sb += w1[e] * x[t[i], e]
                    out[t[i], r_out + r0] = sa
                    out[t[i], r_out + r1] = sb
