"""Q6_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q6_K (210 bytes, 256 weights): ``ql[128] @0 | qh[64] @128 | scales[16] int8 @192 | d @208``;
``e = 128n + l + 32t`` (t = 0..3): ``u = nibble of ql[64n + l + 32(t & 1)]`` (lo for t < 2) ``| ((qh[32n + l] >> 2t)
& 3) << 4``,
sub-block ``8n + l//16 + 2t``; ``w = d*sc*(u - 32)``.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, inttiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm

_F32 = np.float32


# --- float mat-vec and dequantization ------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def q6_k_quants_float(row, o, n, h):
    """Unsigned 6-bit quants (0..63) of elements 128n + 16h + 32t + (0..15), t = 0..3, as four F32x16."""
    la, lb = simd.bload(row, o + 64 * n + 16 * h), simd.bload(row, o + 64 * n + 32 + 16 * h)
    qh = simd.bload(row, o + 128 + 32 * n + 16 * h)
    u0 = simd.bor(simd.band(la, 15), simd.bshl(simd.band(qh, 3), 4))
    u1 = simd.bor(simd.band(lb, 15), simd.bshl(simd.band(simd.bshr(qh, 2), 3), 4))
    u2 = simd.bor(simd.bshr(la, 4), simd.bshl(simd.band(simd.bshr(qh, 4), 3), 4))
    u3 = simd.bor(simd.bshr(lb, 4), simd.bshl(simd.bshr(qh, 6), 4))
    return simd.bto_f32(u0), simd.bto_f32(u1), simd.bto_f32(u2), simd.bto_f32(u3)


@njit(inline="always", cache=True)
def q6_k_superblock(row, o, xv, xs, x0, acc, c):
    scales = simd.vmul(simd.vsplat(simd.load_f16(row, o + 208)), simd.bto_f32_signed(simd.bload(row, o + 192)))
    c = simd.vfma(scales, simd.vload(xs, x0 // 16), c)
    for n in range(2):
        for h in range(2):
            u0, u1, u2, u3 = q6_k_quants_float(row, o, n, h)
            k = 8 * n + h
            e = x0 + 128 * n + 16 * h
            acc = simd.vfma(simd.vlane(scales, k), simd.vmul(u0, simd.vload(xv, e)), acc)
            acc = simd.vfma(simd.vlane(scales, k + 2), simd.vmul(u1, simd.vload(xv, e + 32)), acc)
            acc = simd.vfma(simd.vlane(scales, k + 4), simd.vmul(u2, simd.vload(xv, e + 64)), acc)
            acc = simd.vfma(simd.vlane(scales, k + 6), simd.vmul(u3, simd.vload(xv, e + 96)), acc)
    return acc, c


@njit(inline="always", cache=True)
def dequant_superblock_q6_k(row, o, dst, y):
    """``dequantize_row_q6_K`` of the super-block at byte ``o`` into ``dst[y : y + 256]``."""
    d = simd.load_f16(row, o + 208)
    thirty_two = simd.vsplat(_F32(32.0))
    for n in range(2):
        for h in range(2):
            u0, u1, u2, u3 = q6_k_quants_float(row, o, n, h)
            k = 8 * n + h
            e = y + 128 * n + 16 * h
            simd.vstore(
                dst, e, simd.vmul(simd.vsplat(d * _F32(np.int8(row[o + 192 + k]))), simd.vsub(u0, thirty_two))
            )
            simd.vstore(
                dst,
                e + 32,
                simd.vmul(simd.vsplat(d * _F32(np.int8(row[o + 194 + k]))), simd.vsub(u1, thirty_two)),
            )
            simd.vstore(
                dst,
                e + 64,
                simd.vmul(simd.vsplat(d * _F32(np.int8(row[o + 196 + k]))), simd.vsub(u2, thirty_two)),
            )
            simd.vstore(
                dst,
                e + 96,
                simd.vmul(simd.vsplat(d * _F32(np.int8(row[o + 198 + k]))), simd.vsub(u3, thirty_two)),
            )


# --- integer-dot kernels (ggml numerics): one token (row_dot_q6_k), several tokens (register tiles) ----------------
@njit(inline="always", cache=True)
def q6_k_quants(row, o, j):
    """The four 32-quant vectors of half ``j`` of a Q6_K super-block (as q6_k_sumi unpacks them)."""
    ql0, ql1 = int8.load32(row, o + 64 * j), int8.load32(row, o + 64 * j + 32)
    qh = int8.load32(row, o + 128 + 32 * j)
    q0 = int8.bor8(int8.band8(ql0, 15), int8.bshl8(int8.band8(qh, 3), 4))
    q1 = int8.bor8(int8.band8(ql1, 15), int8.bshl8(int8.band8(int8.bshr8(qh, 2), 3), 4))
    q2 = int8.bor8(int8.bshr8(ql0, 4), int8.bshl8(int8.band8(int8.bshr8(qh, 4), 3), 4))
    q3 = int8.bor8(int8.bshr8(ql1, 4), int8.bshl8(int8.bshr8(qh, 6), 4))
    return q0, q1, q2, q3


@njit(inline="always", cache=True)
def dot_q6_k(q0, q1, q2, q3, row, sc, yq, y):
    p0 = int8.dot4_scaled(q0, int8.load32(yq, y), np.int8(row[sc]), np.int8(row[sc + 1]))
    p1 = int8.dot4_scaled(q1, int8.load32(yq, y + 32), np.int8(row[sc + 2]), np.int8(row[sc + 3]))
    p2 = int8.dot4_scaled(q2, int8.load32(yq, y + 64), np.int8(row[sc + 4]), np.int8(row[sc + 5]))
    p3 = int8.dot4_scaled(q3, int8.load32(yq, y + 96), np.int8(row[sc + 6]), np.int8(row[sc + 7]))
    return int8.iadd(int8.iadd(p0, p1), int8.iadd(p2, p3))


@njit(inline="always", cache=True)
def q6_k_sumi(row, o, yq, e, ys, i):
    """One super-block's integer sum with the activation from element ``e``, less ``32 * bsums . scales``."""
    sumi = int8.izero()
    for j in range(2):
        q0, q1, q2, q3 = q6_k_quants(row, o, j)
        sumi = int8.iadd(sumi, dot_q6_k(q0, q1, q2, q3, row, o + 192 + 8 * j, yq, e + 128 * j))
    return int8.isub(sumi, int8.ishl(int8.madd16(ys, 16 * i, row, o + 192), 5))


