"""The integer-dot mat-vec for the ``ggml`` numerics (llama.cpp's AVX2 ``ggml_vec_dot_<w>_<q8>``, row by row): how
it works, and the loops and helpers its per-type kernels share. A type's own arithmetic (``quants_<type>``,
``row_dot_<type>``) is in its module of :mod:`.types`; its compiled ``matvec_int_<type>`` and ``token_<type>`` (quantize
one float32 token, then the mat-vec, in one call) are generated into :mod:`.entries` from :data:`.kernel_specs.SPECS`.

The activation arrives quantized once per token (:func:`.activations.quantize_int`): int8 quants ``yq``, their
block scales ``yd`` and one auxiliary array ``ya`` per type (below). Each weight block is multiplied in integers
(:mod:`.int8`: 32 quants per ``vpmaddubsw`` on AVX2) and scaled once per block in float32 with the same
operations, lanes and order as ggml's AVX2 code (ggml-cpu/arch/x86/quants.c), so the result is libggml's value bit
for bit where libggml runs that code (tested against it). Q4_0, Q4_1, Q5_0 and Q5_1 take two rows per iteration,
which share the activation loads (``pair_<type>``); Q8_0 and the K-quants one row (``row_dot_<type>``), so each
thread's bytes stream in order (see ``types.q8_0.matvec_int_loop_q8_0``). Where the kernels are compiled for
AVX-512 VNNI, Q4_1, Q5_0, Q5_1 and Q8_0 take four rows a step on 512-bit vectors instead (:func:`quads_matvec`, the
same lanes and float order; Q4_1 on AVX2 too), and Q4_0 its own four-row loop in llama.cpp's repacked order
(``types.q4_0``). The rows are split over threads; the weight stream is prefetched a few KB ahead.
``matvec_int_<type>`` takes one token (several tokens: :mod:`.inttiles`; the untiled mat-mat kept for measuring is
``bench_compare.untiled_int``).

==========  ==========================  =====================================================================
weight      ``ya``                      per block (32 quants) / super-block (256), then ``out = fsum(acc) + c``
==========  ==========================  =====================================================================
Q4_0 Q5_0   int32 ``sum4(yq)``          ``acc += (d_w d_y) * (dot4(q, yq) - 8 ya)`` (ggml: ``(q - 8) . yq``; 16)
Q4_1 Q5_1   float32 ``s`` (Q8_1 sums)   ``acc += (d_w d_y) * dot4(q, yq)``; ``c += m * s``
Q8_0        (unused)                    ``acc += (d_w d_y) * dot4_signed(q, yq)``
Q4_K Q5_K   int16 ``bsums`` (per 16)    ``acc += (d_y d) * sum_j sc_j dot4(q_j, yq_j)``; mins via bsum pairs
Q6_K        int16 ``bsums``             ``acc += (d_y d) * (sum_k sc_k dot4(q_k, yq_k) - 32 bsums . sc)``
==========  ==========================  =====================================================================
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa import zmm
from inference_engine.backends.numba_kernels.isa.int8 import (
    bits32,
    bor8,
    bshl8,
    dot4,
    dot4_scaled,
    fma_int,
    fsum,
    fzero,
    iadd,
    iload,
    ishl,
    isub,
    izero,
    load32,
    load_u32,
    nibbles32,
)
from inference_engine.backends.numba_kernels.isa.simd import (
    far_ahead,
    fma32,
    load_f16,
    prefetch,
    prefetch_l2,
    rows_ahead,
    vzero,
)

_F32 = np.float32
_KMASK1, _KMASK2, _KMASK3 = np.uint32(0x3F3F3F3F), np.uint32(0x0F0F0F0F), np.uint32(0x03030303)


@njit(inline="always", cache=True)
def prefetch_span(p0, off, size, far=False):
    """The cache lines of ``size`` bytes at ``off`` of a row ahead; into the L2 only where ``far``
    (:func:`.isa.simd.far_ahead`)."""
    for line in range(0, size, 64):
        if far:
            prefetch_l2(p0, off + line)
        else:
            prefetch(p0, off + line)


# --- Q4_0, Q4_1, Q8_0 ----------------------------------------------------------------------------------------------


@njit(inline="always", cache=True)
def five_bits(row, qh_off, qs_off):
    """A Q5 block's 32 unsigned 5-bit quants: nibbles plus the fifth bits of ``qh`` (element j: bit j)."""
    return bor8(nibbles32(row, qs_off), bshl8(bits32(row, qh_off), 4))


