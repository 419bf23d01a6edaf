"""The K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): 256-weight super-blocks, read straight from the GGUF blocks.

Every K-quant weight is ``scale_k * u - min_k`` inside a sub-block ``k`` (16 or 32 weights), with ``u`` a small
unsigned integer. ``matvec_*`` therefore compute, per row, ``sum_k scale_k * dot(u_k, xv_k)`` on 16-lane vectors
and the constant terms ``sum_k min_k * xs_k``, where ``xs`` holds the activation's sub-block sums
(:mod:`.activations`: plain sums for ``f32`` numerics; ``d_a * bsums`` of the Q8_K activation for ``ggml``
numerics, which is how ggml folds the mins in). A super-block's 8 or 16 sub-block scales are unpacked from their
6-bit / 4-bit fields into one vector (a lane per sub-block) with a few byte shuffles, and the constant terms are
accumulated lane-wise too, so nothing is repacked at load time and no scalar work is left per sub-block.

Layouts (ggml-common.h; byte offsets inside one super-block; ``e`` = element index 0..255)::

    Q2_K  (84): scales[16] @0 (lo 4 bits: sc, hi 4 bits: m) | qs[64] @16 | d @80 | dmin @82
                e = 128n + 32j + l: u = (qs[32n + l] >> 2j) & 3, sub-block 8n + 2j + l//16;  w = d*sc*u - dmin*m
    Q3_K (110): hmask[32] @0 | qs[64] @32 | scales[12] @96 (16 x 6 bits, minus 32) | d @108
                e = 128n + 32j + l: u = ((qs[32n + l] >> 2j) & 3) | (bit (4n + j) of hmask[l]) << 2,
                sub-block 8n + 2j + l//16;  w = d*sc*(u - 4)
    Q4_K (144): d @0 | dmin @2 | scales[12] @4 (8 x (6-bit sc, 6-bit m)) | qs[128] @16
                e = 64j + l (l < 32): u = lo(qs[32j + l]), sub-block 2j;  e = 64j + 32 + l: hi nibble, 2j + 1
                w = d*sc*u - dmin*m
    Q5_K (176): d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48
                as Q4_K plus a fifth bit: bit 2j (low half) / 2j + 1 (high half) of qh[l]
    Q6_K (210): ql[128] @0 | qh[64] @128 | scales[16] int8 @192 | d @208
                e = 128n + l + 32t (t = 0..3): u = nibble of ql[64n + l + 32(t & 1)] (lo for t < 2) |
                ((qh[32n + l] >> 2t) & 3) << 4, sub-block 8n + l//16 + 2t;  w = d*sc*(u - 32)

``dequant_*`` reproduce ggml's ``dequantize_row_q*_K`` (same operations, same rounding) for whole rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
    bor,
    bselect,
    bshl,
    bshr,
    bshr_lanes,
    bshuffle,
    bto_f32,
    bto_f32_signed,
    load_f16,
    prefetch,
    rows_ahead,
    vfma,
    vhalves,
    vlane,
    vload,
    vload_high8,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum,
    vzero,
)

_F32 = np.float32
QK_K = 256


# --- scale fields ------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def scale_min_k4(row, off, j):
    """ggml's ``get_scale_min_k4``: the 6-bit (scale, min) of sub-block ``j`` from Q4_K / Q5_K's 12 scale bytes."""
    if j < 4:
        return row[off + j] & 63, row[off + j + 4] & 63
    sc = (row[off + j + 4] & 15) | ((row[off + j - 4] >> 6) << 4)
    mn = (row[off + j + 4] >> 4) | ((row[off + j] >> 6) << 4)
    return sc, mn


@njit(inline="always", cache=True)
def scale_q3_k(row, off, k):
    """Q3_K's signed 6-bit scale of sub-block ``k`` (0..15) from its 12 scale bytes at ``off``."""
    low = (row[off + (k & 7)] >> (4 * (k >> 3))) & 15
    high = (row[off + 8 + (k & 3)] >> (2 * (k >> 2))) & 3
    return (low | (high << 4)) - 32


