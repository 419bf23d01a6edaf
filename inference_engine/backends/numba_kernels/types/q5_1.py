"""Q5_1: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_1 (24 bytes, 32 weights): ``| d f16 | m f16 | qh u32 | qs[16] |``; the quants as Q5_0; ``w = d * q + m``.
"""

from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm


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
def quad_q5_1(w0, w1, w2, w3, p0, yq, yd, ya):
    """Four Q5_1 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums and ``m * s`` terms, as
    :func:`.q4_1.quad_q4_1` (``p0``: the first of the four rows to prefetch, 96 bytes a block)."""
    lo, hi, c = simd.vzero(), simd.vzero(), int8.fzero()
    for b in range(yd.shape[0]):
        o = 24 * b
        intdot.prefetch_span(p0, 96 * b, 96)
        dm = zmm.f16_pairs(w0, w1, w2, w3, o)
        d = zmm.row_scales(dm, yd[b])
        qlo, qhi = zmm.five_bit_dots(w0, w1, w2, w3, o + 8, yq, 32 * b)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
        c = zmm.fma_splat8(dm, ya[b], c)
    return lo, hi, c


@njit(inline="always", cache=True)
def matvec_int_loop_q5_1(pair, w, yq, yd, ya, out):
    """One token, ``vec_dot``'s lanes and float order: four rows a step on 512-bit vectors where the kernels are
    compiled for AVX-512 VNNI (:func:`quad_q5_1`; as Q5_0, AVX2 keeps the pairs), else row pairs (``pair``:
    :func:`.intdot.pair_min`)."""
    n = out.shape[0]
    if zmm.has_zmm_vnni() and n >= zmm.ROWS:
        ahead = simd.rows_ahead(w, zmm.ROWS)
        for g in prange((n + zmm.ROWS - 1) // zmm.ROWS):
            r = min(zmm.ROWS * g, n - zmm.ROWS)
            p = w[min(r + ahead, n - zmm.ROWS)]
            lo, hi, c = quad_q5_1(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, ya)
            zmm.store_rows_plus(out, r, lo, hi, c)
    else:
        intdot.pairs_matvec(pair, w, yq, yd, ya, out)
