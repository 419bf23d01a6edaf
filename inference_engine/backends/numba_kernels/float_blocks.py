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
    prefetch,
    rows_ahead,
    vfma,
    vhalves,
    vload,
    vmul,
    vsplat,
    vsum,
    vzero,
)

_F32 = np.float32
QK_K = 256  # weights per K-quant super-block


# --- Q4_0 / Q4_1: a block's 32 nibbles times the activation ----------------------------------------------------------


@njit(inline="always", cache=True)
def nibble_dot(row, off, xl, xh):
    """16 lanes of ``lo(qs[j]) * x[j] + hi(qs[j]) * x[j+16]`` for the 16 quant bytes at ``row[off:off+16]``."""
    q = bload(row, off)
    return vfma(bto_f32(bshr(q, 4)), xh, vmul(bto_f32(band(q, 15)), xl))


# --- Q5_0 / Q5_1: nibbles plus the fifth bits of qh ----------------------------------------------------------------


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
def pairs_matvec_float(block, layout, w, xv, xs, out):
    """Two rows per iteration over 32-weight blocks: ``block(row, o, xl, xh)`` gives a block's scale ``d``, its
    16-lane quant dot and the factor ``m`` of its constant term; ``out = vsum(sum d * dot) - k * sum(m * xs)``."""
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
            d0, q0, m0 = block(w0, o, xl, xh)
            d1, q1, m1 = block(w1, o, xl, xh)
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