@njit(inline="always", cache=True)
def row_dot_q6_k(w0, p0, yq, yd, ya):
    """One Q6_K row."""
    a0 = int8.fzero()
    for i in range(yd.shape[0]):
        o = 210 * i
        intdot.prefetch_span(p0, o, 210)
        a0 = int8.fma_int(yd[i] * simd.load_f16(w0, o + 208), q6_k_sumi(w0, o, yq, float_blocks.QK_K * i, ya, i), a0)
    return int8.fsum(a0)


@njit(inline="always", cache=True)
def close_q6_k(row, o, ydi, ys, i, sumi, acc):
    return int8.fma_int(
        ydi * simd.load_f16(row, o + 208), int8.isub(sumi, int8.ishl(int8.madd16(ys, 16 * i, row, o + 192), 5)), acc
    )


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q6_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for i in range(d0.shape[0]):
        o = 210 * i
        i00, i01, i02, i03 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        i10, i11, i12, i13 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        for j in range(2):
            e, sc = float_blocks.QK_K * i + 128 * j, o + 192 + 8 * j
            q00, q01, q02, q03 = q6_k_quants(w0, o, j)
            q10, q11, q12, q13 = q6_k_quants(w1, o, j)
            i00 = int8.iadd(i00, dot_q6_k(q00, q01, q02, q03, w0, sc, y0, e))
            i01 = int8.iadd(i01, dot_q6_k(q00, q01, q02, q03, w0, sc, y1, e))
            i02 = int8.iadd(i02, dot_q6_k(q00, q01, q02, q03, w0, sc, y2, e))
            i03 = int8.iadd(i03, dot_q6_k(q00, q01, q02, q03, w0, sc, y3, e))
            i10 = int8.iadd(i10, dot_q6_k(q10, q11, q12, q13, w1, sc, y0, e))
            i11 = int8.iadd(i11, dot_q6_k(q10, q11, q12, q13, w1, sc, y1, e))
            i12 = int8.iadd(i12, dot_q6_k(q10, q11, q12, q13, w1, sc, y2, e))
            i13 = int8.iadd(i13, dot_q6_k(q10, q11, q12, q13, w1, sc, y3, e))
        a00 = close_q6_k(w0, o, d0[i], s0, i, i00, a00)
        a01 = close_q6_k(w0, o, d1[i], s1, i, i01, a01)
        a02 = close_q6_k(w0, o, d2[i], s2, i, i02, a02)
        a03 = close_q6_k(w0, o, d3[i], s3, i, i03, a03)
        a10 = close_q6_k(w1, o, d0[i], s0, i, i10, a10)
        a11 = close_q6_k(w1, o, d1[i], s1, i, i11, a11)
        a12 = close_q6_k(w1, o, d2[i], s2, i, i12, a12)
        a13 = close_q6_k(w1, o, d3[i], s3, i, i13, a13)
    return inttiles.fsums(a00, a01, a02, a03, a10, a11, a12, a13)


