"""Q4_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q4_1 (20 bytes, 32 weights): ``| d f16 | m f16 | qs[16] |``; ``w[j] = d * lo(qs[j]) + m``, ``w[j+16] = d * hi(qs[j])
+ m``.
"""

from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm


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
def quad_q4_1(w0, w1, w2, w3, p0, yq, yd, ya):
    """Four Q4_1 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums and ``m * s`` terms.
    ``p0``: the first of the four rows to prefetch (they follow it in memory: 80 bytes a block)."""
    lo, hi, c = simd.vzero(), simd.vzero(), int8.fzero()
    for b in range(yd.shape[0]):
        o = 20 * b
        intdot.prefetch_span(p0, 80 * b, 80)
        dm = zmm.f16_pairs(w0, w1, w2, w3, o)
        d = zmm.row_scales(dm, yd[b])
        qlo, qhi = zmm.nibble_dots(w0, w1, w2, w3, o + 4, yq, 32 * b)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
        c = zmm.fma_splat8(dm, ya[b], c)
    return lo, hi, c


@njit(inline="always", cache=True)
def matvec_int_loop_q4_1(w, yq, yd, ya, out):
    """Four rows a step on 512-bit vectors (:func:`quad_q4_1`) where the kernels are compiled for AVX-512 VNNI or
    AVX2 (there two 256-bit halves, ``vpmaddubsw`` + ``vpmaddwd``: 8960x1536 streamed, 2 threads, 240 -> 165 us),
    else row pairs; ``vec_dot``'s lanes and float order either way."""
    n = out.shape[0]
    if zmm.compiled_isa() >= 1 and n >= zmm.ROWS:
        # four rows a step; the last step ends at row n - 1 (rows it shares with the one before get the same values)
        ahead = simd.rows_ahead(w, zmm.ROWS)
        for g in prange((n + zmm.ROWS - 1) // zmm.ROWS):
            r = min(zmm.ROWS * g, n - zmm.ROWS)
            p = w[min(r + ahead, n - zmm.ROWS)]
            lo, hi, c = quad_q4_1(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, ya)
            zmm.store_rows_plus(out, r, lo, hi, c)
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
