"""The float path's shared block unpacking (the ``matvec_float_<type>`` kernels of :mod:`.types`).

Conventions every float mat-vec follows: weights come as uint8 byte rows, read straight from the GGUF blocks;
``matvec_float_<type>(w, xv, xs, out)`` computes ``out[r] = sum_b d_rb * dot(q_rb, xv_b) + c_rb * xs_b`` with the
block's constant term ``c`` applied once per block (or sub-block) to ``xs_b``, the activation's block sum
(:mod:`.ops.activations`: the plain sum for ``f32`` numerics, ggml's ``d_a * sum(q_a)`` for ``ggml`` numerics; F32
/ F16 / BF16 weights have no constant term and ignore ``xs``). 16-lane accumulators, reduced once at the end of a
row; two rows per iteration share the activation loads. The K-quants (256-weight super-blocks, ``scale_k * u -
min_k`` inside a sub-block ``k``) unpack a super-block's 6-bit / 4-bit scale fields into one vector (a lane per
sub-block) with a few byte shuffles, so nothing is repacked at load time. ``dequant_<type>`` reproduce ggml's
``dequantize_row_*`` (same operations, same rounding) for whole rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bbits,
    bload,
    bor,
    bselect,
    bshl,
    bshr,
    bshr_lanes,
    bshuffle,
    bto_f32,
    load_f16,
    prefetch,
    rows_ahead,
    vadd,
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
QK_K = 256  # weights per K-quant super-block


# --- Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0: 32-weight blocks ``w = d (q - k)`` (offset) or ``w = d q + m`` (min) ----------
# ``unpack(row, o)``: the block's 32 quants as two F32x16 (elements 0..15 and 16..31), the type's own arithmetic.
@njit(inline="always", cache=True)
def nibbles(row, off):
    """The 32 unsigned 4-bit quants at ``row[off:off+16]`` (lo nibbles: elements 0..15, hi: 16..31)."""
    q = bload(row, off)
    return bto_f32(band(q, 15)), bto_f32(bshr(q, 4))


@njit(inline="always", cache=True)
def five_bit_quants(row, qh_off, qs_off):
    """The block's 32 unsigned 5-bit quants as two F32x16: elements 0..15 and 16..31."""
    q = bload(row, qs_off)
    lo = bor(band(q, 15), bshl(bbits(row, qh_off, 0), 4))
    hi = bor(bshr(q, 4), bshl(bbits(row, qh_off, 16), 4))
    return bto_f32(lo), bto_f32(hi)


@njit(inline="always", cache=True)
def offset_block(unpack, row, o, xl, xh):
    """:func:`pairs_matvec_float`'s block of an offset type: ``d``, the quants' dot, ``d`` (constant term ``-k d``)."""
    d = load_f16(row, o)
    lo, hi = unpack(row, o)
    return d, vfma(hi, xh, vmul(lo, xl)), d


@njit(inline="always", cache=True)
def min_block(unpack, row, o, xl, xh):
    """:func:`pairs_matvec_float`'s block of a min type: ``d``, the quants' dot, ``m`` (``d`` at byte 0, ``m`` at 2)."""
    lo, hi = unpack(row, o)
    return load_f16(row, o), vfma(hi, xh, vmul(lo, xl)), load_f16(row, o + 2)


@njit(inline="always", cache=True)
def offset_dequant(unpack, row, o, dst, e, k):
    """``dequantize_row`` of an offset type's block into ``dst[e : e + 32]``: ``(q - k) * d``, as ggml rounds it."""
    d, kv = vsplat(load_f16(row, o)), vsplat(k)
    lo, hi = unpack(row, o)
    vstore(dst, e, vmul(vsub(lo, kv), d))
    vstore(dst, e + 16, vmul(vsub(hi, kv), d))


@njit(inline="always", cache=True)
def min_dequant(unpack, row, o, dst, e, k):
    """``dequantize_row`` of a min type's block into ``dst[e : e + 32]``: ``q * d + m`` (two roundings, as ggml)."""
    d, m = vsplat(load_f16(row, o)), vsplat(load_f16(row, o + 2))
    lo, hi = unpack(row, o)
    vstore(dst, e, vadd(vmul(lo, d), m))
    vstore(dst, e + 16, vadd(vmul(hi, d), m))


