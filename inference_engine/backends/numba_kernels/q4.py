"""Q4_0 and Q4_1: 32 weights per block, 4-bit quants, read straight from the GGUF blocks.

Block layouts (ggml-common.h; bytes)::

    Q4_0 (18): | d f16 | qs[16] |            w[j] = d * (lo(qs[j]) - 8),   w[j+16] = d * (hi(qs[j]) - 8)
    Q4_1 (20): | d f16 | m f16 | qs[16] |    w[j] = d * lo(qs[j]) + m,     w[j+16] = d * hi(qs[j]) + m

``matvec_*`` compute ``out[r] = sum_b d_rb * dot(q_rb, xv_b) + c_rb * xs_b`` with the unsigned nibbles ``q`` and
the block's constant term ``c`` (``-8 d`` for Q4_0, ``m`` for Q4_1) applied once per block to ``xs_b``, the block
sum of the activation (see :mod:`.activations`: the plain sum for ``f32`` numerics, ggml's ``d_a * sum(q_a)`` /
f16 ``s`` for ``ggml`` numerics). Two rows per iteration share the activation loads; each row keeps a 16-lane
accumulator, reduced once at the end of the row.

``dequant_*`` write whole rows as float32 with ggml's own formula and rounding (``dequantize_row_q4_0/1``), for
the prefill path (a tile of rows, then BLAS) and for embedding look-ups.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
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
def nibble_dot(row, off, xl, xh):
    """16 lanes of ``lo(qs[j]) * x[j] + hi(qs[j]) * x[j+16]`` for the 16 quant bytes at ``row[off:off+16]``."""
    q = bload(row, off)
    return vfma(bto_f32(bshr(q, 4)), xh, vmul(bto_f32(band(q, 15)), xl))


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_0(w, xv, xs, out):
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
            o = 18 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            d0, d1 = load_f16(w0, o), load_f16(w1, o)
            a0 = vfma(vsplat(d0), nibble_dot(w0, o + 2, xl, xh), a0)
            a1 = vfma(vsplat(d1), nibble_dot(w1, o + 2, xl, xh), a1)
            c0 += d0 * xs[b]
            c1 += d1 * xs[b]
        out[r0] = vsum(a0) - _F32(8.0) * c0
        out[r1] = vsum(a1) - _F32(8.0) * c1


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_1(w, xv, xs, out):
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
            o = 20 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            a0 = vfma(vsplat(load_f16(w0, o)), nibble_dot(w0, o + 4, xl, xh), a0)
            a1 = vfma(vsplat(load_f16(w1, o)), nibble_dot(w1, o + 4, xl, xh), a1)
            c0 += load_f16(w0, o + 2) * xs[b]
            c1 += load_f16(w1, o + 2) * xs[b]
        out[r0] = vsum(a0) + c0
        out[r1] = vsum(a1) + c1


@njit(parallel=True, cache=True)
def dequant_q4_0(w, row0, out):
    """``out[i] = dequantize_row_q4_0(w[row0 + i])``: ``(q - 8) * d``, as ggml rounds it."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        eight = vsplat(_F32(8.0))
        for b in range(nb):
            o = 18 * b
            d = vsplat(load_f16(row, o))
            q = bload(row, o + 2)
            vstore(dst, 32 * b, vmul(vsub(bto_f32(band(q, 15)), eight), d))
            vstore(dst, 32 * b + 16, vmul(vsub(bto_f32(bshr(q, 4)), eight), d))


@njit(parallel=True, cache=True)
def dequant_q4_1(w, row0, out):
    """``out[i] = dequantize_row_q4_1(w[row0 + i])``: ``q * d + m`` (two roundings, as ggml and gguf-py)."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 20 * b
            d, m = vsplat(load_f16(row, o)), vsplat(load_f16(row, o + 2))
            q = bload(row, o + 4)
            vstore(dst, 32 * b, vadd(vmul(bto_f32(band(q, 15)), d), m))
            vstore(dst, 32 * b + 16, vadd(vmul(bto_f32(bshr(q, 4)), d), m))
