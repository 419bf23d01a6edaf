"""Q5_0: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q5_0 (22 bytes, 32 weights): ``| d f16 | qh u32 | qs[16] |``; ``q[j] = lo(qs[j]) | bit_j(qh) << 4``, ``q[j+16] =
hi(qs[j]) | bit_{j+16}(qh) << 4``; ``w = d * (q - 16)``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot
from inference_engine.backends.numba_kernels.float_blocks import pairs_matvec_float
from inference_engine.backends.numba_kernels.intdot import pair_offset, pairs_matvec
from inference_engine.backends.numba_kernels.inttiles import tile_offset, tiled_pairs
from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.ops.activations import row_q8_0_sum4

_F32 = np.float32


# --- float mat-vec and dequantization (from q5.py) ------------------------------------------------------------------
@njit(inline="always", cache=True)
def layout_q5_0():
    """(block bytes, constant-term factor) for :func:`.float_blocks.pairs_matvec_float`."""
    return 22, _F32(16.0)


@njit(inline="always", cache=True)
def block_q5_0(row, o, xl, xh):
    """The block at byte ``o`` (:func:`.float_blocks.pairs_matvec_float`): ``d``, the 5-bit quants' dot, ``d`` (the constant term is ``-16 d``)."""
    d = simd.load_f16(row, o)
    return d, float_blocks.five_bit_dot(row, o + 2, o + 6, xl, xh), d


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q5_0(w, xv, xs, out):
    pairs_matvec_float(block_q5_0, layout_q5_0, w, xv, xs, out)


@njit(parallel=True, cache=True)
def dequant_q5_0(w, row0, out):
    """``out[i] = dequantize_row_q5_0(w[row0 + i])``: ``(q - 16) * d``."""
    nb = out.shape[1] // 32
    for i in prange(out.shape[0]):
        row, dst = w[row0 + i], out[i]
        sixteen = simd.vsplat(_F32(16.0))
        for b in range(nb):
            o = 22 * b
            d = simd.vsplat(simd.load_f16(row, o))
            lo, hi = float_blocks.five_bit_quants(row, o + 2, o + 6)
            simd.vstore(dst, 32 * b, simd.vmul(simd.vsub(lo, sixteen), d))
            simd.vstore(dst, 32 * b + 16, simd.vmul(simd.vsub(hi, sixteen), d))


# --- integer-dot mat-vec (ggml numerics, one token) (from intdot.py) ------------------------------------------------
@njit(inline="always", cache=True)
def quants_q5_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors."""
    return intdot.five_bits(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def pair_q5_0(w0, w1, p0, p1, yq, yd, ya):
    return pair_offset(quants_q5_0, 22, 4, w0, w1, p0, p1, yq, yd, ya)


@njit(parallel=True, cache=True)
def matvec_int_q5_0(w, yq, yd, ya, out):
    pairs_matvec(pair_q5_0, w, yq, yd, ya, out)


@njit(cache=True)
def token_q5_0(w, x, out):
    yq, yd, ya = row_q8_0_sum4(x)
    matvec_int_q5_0(w, yq, yd, ya, out)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) (from inttiles.py) --------------------------
@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    return tile_offset(quants_q5_0, 22, 4, w0, w1, yq, yd, ya, t0, t1, t2, t3)


@njit(parallel=True, cache=True)
def tiled_q5_0(w, yq, yd, ya, out):
    tiled_pairs(tile_q5_0, w, yq, yd, ya, out)


QTYPE = T.Q5_0
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q5_0, dequant_q5_0, "q8_0", 32, matvec_int_q5_0, "q8_0_sum4", tiled_q5_0, token_q5_0)