# --- scale fields ------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def scale_min_k4(row, off, j):
    """ggml's ``get_scale_min_k4``: the 6-bit (scale, min) of sub-block ``j`` from Q4_K / Q5_K's 12 scale bytes."""
    if j < 4:
        return row[off + j] & 63, row[off + j + 4] & 63
    sc = (row[off + j + 4] & 15) | ((row[off + j - 4] >> 6) << 4)
    mn = (row[off + j + 4] >> 4) | ((row[off + j] >> 6) << 4)
    return sc, mn


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


# --- prefetch ----------------------------------------------------------------------------------------------------


@njit(inline="always", cache=True)
def prefetch_lines(p0, p1, off, size):
    """Prefetch the cache lines of one super-block (``size`` bytes at ``off``) of two rows ahead."""
    for line in range(0, size, 64):
        prefetch(p0, off + line)
        prefetch(p1, off + line)


# --- the mat-vec loops, one per shape: each type's ``matvec_float_<type>`` is one of them with its block arithmetic -
# Inlined (``inline="always"``) into the type's own ``@njit(parallel=True, fastmath=True, cache=True)`` kernel, which
# passes its block function and its ``layout_<type>()``: ``(block bytes, constant-term factor)``, called inside the
# parallel loop so that both stay compile-time constants there (passed as arguments they became the loop's runtime
# parameters). Each kernel keeps its own file in Numba's cache.
@njit(inline="always", cache=True)
def pairs_matvec_float(block, unpack, layout, w, xv, xs, out):
    """Two rows per iteration over 32-weight blocks: ``block(unpack, row, o, xl, xh)`` (:func:`offset_block`,
    :func:`min_block`) gives a block's scale ``d``, its 16-lane quant dot and the factor ``m`` of its constant term;
    ``out = vsum(sum d * dot) - k * sum(m * xs)``."""
    n, nb = out.shape[0], xs.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        block_bytes, k = layout()
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = vzero(), vzero()
        c0, c1 = _F32(0.0), _F32(0.0)
        for b in range(nb):
            o = block_bytes * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            d0, q0, m0 = block(unpack, w0, o, xl, xh)
            d1, q1, m1 = block(unpack, w1, o, xl, xh)
            a0 = vfma(vsplat(d0), q0, a0)
            a1 = vfma(vsplat(d1), q1, a1)
            c0 += m0 * xs[b]
            c1 += m1 * xs[b]
        out[r0] = vsum(a0) - k * c0
        out[r1] = vsum(a1) - k * c1


@njit(inline="always", cache=True)
def superblocks_matvec_float(superblock, layout, w, xv, xs, out):
    """Two rows per iteration over 256-weight super-blocks: ``superblock(row, o, xv, xs, x0, acc, c)`` adds one
    super-block's products to the vector accumulator and its constant terms to ``c``; ``out = vsum(acc) - k *
    vsum(c)``."""
    n, nsb = out.shape[0], xv.shape[0] // QK_K
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        block_bytes, k = layout()
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1, c0, c1 = vzero(), vzero(), vzero(), vzero()
        for i in range(nsb):
            prefetch_lines(p0, p1, block_bytes * i, block_bytes)
            a0, c0 = superblock(w[r0], block_bytes * i, xv, xs, QK_K * i, a0, c0)
            a1, c1 = superblock(w[r1], block_bytes * i, xv, xs, QK_K * i, a1, c1)
        out[r0] = vsum(a0) - k * vsum(c0)
        out[r1] = vsum(a1) - k * vsum(c1)


