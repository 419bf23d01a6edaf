"""F32: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
F32 weights: 4 bytes a value, element ``e`` at byte ``4e``.
"""

from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels


# --- float mat-vec and dequantization (from floats.py) --------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_f32(row, ahead, xv):
    k = xv.shape[0]
    a, b = simd.vzero(), simd.vzero()
    e = 0
    while e + 32 <= k:
        simd.prefetch(ahead, 4 * e)
        simd.prefetch(ahead, 4 * e + 64)
        a = simd.vfma(simd.vload_f32(row, 4 * e), simd.vload(xv, e), a)
        b = simd.vfma(simd.vload_f32(row, 4 * e + 64), simd.vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = simd.vfma(simd.vload_f32(row, 4 * e), simd.vload(xv, e), a)
        e += 16
    t = simd.vsum(simd.vadd(a, b))
    for i in range(e, k):
        t += simd.load_f32(row, 4 * i) * xv[i]
    return t


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_f32(w, xv, xs, out):
    n = out.shape[0]
    ahead = simd.rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_f32(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, cache=True)
def dequant_f32(w, row0, out):
    k = out.shape[1]
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(k):
            dst[i] = simd.load_f32(row, 4 * i)


QTYPE = T.F32
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_f32, dequant_f32, "f32", 0)
