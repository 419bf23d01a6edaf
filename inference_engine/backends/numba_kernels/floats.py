"""F32, F16 and BF16 weights: 16 values per vector, widened to float32 on the fly (vcvtph2ps for F16).

Weights come as uint8 byte rows like the quantized types (element ``e`` at byte ``4e`` / ``2e``), so all kernels
share one calling convention. Rows need not be a multiple of 16 long: the last ``n % 16`` values go through a
scalar tail. Each row keeps two accumulators (even and odd vectors) so that a long row is not one serial chain of
fused multiply-adds. ``xs`` is unused (no constant terms); it is there to keep the signature of every
``matvec_*`` the same. For ``ggml`` numerics the activation arrives already rounded to F16 / BF16
(:mod:`.activations`), which is what ggml's ``vec_dot_f16`` / ``vec_dot_bf16`` multiply.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    load_bf16,
    load_f16,
    load_f32,
    prefetch,
    rows_ahead,
    vadd,
    vfma,
    vload,
    vload_bf16,
    vload_f16,
    vload_f32,
    vstore,
    vsum,
    vzero,
)

_F32 = np.float32


@njit(inline="always", cache=True)
def row_dot_f32(row, ahead, xv):
    k = xv.shape[0]
    a, b = vzero(), vzero()
    e = 0
    while e + 32 <= k:
        prefetch(ahead, 4 * e)
        prefetch(ahead, 4 * e + 64)
        a = vfma(vload_f32(row, 4 * e), vload(xv, e), a)
        b = vfma(vload_f32(row, 4 * e + 64), vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = vfma(vload_f32(row, 4 * e), vload(xv, e), a)
        e += 16
    t = vsum(vadd(a, b))
    for i in range(e, k):
        t += load_f32(row, 4 * i) * xv[i]
    return t


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


@njit(inline="always", cache=True)
def row_dot_bf16(row, ahead, xv):
    k = xv.shape[0]
    a, b = vzero(), vzero()
    e = 0
    while e + 32 <= k:
        prefetch(ahead, 2 * e)
        a = vfma(vload_bf16(row, 2 * e), vload(xv, e), a)
        b = vfma(vload_bf16(row, 2 * e + 32), vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = vfma(vload_bf16(row, 2 * e), vload(xv, e), a)
        e += 16
    t = vsum(vadd(a, b))
    for i in range(e, k):
        t += load_bf16(row, 2 * i) * xv[i]
    return t


@njit(parallel=True, fastmath=True, cache=True)
def matvec_f32(w, xv, xs, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_f32(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_f16(w, xv, xs, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_f16(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_bf16(w, xv, xs, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_bf16(w[r], w[min(r + ahead, n - 1)], xv)


@njit(parallel=True, cache=True)
def dequant_f32(w, row0, out):
    k = out.shape[1]
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(k):
            dst[i] = load_f32(row, 4 * i)


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


@njit(parallel=True, cache=True)
def dequant_bf16(w, row0, out):
    k = out.shape[1]
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        e = 0
        while e + 16 <= k:
            vstore(dst, e, vload_bf16(row, 2 * e))
            e += 16
        for i in range(e, k):
            dst[i] = load_bf16(row, 2 * i)