@njit(inline="always", cache=True)
def sumi_q6_k(q0, q1, q2, q3, w, sc, yq, e, acc):
    return int8.iadd(acc, dot_q6_k(q0, q1, q2, q3, w, sc, yq, e))


@njit(cache=True)
def row8_q6_k(w, yq, yd, ya, t, out, r):
    """As row8_q4_k (``ya``: the tokens' block sums)."""
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    s0, s1, s2, s3 = ya[t], ya[t + 1], ya[t + 2], ya[t + 3]
    s4, s5, s6, s7 = ya[t + 4], ya[t + 5], ya[t + 6], ya[t + 7]
    z = int8.fzero()
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3, i4, i5, i6, i7 = (
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
        )
        for j in range(2):
            e, sc = float_blocks.QK_K * i + 128 * j, o + 192 + 8 * j
            q0, q1, q2, q3 = q6_k_quants(w, o, j)
            i0, i1 = sumi_q6_k(q0, q1, q2, q3, w, sc, y0, e, i0), sumi_q6_k(q0, q1, q2, q3, w, sc, y1, e, i1)
            i2, i3 = sumi_q6_k(q0, q1, q2, q3, w, sc, y2, e, i2), sumi_q6_k(q0, q1, q2, q3, w, sc, y3, e, i3)
            i4, i5 = sumi_q6_k(q0, q1, q2, q3, w, sc, y4, e, i4), sumi_q6_k(q0, q1, q2, q3, w, sc, y5, e, i5)
            i6, i7 = sumi_q6_k(q0, q1, q2, q3, w, sc, y6, e, i6), sumi_q6_k(q0, q1, q2, q3, w, sc, y7, e, i7)
        a0 = close_q6_k(w, o, yd[t, i], s0, i, i0, a0)
        a1 = close_q6_k(w, o, yd[t + 1, i], s1, i, i1, a1)
        a2 = close_q6_k(w, o, yd[t + 2, i], s2, i, i2, a2)
        a3 = close_q6_k(w, o, yd[t + 3, i], s3, i, i3, a3)
        a4 = close_q6_k(w, o, yd[t + 4, i], s4, i, i4, a4)
        a5 = close_q6_k(w, o, yd[t + 5, i], s5, i, i5, a5)
        a6 = close_q6_k(w, o, yd[t + 6, i], s6, i, i6, a6)
        a7 = close_q6_k(w, o, yd[t + 7, i], s7, i, i7, a7)
    inttiles.store4(out, r, t, int8.fsum(a0), int8.fsum(a1), int8.fsum(a2), int8.fsum(a3))
    inttiles.store4(out, r, t + 4, int8.fsum(a4), int8.fsum(a5), int8.fsum(a6), int8.fsum(a7))


