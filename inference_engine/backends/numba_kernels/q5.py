"""Q5_0 and Q5_1: 32 weights per block, 4-bit quants plus a fifth bit per weight kept in a 32-bit word.

Block layouts (ggml-common.h; bytes)::

    Q5_0 (22): | d f16 | qh u32 | qs[16] |           q[j] = lo(qs[j]) | bit_j(qh) << 4,  q[j+16] = hi(qs[j]) |
    Q5_1 (24): | d f16 | m f16 | qh u32 | qs[16] |   bit_{j+16}(qh) << 4;  Q5_0: w = d * (q - 16), Q5_1: w = d*q + m

Same kernel shape as :mod:`.q4` (two rows per iteration, one 16-lane accumulator per row, the block's constant
term ``-16 d`` / ``m`` applied once per block to the activation block sum ``xs``).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bbits,
    bload,
    bor,
    bshl,
    bshr,
    bto_f32,
    load_f16,
    prefetch,
    rows_ahead,
    vadd,
    vfma,
    vload,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum,
    vzero,
)

_F32 = np.float32


@njit(inline="always", cache=True)
def five_bit_quants(row, qh_off, qs_off):
    """The block's 32 unsigned 5-bit quants as two F32x16: elements 0..15 and 16..31."""
    q = bload(row, qs_off)
    lo = bor(band(q, 15), bshl(bbits(row, qh_off, 0), 4))
    hi = bor(bshr(q, 4), bshl(bbits(row, qh_off, 16), 4))
    return bto_f32(lo), bto_f32(hi)


@njit(inline="always", cache=True)
def five_bit_dot(row, qh_off, qs_off, xl, xh):
    lo, hi = five_bit_quants(row, qh_off, qs_off)
    return vfma(hi, xh, vmul(lo, xl))


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q5_0(w, xv, xs, out):
    n, nb = out.shape[0], xs.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = vzero(), vzero()
        c0, c1 = _F32(0.0), _F32(0.0)
        for b in range(nb):
            o = 22 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            d0, d1 = load_f16(w0, o), load_f16(w1, o)
            a0 = vfma(vsplat(d0), five_bit_dot(w0, o + 2, o + 6, xl, xh), a0)
            a1 = vfma(vsplat(d1), five_bit_dot(w1, o + 2, o + 6, xl, xh), a1)
            c0 += d0 * xs[b]
            c1 += d1 * xs[b]
        out[r0] = vsum(a0) - _F32(16.0) * c0
        out[r1] = vsum(a1) - _F32(16.0) * c1


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q5_1(w, xv, xs, out):
    n, nb = out.shape[0], xs.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = vzero(), vzero()
        c0, c1 = _F32(0.0), _F32(0.0)
        for b in range(nb):
            o = 24 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            a0 = vfma(vsplat(load_f16(w0, o)), five_bit_dot(w0, o + 4, o + 8, xl, xh), a0)
            a1 = vfma(vsplat(load_f16(w1, o)), five_bit_dot(w1, o + 4, o + 8, xl, xh), a1)
            c0 += load_f16(w0, o + 2) * xs[b]
            c1 += load_f16(w1, o + 2) * xs[b]
        out[r0] = vsum(a0) + c0
        out[r1] = vsum(a1) + c1


@njit(parallel=True, cache=True)
def dequant_q5_0(w, row0, out):
    """``out[i] = dequantize_row_q5_0(w[row0 + i])``: ``(q - 16) * d``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        sixteen = vsplat(_F32(16.0))
        for b in range(nb):
            o = 22 * b
            d = vsplat(load_f16(row, o))
            lo, hi = five_bit_quants(row, o + 2, o + 6)
            vstore(dst, 32 * b, vmul(vsub(lo, sixteen), d))
            vstore(dst, 32 * b + 16, vmul(vsub(hi, sixteen), d))


@njit(parallel=True, cache=True)
def dequant_q5_1(w, row0, out):
    """``out[i] = dequantize_row_q5_1(w[row0 + i])``: ``q * d + m``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 24 * b
            d, m = vsplat(load_f16(row, o)), vsplat(load_f16(row, o + 2))
            lo, hi = five_bit_quants(row, o + 4, o + 8)
            vstore(dst, 32 * b, vadd(vmul(lo, d), m))
            vstore(dst, 32 * b + 16, vadd(vmul(hi, d), m))
