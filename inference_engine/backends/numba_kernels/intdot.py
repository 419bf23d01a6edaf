"""Integer-dot mat-vec kernels for the ``ggml`` numerics: llama.cpp's AVX2 ``ggml_vec_dot_<w>_<q8>``, row by row.

The activation arrives quantized once per token (:func:`.activations.quantize_int`): int8 quants ``yq``, their
block scales ``yd`` and one auxiliary array ``ya`` per type (below). Each weight block is multiplied in integers
(:mod:`.int8`: 32 quants per ``vpmaddubsw`` on AVX2) and scaled once per block in float32 with the same
operations, lanes and order as ggml's AVX2 code (ggml-cpu/arch/x86/quants.c), so the result is libggml's value bit
for bit where libggml runs that code (tested against it). Q4_0, Q4_1, Q5_0 and Q5_1 take two rows per iteration,
which share the activation loads (``pair_<type>``); Q8_0 and the K-quants one row (``row_dot_<type>``), so each
thread's bytes stream in order (see ``matvec_q8_0``). The rows are split over threads; the weight stream is
prefetched a few KB ahead. ``matvec_<type>`` takes one token (several tokens: :mod:`.inttiles`; the untiled
mat-mat kept for measuring is ``bench_compare.untiled_int``).

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

from inference_engine.backends.numba_kernels.isa.int8 import (
    band8,
    bits32,
    bor8,
    bshl8,
    bshr8,
    dot4,
    dot4_scaled,
    dot4_signed,
    fma_int,
    fsum,
    fzero,
    iadd,
    ihsum,
    iload,
    ishl,
    isub,
    izero,
    kmin_pairs,
    load32,
    load_u32,
    madd16,
    nibbles32,
)
from inference_engine.backends.numba_kernels.isa.simd import fma32, load_f16, prefetch, rows_ahead, vzero
from inference_engine.backends.numba_kernels.isa.zmm import (
    ROWS,
    f16_pairs,
    f16_quad,
    fma_lanes,
    fma_splat8,
    has_zmm_vnni,
    nibble_dots,
    row_scales,
    signed_dots,
    store_rows,
    store_rows_plus,
)
from inference_engine.backends.numba_kernels.ops.activations import row_q8_0, row_q8_0_sum4, row_q8_1, row_q8_K

_F32 = np.float32
QK_K = 256
_KMASK1, _KMASK2, _KMASK3 = np.uint32(0x3F3F3F3F), np.uint32(0x0F0F0F0F), np.uint32(0x03030303)


@njit(inline="always", cache=True)
def prefetch_span(p0, off, size):
    """The cache lines of ``size`` bytes at ``off`` of a row ahead."""
    for line in range(0, size, 64):
        prefetch(p0, off + line)


# --- Q4_0, Q4_1, Q8_0 ----------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def pair_q4_0(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    for b in range(nb):
        o = 18 * b
        prefetch(p0, o)
        prefetch(p1, o)
        y, y8 = load32(yq, 32 * b), ishl(iload(ya, 8 * b), 3)
        s0 = isub(dot4(nibbles32(w0, o + 2), y), y8)
        s1 = isub(dot4(nibbles32(w1, o + 2), y), y8)
        a0 = fma_int(load_f16(w0, o) * yd[b], s0, a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], s1, a1)
    return fsum(a0), fsum(a1)


@njit(inline="always", cache=True)
def five_bits(row, qh_off, qs_off):
    """A Q5 block's 32 unsigned 5-bit quants: nibbles plus the fifth bits of ``qh`` (element j: bit j)."""
    return bor8(nibbles32(row, qs_off), bshl8(bits32(row, qh_off), 4))


@njit(inline="always", cache=True)
def pair_q5_0(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    for b in range(nb):
        o = 22 * b
        prefetch(p0, o)
        prefetch(p1, o)
        y, y16 = load32(yq, 32 * b), ishl(iload(ya, 8 * b), 4)
        s0 = isub(dot4(five_bits(w0, o + 2, o + 6), y), y16)
        s1 = isub(dot4(five_bits(w1, o + 2, o + 6), y), y16)
        a0 = fma_int(load_f16(w0, o) * yd[b], s0, a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], s1, a1)
    return fsum(a0), fsum(a1)


