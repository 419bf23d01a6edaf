"""Q5_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_1 (24 bytes, 32 weights): ``| d f16 | m f16 | qh u32 | qs[16] |``; the quants as Q5_0; ``w = d * q + m``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot


@njit(inline="always", cache=True)
def unpack_q5_1(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.five_bit_quants(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def quants_q5_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return intdot.five_bits(row, o + 4, o + 8)
