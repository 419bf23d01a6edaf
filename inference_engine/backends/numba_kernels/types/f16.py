"""F16: the tensor type's Numba kernels, all in this file.

Layout (ggml-common.h; byte offsets):
F16 weights: 2 bytes a value, widened to float32 on the fly (``vcvtph2ps``).

Kernels: the float mat-vec (``matvec_float_f16(w, xv, xs, out)``: the activation in float32, ``xs`` its block sums)
and ggml's dequantization (``dequant_f16``). :data:`KERNELS` is the type's entry in the kernel table
(:data:`..types.KERNELS`).
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    load_f16,
    prefetch,
    rows_ahead,
    vadd,
    vfma,
    vload,
    vload_f16,
    vstore,
    vsum,
    vzero,
)
from inference_engine.backends.numba_kernels.kernel_entry import Kernels


# --- float mat-vec and dequantization (from floats.py) --------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_f16(row, ahead, xv):
    k = xv.shape[0]
    a, b = vzero(), vzero()
    e = 0
    while e + 32 <= k:
        prefetch(ahead, 2 * e)
        a = vfma(vload_f16(row, 2 * e), vload(xv, e), a)
        b = vfma(vload_f16(row, 2 * e + 32), vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = vfma(vload_f16(row, 2 * e), vload(xv, e), a)
        e += 16
    t = vsum(vadd(a, b))
    for i in range(e, k):
        t += load_f16(row, 2 * i) * xv[i]
    return t


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_f16(w, xv, xs, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_f16(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, cache=True)
def dequant_f16(w, row0, out):
    k = out.shape[1]
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        e = 0
        while e + 16 <= k:
            vstore(dst, e, vload_f16(row, 2 * e))
            e += 16
        for i in range(e, k):
            dst[i] = load_f16(row, 2 * i)


QTYPE = T.F16
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_f16, dequant_f16, "f16", 0)