@njit(inline="always", cache=True)
def dots_q6_k(acc, q0, q1, q2, q3, w, sc, y, e):
    """One token pair's scaled dot products with half a Q6_K super-block (scales at ``sc``, activations at ``e``)."""
    acc = zmm.scaled_dots2(acc, q0, y, e, np.int8(w[sc]), np.int8(w[sc + 1]))
    acc = zmm.scaled_dots2(acc, q1, y, e + 64, np.int8(w[sc + 2]), np.int8(w[sc + 3]))
    acc = zmm.scaled_dots2(acc, q2, y, e + 128, np.int8(w[sc + 4]), np.int8(w[sc + 5]))
    return zmm.scaled_dots2(acc, q3, y, e + 192, np.int8(w[sc + 6]), np.int8(w[sc + 7]))


@njit(inline="always", cache=True)
def close_pair_q6_k(w, o, i, yd, ya, t, sumi, acc):
    """Tokens ``t`` and ``t + 1``'s super-block step (:func:`close_q6_k` for both, two tokens per vector)."""
    dw = simd.load_f16(w, o + 208)
    sumi = zmm.minus_bsums32(sumi, ya[t], ya[t + 1], 16 * i, w, o + 192)
    return zmm.fma_tokens(yd[t, i] * dw, yd[t + 1, i] * dw, sumi, acc)


@njit(cache=True)
def row16z_q6_k(w, yq2, yd, ya, t, out, r):
    """:func:`row8_q6_k` for 16 tokens on 512-bit vectors (:mod:`.zmm`, two tokens per vector): each half
    super-block unpacked once for 8 vectors; the same integers and float steps, so the same outputs bit for bit."""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    y4, y5, y6, y7 = yq2[p + 4], yq2[p + 5], yq2[p + 6], yq2[p + 7]
    a0, a1, a2, a3, a4, a5, a6, a7 = (
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
        simd.vzero(),
    )
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3 = zmm.izero16(), zmm.izero16(), zmm.izero16(), zmm.izero16()
        i4, i5, i6, i7 = zmm.izero16(), zmm.izero16(), zmm.izero16(), zmm.izero16()
        for j in range(2):
            e, sc = 2 * (float_blocks.QK_K * i + 128 * j), o + 192 + 8 * j
            q0, q1, q2, q3 = zmm.q6_quants_both(w, o, j)
            i0, i1 = dots_q6_k(i0, q0, q1, q2, q3, w, sc, y0, e), dots_q6_k(i1, q0, q1, q2, q3, w, sc, y1, e)
            i2, i3 = dots_q6_k(i2, q0, q1, q2, q3, w, sc, y2, e), dots_q6_k(i3, q0, q1, q2, q3, w, sc, y3, e)
            i4, i5 = dots_q6_k(i4, q0, q1, q2, q3, w, sc, y4, e), dots_q6_k(i5, q0, q1, q2, q3, w, sc, y5, e)
            i6, i7 = dots_q6_k(i6, q0, q1, q2, q3, w, sc, y6, e), dots_q6_k(i7, q0, q1, q2, q3, w, sc, y7, e)
        a0, a1 = close_pair_q6_k(w, o, i, yd, ya, t, i0, a0), close_pair_q6_k(w, o, i, yd, ya, t + 2, i1, a1)
        a2, a3 = close_pair_q6_k(w, o, i, yd, ya, t + 4, i2, a2), close_pair_q6_k(w, o, i, yd, ya, t + 6, i3, a3)
        a4, a5 = close_pair_q6_k(w, o, i, yd, ya, t + 8, i4, a4), close_pair_q6_k(w, o, i, yd, ya, t + 10, i5, a5)
        a6, a7 = close_pair_q6_k(w, o, i, yd, ya, t + 12, i6, a6), close_pair_q6_k(w, o, i, yd, ya, t + 14, i7, a7)
    inttiles.store4(
        out, r, t, zmm.fsum_token(a0, 0), zmm.fsum_token(a0, 1), zmm.fsum_token(a1, 0), zmm.fsum_token(a1, 1)
    )
    inttiles.store4(
        out, r, t + 4, zmm.fsum_token(a2, 0), zmm.fsum_token(a2, 1), zmm.fsum_token(a3, 0), zmm.fsum_token(a3, 1)
    )
    inttiles.store4(
        out, r, t + 8, zmm.fsum_token(a4, 0), zmm.fsum_token(a4, 1), zmm.fsum_token(a5, 0), zmm.fsum_token(a5, 1)
    )
    inttiles.store4(
        out, r, t + 12, zmm.fsum_token(a6, 0), zmm.fsum_token(a6, 1), zmm.fsum_token(a7, 0), zmm.fsum_token(a7, 1)
    )