# --- sub-block scales as vectors (one lane per sub-block) ------------------------------------------------------
@njit(inline="always", cache=True)
def k4_scales_mins(row, off, d, dmin):
    """Q4_K / Q5_K: lanes 0..7 = ``d * sc_j``, lanes 8..15 = ``dmin * m_j`` (get_scale_min_k4, vectorized).

    Reads 16 bytes at ``off`` (the 12 scale bytes and 4 quant bytes, all inside the block).
    """
    b = bload(row, off)
    a = bshuffle(b, "0123 89ab 4567 89ab")  # b[j] / b[j+4] per lane
    top = bshuffle(b, "0123 0123 4567 4567")  # b[j-4] / b[j]: the 2 high bits
    six_bit = band(a, 63)  # j < 4
    split = bor(band(bshr_lanes(a, "0000 0000 0000 4444"), 15), bshl(bshr(top, 6), 4))
    packed = bselect("0000 1111 0000 1111", six_bit, split)
    return vmul(bto_f32(packed), vhalves(d, dmin))


@njit(inline="always", cache=True)
def q3_k_scales(row, off, d):
    """Q3_K: the 16 ``d * (sc_k - 32)`` from the 12 scale bytes at ``off`` (reads off-2 .. off+14)."""
    b = bload(row, off - 2)  # scale byte i is b[i + 2]; starting 2 early keeps the load inside the block
    low = band(bshr_lanes(bshuffle(b, "2345 6789 2345 6789"), "0000 0000 4444 4444"), 15)
    high = band(bshr_lanes(bshuffle(b, "abcd abcd abcd abcd"), "0000 2222 4444 6666"), 3)
    return vmul(vsplat(d), vsub(bto_f32(bor(low, bshl(high, 4))), vsplat(_F32(32.0))))