# --- K-quants ------------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def k4_scales(row, off):
    """ggml's ``utmp`` unpacking of the 12 scale bytes of Q4_K / Q5_K: (scales 0..3, 4..7, mins 0..3, 4..7) as
    four uint32 of four bytes each."""
    u0, u1, u2 = load_u32(row, off), load_u32(row, off + 4), load_u32(row, off + 8)
    t3 = ((u2 >> 4) & _KMASK2) | (((u1 >> 6) & _KMASK3) << 4)
    t2 = u1 & _KMASK1
    t1 = (u2 & _KMASK2) | (((u0 >> 6) & _KMASK3) << 4)
    t0 = u0 & _KMASK1
    return t0, t1, t2, t3


@njit(inline="always", cache=True)
def k4_sumi(quants, row, o, yq, e, t0, t1):
    """Q4_K / Q5_K: one super-block's integer sum with the activation from element ``e``, each sub-block's dot
    scaled by its 6-bit scale (``t0``, ``t1``: :func:`k4_scales`' scale words; ``quants(row, o, j)``: the 64 quants of
    sub-blocks ``2j``, ``2j + 1`` as two int8 vectors)."""
    sumi = izero()
    for j in range(4):
        q_lo, q_hi = quants(row, o, j)
        word = t0 if j < 2 else t1
        sl, sh = byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)
        lo = dot4_scaled(q_lo, load32(yq, e + 64 * j), sl, sl)
        hi = dot4_scaled(q_hi, load32(yq, e + 64 * j + 32), sh, sh)
        sumi = iadd(sumi, iadd(lo, hi))
    return sumi


@njit(inline="always", cache=True)
def byte(word, k):
    return np.int32((word >> np.uint32(8 * k)) & np.uint32(0xFF))


