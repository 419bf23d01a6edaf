"""Q8_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q8_0 (34 bytes, 32 weights): ``| d f16 | qs[32] int8 |``; ``w[j] = d * qs[j]``. The type of the big tied output /
embedding matrices.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import intdot, inttiles, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm


# --- float mat-vec and dequantization (from q8_0.py) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def int8_dot(row, off, xl, xh):
    """16 lanes of ``qs[j] * x[j] + qs[j+16] * x[j+16]`` for the 32 int8 quants at ``row[off:off+32]``."""
    return simd.vfma(
        simd.bto_f32_signed(simd.bload(row, off + 16)), xh, simd.vmul(simd.bto_f32_signed(simd.bload(row, off)), xl)
    )


@njit(inline="always", cache=True)
def matvec_float_loop_q8_0(w, xv, xs, out):
    """:func:`.float_blocks.pairs_matvec_float` without a constant term (Q8_0 has none, and no ``xs``)."""
    n, nb = out.shape[0], xv.shape[0] // 32
    ahead = simd.rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        w0, w1 = w[r0], w[r1]
        p0, p1 = w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)]
        a0, a1 = simd.vzero(), simd.vzero()
        for b in range(nb):
            o = 34 * b
            simd.prefetch(p0, o)
            simd.prefetch(p1, o)
            xl, xh = simd.vload(xv, 32 * b), simd.vload(xv, 32 * b + 16)
            a0 = simd.vfma(simd.vsplat(simd.load_f16(w0, o)), int8_dot(w0, o + 2, xl, xh), a0)
            a1 = simd.vfma(simd.vsplat(simd.load_f16(w1, o)), int8_dot(w1, o + 2, xl, xh), a1)
        out[r0] = simd.vsum(a0)
        out[r1] = simd.vsum(a1)


@njit(inline="always", cache=True)
def unpack_q8_0(row, o):
    """The 32 signed quants of the block at byte ``o`` as two F32x16 (dequantization: ``(q - 0) * d``)."""
    return simd.bto_f32_signed(simd.bload(row, o + 2)), simd.bto_f32_signed(simd.bload(row, o + 18))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def dots_q8_0(w0, w1, w2, w3, o, yq, yo, corr, co):
    """The zmm step of the block at ``o`` (:func:`..intdot.quad_blocks`): its 32 signed quants after ``d``."""
    return zmm.signed_dots(w0, w1, w2, w3, o + 2, yq, yo, corr, co)


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
def row_dot_q8_0(w0, p0, yq, yd, ya):
    """One Q8_0 row (``ya`` unused: :func:`.intdot.rows_matvec`'s signature)."""
    a0 = int8.fzero()
    for b in range(yd.shape[0]):
        o = 34 * b
        simd.prefetch(p0, o)
        a0 = int8.fma_int(
            simd.load_f16(w0, o) * yd[b], int8.dot4_signed(int8.load32(w0, o + 2), int8.load32(yq, 32 * b)), a0
        )
    return int8.fsum(a0)


@njit(inline="always", cache=True)
def matvec_int_loop_q8_0(w, yq, yd, ya, out):
    # One row at a time, not a pair (here and in the K-quants' mat-vecs): each thread then reads its rows' bytes in
    # strictly ascending order, which the hardware prefetchers follow better than two interleaved rows; Q4_0, Q4_1
    # and Q5_0 gained nothing (their arithmetic limits them), so they keep their pairs. Measured: docs/PERFORMANCE.md,
    # "What each CPU-path change measured".
    n = out.shape[0]
    if zmm.has_zmm_vnni() and n >= zmm.ROWS:
        intdot.quads_matvec(dots_q8_0, 34, False, w, yq, yd, q8_corrections(yq), out)
    else:
        intdot.rows_matvec(row_dot_q8_0, w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(inline="always", cache=True)
def step_q8_0(x0, x1, f0, f1, yq, yd, b, a0, a1):
    y = int8.load32(yq, 32 * b)
    return int8.fma_int(f0 * yd[b], int8.dot4_signed(x0, y), a0), int8.fma_int(
        f1 * yd[b], int8.dot4_signed(x1, y), a1
    )


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q8_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for b in range(d0.shape[0]):
        o = 34 * b
        x0, x1 = int8.load32(w0, o + 2), int8.load32(w1, o + 2)
        f0, f1 = simd.load_f16(w0, o), simd.load_f16(w1, o)
        a00, a10 = step_q8_0(x0, x1, f0, f1, y0, d0, b, a00, a10)
        a01, a11 = step_q8_0(x0, x1, f0, f1, y1, d1, b, a01, a11)
        a02, a12 = step_q8_0(x0, x1, f0, f1, y2, d2, b, a02, a12)
        a03, a13 = step_q8_0(x0, x1, f0, f1, y3, d3, b, a03, a13)
    return inttiles.fsums(a00, a01, a02, a03, a10, a11, a12, a13)


# --- 16 tokens a vector in vec_dot's order (:func:`..ktiles.ktiled_lanes`) ----------------------------------------
@njit(inline="always", cache=True)
def q8_0_halves(row, o):
    """The block at ``o``'s signed quants as unsigned bytes ``q + 128``, elements 0..15 and 16..31."""
    return simd.bxor(simd.bload(row, o + 2), 128), simd.bxor(simd.bload(row, o + 18), 128)


@njit(inline="always", cache=True)
def unpack_rows_q8_0(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_lanes` (:func:`..ktiles.unpack_blocks`): ``q + 128`` (``vpdpbusd``
    multiplies unsigned by signed; the ``-128 sum4(y)`` start of each dot takes it back off); ``d``."""
    ktiles.unpack_blocks(q8_0_halves, 34, 0, w, r, codes, dd, mm)
