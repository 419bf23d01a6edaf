"""Q5_K: the tensor type's Numba kernels, all in this file.

Layout (ggml-common.h; byte offsets):
Q5_K (176 bytes, 256 weights): ``d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48``: as Q4_K plus a fifth
bit,
bit ``2j`` (low half) / ``2j + 1`` (high half) of ``qh[l]``.

Kernels: the float mat-vec (``matvec_float_q5_k(w, xv, xs, out)``: the activation in float32, ``xs`` its block sums)
and ggml's dequantization (``dequant_q5_k``); the integer-dot mat-vec (``matvec_int_q5_k(w, yq, yd, ya, out)``: the
activation quantized once per token, libggml's x86 ``vec_dot`` bit for bit; ``token_q5_k`` quantizes and multiplies
in one call), and the register-tiled kernel for several tokens (``tiled_q5_k``, the same outputs). :data:`KERNELS`
is the type's entry in the kernel table (:data:`..types.KERNELS`).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.float_blocks import QK_K, k4_scales_mins, prefetch_lines, scale_min_k4
from inference_engine.backends.numba_kernels.intdot import (
    bsum_pairs,
    bsum_pairs_into,
    byte,
    k4_scales,
    prefetch_span,
)
from inference_engine.backends.numba_kernels.inttiles import (
    GROUP_ROWS,
    TILE8_TOKENS,
    TILE_TOKENS,
    close_min,
    dot_pair,
    store4,
    store_tile,
    sub_scales,
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
    ihsum,
    izero,
    kmin_pairs,
    load32,
)
from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
    bor,
    bshl,
    bshr,
    bto_f32,
    fma32,
    load_f16,
    rows_ahead,
    vfma,
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
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_K

_F32 = np.float32


# --- float mat-vec and dequantization (from k_quants.py) ------------------------------------------------------------
@njit(inline="always", cache=True)
def q5_k_quants_float(row, o, j):
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
        u0, u1, u2, u3 = q5_k_quants_float(row, o, j)
        e = x0 + 64 * j
        lo = vfma(u1, vload(xv, e + 16), vmul(u0, vload(xv, e)))
        hi = vfma(u3, vload(xv, e + 48), vmul(u2, vload(xv, e + 32)))
        acc = vfma(vlane(sm, 2 * j), lo, acc)
        acc = vfma(vlane(sm, 2 * j + 1), hi, acc)
    return acc, c


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q5_k(w, xv, xs, out):
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
                u0, u1, u2, u3 = q5_k_quants_float(row, o, j)
                e = y + 64 * j
                vstore(dst, e, vsub(vmul(d1, u0), m1))
                vstore(dst, e + 16, vsub(vmul(d1, u1), m1))
                vstore(dst, e + 32, vsub(vmul(d2, u2), m2))
                vstore(dst, e + 48, vsub(vmul(d2, u3), m2))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def q5_k_sumi(row, o, yq, e, t0, t1):
    sumi = izero()
    hbits = load32(row, o + 16)
    for j in range(4):
        q = load32(row, o + 48 + 32 * j)
        word = t0 if j < 2 else t1
        sl, sh = byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)
        h = bshr8(hbits, 2 * j)
        q0 = bor8(band8(q, 15), bshl8(band8(h, 1), 4))
        q1 = bor8(band8(bshr8(q, 4), 15), bshl8(band8(bshr8(h, 1), 1), 4))
        lo = dot4_scaled(q0, load32(yq, e + 64 * j), sl, sl)
        hi = dot4_scaled(q1, load32(yq, e + 64 * j + 32), sh, sh)
        sumi = iadd(sumi, iadd(lo, hi))
    return sumi


@njit(inline="always", cache=True)
def row_dot_q5_k(w0, p0, yq, yd, ys):
    """One Q5_K row. ``ys``: the activation's bsum pairs; the min terms as in :func:`row_dot_q4_k`, summed in
    integers (ggml's Q5_K adds them before the one float multiply-add)."""
    a0, c0 = fzero(), _F32(0.0)
    for i in range(yd.shape[0]):
        o = 176 * i
        prefetch_span(p0, o, 176)
        t00, t01, t02, t03 = k4_scales(w0, o + 4)
        c0 = fma32(-yd[i] * load_f16(w0, o + 2), _F32(ihsum(kmin_pairs(ys, 8 * i, t02, t03))), c0)
        a0 = fma_int(yd[i] * load_f16(w0, o), q5_k_sumi(w0, o, yq, QK_K * i, t00, t01), a0)
    return fsum(a0) + c0


@njit(parallel=True, cache=True)
def matvec_int_q5_k(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    ys = np.empty(ya.shape[0] // 2, np.int16)
    bsum_pairs_into(ya, ys)
    for r in prange(n):  # one row at a time, as matvec_int_q8_0
        out[r] = row_dot_q5_k(w[r], w[min(r + ahead, n - 1)], yq, yd, ys)


@njit(cache=True)
def token_q5_k(w, x, out):
    yq, yd, ya = row_q8_K(x)
    matvec_int_q5_k(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(inline="always", cache=True)
def q5_k_quants(row, o, j):
    hbits = load32(row, o + 16)
    q = load32(row, o + 48 + 32 * j)
    h = bshr8(hbits, 2 * j)
    q0 = bor8(band8(q, 15), bshl8(band8(h, 1), 4))
    q1 = bor8(band8(bshr8(q, 4), 15), bshl8(band8(bshr8(h, 1), 1), 4))
    return q0, q1


@njit(inline="always", cache=True)
def close_q5_k(row, o, ydi, ys, i, t_mlo, t_mhi, sumi, st):
    """row_dot_q5_k's per-super-block float steps for one output; state (acc, c)."""
    dmin = -ydi * load_f16(row, o + 2)
    mins = _F32(ihsum(kmin_pairs(ys, 8 * i, t_mlo, t_mhi)))
    return fma_int(ydi * load_f16(row, o), sumi, st[0]), fma32(dmin, mins, st[1])


@njit(inline="always", cache=True)
def row_q5_k(row, o, e, y0, y1, y2, y3, u_lo, u_hi):
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for j in range(4):
        lo, hi = q5_k_quants(row, o, j)
        sl, sh = sub_scales(u_lo, u_hi, j)
        ej = e + 64 * j
        i0, i1 = iadd(i0, dot_pair(lo, hi, y0, ej, sl, sh)), iadd(i1, dot_pair(lo, hi, y1, ej, sl, sh))
        i2, i3 = iadd(i2, dot_pair(lo, hi, y2, ej, sl, sh)), iadd(i3, dot_pair(lo, hi, y3, ej, sl, sh))
    return i0, i1, i2, i3


@njit(inline="always", cache=True)
def row_tile_q5_k(w, yq, yd, ya, t0, t1, t2, t3):
    """As row_tile_q4_k."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a0, a1, a2, a3 = (fzero(), _F32(0.0)), (fzero(), _F32(0.0)), (fzero(), _F32(0.0)), (fzero(), _F32(0.0))
    for i in range(d0.shape[0]):
        o = 176 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q5_k(w, o, QK_K * i, y0, y1, y2, y3, u0, u1)
        a0 = close_q5_k(w, o, d0[i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, d1[i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, d2[i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, d3[i], s3, i, u2, u3, i3, a3)
    return close_min(a0), close_min(a1), close_min(a2), close_min(a3)


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
    z = (fzero(), _F32(0.0))
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 176 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q5_k(w, o, QK_K * i, y0, y1, y2, y3, u0, u1)
        i4, i5, i6, i7 = row_q5_k(w, o, QK_K * i, y4, y5, y6, y7, u0, u1)
        a0 = close_q5_k(w, o, yd[t, i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, yd[t + 1, i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, yd[t + 2, i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, yd[t + 3, i], s3, i, u2, u3, i3, a3)
        a4 = close_q5_k(w, o, yd[t + 4, i], s4, i, u2, u3, i4, a4)
        a5 = close_q5_k(w, o, yd[t + 5, i], s5, i, u2, u3, i5, a5)
        a6 = close_q5_k(w, o, yd[t + 6, i], s6, i, u2, u3, i6, a6)
        a7 = close_q5_k(w, o, yd[t + 7, i], s7, i, u2, u3, i7, a7)
    store4(out, r, t, close_min(a0), close_min(a1), close_min(a2), close_min(a3))
    store4(out, r, t + 4, close_min(a4), close_min(a5), close_min(a6), close_min(a7))


@njit(cache=True)
def group_q5_k(w, yq, yd, ya, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 8 tokens by :func:`row8_q5_k`, the rest by 4-token tiles."""
    n_tok, n = out.shape
    full = n_tok - n_tok % TILE8_TOKENS
    for t in range(0, full, TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q5_k(w[r], yq, yd, ya, t, out, r)
    for t in range(full, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile_q5_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q5_k(w, yq, yd, ya, out):
    n = out.shape[1]
    ya = bsum_pairs(ya)
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        group_q5_k(w, yq, yd, ya, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n))


QTYPE = T.Q5_K
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q5_k, dequant_q5_k, "q8_K", 32, matvec_int_q5_k, "q8_K", tiled_q5_k, token_q5_k)
