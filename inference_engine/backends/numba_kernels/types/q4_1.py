"""Q4_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q4_1 (20 bytes, 32 weights): ``| d f16 | m f16 | qs[16] |``; ``w[j] = d * lo(qs[j]) + m``, ``w[j+16] = d * hi(qs[j])
+ m``.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, zmm


@njit(inline="always", cache=True)
def unpack_q4_1(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.nibbles(row, o + 4)


@njit(inline="always", cache=True)
def quants_q4_1(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return int8.nibbles32(row, o + 4)


@njit(inline="always", cache=True)
def pair_q4_1(w0, w1, p0, p1, yq, yd, ya):
    return intdot.pair_min(quants_q4_1, 20, w0, w1, p0, p1, yq, yd, ya)


@njit(inline="always", cache=True)
def dots_q4_1(w0, w1, w2, w3, o, yq, yo, ya, so):
    """The zmm step of the block at ``o`` (:func:`..intdot.quad_blocks_min`): its nibbles after ``d``, ``m``."""
    return zmm.nibble_dots(w0, w1, w2, w3, o + 4, yq, yo)


@njit(inline="always", cache=True)
def matvec_int_loop_q4_1(w, yq, yd, ya, out):
    """Four rows a step on 512-bit vectors (:func:`..intdot.quads_matvec`) where the kernels are compiled for
    AVX-512 VNNI or AVX2 (there two 256-bit halves, ``vpmaddubsw`` + ``vpmaddwd``: 8960x1536 streamed, 2 threads,
    240 -> 165 us), else row pairs; ``vec_dot``'s lanes and float order either way."""
    if zmm.compiled_isa() >= 1 and out.shape[0] >= zmm.ROWS:
        intdot.quads_matvec(dots_q4_1, 20, True, w, yq, yd, ya, out)
    else:
        intdot.pairs_matvec(pair_q4_1, w, yq, yd, ya, out)


@njit(inline="always", cache=True)
def halves_q4_1(row, o):
    return ktiles.nibble_halves(row, o + 4)


@njit(inline="always", cache=True)
def unpack_rows_q4_1(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_lanes` (:func:`..ktiles.unpack_blocks`): nibbles 0..15; ``d`` and
    ``m``."""
    ktiles.unpack_blocks(halves_q4_1, 20, 2, w, r, codes, dd, mm)
