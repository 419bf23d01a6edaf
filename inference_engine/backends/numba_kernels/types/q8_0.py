"""Q8_0: the tensor type's Numba kernels, all in this file.

Layout (ggml-common.h; byte offsets):
Q8_0 (34 bytes, 32 weights): ``| d f16 | qs[32] int8 |``; ``w[j] = d * qs[j]``. The type of the big tied output /
embedding matrices.

Kernels: the float mat-vec (``matvec_float_q8_0(w, xv, xs, out)``: the activation in float32, ``xs`` its block sums)
and ggml's dequantization (``dequant_q8_0``); the integer-dot mat-vec (``matvec_int_q8_0(w, yq, yd, ya, out)``: the
activation quantized once per token, libggml's x86 ``vec_dot`` bit for bit; ``token_q8_0`` quantizes and multiplies
in one call), and the register-tiled kernel for several tokens (``tiled_q8_0``, the same outputs). :data:`KERNELS`
is the type's entry in the kernel table (:data:`..types.KERNELS`).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.intdot import prefetch_span
from inference_engine.backends.numba_kernels.inttiles import GROUP_ROWS, TILE_TOKENS, store_tile
from inference_engine.backends.numba_kernels.isa.int8 import dot4_signed, fma_int, fsum, fzero, load32
from inference_engine.backends.numba_kernels.isa.simd import (
    bload,
    bto_f32_signed,
    load_f16,
    prefetch,
    rows_ahead,
    vfma,
    vload,
    vmul,
    vsplat,
    vstore,
    vsum,
    vzero,
)
from inference_engine.backends.numba_kernels.isa.zmm import (
    ROWS,
    f16_quad,
    fma_lanes,
    has_zmm_vnni,
    row_scales,
    signed_dots,
    store_rows,
)
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_0


# --- float mat-vec and dequantization (from q8_0.py) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def int8_dot(row, off, xl, xh):
    """16 lanes of ``qs[j] * x[j] + qs[j+16] * x[j+16]`` for the 32 int8 quants at ``row[off:off+32]``."""
    return vfma(bto_f32_signed(bload(row, off + 16)), xh, vmul(bto_f32_signed(bload(row, off)), xl))


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q8_0(w, xv, xs, out):
    n, nb = out.shape[0], xv.shape[0] // 32
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = vzero(), vzero()
        for b in range(nb):
            o = 34 * b
            prefetch(p0, o)
            prefetch(p1, o)
            xl, xh = vload(xv, 32 * b), vload(xv, 32 * b + 16)
            a0 = vfma(vsplat(load_f16(w0, o)), int8_dot(w0, o + 2, xl, xh), a0)
            a1 = vfma(vsplat(load_f16(w1, o)), int8_dot(w1, o + 2, xl, xh), a1)
        out[r0] = vsum(a0)
        out[r1] = vsum(a1)


@njit(parallel=True, cache=True)
def dequant_q8_0(w, row0, out):
    """``out[i] = dequantize_row_q8_0(w[row0 + i])``: ``qs * d``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 34 * b
            d = vsplat(load_f16(row, o))
            vstore(dst, 32 * b, vmul(bto_f32_signed(bload(row, o + 2)), d))
            vstore(dst, 32 * b + 16, vmul(bto_f32_signed(bload(row, o + 18)), d))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def quad_q8_0(w0, w1, w2, w3, p0, yq, yd, corr):
    """Four Q8_0 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums (``p0`` as in
    :func:`quad_q4_1`: 136 bytes a block)."""
    lo, hi = vzero(), vzero()
    for b in range(yd.shape[0]):
        o = 34 * b
        prefetch_span(p0, 136 * b, 136)
        d = row_scales(f16_quad(w0, w1, w2, w3, o), yd[b])
        qlo, qhi = signed_dots(w0, w1, w2, w3, o + 2, yq, 32 * b, corr, 8 * b)
        lo = fma_lanes(d, qlo, lo)
        hi = fma_lanes(d, qhi, hi)
    return lo, hi