# --- one super-block of one row: (vector accumulator, vector of constant terms) -------------------------------
@njit(inline="always", cache=True)
def q2_k_superblock(row, o, xv, xs, x0, acc, c):
    b = bload(row, o)
    scales = vmul(vsplat(load_f16(row, o + 80)), bto_f32(band(b, 15)))
    c = vfma(vmul(vsplat(load_f16(row, o + 82)), bto_f32(bshr(b, 4))), vload(xs, x0 // 16), c)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                u = bto_f32(band(bshr(bload(row, o + 16 + 32 * n + 16 * h), 2 * j), 3))
                acc = vfma(vlane(scales, k), vmul(u, vload(xv, x0 + 16 * k)), acc)
    return acc, c


@njit(inline="always", cache=True)
def q3_k_superblock(row, o, xv, xs, x0, acc, c):
    scales = q3_k_scales(row, o + 96, load_f16(row, o + 108))
    c = vfma(scales, vload(xs, x0 // 16), c)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                low = band(bshr(bload(row, o + 32 + 32 * n + 16 * h), 2 * j), 3)
                high = bshl(band(bshr(bload(row, o + 16 * h), 4 * n + j), 1), 2)
                acc = vfma(vlane(scales, k), vmul(bto_f32(bor(low, high)), vload(xv, x0 + 16 * k)), acc)
    return acc, c


@njit(inline="always", cache=True)
def q4_k_superblock(row, o, xv, xs, x0, acc, c):
    sm = k4_scales_mins(row, o + 4, load_f16(row, o), load_f16(row, o + 2))
    c = vfma(sm, vload_high8(xs, x0 // 32), c)
    for j in range(4):
        q0, q1 = bload(row, o + 16 + 32 * j), bload(row, o + 32 + 32 * j)
        e = x0 + 64 * j
        lo = vfma(bto_f32(band(q1, 15)), vload(xv, e + 16), vmul(bto_f32(band(q0, 15)), vload(xv, e)))
        hi = vfma(bto_f32(bshr(q1, 4)), vload(xv, e + 48), vmul(bto_f32(bshr(q0, 4)), vload(xv, e + 32)))
        acc = vfma(vlane(sm, 2 * j), lo, acc)
        acc = vfma(vlane(sm, 2 * j + 1), hi, acc)
    return acc, c


@njit(inline="always", cache=True)
def q5_k_quants(row, o, j):
    """The 64 unsigned 5-bit quants of chunk ``j`` (elements 64j .. 64j+63) as four F32x16."""
    q0, q1 = bload(row, o + 48 + 32 * j), bload(row, o + 64 + 32 * j)
    h0, h1 = bload(row, o + 16), bload(row, o + 32)
    u0 = bor(band(q0, 15), bshl(band(bshr(h0, 2 * j), 1), 4))
    u1 = bor(band(q1, 15), bshl(band(bshr(h1, 2 * j), 1), 4))
    u2 = bor(bshr(q0, 4), bshl(band(bshr(h0, 2 * j + 1), 1), 4))
    u3 = bor(bshr(q1, 4), bshl(band(bshr(h1, 2 * j + 1), 1), 4))
    return bto_f32(u0), bto_f32(u1), bto_f32(u2), bto_f32(u3)


@njit(inline="always", cache=True)
def q5_k_superblock(row, o, xv, xs, x0, acc, c):
    sm = k4_scales_mins(row, o + 4, load_f16(row, o), load_f16(row, o + 2))
    c = vfma(sm, vload_high8(xs, x0 // 32), c)
    for j in range(4):
        u0, u1, u2, u3 = q5_k_quants(row, o, j)
        e = x0 + 64 * j
        lo = vfma(u1, vload(xv, e + 16), vmul(u0, vload(xv, e)))
        hi = vfma(u3, vload(xv, e + 48), vmul(u2, vload(xv, e + 32)))
        acc = vfma(vlane(sm, 2 * j), lo, acc)
        acc = vfma(vlane(sm, 2 * j + 1), hi, acc)
    return acc, c


@njit(inline="always", cache=True)
def q6_k_quants(row, o, n, h):
    """Unsigned 6-bit quants (0..63) of elements 128n + 16h + 32t + (0..15), t = 0..3, as four F32x16."""
    la, lb = bload(row, o + 64 * n + 16 * h), bload(row, o + 64 * n + 32 + 16 * h)
    qh = bload(row, o + 128 + 32 * n + 16 * h)
    u0 = bor(band(la, 15), bshl(band(qh, 3), 4))
    u1 = bor(band(lb, 15), bshl(band(bshr(qh, 2), 3), 4))
    u2 = bor(bshr(la, 4), bshl(band(bshr(qh, 4), 3), 4))
    u3 = bor(bshr(lb, 4), bshl(bshr(qh, 6), 4))
    return bto_f32(u0), bto_f32(u1), bto_f32(u2), bto_f32(u3)


@njit(inline="always", cache=True)
def q6_k_superblock(row, o, xv, xs, x0, acc, c):
    scales = vmul(vsplat(load_f16(row, o + 208)), bto_f32_signed(bload(row, o + 192)))
    c = vfma(scales, vload(xs, x0 // 16), c)
    for n in range(2):
        for h in range(2):
            u0, u1, u2, u3 = q6_k_quants(row, o, n, h)
            k = 8 * n + h
            e = x0 + 128 * n + 16 * h
            acc = vfma(vlane(scales, k), vmul(u0, vload(xv, e)), acc)
            acc = vfma(vlane(scales, k + 2), vmul(u1, vload(xv, e + 32)), acc)
            acc = vfma(vlane(scales, k + 4), vmul(u2, vload(xv, e + 64)), acc)
            acc = vfma(vlane(scales, k + 6), vmul(u3, vload(xv, e + 96)), acc)
    return acc, c


@njit(inline="always", cache=True)
def prefetch_lines(p0, p1, off, size):
    """Prefetch the cache lines of one super-block (``size`` bytes at ``off``) of two rows ahead."""
    for line in range(0, size, 64):
        prefetch(p0, off + line)
        prefetch(p1, off + line)


# --- mat-vec kernels: two rows per iteration -------------------------------------------------------------------
@njit(parallel=True, fastmath=True, cache=True)
def matvec_q2_k(w, xv, xs, out):
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, 84 * i, 84)
            a0, c0 = q2_k_superblock(w[r0], 84 * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = q2_k_superblock(w[r1], 84 * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - vsum(c0)
        out[r1] = vsum(a1) - vsum(c1)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q3_k(w, xv, xs, out):
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, 110 * i, 110)
            a0, c0 = q3_k_superblock(w[r0], 110 * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = q3_k_superblock(w[r1], 110 * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - _F32(4.0) * vsum(c0)
        out[r1] = vsum(a1) - _F32(4.0) * vsum(c1)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q4_k(w, xv, xs, out):
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, 144 * i, 144)
            a0, c0 = q4_k_superblock(w[r0], 144 * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = q4_k_superblock(w[r1], 144 * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - vsum(c0)
        out[r1] = vsum(a1) - vsum(c1)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q5_k(w, xv, xs, out):
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, 176 * i, 176)
            a0, c0 = q5_k_superblock(w[r0], 176 * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = q5_k_superblock(w[r1], 176 * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - vsum(c0)
        out[r1] = vsum(a1) - vsum(c1)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q6_k(w, xv, xs, out):
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, 210 * i, 210)
            a0, c0 = q6_k_superblock(w[r0], 210 * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = q6_k_superblock(w[r1], 210 * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - _F32(32.0) * vsum(c0)
        out[r1] = vsum(a1) - _F32(32.0) * vsum(c1)


# --- dequantization (ggml's dequantize_row_q*_K, same operations in the same order) ----------------------------
@njit(parallel=True, cache=True)
def dequant_q2_k(w, row0, out):
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 84 * i, QK_K * i
            d, dmin = load_f16(row, o + 80), load_f16(row, o + 82)
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        k = 8 * n + 2 * j + h
                        sc = row[o + k]
                        dl, ml = vsplat(d * _F32(sc & 15)), vsplat(dmin * _F32(sc >> 4))
                        u = bto_f32(band(bshr(bload(row, o + 16 + 32 * n + 16 * h), 2 * j), 3))
                        vstore(dst, y + 16 * k, vsub(vmul(dl, u), ml))


@njit(parallel=True, cache=True)
def dequant_q3_k(w, row0, out):
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 110 * i, QK_K * i
            d = load_f16(row, o + 108)
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        k = 8 * n + 2 * j + h
                        dl = vsplat(d * _F32(scale_q3_k(row, o + 96, k)))
                        low = band(bshr(bload(row, o + 32 + 32 * n + 16 * h), 2 * j), 3)
                        high = bshl(band(bshr(bload(row, o + 16 * h), 4 * n + j), 1), 2)
                        q = vsub(bto_f32(bor(low, high)), vsplat(_F32(4.0)))
                        vstore(dst, y + 16 * k, vmul(dl, q))


@njit(parallel=True, cache=True)
def dequant_q4_k(w, row0, out):
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 144 * i, QK_K * i
            d, dmin = load_f16(row, o), load_f16(row, o + 2)
            for j in range(4):
                sc_a, mn_a = scale_min_k4(row, o + 4, 2 * j)
                sc_b, mn_b = scale_min_k4(row, o + 4, 2 * j + 1)
                d1, m1 = vsplat(d * _F32(sc_a)), vsplat(dmin * _F32(mn_a))
                d2, m2 = vsplat(d * _F32(sc_b)), vsplat(dmin * _F32(mn_b))
                q0, q1 = bload(row, o + 16 + 32 * j), bload(row, o + 32 + 32 * j)
                e = y + 64 * j
                vstore(dst, e, vsub(vmul(d1, bto_f32(band(q0, 15))), m1))
                vstore(dst, e + 16, vsub(vmul(d1, bto_f32(band(q1, 15))), m1))
                vstore(dst, e + 32, vsub(vmul(d2, bto_f32(bshr(q0, 4))), m2))
                vstore(dst, e + 48, vsub(vmul(d2, bto_f32(bshr(q1, 4))), m2))


@njit(parallel=True, cache=True)
def dequant_q5_k(w, row0, out):
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 176 * i, QK_K * i
            d, dmin = load_f16(row, o), load_f16(row, o + 2)
            for j in range(4):
                sc_a, mn_a = scale_min_k4(row, o + 4, 2 * j)
                sc_b, mn_b = scale_min_k4(row, o + 4, 2 * j + 1)
                d1, m1 = vsplat(d * _F32(sc_a)), vsplat(dmin * _F32(mn_a))
                d2, m2 = vsplat(d * _F32(sc_b)), vsplat(dmin * _F32(mn_b))
                u0, u1, u2, u3 = q5_k_quants(row, o, j)
                e = y + 64 * j
                vstore(dst, e, vsub(vmul(d1, u0), m1))
                vstore(dst, e + 16, vsub(vmul(d1, u1), m1))
                vstore(dst, e + 32, vsub(vmul(d2, u2), m2))
                vstore(dst, e + 48, vsub(vmul(d2, u3), m2))


@njit(parallel=True, cache=True)
def dequant_q6_k(w, row0, out):
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 210 * i, QK_K * i
            d = load_f16(row, o + 208)
            thirty_two = vsplat(_F32(32.0))
            for n in range(2):
                for h in range(2):
                    u0, u1, u2, u3 = q6_k_quants(row, o, n, h)
                    k = 8 * n + h
                    e = y + 128 * n + 16 * h
                    vstore(dst, e, vmul(vsplat(d * _F32(np.int8(row[o + 192 + k]))), vsub(u0, thirty_two)))
                    vstore(dst, e + 32, vmul(vsplat(d * _F32(np.int8(row[o + 194 + k]))), vsub(u1, thirty_two)))
                    vstore(dst, e + 64, vmul(vsplat(d * _F32(np.int8(row[o + 196 + k]))), vsub(u2, thirty_two)))
                    vstore(dst, e + 96, vmul(vsplat(d * _F32(np.int8(row[o + 198 + k]))), vsub(u3, thirty_two)))