@njit(inline="always", cache=True)
def pair_q5_1(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    c0, c1 = _F32(0.0), _F32(0.0)
    for b in range(nb):
        o = 24 * b
        prefetch(p0, o)
        prefetch(p1, o)
        y = load32(yq, 32 * b)
        a0 = fma_int(load_f16(w0, o) * yd[b], dot4(five_bits(w0, o + 4, o + 8), y), a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], dot4(five_bits(w1, o + 4, o + 8), y), a1)
        c0 = fma32(load_f16(w0, o + 2), ya[b], c0)
        c1 = fma32(load_f16(w1, o + 2), ya[b], c1)
    return fsum(a0) + c0, fsum(a1) + c1


@njit(inline="always", cache=True)
def pair_q4_1(w0, w1, p0, p1, yq, yd, ya):
    nb = yd.shape[0]
    a0, a1 = fzero(), fzero()
    c0, c1 = _F32(0.0), _F32(0.0)
    for b in range(nb):
        o = 20 * b
        prefetch(p0, o)
        prefetch(p1, o)
        y = load32(yq, 32 * b)
        a0 = fma_int(load_f16(w0, o) * yd[b], dot4(nibbles32(w0, o + 4), y), a0)
        a1 = fma_int(load_f16(w1, o) * yd[b], dot4(nibbles32(w1, o + 4), y), a1)
        c0 = fma32(load_f16(w0, o + 2), ya[b], c0)
        c1 = fma32(load_f16(w1, o + 2), ya[b], c1)
    return fsum(a0) + c0, fsum(a1) + c1


@njit(inline="always", cache=True)
def quad_q4_1(w0, w1, w2, w3, p0, yq, yd, ya):
    """Four Q4_1 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums and ``m * s`` terms.
    ``p0``: the first of the four rows to prefetch (they follow it in memory: 80 bytes a block)."""
    lo, hi, c = vzero(), vzero(), fzero()
    for b in range(yd.shape[0]):
        o = 20 * b
        prefetch_span(p0, 80 * b, 80)
        dm = f16_pairs(w0, w1, w2, w3, o)
        d = row_scales(dm, yd[b])
        qlo, qhi = nibble_dots(w0, w1, w2, w3, o + 4, yq, 32 * b)
        lo = fma_lanes(d, qlo, lo)
        hi = fma_lanes(d, qhi, hi)
        c = fma_splat8(dm, ya[b], c)
    return lo, hi, c


@njit(inline="always", cache=True)
def quad_q8_0(w0, w1, w2, w3, p0, yq, yd, corr):
    """Four Q8_0 rows on 512-bit vectors (:mod:`.zmm`): their ``lo`` / ``hi`` lane sums (``p0`` as in
    :func:`quad_q4_1`: 136 bytes a block)."""
    lo, hi = vzero(), vzero()
    for b in range(yd.shape[0]):
        o = 34 * b
        prefetch_span(p0, 136 * b, 136)
        d = row_scales(f16_quad(w0, w1, w2, w3, o), yd[b])
        qlo, qhi = signed_dots(w0, w1, w2, w3, o + 2, yq, 32 * b, corr, 8 * b)
        lo = fma_lanes(d, qlo, lo)
        hi = fma_lanes(d, qhi, hi)
    return lo, hi