@njit(cache=True)
def group_q6_k(w, yq, yd, ya, yq2, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 16 tokens by :func:`row16z_q6_k` where ``yq2`` holds the token
    pairs (AVX-512 VNNI), then blocks of 8 by :func:`row8_q6_k`, the rest by 4-token tiles."""
    n_tok = out.shape[0]
    full16 = n_tok - n_tok % 16 if yq2.shape[0] else 0
    for t in range(0, full16, 16):
        for r in range(lo, hi):
            row16z_q6_k(w[r], yq2, yd, ya, t, out, r)
    full = n_tok - n_tok % inttiles.TILE8_TOKENS
    for t in range(full16, full, inttiles.TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q6_k(w[r], yq, yd, ya, t, out, r)
    inttiles.tile_rows(tile_q6_k, w, yq, yd, ya, out, lo, hi, full)


@njit(inline="always", cache=True)
def tiled_loop_q6_k(w, yq, yd, ya, out):
    """Row groups split over threads, each by :func:`group_q6_k`."""
    n = out.shape[1]
    yq2 = inttiles.token_pairs(yq) if zmm.has_zmm_vnni() else np.empty((0, 0), np.uint8)
    for g in prange((n + inttiles.GROUP_ROWS - 1) // inttiles.GROUP_ROWS):
        group_q6_k(
            w, yq, yd, ya, yq2, out, g * inttiles.GROUP_ROWS, min(g * inttiles.GROUP_ROWS + inttiles.GROUP_ROWS, n)
        )


# --- llama.cpp's tiled mat-mul (AVX-512 VNNI, 8 tokens or more: :mod:`..ktiles`) ---------------------------------
@njit(inline="always", cache=True)
def unpack_rows_q6_k(w, r, codes, sc, mn, dd, dm):
    """Rows ``r .. r + 7``: their quants in element order, one a byte (0..63; ggml's ``tiled_unpack_src0``), the
    int8 sub-block scales as int32, ``d`` as float32 (``mn``, ``dm``: Q6_K has no min terms)."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for i in range(dd.shape[1]):
            o, e = 210 * i, 256 * i
            for n in range(2):
                ql, qh, base = o + 64 * n, o + 128 + 32 * n, e + 128 * n
                for l in range(32):
                    a, b, h = row[ql + l], row[ql + 32 + l], row[qh + l]
                    dst[base + l] = (a & 15) | ((h & 3) << 4)
                    dst[base + 32 + l] = (b & 15) | (((h >> 2) & 3) << 4)
                    dst[base + 64 + l] = (a >> 4) | (((h >> 4) & 3) << 4)
                    dst[base + 96 + l] = (b >> 4) | ((h >> 6) << 4)
            for s in range(16):
                sc[j, 16 * i + s] = np.int32(np.int8(row[o + 192 + s]))
            dd[j, i] = simd.load_f16(row, o + 208)
            dm[j, i] = _F32(0.0)
