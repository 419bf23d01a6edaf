"""Q4_0: the tensor type's Numba kernels, all in this file.

Layout (ggml-common.h; byte offsets):
Q4_0 (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d * (lo(qs[j]) - 8)``, ``w[j+16] = d * (hi(qs[j]) -
8)``.

Kernels: the float mat-vec (``matvec_float_q4_0(w, xv, xs, out)``: the activation in float32, ``xs`` its block sums)
and ggml's dequantization (``dequant_q4_0``); the integer-dot mat-vec (``matvec_int_q4_0(w, yq, yd, ya, out)``: the
activation quantized once per token, libggml's x86 ``vec_dot`` bit for bit; ``token_q4_0`` quantizes and multiplies
in one call), and the register-tiled kernel for several tokens (``tiled_q4_0``, the same outputs). :data:`KERNELS`
is the type's entry in the kernel table (:data:`..types.KERNELS`).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels.float_blocks import nibble_dot
from inference_engine.backends.numba_kernels.inttiles import GROUP_ROWS, TILE_TOKENS, step_offset, store_tile
from inference_engine.backends.numba_kernels.isa.int8 import (
    dot4,
    fma_int,
    fsum,
    fzero,
    iload,
    ishl,
    isub,
    load32,
    nibbles32,
)
from inference_engine.backends.numba_kernels.isa.simd import (
    band,
    bload,
    bshr,
    bto_f32,
    load_f16,
    prefetch,
    rows_ahead,
    vfma,
    vload,
    vmul,
    vsplat,
    vstore,
    vsub,
    vsum,
    vzero,
)
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_0_sum4

_F32 = np.float32


# --- float mat-vec and dequantization (from q4.py) ------------------------------------------------------------------
@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q4_0(w, xv, xs, out):
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


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def pair_q4_0(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    for b in range(nb):
        o = 18 * b
        prefetch(p0, o)
        prefetch(p1, o)
        y, y8 = load32(yq, 32 * b), ishl(iload(ya, 8 * b), 3)
        s0 = isub(dot4(nibbles32(w0, o + 2), y), y8)
        s1 = isub(dot4(nibbles32(w1, o + 2), y), y8)
        a0 = fma_int(load_f16(w0, o) * yd[b], s0, a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], s1, a1)
    return fsum(a0), fsum(a1)


@njit(parallel=True, cache=True)
def matvec_int_q4_0(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q4_0(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)


@njit(cache=True)
def token_q4_0(w, x, out):
    yq, yd, ya = row_q8_0_sum4(x)
    matvec_int_q4_0(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for b in range(d0.shape[0]):
        o = 18 * b
        x0, x1 = nibbles32(w0, o + 2), nibbles32(w1, o + 2)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_offset(x0, x1, f0, f1, y0, d0, s0, b, 3, a00, a10)
        a01, a11 = step_offset(x0, x1, f0, f1, y1, d1, s1, b, 3, a01, a11)
        a02, a12 = step_offset(x0, x1, f0, f1, y2, d2, s2, b, 3, a02, a12)
        a03, a13 = step_offset(x0, x1, f0, f1, y3, d3, s3, b, 3, a03, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


@njit(parallel=True, cache=True)
def tiled_q4_0(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q4_0(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


QTYPE = T.Q4_0
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q4_0, dequant_q4_0, "q8_0", 32, matvec_int_q4_0, "q8_0_sum4", tiled_q4_0, token_q4_0)
