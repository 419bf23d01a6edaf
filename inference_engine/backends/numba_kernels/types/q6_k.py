"""Q6_K: the tensor type's Numba kernels, all in this file.

Layout (ggml-common.h; byte offsets):
Q6_K (210 bytes, 256 weights): ``ql[128] @0 | qh[64] @128 | scales[16] int8 @192 | d @208``;
``e = 128n + l + 32t`` (t = 0..3): ``u = nibble of ql[64n + l + 32(t & 1)]`` (lo for t < 2) ``| ((qh[32n + l] >> 2t)
& 3) << 4``,
sub-block ``8n + l//16 + 2t``; ``w = d*sc*(u - 32)``.

Kernels: the float mat-vec (``matvec_float_q6_k(w, xv, xs, out)``: the activation in float32, ``xs`` its block sums)
and ggml's dequantization (``dequant_q6_k``); the integer-dot mat-vec (``matvec_int_q6_k(w, yq, yd, ya, out)``: the
activation quantized once per token, libggml's x86 ``vec_dot`` bit for bit; ``token_q6_k`` quantizes and multiplies
in one call), and the register-tiled kernel for several tokens (``tiled_q6_k``, the same outputs). :data:`KERNELS`
is the type's entry in the kernel table (:data:`..types.KERNELS`).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.float_blocks import QK_K, prefetch_lines
from inference_engine.backends.numba_kernels.intdot import prefetch_span
from inference_engine.backends.numba_kernels.inttiles import (
    GROUP_ROWS,
    TILE8_TOKENS,
    TILE_TOKENS,
    store4,
    store_tile,
    token_pairs,
)
from inference_engine.backends.numba_kernels.isa.int8 import (
    band8,
    bor8,
    bshl8,
    bshr8,
    dot4_scaled,
    fma_int,
    fsum,
    fzero,
    iadd,
    ishl,
    isub,
    izero,
    load32,
    madd16,
)
from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
    bor,
    bshl,
    bshr,
    bto_f32,
    bto_f32_signed,
    load_f16,
    rows_ahead,
    vfma,
    vlane,
    vload,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum,
    vzero,
)
from inference_engine.backends.numba_kernels.isa.zmm import (
    fma_tokens,
    fsum_token,
    has_zmm_vnni,
    izero16,
    minus_bsums32,
    q6_quants_both,
    scaled_dots2,
)
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_K

_F32 = np.float32


# --- float mat-vec and dequantization (from k_quants.py) ------------------------------------------------------------
@njit(inline="always", cache=True)
def q6_k_quants_float(row, o, n, h):
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
            u0, u1, u2, u3 = q6_k_quants_float(row, o, n, h)
            k = 8 * n + h
            e = x0 + 128 * n + 16 * h
            acc = vfma(vlane(scales, k), vmul(u0, vload(xv, e)), acc)
            acc = vfma(vlane(scales, k + 2), vmul(u1, vload(xv, e + 32)), acc)
            acc = vfma(vlane(scales, k + 4), vmul(u2, vload(xv, e + 64)), acc)
            acc = vfma(vlane(scales, k + 6), vmul(u3, vload(xv, e + 96)), acc)
    return acc, c


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q6_k(w, xv, xs, out):
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
                    u0, u1, u2, u3 = q6_k_quants_float(row, o, n, h)
                    k = 8 * n + h
                    e = y + 128 * n + 16 * h
                    vstore(dst, e, vmul(vsplat(d * _F32(np.int8(row[o + 192 + k]))), vsub(u0, thirty_two)))
                    vstore(dst, e + 32, vmul(vsplat(d * _F32(np.int8(row[o + 194 + k]))), vsub(u1, thirty_two)))
                    vstore(dst, e + 64, vmul(vsplat(d * _F32(np.int8(row[o + 196 + k]))), vsub(u2, thirty_two)))
                    vstore(dst, e + 96, vmul(vsplat(d * _F32(np.int8(row[o + 198 + k]))), vsub(u3, thirty_two)))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def q6_k_sumi(row, o, yq, e, ys, i):
    sumi = izero()
    for j in range(2):
        ql0, ql1 = load32(row, o + 64 * j), load32(row, o + 64 * j + 32)
        qh = load32(row, o + 128 + 32 * j)
        q0 = bor8(band8(ql0, 15), bshl8(band8(qh, 3), 4))
        q1 = bor8(band8(ql1, 15), bshl8(band8(bshr8(qh, 2), 3), 4))
        q2 = bor8(bshr8(ql0, 4), bshl8(band8(bshr8(qh, 4), 3), 4))
        q3 = bor8(bshr8(ql1, 4), bshl8(bshr8(qh, 6), 4))
        sc = o + 192 + 8 * j
        y = e + 128 * j
        p0 = dot4_scaled(q0, load32(yq, y), np.int8(row[sc]), np.int8(row[sc + 1]))
        p1 = dot4_scaled(q1, load32(yq, y + 32), np.int8(row[sc + 2]), np.int8(row[sc + 3]))
        p2 = dot4_scaled(q2, load32(yq, y + 64), np.int8(row[sc + 4]), np.int8(row[sc + 5]))
        p3 = dot4_scaled(q3, load32(yq, y + 96), np.int8(row[sc + 6]), np.int8(row[sc + 7]))
        sumi = iadd(sumi, iadd(p0, p1))
        sumi = iadd(sumi, iadd(p2, p3))
    return isub(sumi, ishl(madd16(ys, 16 * i, row, o + 192), 5))


@njit(inline="always", cache=True)
def row_dot_q6_k(w0, p0, yq, yd, ya):
    """One Q6_K row."""
    a0 = fzero()
    for i in range(yd.shape[0]):
        o = 210 * i
        prefetch_span(p0, o, 210)
        a0 = fma_int(yd[i] * load_f16(w0, o + 208), q6_k_sumi(w0, o, yq, QK_K * i, ya, i), a0)
    return fsum(a0)


@njit(parallel=True, cache=True)
def matvec_int_q6_k(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):  # one row at a time, as matvec_int_q8_0
        out[r] = row_dot_q6_k(w[r], w[min(r + ahead, n - 1)], yq, yd, ya)


@njit(cache=True)
def token_q6_k(w, x, out):
    yq, yd, ya = row_q8_K(x)
    matvec_int_q6_k(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(inline="always", cache=True)
def q6_k_quants(row, o, j):
    """The four 32-quant vectors of half ``j`` of a Q6_K super-block (as q6_k_sumi unpacks them)."""
    ql0, ql1 = load32(row, o + 64 * j), load32(row, o + 64 * j + 32)
    qh = load32(row, o + 128 + 32 * j)
    q0 = bor8(band8(ql0, 15), bshl8(band8(qh, 3), 4))
    q1 = bor8(band8(ql1, 15), bshl8(band8(bshr8(qh, 2), 3), 4))
    q2 = bor8(bshr8(ql0, 4), bshl8(band8(bshr8(qh, 4), 3), 4))
    q3 = bor8(bshr8(ql1, 4), bshl8(bshr8(qh, 6), 4))
    return q0, q1, q2, q3


@njit(inline="always", cache=True)
def dot_q6_k(q0, q1, q2, q3, row, sc, yq, y):
    p0 = dot4_scaled(q0, load32(yq, y), np.int8(row[sc]), np.int8(row[sc + 1]))
    p1 = dot4_scaled(q1, load32(yq, y + 32), np.int8(row[sc + 2]), np.int8(row[sc + 3]))
    p2 = dot4_scaled(q2, load32(yq, y + 64), np.int8(row[sc + 4]), np.int8(row[sc + 5]))
    p3 = dot4_scaled(q3, load32(yq, y + 96), np.int8(row[sc + 6]), np.int8(row[sc + 7]))
    return iadd(iadd(p0, p1), iadd(p2, p3))


@njit(inline="always", cache=True)
def close_q6_k(row, o, ydi, ys, i, sumi, acc):
    return fma_int(ydi * load_f16(row, o + 208), isub(sumi, ishl(madd16(ys, 16 * i, row, o + 192), 5)), acc)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q6_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for i in range(d0.shape[0]):
        o = 210 * i
        i00, i01, i02, i03 = izero(), izero(), izero(), izero()
        i10, i11, i12, i13 = izero(), izero(), izero(), izero()
        for j in range(2):
            e, sc = QK_K * i + 128 * j, o + 192 + 8 * j
            q00, q01, q02, q03 = q6_k_quants(w0, o, j)
            q10, q11, q12, q13 = q6_k_quants(w1, o, j)
            i00 = iadd(i00, dot_q6_k(q00, q01, q02, q03, w0, sc, y0, e))
            i01 = iadd(i01, dot_q6_k(q00, q01, q02, q03, w0, sc, y1, e))
            i02 = iadd(i02, dot_q6_k(q00, q01, q02, q03, w0, sc, y2, e))
            i03 = iadd(i03, dot_q6_k(q00, q01, q02, q03, w0, sc, y3, e))
            i10 = iadd(i10, dot_q6_k(q10, q11, q12, q13, w1, sc, y0, e))
            i11 = iadd(i11, dot_q6_k(q10, q11, q12, q13, w1, sc, y1, e))
            i12 = iadd(i12, dot_q6_k(q10, q11, q12, q13, w1, sc, y2, e))
            i13 = iadd(i13, dot_q6_k(q10, q11, q12, q13, w1, sc, y3, e))
        a00 = close_q6_k(w0, o, d0[i], s0, i, i00, a00)
        a01 = close_q6_k(w0, o, d1[i], s1, i, i01, a01)
        a02 = close_q6_k(w0, o, d2[i], s2, i, i02, a02)
        a03 = close_q6_k(w0, o, d3[i], s3, i, i03, a03)
        a10 = close_q6_k(w1, o, d0[i], s0, i, i10, a10)
        a11 = close_q6_k(w1, o, d1[i], s1, i, i11, a11)
        a12 = close_q6_k(w1, o, d2[i], s2, i, i12, a12)
        a13 = close_q6_k(w1, o, d3[i], s3, i, i13, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


@njit(inline="always", cache=True)
def sumi_q6_k(q0, q1, q2, q3, w, sc, yq, e, acc):
    return iadd(acc, dot_q6_k(q0, q1, q2, q3, w, sc, yq, e))


@njit(cache=True)
def row8_q6_k(w, yq, yd, ya, t, out, r):
    """As row8_q4_k (``ya``: the tokens' block sums)."""
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    s0, s1, s2, s3 = ya[t], ya[t + 1], ya[t + 2], ya[t + 3]
    s4, s5, s6, s7 = ya[t + 4], ya[t + 5], ya[t + 6], ya[t + 7]
    z = fzero()
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3, i4, i5, i6, i7 = izero(), izero(), izero(), izero(), izero(), izero(), izero(), izero()
        for j in range(2):
            e, sc = QK_K * i + 128 * j, o + 192 + 8 * j
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
    store4(out, r, t, fsum(a0), fsum(a1), fsum(a2), fsum(a3))
    store4(out, r, t + 4, fsum(a4), fsum(a5), fsum(a6), fsum(a7))


@njit(inline="always", cache=True)
def dots_q6_k(acc, q0, q1, q2, q3, w, sc, y, e):
    """One token pair's scaled dot products with half a Q6_K super-block (scales at ``sc``, activations at ``e``)."""
    acc = scaled_dots2(acc, q0, y, e, np.int8(w[sc]), np.int8(w[sc + 1]))
    acc = scaled_dots2(acc, q1, y, e + 64, np.int8(w[sc + 2]), np.int8(w[sc + 3]))
    acc = scaled_dots2(acc, q2, y, e + 128, np.int8(w[sc + 4]), np.int8(w[sc + 5]))
    return scaled_dots2(acc, q3, y, e + 192, np.int8(w[sc + 6]), np.int8(w[sc + 7]))


@njit(inline="always", cache=True)
def close_pair_q6_k(w, o, i, yd, ya, t, sumi, acc):
    """Tokens ``t`` and ``t + 1``'s super-block step (:func:`close_q6_k` for both, two tokens per vector)."""
    dw = load_f16(w, o + 208)
    sumi = minus_bsums32(sumi, ya[t], ya[t + 1], 16 * i, w, o + 192)
    return fma_tokens(yd[t, i] * dw, yd[t + 1, i] * dw, sumi, acc)


@njit(cache=True)
def row16z_q6_k(w, yq2, yd, ya, t, out, r):
    """:func:`row8_q6_k` for 16 tokens on 512-bit vectors (:mod:`.zmm`, two tokens per vector): each half
    super-block unpacked once for 8 vectors; the same integers and float steps, so the same outputs bit for bit."""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    y4, y5, y6, y7 = yq2[p + 4], yq2[p + 5], yq2[p + 6], yq2[p + 7]
    a0, a1, a2, a3, a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero()
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3 = izero16(), izero16(), izero16(), izero16()
        i4, i5, i6, i7 = izero16(), izero16(), izero16(), izero16()
        for j in range(2):
            e, sc = 2 * (QK_K * i + 128 * j), o + 192 + 8 * j
            q0, q1, q2, q3 = q6_quants_both(w, o, j)
            i0, i1 = dots_q6_k(i0, q0, q1, q2, q3, w, sc, y0, e), dots_q6_k(i1, q0, q1, q2, q3, w, sc, y1, e)
            i2, i3 = dots_q6_k(i2, q0, q1, q2, q3, w, sc, y2, e), dots_q6_k(i3, q0, q1, q2, q3, w, sc, y3, e)
            i4, i5 = dots_q6_k(i4, q0, q1, q2, q3, w, sc, y4, e), dots_q6_k(i5, q0, q1, q2, q3, w, sc, y5, e)
            i6, i7 = dots_q6_k(i6, q0, q1, q2, q3, w, sc, y6, e), dots_q6_k(i7, q0, q1, q2, q3, w, sc, y7, e)
        a0, a1 = close_pair_q6_k(w, o, i, yd, ya, t, i0, a0), close_pair_q6_k(w, o, i, yd, ya, t + 2, i1, a1)
        a2, a3 = close_pair_q6_k(w, o, i, yd, ya, t + 4, i2, a2), close_pair_q6_k(w, o, i, yd, ya, t + 6, i3, a3)
        a4, a5 = close_pair_q6_k(w, o, i, yd, ya, t + 8, i4, a4), close_pair_q6_k(w, o, i, yd, ya, t + 10, i5, a5)
        a6, a7 = close_pair_q6_k(w, o, i, yd, ya, t + 12, i6, a6), close_pair_q6_k(w, o, i, yd, ya, t + 14, i7, a7)
    store4(out, r, t, fsum_token(a0, 0), fsum_token(a0, 1), fsum_token(a1, 0), fsum_token(a1, 1))
    store4(out, r, t + 4, fsum_token(a2, 0), fsum_token(a2, 1), fsum_token(a3, 0), fsum_token(a3, 1))
    store4(out, r, t + 8, fsum_token(a4, 0), fsum_token(a4, 1), fsum_token(a5, 0), fsum_token(a5, 1))
    store4(out, r, t + 12, fsum_token(a6, 0), fsum_token(a6, 1), fsum_token(a7, 0), fsum_token(a7, 1))


@njit(cache=True)
def group_q6_k(w, yq, yd, ya, yq2, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 16 tokens by :func:`row16z_q6_k` where ``yq2`` holds the token
    pairs (AVX-512 VNNI), then blocks of 8 by :func:`row8_q6_k`, the rest by 4-token tiles."""
    n_tok, n = out.shape
    full16 = n_tok - n_tok % 16 if yq2.shape[0] else 0
    for t in range(0, full16, 16):
        for r in range(lo, hi):
            row16z_q6_k(w[r], yq2, yd, ya, t, out, r)
    full = n_tok - n_tok % TILE8_TOKENS
    for t in range(full16, full, TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q6_k(w[r], yq, yd, ya, t, out, r)
    for t in range(full, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile_q6_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q6_k(w, yq, yd, ya, out):
    n = out.shape[1]
    yq2 = token_pairs(yq) if has_zmm_vnni() else np.empty((0, 0), np.uint8)
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        group_q6_k(w, yq, yd, ya, yq2, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n))


QTYPE = T.Q6_K
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q6_k, dequant_q6_k, "q8_K", 16, matvec_int_q6_k, "q8_K", tiled_q6_k, token_q6_k)
