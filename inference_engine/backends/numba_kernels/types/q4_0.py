"""Q4_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q4_0 (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d * (lo(qs[j]) - 8)``, ``w[j+16] = d * (hi(qs[j]) -
8)``.

llama.cpp repacks a Q4_0 weight whose rows are a multiple of :data:`REPACKED_ROWS` at load (x86 with AVX2:
``block_q4_0x8``, 8 rows interleaved) and multiplies it, at every token count, by ``ggml_gemv_q4_0_8x8_q8_0`` /
``ggml_gemm_q4_0_8x8_q8_0``: per block, the exact integer ``(q - 8) . y``, then ``acc = fma(float(sum), d_w * d_y,
acc)``, one float accumulator an output. Its one-token mat-vec here (:func:`matvec_int_loop_q4_0`) takes that order
for those weights on AVX-512 VNNI and on AVX2 (llama.cpp's values bit for bit), and ``vec_dot``'s (8 float lanes,
``hsum_float_8``) for the others, as llama.cpp does, and on other CPUs.
"""

from numba import njit

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, zmm

REPACKED_ROWS = 8  # ggml_repack_get_optimal_repack_type: Q4_0 -> q4_0_8x8_q8_0 where the rows are a multiple of 8


@njit(inline="always", cache=True)
def unpack_q4_0(row, o):
    """The 32 quants of the block at byte ``o`` as two F32x16 (the float kernels)."""
    return float_blocks.nibbles(row, o + 2)


@njit(inline="always", cache=True)
def quants_q4_0(row, o):
    """The 32 unsigned quants of the block at byte ``o``, as int8 vectors (the integer-dot kernels)."""
    return int8.nibbles32(row, o + 2)


@njit(inline="always", cache=True)
def dots_q4_0(w0, w1, w2, w3, o, yq, yo, starts, so):
    """Four rows' block at byte ``o`` (its quants) dotted with the activation: ``(q - 8) . y`` (``starts``: ``-8 *
    sum4(y)``), the repacked gemv's step (:func:`..intdot.repacked_quad_blocks`)."""
    return zmm.offset_nibble_dots(w0, w1, w2, w3, o, yq, yo, starts, so)


@njit(inline="always", cache=True)
def matvec_int_loop_q4_0(pair, w, yq, yd, ya, out):
    """One token: on AVX-512 VNNI and AVX2 (there each ``vpdpbusd`` is ``vpmaddubsw`` + ``vpmaddwd``, exact for
    nibbles), rows a multiple of :data:`REPACKED_ROWS` in the repacked gemv's order, eight rows a step; otherwise in
    ``vec_dot``'s (``pair``: :func:`.intdot.pair_offset`, two rows a step). The four-row loop beat the pair loop on
    AVX2 code too (1 thread, 8960x1536 streamed: 475 -> 369 us, docs/PERFORMANCE.md)."""
    if zmm.compiled_isa() >= 1 and out.shape[0] % REPACKED_ROWS == 0:
        intdot.repacked_quads_matvec(dots_q4_0, 8, w, yq, yd, ya, out)
    else:
        intdot.pairs_matvec(pair, w, yq, yd, ya, out)


@njit(inline="always", cache=True)
def halves_q4_0(row, o):
    return ktiles.nibble_halves(row, o + 2)


@njit(inline="always", cache=True)
def unpack_rows_q4_0(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_blocks` (:func:`..ktiles.unpack_blocks`): nibbles 0..15, 8 above the
    value; ``d``."""
    ktiles.unpack_blocks(halves_q4_0, 18, 0, w, r, codes, dd, mm)
