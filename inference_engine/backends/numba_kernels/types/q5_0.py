"""Q5_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_0 (22 bytes, 32 weights): ``| d f16 | qh u32 | qs[16] |``; ``q[j] = lo(qs[j]) | bit_j(qh) << 4``, ``q[j+16] =
hi(qs[j]) | bit_{j+16}(qh) << 4``; ``w = d * (q - 16)``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles


@njit(inline="always", cache=True)
def unpack_q5_0(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.five_bit_quants(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def quants_q5_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return intdot.five_bits(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def halves_q5_0(row, o):
    return ktiles.five_bit_halves(row, o + 2, o + 6)


@njit(inline="always", cache=True)
def unpack_rows_q5_0(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_lanes` (:func:`..ktiles.unpack_blocks`): 5-bit quants 0..31, 16
    above the value; ``d``."""
    ktiles.unpack_blocks(halves_q5_0, 22, 0, w, r, codes, dd, mm)
