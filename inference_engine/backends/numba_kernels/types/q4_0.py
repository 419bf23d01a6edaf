"""Q4_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q4_0 (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d * (lo(qs[j]) - 8)``, ``w[j+16] = d * (hi(qs[j]) -
8)``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, ktiles
from inference_engine.backends.numba_kernels.isa import int8


@njit(inline="always", cache=True)
def unpack_q4_0(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.nibbles(row, o + 2)


@njit(inline="always", cache=True)
def quants_q4_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return int8.nibbles32(row, o + 2)


@njit(inline="always", cache=True)
def halves_q4_0(row, o):
    return ktiles.nibble_halves(row, o + 2)


@njit(inline="always", cache=True)
def unpack_rows_q4_0(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_blocks` (:func:`..ktiles.unpack_blocks`): nibbles 0..15, 8 above the
    value; ``d``."""
    ktiles.unpack_blocks(halves_q4_0, 18, 0, w, r, codes, dd, mm)
