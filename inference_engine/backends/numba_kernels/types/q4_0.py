"""Q4_0: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q4_0 (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d * (lo(qs[j]) - 8)``, ``w[j+16] = d * (hi(qs[j]) -
8)``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, inttiles
from inference_engine.backends.numba_kernels.float_blocks import pairs_matvec_float
from inference_engine.backends.numba_kernels.intdot import pairs_matvec
from inference_engine.backends.numba_kernels.inttiles import tiled_pairs
from inference_engine.backends.numba_kernels.isa import int8, simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_0_sum4

_F32 = np.float32


# --- float mat-vec and dequantization (from q4.py) ------------------------------------------------------------------
@njit(inline="always", cache=True)
def layout_q4_0():
    """(block bytes, constant-term factor) for :func:`.float_blocks.pairs_matvec_float`."""
    return 18, _F32(8.0)


@njit(inline="always", cache=True)
def block_q4_0(row, o, xl, xh):
    """The block at byte ``o`` (:func:`.float_blocks.pairs_matvec_float`): ``d``, the nibbles' dot, ``d`` (the constant term is ``-8 d``)."""
    d = simd.load_f16(row, o)
    return d, float_blocks.nibble_dot(row, o + 2, xl, xh), d


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q4_0(w, xv, xs, out):
    pairs_matvec_float(block_q4_0, layout_q4_0, w, xv, xs, out)


@njit(parallel=True, cache=True)
def dequant_q4_0(w, row0, out):
    """``out[i] = dequantize_row_q4_0(w[row0 + i])``: ``(q - 8) * d``, as ggml rounds it."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        eight = simd.vsplat(_F32(8.0))
        for b in range(nb):
            o = 18 * b
            d = simd.vsplat(simd.load_f16(row, o))
            q = simd.bload(row, o + 2)
            simd.vstore(dst, 32 * b, simd.vmul(simd.vsub(simd.bto_f32(simd.band(q, 15)), eight), d))
            simd.vstore(dst, 32 * b + 16, simd.vmul(simd.vsub(simd.bto_f32(simd.bshr(q, 4)), eight), d))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def pair_q4_0(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = int8.fzero(), int8.fzero()
    for b in range(nb):
        o = 18 * b
        simd.prefetch(p0, o)
        simd.prefetch(p1, o)
        y, y8 = int8.load32(yq, 32 * b), int8.ishl(int8.iload(ya, 8 * b), 3)
        s0 = int8.isub(int8.dot4(int8.nibbles32(w0, o + 2), y), y8)
        s1 = int8.isub(int8.dot4(int8.nibbles32(w1, o + 2), y), y8)
        a0 = int8.fma_int(simd.load_f16(w0, o) * yd[b], s0, a0)
        a1 = int8.fma_int(simd.load_f16(w1, o) * yd[b], s1, a1)
    return int8.fsum(a0), int8.fsum(a1)


@njit(parallel=True, cache=True)
def matvec_int_q4_0(w, yq, yd, ya, out):
    pairs_matvec(pair_q4_0, w, yq, yd, ya, out)


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
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for b in range(d0.shape[0]):
        o = 18 * b
        x0, x1 = int8.nibbles32(w0, o + 2), int8.nibbles32(w1, o + 2)
        f0, f1 = simd.load_f16(w0, o), simd.load_f16(w1, o)
        a00, a10 = inttiles.step_offset(x0, x1, f0, f1, y0, d0, s0, b, 3, a00, a10)
        a01, a11 = inttiles.step_offset(x0, x1, f0, f1, y1, d1, s1, b, 3, a01, a11)
        a02, a12 = inttiles.step_offset(x0, x1, f0, f1, y2, d2, s2, b, 3, a02, a12)
        a03, a13 = inttiles.step_offset(x0, x1, f0, f1, y3, d3, s3, b, 3, a03, a13)
    return (
        int8.fsum(a00),
        int8.fsum(a01),
        int8.fsum(a02),
        int8.fsum(a03),
        int8.fsum(a10),
        int8.fsum(a11),
        int8.fsum(a12),
        int8.fsum(a13),
    )


@njit(parallel=True, cache=True)
def tiled_q4_0(w, yq, yd, ya, out):
    tiled_pairs(tile_q4_0, w, yq, yd, ya, out)


QTYPE = T.Q4_0
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q4_0, dequant_q4_0, "q8_0", 32, matvec_int_q4_0, "q8_0_sum4", tiled_q4_0, token_q4_0)
