"""Q5_1: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q5_1 (24 bytes, 32 weights): ``| d f16 | m f16 | qh u32 | qs[16] |``; the quants as Q5_0; ``w = d * q + m``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot
from inference_engine.backends.numba_kernels.float_blocks import pairs_matvec_float
from inference_engine.backends.numba_kernels.intdot import pair_min, pairs_matvec
from inference_engine.backends.numba_kernels.inttiles import tile_min, tiled_pairs
from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_1

_F32 = np.float32


# --- float mat-vec and dequantization (from q5.py) ------------------------------------------------------------------
@njit(inline="always", cache=True)
def layout_q5_1():
    """(block bytes, constant-term factor) for :func:`.float_blocks.pairs_matvec_float`."""
    return 24, _F32(-1.0)


@njit(inline="always", cache=True)
def block_q5_1(row, o, xl, xh):
    """The block at byte ``o`` (:func:`.float_blocks.pairs_matvec_float`): ``d``, the 5-bit quants' dot, ``m``."""
    return simd.load_f16(row, o), float_blocks.five_bit_dot(row, o + 4, o + 8, xl, xh), simd.load_f16(row, o + 2)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q5_1(w, xv, xs, out):
    pairs_matvec_float(block_q5_1, layout_q5_1, w, xv, xs, out)


@njit(parallel=True, cache=True)
def dequant_q5_1(w, row0, out):
    """``out[i] = dequantize_row_q5_1(w[row0 + i])``: ``q * d + m``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        for b in range(nb):
            o = 24 * b
            d, m = simd.vsplat(simd.load_f16(row, o)), simd.vsplat(simd.load_f16(row, o + 2))
            lo, hi = float_blocks.five_bit_quants(row, o + 4, o + 8)
            simd.vstore(dst, 32 * b, simd.vadd(simd.vmul(lo, d), m))
            simd.vstore(dst, 32 * b + 16, simd.vadd(simd.vmul(hi, d), m))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def quants_q5_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors."""
    return intdot.five_bits(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def pair_q5_1(w0, w1, p0, p1, yq, yd, ya):
    return pair_min(quants_q5_1, 24, w0, w1, p0, p1, yq, yd, ya)


@njit(parallel=True, cache=True)
def matvec_int_q5_1(w, yq, yd, ya, out):
    pairs_matvec(pair_q5_1, w, yq, yd, ya, out)


@njit(cache=True)
def token_q5_1(w, x, out):
    yq, yd, ya = row_q8_1(x)
    matvec_int_q5_1(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_1(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    return tile_min(quants_q5_1, 24, w0, w1, yq, yd, ya, t0, t1, t2, t3)


@njit(parallel=True, cache=True)
def tiled_q5_1(w, yq, yd, ya, out):
    tiled_pairs(tile_q5_1, w, yq, yd, ya, out)


QTYPE = T.Q5_1
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q5_1, dequant_q5_1, "q8_1", 32, matvec_int_q5_1, "q8_1", tiled_q5_1, token_q5_1)
