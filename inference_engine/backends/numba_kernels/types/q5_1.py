"""Q5_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_1 (24 bytes, 32 weights): ``| d f16 | m f16 | qh u32 | qs[16] |``; the quants as Q5_0; ``w = d * q + m``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import zmm


@njit(inline="always", cache=True)
def unpack_q5_1(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.five_bit_quants(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def quants_q5_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return intdot.five_bits(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def halves_q5_1(row, o):
    return ktiles.five_bit_halves(row, o + 4, o + 8)


@njit(inline="always", cache=True)
def unpack_rows_q5_1(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_lanes` (:func:`..ktiles.unpack_blocks`): 5-bit quants 0..31; ``d``
    and ``m``."""
    ktiles.unpack_blocks(halves_q5_1, 24, 2, w, r, codes, dd, mm)


@njit(inline="always", cache=True)
def dots_q5_1(w0, w1, w2, w3, o, yq, yo, ya, so):
    """The zmm step of the block at ``o`` (:func:`..intdot.quad_blocks_min`): its five-bit quants (``qh``, ``qs``
    after ``d``, ``m``)."""
    return zmm.five_bit_dots(w0, w1, w2, w3, o + 8, yq, yo)


@njit(inline="always", cache=True)
def matvec_int_loop_q5_1(pair, w, yq, yd, ya, out):
    """One token, ``vec_dot``'s lanes and float order: four rows a step on 512-bit vectors where the kernels are
    compiled for AVX-512 VNNI (:func:`..intdot.quads_matvec`; as Q5_0, AVX2 keeps the pairs), else row pairs
    (``pair``: :func:`.intdot.pair_min`)."""
    if zmm.has_zmm_vnni() and out.shape[0] >= zmm.ROWS:
        intdot.quads_matvec(dots_q5_1, 24, True, w, yq, yd, ya, out)
    else:
        intdot.pairs_matvec(pair, w, yq, yd, ya, out)
