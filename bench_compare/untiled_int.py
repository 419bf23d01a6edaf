"""The untiled integer-dot mat-mat (``T`` tokens through one matrix, no register tiles): measurement-only.

Each row (Q8_0, K-quants) or row pair (Q4_0, Q4_1, Q5_0, Q5_1) stays in L1 while every token passes by, so each
weight byte comes from memory once per call, and each output is computed by the engine's mat-vec arithmetic
(:mod:`inference_engine.backends.numba_kernels.intdot`'s ``pair_<type>`` / ``row_dot_<type>``), bit for bit. The
engine never runs it: it was never faster than the register-tiled kernels of
:mod:`~inference_engine.backends.numba_kernels.inttiles` (docs/PERFORMANCE.md, "kernel choices"), and is kept here
for ``python -m bench_compare.kernel_bench --only int_prefill`` ("untiled"). :data:`MATMUL_INT` maps a tensor type
to its kernel ``(w, yq, yd, ya, out (T, N))``.

Compiled per process, not cached: the kernels inline the engine's helpers, and Numba's cache checks only the file
defining a kernel, so a cached copy would time (and test) old arithmetic after a helper changed (the engine's own
kernels have :mod:`inference_engine.backends.numba_kernels.cache_stamp` for that).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.entries import pair_q4_0, pair_q5_0, pair_q5_1
from inference_engine.backends.numba_kernels.intdot import bsum_pairs
from inference_engine.backends.numba_kernels.isa.simd import rows_ahead
from inference_engine.backends.numba_kernels.types.q4_1 import pair_q4_1
from inference_engine.backends.numba_kernels.types.q4_k import row_dot_q4_k
from inference_engine.backends.numba_kernels.types.q5_k import row_dot_q5_k
from inference_engine.backends.numba_kernels.types.q6_k import row_dot_q6_k
from inference_engine.backends.numba_kernels.types.q8_0 import row_dot_q8_0


@njit(inline="always")
def pairs_matmul(pair, w, yq, yd, ya, out):
    """Two rows at a time through every token (``pair``: an intdot ``pair_<type>``)."""
    n = out.shape[1]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        for t in range(yq.shape[0]):
            p0 = w[min(r0 + ahead, n - 1)] if t == 0 else w0
            p1 = w[min(r1 + ahead, n - 1)] if t == 0 else w1
            out[t, r0], out[t, r1] = pair(w0, w1, p0, p1, yq[t], yd[t], ya[t])


@njit(inline="always")
def rows_matmul(row_dot, w, yq, yd, ys, out):
    """One row at a time through every token (``row_dot``: an intdot ``row_dot_<type>``, ``ys`` its per-token
    auxiliary array)."""
    n = out.shape[1]
    ahead = rows_ahead(w)
    for r in prange(n):
        w0 = w[r]
        for t in range(yq.shape[0]):
            p0 = w[min(r + ahead, n - 1)] if t == 0 else w0
            out[t, r] = row_dot(w0, p0, yq[t], yd[t], ys[t])


@njit(parallel=True)
def matmul_q4_0(w, yq, yd, ya, out):
    pairs_matmul(pair_q4_0, w, yq, yd, ya, out)


@njit(parallel=True)
def matmul_q4_1(w, yq, yd, ya, out):
    pairs_matmul(pair_q4_1, w, yq, yd, ya, out)


@njit(parallel=True)
def matmul_q5_0(w, yq, yd, ya, out):
    pairs_matmul(pair_q5_0, w, yq, yd, ya, out)


@njit(parallel=True)
def matmul_q5_1(w, yq, yd, ya, out):
    pairs_matmul(pair_q5_1, w, yq, yd, ya, out)


@njit(parallel=True)
def matmul_q8_0(w, yq, yd, ya, out):
    rows_matmul(row_dot_q8_0, w, yq, yd, ya, out)


@njit(parallel=True)
def matmul_q4_k(w, yq, yd, ya, out):
    rows_matmul(row_dot_q4_k, w, yq, yd, bsum_pairs(ya), out)


@njit(parallel=True)
def matmul_q5_k(w, yq, yd, ya, out):
    rows_matmul(row_dot_q5_k, w, yq, yd, bsum_pairs(ya), out)


@njit(parallel=True)
def matmul_q6_k(w, yq, yd, ya, out):
    rows_matmul(row_dot_q6_k, w, yq, yd, ya, out)


# tensor type -> its untiled kernel (the types with an integer-dot mat-vec)
MATMUL_INT = {
    T.Q4_0: matmul_q4_0, T.Q4_1: matmul_q4_1, T.Q5_0: matmul_q5_0, T.Q5_1: matmul_q5_1, T.Q8_0: matmul_q8_0,
    T.Q4_K: matmul_q4_k, T.Q5_K: matmul_q5_k, T.Q6_K: matmul_q6_k,
}
