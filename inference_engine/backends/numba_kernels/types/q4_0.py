"""Q4_0: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q4_0 (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d * (lo(qs[j]) - 8)``, ``w[j+16] = d * (hi(qs[j]) -
8)``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks
from inference_engine.backends.numba_kernels.float_blocks import pairs_matvec_float
from inference_engine.backends.numba_kernels.intdot import pair_offset, pairs_matvec
from inference_engine.backends.numba_kernels.inttiles import tile_offset, tiled_pairs
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
def quants_q4_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors."""
    return int8.nibbles32(row, o + 2)


@njit(inline="always", cache=True)
def pair_q4_0(w0, w1, p0, p1, yq, yd, ya):
    return pair_offset(quants_q4_0, 18, 3, w0, w1, p0, p1, yq, yd, ya)


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
    return tile_offset(quants_q4_0, 18, 3, w0, w1, yq, yd, ya, t0, t1, t2, t3)


@njit(parallel=True, cache=True)
def tiled_q4_0(w, yq, yd, ya, out):
    tiled_pairs(tile_q4_0, w, yq, yd, ya, out)


QTYPE = T.Q4_0
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q4_0, dequant_q4_0, "q8_0", 32, matvec_int_q4_0, "q8_0_sum4", tiled_q4_0, token_q4_0)
