"""Q5_0: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q5_0 (22 bytes, 32 weights): ``| d f16 | qh u32 | qs[16] |``; ``q[j] = lo(qs[j]) | bit_j(qh) << 4``, ``q[j+16] =
hi(qs[j]) | bit_{j+16}(qh) << 4``; ``w = d * (q - 16)``.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, ktiles
from inference_engine.backends.numba_kernels.isa import simd, zmm


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
def quad_q5_0(w0, w1, w2, w3, p0, yq, yd, starts):
    """Four Q5_0 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums in ``vec_dot``'s order
    (``p0``: the first of the four rows to prefetch, 88 bytes a block; ``starts``: :func:`offsets_q5_0`)."""
    lo, hi = simd.vzero(), simd.vzero()
    for b in range(yd.shape[0]):
        o = 22 * b
        intdot.prefetch_span(p0, 88 * b, 88)
        d = zmm.row_scales(zmm.f16_quad(w0, w1, w2, w3, o), yd[b])
        qlo, qhi = zmm.offset_five_bit_dots(w0, w1, w2, w3, o + 6, yq, 32 * b, starts, 8 * b)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
    return lo, hi


@njit(inline="always", cache=True)
def offsets_q5_0(ya):
    """``-16 * sum4(y)`` per int32 lane (:func:`.zmm.offset_five_bit_dots`' start values)."""
    out = np.empty(ya.shape[0], np.int32)
    for i in range(ya.shape[0]):
        out[i] = np.int32(-16) * ya[i]
    return out


@njit(inline="always", cache=True)
def matvec_int_loop_q5_0(pair, w, yq, yd, ya, out):
    """One token, ``vec_dot``'s lanes and float order: four rows a step on 512-bit vectors where the kernels are
    compiled for AVX-512 VNNI (:func:`quad_q5_0`; the last step ends at row n - 1, rows it shares with the one before
    get the same values), else row pairs (``pair``: :func:`.intdot.pair_offset`). Measured (2 threads, twelve
    matrices streamed): AVX-512 VNNI 8960x1536 296 -> 167 us, 1536x8960 245 -> 184; AVX2 code (the same loop
    compiled for Haswell, where the fifth bits unpack less well) 318 -> 312 and 296 -> 318, so AVX2 keeps the pairs."""
    n = out.shape[0]
    if zmm.has_zmm_vnni() and n >= zmm.ROWS:
        starts = offsets_q5_0(ya)
        ahead = simd.rows_ahead(w, zmm.ROWS)
        for g in prange((n + zmm.ROWS - 1) // zmm.ROWS):
            r = min(zmm.ROWS * g, n - zmm.ROWS)
            p = w[min(r + ahead, n - zmm.ROWS)]
            lo, hi = quad_q5_0(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, starts)
            zmm.store_rows(out, r, lo, hi)
    else:
        intdot.pairs_matvec(pair, w, yq, yd, ya, out)