# --- dequantization loops: each type's ``dequant_<type>`` is one of them with its block's arithmetic ----------------
@njit(inline="always", cache=True)
def blocks_dequant(block, unpack, layout, w, row0, out):
    """Rows ``row0 ..`` of 32-weight blocks: ``block(unpack, row, o, dst, e, k)`` (:func:`offset_dequant`,
    :func:`min_dequant`) writes the block at byte ``o`` to ``dst[e : e + 32]`` (``layout``: as
    :func:`pairs_matvec_float`'s)."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        block_bytes, k = layout()
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            block(unpack, row, block_bytes * b, dst, 32 * b, k)


@njit(inline="always", cache=True)
def superblocks_dequant(superblock, layout, w, row0, out):
    """Rows ``row0 ..`` of 256-weight super-blocks: ``superblock(row, o, dst, e)`` writes the super-block at byte
    ``o`` to ``dst[e : e + 256]``."""
    nsb = out.shape[1] // QK_K
    for r in prange(out.shape[0]):
        block_bytes, _ = layout()
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            superblock(row, block_bytes * i, dst, QK_K * i)


# --- F32 / F16 / BF16: the values themselves, widened to float32 by ``vload_w`` / ``load_w`` -----------------------
@njit(inline="always", cache=True)
def row_dot_floats(vload_w, load_w, width, row, ahead, xv):
    """``row . xv`` for a row of ``width``-byte floats (``ahead``: the row to prefetch, a few rows on)."""
    k = xv.shape[0]
    a, b = vzero(), vzero()
    e = 0
    while e + 32 <= k:
        for line in range(0, 32 * width, 64):
            prefetch(ahead, width * e + line)
        a = vfma(vload_w(row, width * e), vload(xv, e), a)
        b = vfma(vload_w(row, width * (e + 16)), vload(xv, e + 16), b)
        e += 32
    if e + 16 <= k:
        a = vfma(vload_w(row, width * e), vload(xv, e), a)
        e += 16
    t = vsum(vadd(a, b))
    for i in range(e, k):
        t += load_w(row, width * i) * xv[i]
    return t


@njit(inline="always", cache=True)
def floats_matvec(vload_w, load_w, layout, w, xv, xs, out):
    """One row per iteration (``layout() -> (bytes a value, 0)``; ``xs`` unused: no constant term)."""
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        width, _ = layout()
        out[r] = row_dot_floats(vload_w, load_w, width, w[r], w[min(r + ahead, n - 1)], xv)


@njit(inline="always", cache=True)
def floats_dequant(vload_w, load_w, layout, w, row0, out):
    """The rows widened to float32, 16 values a step where ``vload_w`` is a vector load, then one at a time."""
    k = out.shape[1]
    for r in prange(out.shape[0]):
        width, _ = layout()
        row, dst = w[row0 + r], out[r]
        e = 0
        while e + 16 <= k:
            vstore(dst, e, vload_w(row, width * e))
            e += 16
        for i in range(e, k):
            dst[i] = load_w(row, width * i)


# --- Q4_K / Q5_K: the same scales and mins, quants of 4 or 5 bits (``quants(row, o, j)``: chunk ``j``'s 64 quants,
# elements 64j .. 64j + 63, as four F32x16) ---------------------------------------------------------------------------
@njit(inline="always", cache=True)
def k4_superblock(quants, row, o, xv, xs, x0, acc, c):
    """One Q4_K / Q5_K super-block for :func:`superblocks_matvec_float`."""
    sm = k4_scales_mins(row, o + 4, load_f16(row, o), load_f16(row, o + 2))
    c = vfma(sm, vload_high8(xs, x0 // 32), c)
    for j in range(4):
        u0, u1, u2, u3 = quants(row, o, j)
        e = x0 + 64 * j
        lo = vfma(u1, vload(xv, e + 16), vmul(u0, vload(xv, e)))
        hi = vfma(u3, vload(xv, e + 48), vmul(u2, vload(xv, e + 32)))
        acc = vfma(vlane(sm, 2 * j), lo, acc)
        acc = vfma(vlane(sm, 2 * j + 1), hi, acc)
    return acc, c


@njit(inline="always", cache=True)
def k4_dequant(quants, row, o, dst, y):
    """``dequantize_row_q4_K`` / ``_q5_K`` of the super-block at byte ``o`` into ``dst[y : y + 256]``."""
    d, dmin = load_f16(row, o), load_f16(row, o + 2)
    for j in range(4):
        sc_a, mn_a = scale_min_k4(row, o + 4, 2 * j)
        sc_b, mn_b = scale_min_k4(row, o + 4, 2 * j + 1)
        d1, m1 = vsplat(d * _F32(sc_a)), vsplat(dmin * _F32(mn_a))
        d2, m2 = vsplat(d * _F32(sc_b)), vsplat(dmin * _F32(mn_b))
        u0, u1, u2, u3 = quants(row, o, j)
        e = y + 64 * j
        vstore(dst, e, vsub(vmul(d1, u0), m1))
        vstore(dst, e + 16, vsub(vmul(d1, u1), m1))
        vstore(dst, e + 32, vsub(vmul(d2, u2), m2))
        vstore(dst, e + 48, vsub(vmul(d2, u3), m2))
