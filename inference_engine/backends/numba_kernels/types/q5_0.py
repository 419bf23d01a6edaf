"""Q5_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_0 (22 bytes, 32 weights): ``| d f16 | qh u32 | qs[16] |``; ``q[j] = lo(qs[j]) | bit_j(qh) << 4``, ``q[j+16] =
hi(qs[j]) | bit_{j+16}(qh) << 4``; ``w = d * (q - 16)``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import zmm


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


@njit(inline="always", cache=True)
def dots_q5_0(w0, w1, w2, w3, o, yq, yo, starts, so):
    """The zmm step of the block at ``o`` (:func:`..intdot.quad_blocks`): its five-bit quants (``qh``, ``qs`` after
    ``d``) less 16."""
    return zmm.offset_five_bit_dots(w0, w1, w2, w3, o + 6, yq, yo, starts, so)


@njit(inline="always", cache=True)
def matvec_int_loop_q5_0(pair, w, yq, yd, ya, out):
    """One token, ``vec_dot``'s lanes and float order: four rows a step on 512-bit vectors where the kernels are
    compiled for AVX-512 VNNI (:func:`..intdot.quads_matvec`), else row pairs (``pair``: :func:`.intdot.pair_offset`).
    Measured (2 threads, twelve matrices streamed): AVX-512 VNNI 8960x1536 296 -> 167 us, 1536x8960 245 -> 184; AVX2
    code (the same loop compiled for Haswell, where the fifth bits unpack less well) 318 -> 312 and 296 -> 318, so
    AVX2 keeps the pairs."""
    if zmm.has_zmm_vnni() and out.shape[0] >= zmm.ROWS:
        intdot.quads_matvec(dots_q5_0, 22, False, w, yq, yd, intdot.lane_starts(ya, 16), out)
    else:
        intdot.pairs_matvec(pair, w, yq, yd, ya, out)