@njit(cache=True)
def q8_corrections(yq):
    """``-128 * sum4(y)`` per int32 lane of the Q8_0 activation ``yq`` (:func:`.zmm.signed_dots`' start values)."""
    corr = np.empty(yq.shape[0] // 4, np.int32)
    y = yq.view(np.int8)
    for i in range(corr.shape[0]):
        s = np.int32(y[4 * i]) + np.int32(y[4 * i + 1]) + np.int32(y[4 * i + 2]) + np.int32(y[4 * i + 3])
        corr[i] = -128 * s
    return corr


@njit(inline="always", cache=True)
def row_dot_q8_0(w0, p0, yq, yd):
    """One Q8_0 row."""
    a0 = fzero()
    for b in range(yd.shape[0]):
        o = 34 * b
        prefetch(p0, o)
        a0 = fma_int(load_f16(w0, o) * yd[b], dot4_signed(load32(w0, o + 2), load32(yq, 32 * b)), a0)
    return fsum(a0)


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


@njit(inline="always", cache=True)
def q4_k_sumi(row, o, yq, e, t0, t1):
    sumi = izero()
    for j in range(4):
        q = load32(row, o + 16 + 32 * j)
        word = t0 if j < 2 else t1
        sl, sh = byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)
        lo = dot4_scaled(band8(q, 15), load32(yq, e + 64 * j), sl, sl)
        hi = dot4_scaled(band8(bshr8(q, 4), 15), load32(yq, e + 64 * j + 32), sh, sh)
        sumi = iadd(sumi, iadd(lo, hi))
    return sumi


@njit(inline="always", cache=True)
def q5_k_sumi(row, o, yq, e, t0, t1):
    sumi = izero()
    hbits = load32(row, o + 16)
    for j in range(4):
        q = load32(row, o + 48 + 32 * j)
        word = t0 if j < 2 else t1
        sl, sh = byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)
        h = bshr8(hbits, 2 * j)
        q0 = bor8(band8(q, 15), bshl8(band8(h, 1), 4))
        q1 = bor8(band8(bshr8(q, 4), 15), bshl8(band8(bshr8(h, 1), 1), 4))
        lo = dot4_scaled(q0, load32(yq, e + 64 * j), sl, sl)
        hi = dot4_scaled(q1, load32(yq, e + 64 * j + 32), sh, sh)
        sumi = iadd(sumi, iadd(lo, hi))
    return sumi


@njit(inline="always", cache=True)
def row_dot_q4_k(w0, p0, yq, yd, ys):
    """One Q4_K row. ``ys``: the activation's bsum pairs (:func:`bsum_pairs`). The four min terms of a super-block
    come from one ``vpmaddwd`` (:func:`.int8.kmin_pairs`, ggml's ``madd(mins, hadd(bsums))``) and accumulate per lane
    in ``m0`` (lanes 4..7 stay +0, so ``fsum`` gives ggml's ``(m0 + m2) + (m1 + m3)``). Against the same integers
    made with scalars per row: 1.3-1.5x the GB/s on Qwen2.5-1.5B's Q4_K matrices (2 threads, AVX2 EPYC)."""
    a0, m0 = fzero(), fzero()
    for i in range(yd.shape[0]):
        o = 144 * i
        prefetch_span(p0, o, 144)
        t00, t01, t02, t03 = k4_scales(w0, o + 4)
        m0 = fma_int(-yd[i] * load_f16(w0, o + 2), kmin_pairs(ys, 8 * i, t02, t03), m0)
        a0 = fma_int(yd[i] * load_f16(w0, o), q4_k_sumi(w0, o, yq, QK_K * i, t00, t01), a0)
    return fsum(a0) + fsum(m0)


@njit(inline="always", cache=True)
def row_dot_q5_k(w0, p0, yq, yd, ys):
    """One Q5_K row. ``ys``: the activation's bsum pairs; the min terms as in :func:`row_dot_q4_k`, summed in
    integers (ggml's Q5_K adds them before the one float multiply-add)."""
    a0, c0 = fzero(), _F32(0.0)
    for i in range(yd.shape[0]):
        o = 176 * i
        prefetch_span(p0, o, 176)
        t00, t01, t02, t03 = k4_scales(w0, o + 4)
        c0 = fma32(-yd[i] * load_f16(w0, o + 2), _F32(ihsum(kmin_pairs(ys, 8 * i, t02, t03))), c0)
        a0 = fma_int(yd[i] * load_f16(w0, o), q5_k_sumi(w0, o, yq, QK_K * i, t00, t01), a0)
    return fsum(a0) + c0


