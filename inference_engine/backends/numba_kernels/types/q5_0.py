"""Q5_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_0 (22 bytes, 32 weights): ``| d f16 | qh u32 | qs[16] |``; ``q[j] = lo(qs[j]) | bit_j(qh) << 4``, ``q[j+16] =
hi(qs[j]) | bit_{j+16}(qh) << 4``; ``w = d * (q - 16)``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot
from inference_engine.backends.numba_kernels.isa import simd


@njit(inline="always", cache=True)
def unpack_q5_0(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.five_bit_quants(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def quants_q5_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return intdot.five_bits(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def unpack_rows_q5_0(w, r, codes, dd, mm):
    """Rows ``r``, ``r + 1`` for :func:`..ktiles.ktiled_lanes`: quants in element order, one a byte (0..31, 16 above
    the value), block ``d`` as float32 (no ``m``)."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for b in range(dd.shape[1]):
            o = 22 * b
            v = simd.bload(row, o + 6)
            simd.bstore(dst, 32 * b, simd.bor(simd.band(v, 15), simd.bshl(simd.bbits(row, o + 2, 0), 4)))
            simd.bstore(dst, 32 * b + 16, simd.bor(simd.bshr(v, 4), simd.bshl(simd.bbits(row, o + 2, 16), 4)))
            dd[j, b] = simd.load_f16(row, o)
            mm[j, b] = 0.0