@njit(cache=True)
def bsum_pairs(bsums):
    """Q8_K's 16 int16 block sums per super-block -> the 8 sums of adjacent pairs (ggml's ``hadd_epi16``, for
    :func:`.int8.kmin_pairs`): ``(T, 16 nb) -> (T, 8 nb)``, made once per token instead of once per weight row.
    |pair| <= 2 x 16 x 127, so int16 holds it exactly."""
    out = np.empty((bsums.shape[0], bsums.shape[1] // 2), np.int16)
    for t in range(bsums.shape[0]):
        bsum_pairs_into(bsums[t], out[t])
    return out


@njit(inline="always", cache=True)
def bsum_pairs_into(bsums, out):
    """:func:`bsum_pairs` of one token."""
    for k in range(out.shape[0]):
        out[k] = bsums[2 * k] + bsums[2 * k + 1]


# --- the mat-vec loops, one per shape: each type's ``matvec_int_<type>`` is one of them with its row arithmetic ------
# Inlined (``inline="always"``) into the type's own ``@njit(parallel=True, cache=True)`` kernel with its ``pair_<type>``
# / ``row_dot_<type>`` as a constant there: the same machine code as the loop written out per type (checked), and each
# kernel keeps its own file in Numba's cache (which keeps nothing for a function taking a compiled one as argument).
@njit(inline="always", cache=True)
def pairs_matvec(pair, w, yq, yd, ya, out):
    """Two rows per iteration (``pair``: a type's ``pair_<type>``, which shares the activation loads between them)."""
    n = out.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)


@njit(inline="always", cache=True)
def rows_matvec(row_dot, w, yq, yd, ys, out):
    """One row at a time (``row_dot``: a type's ``row_dot_<type>``; see ``types.q8_0.matvec_int_loop_q8_0`` for why)."""
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot(w[r], w[min(r + ahead, n - 1)], yq, yd, ys)


@njit(inline="always", cache=True)
def rows_matvec_bsum_pairs(row_dot, w, yq, yd, ya, out):
    """:func:`rows_matvec` for Q4_K / Q5_K, whose rows read the activation's block-sum pairs (:func:`bsum_pairs`)."""
    ys = np.empty(ya.shape[0] // 2, np.int16)
    bsum_pairs_into(ya, ys)
    rows_matvec(row_dot, w, yq, yd, ys, out)


# --- four rows a step on 512-bit vectors (:mod:`.isa.zmm`), ``vec_dot``'s lanes and float order -------------------
# ``dots(w0, w1, w2, w3, o, yq, yo, starts, so)``: a type's zmm step for the block at byte ``o`` (its quants' offset
# in the block a literal inside it), the activation's block at ``yo``, the lanes' start values at ``so``. The last
# step of a loop ends at row n - 1: rows it shares with the step before get the same values.
@njit(inline="always", cache=True)
def quad_blocks(dots, block_bytes, w0, w1, w2, w3, p0, far, yq, yd, starts):
    """Four rows' ``lo`` / ``hi`` lane sums of a type whose block is ``d`` then its quants (Q8_0, Q5_0): per block
    ``fma(d_w * d_y, float(dots), lane)``. ``p0``: the first of the four rows to prefetch (they follow it in memory:
    four blocks' bytes a block; ``far``: into the L2)."""
    lo, hi = vzero(), vzero()
    for b in range(yd.shape[0]):
        o = block_bytes * b
        prefetch_span(p0, 4 * block_bytes * b, 4 * block_bytes, far)
        d = zmm.quad_scales(w0, w1, w2, w3, o, yd[b])
        qlo, qhi = dots(w0, w1, w2, w3, o, yq, 32 * b, starts, 8 * b)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
    return lo, hi


@njit(inline="always", cache=True)
def quad_blocks_min(dots, block_bytes, w0, w1, w2, w3, p0, far, yq, yd, ya):
    """:func:`quad_blocks` for a type whose block is ``d``, ``m`` then its quants (Q4_1, Q5_1), plus each row's ``m *
    s`` terms (``ya``: the activation's block sums ``s``); ``dots`` starts from 0."""
    lo, hi, c = vzero(), vzero(), fzero()
    for b in range(yd.shape[0]):
        o = block_bytes * b
        prefetch_span(p0, 4 * block_bytes * b, 4 * block_bytes, far)
        dm = zmm.f16_pairs(w0, w1, w2, w3, o)
        d = zmm.row_scales(dm, yd[b])
        qlo, qhi = dots(w0, w1, w2, w3, o, yq, 32 * b, ya, 0)
        lo = zmm.fma_lanes(d, qlo, lo)
        hi = zmm.fma_lanes(d, qhi, hi)
        c = zmm.fma_splat8(dm, ya[b], c)
    return lo, hi, c


@njit(inline="always", cache=True)
def quads_matvec(dots, block_bytes, has_min, w, yq, yd, ys, out):
    """One token through :func:`quad_blocks` (``ys``: the start values), or with ``has_min`` (a literal)
    :func:`quad_blocks_min` (``ys``: the block sums); each row's ``hsum_float_8`` of its lanes (plus its ``m * s``)
    stored."""
    n = out.shape[0]
    ahead = rows_ahead(w, zmm.ROWS)
    far = far_ahead(w, ahead)
    for g in prange((n + zmm.ROWS - 1) // zmm.ROWS):
        r = min(zmm.ROWS * g, n - zmm.ROWS)
        p = w[min(r + ahead, n - zmm.ROWS)]
        if has_min:
            lo, hi, c = quad_blocks_min(dots, block_bytes, w[r], w[r + 1], w[r + 2], w[r + 3], p, far, yq, yd, ys)
            zmm.store_rows_plus(out, r, lo, hi, c)
        else:
            lo, hi = quad_blocks(dots, block_bytes, w[r], w[r + 1], w[r + 2], w[r + 3], p, far, yq, yd, ys)
            zmm.store_rows(out, r, lo, hi)


# --- eight rows a step (two quads) in llama.cpp's repacked gemv's order (Q4_0, IQ4_NL: the 18-byte ``| d f16 |
# qs[16] |`` blocks it interleaves 8 rows at a time): per block the exact integer dot of each row, then ``acc =
# fma(float(sum), d_w * d_y, acc)``, one accumulator a row. ``dots(w0, w1, w2, w3, o, yq, yo, starts, so)``: the
# type's zmm step for the quants at byte ``o``, lanes started at ``starts[so:so + 8]`` (its offset's ``-offset *
# sum4(y)``).
@njit(inline="always", cache=True)
def repacked_quad_blocks(dots, w0, w1, w2, w3, w4, w5, w6, w7, p0, far, yq, yd, starts):
    """Eight rows' accumulators, two quads (rows 0-3, 4-7) each row in its four lanes, the activation's block loads
    shared between them. ``p0``: the first of the eight rows to prefetch (they follow it in memory: 144 bytes a
    block; ``far``: into the L2)."""
    acc0, acc1 = vzero(), vzero()
    for b in range(yd.shape[0]):
        o = 18 * b
        prefetch_span(p0, 144 * b, 144, far)
        d0 = zmm.quad_scales(w0, w1, w2, w3, o, yd[b])
        d1 = zmm.quad_scales(w4, w5, w6, w7, o, yd[b])
        lo0, hi0 = dots(w0, w1, w2, w3, o + 2, yq, 32 * b, starts, 8 * b)
        lo1, hi1 = dots(w4, w5, w6, w7, o + 2, yq, 32 * b, starts, 8 * b)
        acc0 = zmm.fma_lanes(d0, zmm.block_sums(lo0, hi0), acc0)
        acc1 = zmm.fma_lanes(d1, zmm.block_sums(lo1, hi1), acc1)
    return acc0, acc1


@njit(inline="always", cache=True)
def repacked_quads_matvec(dots, offset, w, yq, yd, ya, out):
    """One token through :func:`repacked_quad_blocks`, rows a multiple of eight (llama.cpp repacks those: the
    callers' ``REPACKED_ROWS``; ``offset``: the type's, for the lane starts: Q4_0 8, IQ4_NL 128). Eight rows a step
    read the activation once per eight rows of weights, not four: one thread, 8960x1536 Q4_0, 20 -> 22 GB/s of
    weights (AMD EPYC VM, Zen 4); rows prefetched far ahead go to the L2 (``PREFETCH_L1_BYTES``)."""
    starts = lane_starts(ya, offset)
    n = out.shape[0]
    step = 2 * zmm.ROWS
    ahead = rows_ahead(w, step)
    far = far_ahead(w, ahead)
    for g in prange(n // step):
        r = step * g
        p = w[min(r + ahead, n - step)]
        acc0, acc1 = repacked_quad_blocks(dots, w[r], w[r + 1], w[r + 2], w[r + 3], w[r + 4], w[r + 5], w[r + 6],
                                          w[r + 7], p, far, yq, yd, starts)
        zmm.store_first_lanes(out, r, acc0)
        zmm.store_first_lanes(out, r + zmm.ROWS, acc1)


@njit(inline="always", cache=True)
def lane_starts(ya, offset):
    """``-offset * sum4(y)`` per int32 lane (``ya``: the activation's sums of 4 quants): the start values that take
    a type's quant offset back out of its dot products (Q4_0 8, Q5_0 16)."""
    out = np.empty(ya.shape[0], np.int32)
    for i in range(ya.shape[0]):
        out[i] = np.int32(-offset) * ya[i]
    return out


# --- the row-pair arithmetic of the 32-weight types: ``pair_<type>`` is one of these with its quants and constants --
# Called from the type's inlined ``pair_<type>`` with the block bytes and the offset's shift as literals, so they are
# constants inside the mat-vec's parallel loop. ``quants(row, o)``: the block's 32 unsigned quants as int8 vectors.
@njit(inline="always", cache=True)
def pair_offset(quants, block_bytes, shift, w0, w1, p0, p1, yq, yd, ya):
    """Q4_0 / Q5_0 (``w = d * (q - 2^shift)``): ``acc += (d_w d_y) * (dot4(q, yq) - 2^shift sum4(yq))``."""
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    for b in range(nb):
        o = block_bytes * b
        prefetch(p0, o)
        prefetch(p1, o)
        y, y8 = load32(yq, 32 * b), ishl(iload(ya, 8 * b), shift)
        s0 = isub(dot4(quants(w0, o), y), y8)
        s1 = isub(dot4(quants(w1, o), y), y8)
        a0 = fma_int(load_f16(w0, o) * yd[b], s0, a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], s1, a1)
    return fsum(a0), fsum(a1)


@njit(inline="always", cache=True)
def pair_min(quants, block_bytes, w0, w1, p0, p1, yq, yd, ya):
    """Q4_1 / Q5_1 (``w = d q + m``): ``acc += (d_w d_y) * dot4(q, yq)``, ``c += m * s``."""
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    c0, c1 = _F32(0.0), _F32(0.0)
    for b in range(nb):
        o = block_bytes * b
        prefetch(p0, o)
        prefetch(p1, o)
        y = load32(yq, 32 * b)
        a0 = fma_int(load_f16(w0, o) * yd[b], dot4(quants(w0, o), y), a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], dot4(quants(w1, o), y), a1)
        c0 = fma32(load_f16(w0, o + 2), ya[b], c0)
        c1 = fma32(load_f16(w1, o + 2), ya[b], c1)
    return fsum(a0) + c0, fsum(a1) + c1