@njit(inline="always", cache=True)
def q6_k_sumi(row, o, yq, e, ys, i):
    sumi = izero()
    for j in range(2):
        ql0, ql1 = load32(row, o + 64 * j), load32(row, o + 64 * j + 32)
        qh = load32(row, o + 128 + 32 * j)
        q0 = bor8(band8(ql0, 15), bshl8(band8(qh, 3), 4))
        q1 = bor8(band8(ql1, 15), bshl8(band8(bshr8(qh, 2), 3), 4))
        q2 = bor8(bshr8(ql0, 4), bshl8(band8(bshr8(qh, 4), 3), 4))
        q3 = bor8(bshr8(ql1, 4), bshl8(bshr8(qh, 6), 4))
        sc = o + 192 + 8 * j
        y = e + 128 * j
        p0 = dot4_scaled(q0, load32(yq, y), np.int8(row[sc]), np.int8(row[sc + 1]))
        p1 = dot4_scaled(q1, load32(yq, y + 32), np.int8(row[sc + 2]), np.int8(row[sc + 3]))
        p2 = dot4_scaled(q2, load32(yq, y + 64), np.int8(row[sc + 4]), np.int8(row[sc + 5]))
        p3 = dot4_scaled(q3, load32(yq, y + 96), np.int8(row[sc + 6]), np.int8(row[sc + 7]))
        sumi = iadd(sumi, iadd(p0, p1))
        sumi = iadd(sumi, iadd(p2, p3))
    return isub(sumi, ishl(madd16(ys, 16 * i, row, o + 192), 5))


@njit(inline="always", cache=True)
def row_dot_q6_k(w0, p0, yq, yd, ya):
    """One Q6_K row."""
    a0 = fzero()
    for i in range(yd.shape[0]):
        o = 210 * i
        prefetch_span(p0, o, 210)
        a0 = fma_int(yd[i] * load_f16(w0, o + 208), q6_k_sumi(w0, o, yq, QK_K * i, ya, i), a0)
    return fsum(a0)


# --- the mat-vec kernels: one token -------------------------------------------------------------------------------
# Written out per type (not made by a factory): Numba's cache keys a closure by its pickled cell contents, which
# differ between processes for a captured dispatcher, so factory-made kernels were compiled again in every process.


