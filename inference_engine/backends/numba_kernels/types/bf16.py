"""BF16: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
BF16 weights: 2 bytes a value, the high half of a float32.
"""

from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels


# --- float mat-vec and dequantization (from floats.py) --------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_bf16(row, ahead, xv):
    k = xv.shape[0]
    a, b = simd.vzero(), simd.vzero()
    e = 0
    while e + 32 <= k:
        simd.prefetch(ahead, 2 * e)
        a = simd.vfma(simd.vload_bf16(row, 2 * e), simd.vload(xv, e), a)
        b = simd.vfma(simd.vload_bf16(row, 2 * e + 32), simd.vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = simd.vfma(simd.vload_bf16(row, 2 * e), simd.vload(xv, e), a)
        e += 16
    t = simd.vsum(simd.vadd(a, b))
    for i in range(e, k):
        t += simd.load_bf16(row, 2 * i) * xv[i]
    return t


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_bf16(w, xv, xs, out):
    n = out.shape[0]
    ahead = simd.rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_bf16(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, cache=True)
def dequant_bf16(w, row0, out):
    k = out.shape[1]
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        e = 0
        while e + 16 <= k:
            simd.vstore(dst, e, simd.vload_bf16(row, 2 * e))
            e += 16
        for i in range(e, k):
            dst[i] = simd.load_bf16(row, 2 * i)


QTYPE = T.BF16
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_bf16, dequant_bf16, "bf16", 0)
