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

from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm

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
def quad_blocks_q4_0(w0, w1, w2, w3, p0, yq, yd, starts):
    """Four rows on 512-bit vectors (:mod:`.zmm`) in the repacked gemv's order; each row's accumulator in its four
    lanes. ``starts``: ``-8 * sum4(y)`` (:func:`..intdot.lane_starts`); ``p0``: the first of the four rows to
    prefetch (they follow it in memory: 72 bytes a block)."""
    acc = simd.vzero()
    for b in range(yd.shape[0]):
        o = 18 * b
        intdot.prefetch_span(p0, 72 * b, 72)
        d = zmm.row_scales(zmm.f16_quad(w0, w1, w2, w3, o), yd[b])
        lo, hi = zmm.offset_nibble_dots(w0, w1, w2, w3, o + 2, yq, 32 * b, starts, 8 * b)
        acc = zmm.fma_lanes(d, zmm.block_sums(lo, hi), acc)
    return acc


@njit(inline="always", cache=True)
def matvec_int_loop_q4_0(pair, w, yq, yd, ya, out):
    """One token: on AVX-512 VNNI and AVX2 (there each ``vpdpbusd`` is ``vpmaddubsw`` + ``vpmaddwd``, exact for
    nibbles), rows a multiple of :data:`REPACKED_ROWS` in the repacked gemv's order, four rows a step; otherwise in
    ``vec_dot``'s (``pair``: :func:`.intdot.pair_offset`, two rows a step). The four-row loop beat the pair loop on
    AVX2 code too (1 thread, 8960x1536 streamed: 475 -> 369 us, docs/PERFORMANCE.md)."""
    n = out.shape[0]
    if zmm.compiled_isa() >= 1 and n % REPACKED_ROWS == 0:
        starts = intdot.lane_starts(ya, 8)
        ahead = simd.rows_ahead(w, zmm.ROWS)
        for g in prange(n // zmm.ROWS):
            r = zmm.ROWS * g
            p = w[min(r + ahead, n - zmm.ROWS)]
            zmm.store_first_lanes(out, r, quad_blocks_q4_0(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, starts))
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
