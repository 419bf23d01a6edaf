"""Q5_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_K (176 bytes, 256 weights): ``d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48``: as Q4_K plus a fifth
bit,
bit ``2j`` (low half) / ``2j + 1`` (high half) of ``qh[l]``.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, inttiles, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd

_F32 = np.float32


# --- float mat-vec and dequantization ------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def quants_float_q5_k(row, o, j):
    """The 64 unsigned 5-bit quants of chunk ``j`` (elements 64j .. 64j+63) as four F32x16."""
    q0, q1 = simd.bload(row, o + 48 + 32 * j), simd.bload(row, o + 64 + 32 * j)
    h0, h1 = simd.bload(row, o + 16), simd.bload(row, o + 32)
    u0 = simd.bor(simd.band(q0, 15), simd.bshl(simd.band(simd.bshr(h0, 2 * j), 1), 4))
    u1 = simd.bor(simd.band(q1, 15), simd.bshl(simd.band(simd.bshr(h1, 2 * j), 1), 4))
    u2 = simd.bor(simd.bshr(q0, 4), simd.bshl(simd.band(simd.bshr(h0, 2 * j + 1), 1), 4))
    u3 = simd.bor(simd.bshr(q1, 4), simd.bshl(simd.band(simd.bshr(h1, 2 * j + 1), 1), 4))
    return simd.bto_f32(u0), simd.bto_f32(u1), simd.bto_f32(u2), simd.bto_f32(u3)


@njit(inline="always", cache=True)
def q5_k_superblock(row, o, xv, xs, x0, acc, c):
    return float_blocks.k4_superblock(quants_float_q5_k, row, o, xv, xs, x0, acc, c)


@njit(inline="always", cache=True)
def dequant_superblock_q5_k(row, o, dst, y):
    float_blocks.k4_dequant(quants_float_q5_k, row, o, dst, y)


# --- integer-dot mat-vec (ggml numerics, one token) ---------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_q5_k(w0, p0, yq, yd, ys):
    """One Q5_K row. ``ys``: the activation's bsum pairs; the min terms as in :func:`row_dot_q4_k`, summed in
    integers (ggml's Q5_K adds them before the one float multiply-add)."""
    a0, c0 = int8.fzero(), _F32(0.0)
    for i in range(yd.shape[0]):
        o = 176 * i
        intdot.prefetch_span(p0, o, 176)
        t00, t01, t02, t03 = intdot.k4_scales(w0, o + 4)
        c0 = simd.fma32(-yd[i] * simd.load_f16(w0, o + 2), _F32(int8.ihsum(int8.kmin_pairs(ys, 8 * i, t02, t03))), c0)
        a0 = int8.fma_int(
            yd[i] * simd.load_f16(w0, o), intdot.k4_sumi(q5_k_quants, w0, o, yq, float_blocks.QK_K * i, t00, t01), a0
        )
    return int8.fsum(a0) + c0


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) ---------------------------------------------
@njit(inline="always", cache=True)
def q5_k_quants(row, o, j):
    hbits = int8.load32(row, o + 16)
    q = int8.load32(row, o + 48 + 32 * j)
    h = int8.bshr8(hbits, 2 * j)
    q0 = int8.bor8(int8.band8(q, 15), int8.bshl8(int8.band8(h, 1), 4))
    q1 = int8.bor8(int8.band8(int8.bshr8(q, 4), 15), int8.bshl8(int8.band8(int8.bshr8(h, 1), 1), 4))
    return q0, q1


@njit(inline="always", cache=True)
def close_q5_k(row, o, ydi, ys, i, t_mlo, t_mhi, sumi, st):
    """row_dot_q5_k's per-super-block float steps for one output; state (acc, c)."""
    dmin = -ydi * simd.load_f16(row, o + 2)
    mins = _F32(int8.ihsum(int8.kmin_pairs(ys, 8 * i, t_mlo, t_mhi)))
    return int8.fma_int(ydi * simd.load_f16(row, o), sumi, st[0]), simd.fma32(dmin, mins, st[1])