@njit(parallel=True, cache=True)
def matvec_q4_0(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q4_0(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)



@njit(parallel=True, cache=True)
def matvec_q4_1(w, yq, yd, ya, out):
    n = out.shape[0]
    if has_zmm_vnni() and n >= ROWS:
        # four rows a step; the last step ends at row n - 1 (rows it shares with the one before get the same values)
        ahead = rows_ahead(w)
        for g in prange((n + ROWS - 1) // ROWS):
            r = min(ROWS * g, n - ROWS)
            p = w[min(r + ahead, n - ROWS)]
            lo, hi, c = quad_q4_1(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, ya)
            store_rows_plus(out, r, lo, hi, c)
        return
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q4_1(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)



@njit(parallel=True, cache=True)
def matvec_q8_0(w, yq, yd, ya, out):
    # One row at a time, not a pair (here and in the K-quants' mat-vecs): each thread then reads its rows' bytes in
    # strictly ascending order, which the hardware prefetchers follow better than two interleaved rows. Measured on
    # matrices larger than the L3, 2 threads, 8 alternating runs (AVX2 EPYC), median GB/s of weight bytes, pairs ->
    # one row (a loop that only reads the bytes): Q8_0 178 MB (Gemma 3's output) 14.2 -> 18.0-18.5 (17.3); Q4_K
    # 35 MB 14.8 -> 17.3 (17.1); Q6_K 52 MB 14.4 -> 20.7 (18.4); Q5_K 8960x1536 x 10 matrices 15.1 -> 17.7. Q4_0, Q4_1
    # and Q5_0 gained nothing (Q4_1 53 MB 10.5 vs 10.7: their arithmetic limits them), so they keep their pairs.
    n = out.shape[0]
    if has_zmm_vnni() and n >= ROWS:
        corr = q8_corrections(yq)
        ahead = rows_ahead(w)
        for g in prange((n + ROWS - 1) // ROWS):
            r = min(ROWS * g, n - ROWS)
            p = w[min(r + ahead, n - ROWS)]
            lo, hi = quad_q8_0(w[r], w[r + 1], w[r + 2], w[r + 3], p, yq, yd, corr)
            store_rows(out, r, lo, hi)
        return
    ahead = rows_ahead(w)
    for r in prange(n):
        out[r] = row_dot_q8_0(w[r], w[min(r + ahead, n - 1)], yq, yd)



@njit(parallel=True, cache=True)
def matvec_q4_k(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    ys = np.empty(ya.shape[0] // 2, np.int16)
    bsum_pairs_into(ya, ys)
    for r in prange(n):  # one row at a time, as matvec_q8_0
        out[r] = row_dot_q4_k(w[r], w[min(r + ahead, n - 1)], yq, yd, ys)



@njit(parallel=True, cache=True)
def matvec_q5_k(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    ys = np.empty(ya.shape[0] // 2, np.int16)
    bsum_pairs_into(ya, ys)
    for r in prange(n):  # one row at a time, as matvec_q8_0
        out[r] = row_dot_q5_k(w[r], w[min(r + ahead, n - 1)], yq, yd, ys)



@njit(parallel=True, cache=True)
def matvec_q6_k(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for r in prange(n):  # one row at a time, as matvec_q8_0
        out[r] = row_dot_q6_k(w[r], w[min(r + ahead, n - 1)], yq, yd, ya)



@njit(parallel=True, cache=True)
def matvec_q5_0(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q5_0(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)



@njit(parallel=True, cache=True)
def matvec_q5_1(w, yq, yd, ya, out):
    n = out.shape[0]
    ahead = rows_ahead(w)
    for g in prange((n + 1) // 2):
        r0 = 2 * g
        r1 = min(r0 + 1, n - 1)
        out[r0], out[r1] = pair_q5_1(w[r0], w[r1], w[min(r0 + ahead, n - 1)], w[min(r1 + ahead, n - 1)], yq, yd, ya)



# --- one token in one compiled call: quantize the activation, then the mat-vec (a decode step's matmul) -----------
# The same quantizer and kernel as activations.quantize_int_row + matvec_<type>, so the same bits; one call from
# Python instead of two, and the quantized activation never becomes a Python object (boxing its three arrays cost
# more than quantizing). Measured on random Q4_1 blocks, 2 threads, cache-resident: 576x576 27.5 -> 18.6 us a call,
# 3072x576 89 -> 82 us; a SmolLM2 decode step makes 121 of these calls. The mat-vec keeps its threads when called
# from here (Numba runs a parallel callee's loop on its pool). Written out per type, as the kernels above are.


@njit(cache=True)
def token_q4_0(w, x, out):
    yq, yd, ya = row_q8_0_sum4(x)
    matvec_q4_0(w, yq, yd, ya, out)


@njit(cache=True)
def token_q4_1(w, x, out):
    yq, yd, ya = row_q8_1(x)
    matvec_q4_1(w, yq, yd, ya, out)


@njit(cache=True)
def token_q5_0(w, x, out):
    yq, yd, ya = row_q8_0_sum4(x)
    matvec_q5_0(w, yq, yd, ya, out)


@njit(cache=True)
def token_q5_1(w, x, out):
    yq, yd, ya = row_q8_1(x)
    matvec_q5_1(w, yq, yd, ya, out)


@njit(cache=True)
def token_q8_0(w, x, out):
    yq, yd, ya = row_q8_0(x)
    matvec_q8_0(w, yq, yd, ya, out)


@njit(cache=True)
def token_q4_k(w, x, out):
    yq, yd, ya = row_q8_K(x)
    matvec_q4_k(w, yq, yd, ya, out)


@njit(cache=True)
def token_q5_k(w, x, out):
    yq, yd, ya = row_q8_K(x)
    matvec_q5_k(w, yq, yd, ya, out)


@njit(cache=True)
def token_q6_k(w, x, out):
    yq, yd, ya = row_q8_K(x)
    matvec_q6_k(w, yq, yd, ya, out)
