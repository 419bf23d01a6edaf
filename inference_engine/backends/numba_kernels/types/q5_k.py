"""Q5_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_K (176 bytes, 256 weights): ``d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48``: as Q4_K plus a fifth
bit,
bit ``2j`` (low half) / ``2j + 1`` (high half) of ``qh[l]``.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, inttiles
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
def q5_k_sumi(row, o, yq, e, t0, t1):
    sumi = int8.izero()
    hbits = int8.load32(row, o + 16)
    for j in range(4):
        q = int8.load32(row, o + 48 + 32 * j)
        word = t0 if j < 2 else t1
        sl, sh = intdot.byte(word, (2 * j) % 4), intdot.byte(word, (2 * j + 1) % 4)
        h = int8.bshr8(hbits, 2 * j)
        q0 = int8.bor8(int8.band8(q, 15), int8.bshl8(int8.band8(h, 1), 4))
        q1 = int8.bor8(int8.band8(int8.bshr8(q, 4), 15), int8.bshl8(int8.band8(int8.bshr8(h, 1), 1), 4))
        lo = int8.dot4_scaled(q0, int8.load32(yq, e + 64 * j), sl, sl)
        hi = int8.dot4_scaled(q1, int8.load32(yq, e + 64 * j + 32), sh, sh)
        sumi = int8.iadd(sumi, int8.iadd(lo, hi))
    return sumi


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
        a0 = int8.fma_int(yd[i] * simd.load_f16(w0, o), q5_k_sumi(w0, o, yq, float_blocks.QK_K * i, t00, t01), a0)
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
def row_q5_k(row, o, e, y0, y1, y2, y3, u_lo, u_hi):
    i0, i1, i2, i3 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
    for j in range(4):
        lo, hi = q5_k_quants(row, o, j)
        sl, sh = inttiles.sub_scales(u_lo, u_hi, j)
        ej = e + 64 * j
        i0, i1 = (
            int8.iadd(i0, inttiles.dot_pair(lo, hi, y0, ej, sl, sh)),
            int8.iadd(i1, inttiles.dot_pair(lo, hi, y1, ej, sl, sh)),
        )
        i2, i3 = (
            int8.iadd(i2, inttiles.dot_pair(lo, hi, y2, ej, sl, sh)),
            int8.iadd(i3, inttiles.dot_pair(lo, hi, y3, ej, sl, sh)),
        )
    return i0, i1, i2, i3


@njit(inline="always", cache=True)
def row_tile_q5_k(w, yq, yd, ya, t0, t1, t2, t3):
    """As row_tile_q4_k."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a0, a1, a2, a3 = (
        (int8.fzero(), _F32(0.0)),
        (int8.fzero(), _F32(0.0)),
        (int8.fzero(), _F32(0.0)),
        (int8.fzero(), _F32(0.0)),
    )
    for i in range(d0.shape[0]):
        o = 176 * i
        u0, u1, u2, u3 = intdot.k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q5_k(w, o, float_blocks.QK_K * i, y0, y1, y2, y3, u0, u1)
        a0 = close_q5_k(w, o, d0[i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, d1[i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, d2[i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, d3[i], s3, i, u2, u3, i3, a3)
    return inttiles.close_min(a0), inttiles.close_min(a1), inttiles.close_min(a2), inttiles.close_min(a3)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    v00, v01, v02, v03 = row_tile_q5_k(w0, yq, yd, ya, t0, t1, t2, t3)
    v10, v11, v12, v13 = row_tile_q5_k(w1, yq, yd, ya, t0, t1, t2, t3)
    return v00, v01, v02, v03, v10, v11, v12, v13


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
        i0, i1, i2, i3 = row_q5_k(w, o, float_blocks.QK_K * i, y0, y1, y2, y3, u0, u1)
        i4, i5, i6, i7 = row_q5_k(w, o, float_blocks.QK_K * i, y4, y5, y6, y7, u0, u1)
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
    n_tok, n = out.shape
    full = n_tok - n_tok % inttiles.TILE8_TOKENS
    for t in range(0, full, inttiles.TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q5_k(w[r], yq, yd, ya, t, out, r)
    for t in range(full, n_tok, inttiles.TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            inttiles.store_tile(out, r0, r1, t, t1, t2, t3, tile_q5_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(inline="always", cache=True)
def tiled_loop_q5_k(w, yq, yd, ya, out):
    """Row groups split over threads, each by :func:`group_q5_k`."""
    n = out.shape[1]
    ya = intdot.bsum_pairs(ya)
    for g in prange((n + inttiles.GROUP_ROWS - 1) // inttiles.GROUP_ROWS):
        group_q5_k(w, yq, yd, ya, out, g * inttiles.GROUP_ROWS, min(g * inttiles.GROUP_ROWS + inttiles.GROUP_ROWS, n))