@njit(inline="always", cache=True)
def zero_q5_k():
    """:func:`close_q5_k`'s state before the first super-block."""
    return int8.fzero(), _F32(0.0)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    return inttiles.k4_tile(
        q5_k_quants, close_q5_k, inttiles.close_min, zero_q5_k, 176, w0, w1, yq, yd, ya, t0, t1, t2, t3
    )


@njit(cache=True)
def row8_q5_k(w, yq, yd, ya, t, out, r):
    """As row8_q4_k."""
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    s0, s1, s2, s3 = ya[t], ya[t + 1], ya[t + 2], ya[t + 3]
    s4, s5, s6, s7 = ya[t + 4], ya[t + 5], ya[t + 6], ya[t + 7]
    z = (int8.fzero(), _F32(0.0))
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 176 * i
        u0, u1, u2, u3 = intdot.k4_scales(w, o + 4)
        i0, i1, i2, i3 = inttiles.k4_rows4(q5_k_quants, w, o, float_blocks.QK_K * i, y0, y1, y2, y3, u0, u1)
        i4, i5, i6, i7 = inttiles.k4_rows4(q5_k_quants, w, o, float_blocks.QK_K * i, y4, y5, y6, y7, u0, u1)
        a0 = close_q5_k(w, o, yd[t, i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, yd[t + 1, i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, yd[t + 2, i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, yd[t + 3, i], s3, i, u2, u3, i3, a3)
        a4 = close_q5_k(w, o, yd[t + 4, i], s4, i, u2, u3, i4, a4)
        a5 = close_q5_k(w, o, yd[t + 5, i], s5, i, u2, u3, i5, a5)
        a6 = close_q5_k(w, o, yd[t + 6, i], s6, i, u2, u3, i6, a6)
        a7 = close_q5_k(w, o, yd[t + 7, i], s7, i, u2, u3, i7, a7)
    inttiles.store4(
        out, r, t, inttiles.close_min(a0), inttiles.close_min(a1), inttiles.close_min(a2), inttiles.close_min(a3)
    )
    inttiles.store4(
        out, r, t + 4, inttiles.close_min(a4), inttiles.close_min(a5), inttiles.close_min(a6), inttiles.close_min(a7)
    )


@njit(cache=True)
def group_q5_k(w, yq, yd, ya, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 8 tokens by :func:`row8_q5_k`, the rest by 4-token tiles."""
    n_tok = out.shape[0]
    full = n_tok - n_tok % inttiles.TILE8_TOKENS
    for t in range(0, full, inttiles.TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q5_k(w[r], yq, yd, ya, t, out, r)
    inttiles.tile_rows(tile_q5_k, w, yq, yd, ya, out, lo, hi, full)


@njit(inline="always", cache=True)
def tiled_loop_q5_k(w, yq, yd, ya, out):
    """Row groups split over threads, each by :func:`group_q5_k`."""
    n = out.shape[1]
    ya = intdot.bsum_pairs(ya)
    for g in prange((n + inttiles.GROUP_ROWS - 1) // inttiles.GROUP_ROWS):
        group_q5_k(w, yq, yd, ya, out, g * inttiles.GROUP_ROWS, min(g * inttiles.GROUP_ROWS + inttiles.GROUP_ROWS, n))


# --- llama.cpp's tiled mat-mul (AVX-512 VNNI, 8 tokens or more: :mod:`..ktiles`) ---------------------------------
@njit(inline="always", cache=True)
def unpack_rows_q5_k(w, r, codes, sc, mn, dd, dm):
    """Rows ``r .. r + 7``: their quants in element order, one a byte (0..31; ggml's ``tiled_unpack_src0``), the
    6-bit sub-block scales and mins as int32, ``d`` and ``dmin`` as float32."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for i in range(dd.shape[1]):
            o, e = 176 * i, 256 * i
            for c in range(4):
                q = o + 48 + 32 * c
                for l in range(32):
                    h = row[o + 16 + l]
                    dst[e + 64 * c + l] = (row[q + l] & 15) | (((h >> (2 * c)) & 1) << 4)
                    dst[e + 64 * c + 32 + l] = (row[q + l] >> 4) | (((h >> (2 * c + 1)) & 1) << 4)
            ktiles.k4_scales_mins(row, o, j, i, sc, mn, dd, dm)
