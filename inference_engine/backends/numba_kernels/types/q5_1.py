"""Q5_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_1 (24 bytes, 32 weights): ``| d f16 | m f16 | qh u32 | qs[16] |``; the quants as Q5_0; ``w = d * q + m``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot
from inference_engine.backends.numba_kernels.isa import simd


@njit(inline="always", cache=True)
def unpack_q5_1(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.five_bit_quants(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def quants_q5_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return intdot.five_bits(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def unpack_rows_q5_1(w, r, codes, dd, mm):
    """Rows ``r``, ``r + 1`` for :func:`..ktiles.ktiled_lanes`: quants in element order, one a byte (0..31), block
    ``d`` and ``m`` as float32."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for b in range(dd.shape[1]):
            o = 24 * b
            v = simd.bload(row, o + 8)
            simd.bstore(dst, 32 * b, simd.bor(simd.band(v, 15), simd.bshl(simd.bbits(row, o + 4, 0), 4)))
            simd.bstore(dst, 32 * b + 16, simd.bor(simd.bshr(v, 4), simd.bshl(simd.bbits(row, o + 4, 16), 4)))
            dd[j, b], mm[j, b] = simd.load_f16(row, o), simd.load_f16(row, o + 2)