@njit(cache=True)
def q8_corrections(yq):
    """``-128 * sum4(y)`` per int32 lane of the Q8_0 activation ``yq`` (:func:`.zmm.signed_dots`' start values)."""
    corr = np.empty(yq.shape[0] // 4, np.int32)
    y = yq.view(np.int8)
    for i in range(corr.shape[0]):
        s = np.int32(y[4 * i]) + np.int32(y[4 * i + 1]) + np.int32(y[4 * i + 2]) + np.int32(y[4 * i + 3])
        corr[i] = -128 * s
    return corr


@njit(inline="always", cache=True)
def row_dot_q8_0(w0, p0, yq, yd):
    """One Q8_0 row."""
    a0 = fzero()
    for b in range(yd.shape[0]):
        o = 34 * b
        prefetch(p0, o)
        a0 = fma_int(load_f16(w0, o) * yd[b], dot4_signed(load32(w0, o + 2), load32(yq, 32 * b)), a0)
    return fsum(a0)


@njit(parallel=True, cache=True)
def matvec_int_q8_0(w, yq, yd, ya, out):
    # One row at a time, not a pair (here and in the K-quants' mat-vecs): each thread then reads its rows' bytes in
    # strictly ascending order, which the hardware prefetchers follow better than two interleaved rows. Measured on
    # matrices larger than the L3, 2 threads, 8 alternating runs (AVX2 EPYC), median GB/s of weight bytes, pairs ->
    # one row (a loop that only reads the bytes): Q8_0 178 MB (Gemma 3's output) 14.2 -> 18.0-18.5 (17.3); Q4_K
    # 35 MB 14.8 -> 17.3 (17.1); Q6_K 52 MB 14.4 -> 20.7 (18.4); Q5_K 8960x1536 x 10 matrices 15.1 -> 17.7. Q4_0, Q4_1
    # and Q5_0 gained nothing (Q4_1 53 MB 10.5 vs 10.7: their arithmetic limits them), so they keep their pairs.
    n = out.shape[0]
    if has_zmm_vnni() and n >= ROWS:
        corr = q8_corrections(yq)
        ahead = rows_ahead(w)
        for g in prange((n + ROWS - 1) // ROWS):
            r = min(ROWS * g, n - ROWS)
            p = w[min(r + ahead, n - ROWS)]
            lo, hi = quad_q8_0(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, corr)
            store_rows(out, r, lo, hi)
        return
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_q8_0(w[r], w[min(r + ahead, n - 1)], yq, yd)


@njit(cache=True)
def token_q8_0(w, x, out):
    yq, yd, ya = row_q8_0(x)
    matvec_int_q8_0(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(inline="always", cache=True)
def step_q8_0(x0, x1, f0, f1, yq, yd, b, a0, a1):
    y = load32(yq, 32 * b)
    return fma_int(f0 * yd[b], dot4_signed(x0, y), a0), fma_int(f1 * yd[b], dot4_signed(x1, y), a1)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q8_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for b in range(d0.shape[0]):
        o = 34 * b
        x0, x1 = load32(w0, o + 2), load32(w1, o + 2)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_q8_0(x0, x1, f0, f1, y0, d0, b, a00, a10)
        a01, a11 = step_q8_0(x0, x1, f0, f1, y1, d1, b, a01, a11)
        a02, a12 = step_q8_0(x0, x1, f0, f1, y2, d2, b, a02, a12)
        a03, a13 = step_q8_0(x0, x1, f0, f1, y3, d3, b, a03, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


@njit(parallel=True, cache=True)
def tiled_q8_0(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q8_0(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


QTYPE = T.Q8_0
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q8_0, dequant_q8_0, "q8_0", 0, matvec_int_q8_0, "q8_0", tiled_q8_0, token_q8_0)
