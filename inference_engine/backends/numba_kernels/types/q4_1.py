"""Q4_1: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q4_1 (20 bytes, 32 weights): ``| d f16 | m f16 | qs[16] |``; ``w[j] = d * lo(qs[j]) + m``, ``w[j+16] = d * hi(qs[j])
+ m``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot
from inference_engine.backends.numba_kernels.float_blocks import pairs_matvec_float
from inference_engine.backends.numba_kernels.intdot import pair_min
from inference_engine.backends.numba_kernels.inttiles import tile_min, tiled_pairs
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_1

_F32 = np.float32


# --- float mat-vec and dequantization (from q4.py) ------------------------------------------------------------------
@njit(inline="always", cache=True)
def layout_q4_1():
    """(block bytes, constant-term factor) for :func:`.float_blocks.pairs_matvec_float`."""
    return 20, _F32(-1.0)


@njit(inline="always", cache=True)
def block_q4_1(row, o, xl, xh):
    """The block at byte ``o`` (:func:`.float_blocks.pairs_matvec_float`): ``d``, the nibbles' dot, ``m``."""
    return simd.load_f16(row, o), float_blocks.nibble_dot(row, o + 4, xl, xh), simd.load_f16(row, o + 2)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q4_1(w, xv, xs, out):
    pairs_matvec_float(block_q4_1, layout_q4_1, w, xv, xs, out)


@njit(parallel=True, cache=True)
def dequant_q4_1(w, row0, out):
    """``out[i] = dequantize_row_q4_1(w[row0 + i])``: ``q * d + m`` (two roundings, as ggml and gguf-py)."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 20 * b
            d, m = simd.vsplat(simd.load_f16(row, o)), simd.vsplat(simd.load_f16(row, o + 2))
            q = simd.bload(row, o + 4)
            simd.vstore(dst, 32 * b, simd.vadd(simd.vmul(simd.bto_f32(simd.band(q, 15)), d), m))
            simd.vstore(dst, 32 * b + 16, simd.vadd(simd.vmul(simd.bto_f32(simd.bshr(q, 4)), d), m))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def quants_q4_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors."""
    return int8.nibbles32(row, o + 4)


@njit(inline="always", cache=True)
def pair_q4_1(w0, w1, p0, p1, yq, yd, ya):
    return pair_min(quants_q4_1, 20, w0, w1, p0, p1, yq, yd, ya)


@njit(inline="always", cache=True)
def quad_q4_1(w0, w1, w2, w3, p0, yq, yd, ya):
    """Four Q4_1 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums and ``m * s`` terms.
    ``p0``: the first of the four rows to prefetch (they follow it in memory: 80 bytes a block)."""
    lo, hi, c = simd.vzero(), simd.vzero(), int8.fzero()
    for b in range(yd.shape[0]):
        o = 20 * b
        intdot.prefetch_span(p0, 80 * b, 80)
        dm = zmm.f16_pairs(w0, w1, w2, w3, o)
        d = zmm.row_scales(dm, yd[b])
        qlo, qhi = zmm.nibble_dots(w0, w1, w2, w3, o + 4, yq, 32 * b)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
        c = zmm.fma_splat8(dm, ya[b], c)
    return lo, hi, c


@njit(parallel=True, cache=True)
def matvec_int_q4_1(w, yq, yd, ya, out):
    n = out.shape[0]
    if zmm.has_zmm_vnni() and n >= zmm.ROWS:
        # four rows a step; the last step ends at row n - 1 (rows it shares with the one before get the same values)
        ahead = simd.rows_ahead(w)
        for g in prange((n + zmm.ROWS - 1) // zmm.ROWS):
            r = min(zmm.ROWS * g, n - zmm.ROWS)
            p = w[min(r + ahead, n - zmm.ROWS)]
            lo, hi, c = quad_q4_1(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, ya)
            zmm.store_rows_plus(out, r, lo, hi, c)
        return
    ahead = simd.rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q4_1(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)


@njit(cache=True)
def token_q4_1(w, x, out):
    yq, yd, ya = row_q8_1(x)
    matvec_int_q4_1(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_1(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    return tile_min(quants_q4_1, 20, w0, w1, yq, yd, ya, t0, t1, t2, t3)


@njit(parallel=True, cache=True)
def tiled_q4_1(w, yq, yd, ya, out):
    tiled_pairs(tile_q4_1, w, yq, yd, ya, out)


QTYPE = T.Q4_1
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q4_1, dequant_q4_1, "q8_1", 32, matvec_int_q4_1, "q8_1", tiled_q4_1, token_q4_1)
