"""Q8_0: 32 signed 8-bit weights per block and one f16 scale (34 bytes): ``w[j] = d * qs[j]``.

The type of the big tied output / embedding matrices (SmolLM2's 49152 x 576, Gemma 3's 262144 x 640), so for
Gemma 3 this one kernel reads two thirds of the bytes of a decoded token. Same shape as :mod:`.q4`; there is no
constant term, so no activation block sums are needed.
"""

from __future__ import annotations

from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    bload,
    bto_f32_signed,
    load_f16,
    prefetch,
    rows_ahead,
    vfma,
    vload,
    vmul,
    vsplat,
    vstore,
    vsum,
    vzero,
)


@njit(inline="always", cache=True)
def int8_dot(row, off, xl, xh):
    """16 lanes of ``qs[j] * x[j] + qs[j+16] * x[j+16]`` for the 32 int8 quants at ``row[off:off+32]``."""
    return vfma(bto_f32_signed(bload(row, off + 16)), xh, vmul(bto_f32_signed(bload(row, off)), xl))


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q8_0(w, xv, xs, out):
    n, nb = out.shape[0], xv.shape[0] // 32
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = vzero(), vzero()
        for b in range(nb):
            o = 34 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            a0 = vfma(vsplat(load_f16(w0, o)), int8_dot(w0, o + 2, xl, xh), a0)
            a1 = vfma(vsplat(load_f16(w1, o)), int8_dot(w1, o + 2, xl, xh), a1)
        out[r0] = vsum(a0)
        out[r1] = vsum(a1)


@njit(parallel=True, cache=True)
def dequant_q8_0(w, row0, out):
    """``out[i] = dequantize_row_q8_0(w[row0 + i])``: ``qs * d``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 34 * b
            d = vsplat(load_f16(row, o))
            vstore(dst, 32 * b, vmul(bto_f32_signed(bload(row, o + 2)), d))
            vstore(dst, 32 * b + 16, vmul(bto_f32_signed(bload(row, o + 18)), d))
