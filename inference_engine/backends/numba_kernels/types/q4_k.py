"""Q4_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q4_K (144 bytes, 256 weights): ``d @0 | dmin @2 | scales[12] @4`` (8 x (6-bit sc, 6-bit m)) ``| qs[128] @16``;
``e = 64j + l`` (l < 32): ``u = lo(qs[32j + l])``, sub-block ``2j``; ``e = 64j + 32 + l``: the high nibble, ``2j +
1``; ``w = d*sc*u - dmin*m``.
"""

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks, intdot, inttiles, ktiles
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm


# --- float mat-vec and dequantization ------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def quants_float_q4_k(row, o, j):
    """The 64 unsigned 4-bit quants of chunk ``j`` (elements 64j .. 64j+63) as four F32x16."""
    q0, q1 = simd.bload(row, o + 16 + 32 * j), simd.bload(row, o + 32 + 32 * j)
    return (
        simd.bto_f32(simd.band(q0, 15)),
        simd.bto_f32(simd.band(q1, 15)),
        simd.bto_f32(simd.bshr(q0, 4)),
        simd.bto_f32(simd.bshr(q1, 4)),
    )


@njit(inline="always", cache=True)
def q4_k_superblock(row, o, xv, xs, x0, acc, c):
    return float_blocks.k4_superblock(quants_float_q4_k, row, o, xv, xs, x0, acc, c)


@njit(inline="always", cache=True)
def dequant_superblock_q4_k(row, o, dst, y):
    float_blocks.k4_dequant(quants_float_q4_k, row, o, dst, y)


# --- integer-dot mat-vec (ggml numerics, one token) ---------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_q4_k(w0, p0, yq, yd, ys):
    """One Q4_K row. ``ys``: the activation's bsum pairs (:func:`bsum_pairs`). The four min terms of a super-block
    come from one ``vpmaddwd`` (:func:`.int8.kmin_pairs`, ggml's ``madd(mins, hadd(bsums))``) and accumulate per lane
    in ``m0`` (lanes 4..7 stay +0, so ``fsum`` gives ggml's ``(m0 + m2) + (m1 + m3)``). Against the same integers
    made with scalars per row: 1.3-1.5x the GB/s on Qwen2.5-1.5B's Q4_K matrices (2 threads, AVX2 EPYC)."""
    a0, m0 = int8.fzero(), int8.fzero()
    for i in range(yd.shape[0]):
        o = 144 * i
        intdot.prefetch_span(p0, o, 144)
        t00, t01, t02, t03 = intdot.k4_scales(w0, o + 4)
        m0 = int8.fma_int(-yd[i] * simd.load_f16(w0, o + 2), int8.kmin_pairs(ys, 8 * i, t02, t03), m0)
        a0 = int8.fma_int(
            yd[i] * simd.load_f16(w0, o), intdot.k4_sumi(q4_k_quants, w0, o, yq, float_blocks.QK_K * i, t00, t01), a0
        )
    return int8.fsum(a0) + int8.fsum(m0)


# --- register-tiled integer-dot kernels (ggml numerics, several tokens) ---------------------------------------------
@njit(inline="always", cache=True)
def q4_k_quants(row, o, j):
    q = int8.load32(row, o + 16 + 32 * j)
    return int8.band8(q, 15), int8.band8(int8.bshr8(q, 4), 15)


@njit(inline="always", cache=True)
def close_q4_k(row, o, ydi, ys, i, t_mlo, t_mhi, sumi, st):
    """row_dot_q4_k's per-super-block float steps for one output; state (acc, macc): ``macc`` holds row_dot_q4_k's
    four min accumulators m0..m3 in lanes 0..3 (lanes 4..7 stay +0, so ``fsum(macc)`` is its
    ``(m0 + m2) + (m1 + m3)``), updated by the same one-rounding ``fma(dmin, s_k, m_k)`` per lane."""
    dmin = -ydi * simd.load_f16(row, o + 2)
    return int8.fma_int(ydi * simd.load_f16(row, o), sumi, st[0]), int8.fma_int(
        dmin, int8.kmin_pairs(ys, 8 * i, t_mlo, t_mhi), st[1]
    )


@njit(inline="always", cache=True)
def final_q4_k(st):
    return int8.fsum(st[0]) + int8.fsum(st[1])


@njit(inline="always", cache=True)
def zero_q4_k():
    """:func:`close_q4_k`'s state before the first super-block."""
    return int8.fzero(), int8.fzero()


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    return inttiles.k4_tile(q4_k_quants, close_q4_k, final_q4_k, zero_q4_k, 144, w0, w1, yq, yd, ya, t0, t1, t2, t3)


# row8_q4_k keeps the 4 sub-block pairs as a loop (a count LLVM cannot see), so the 8 tokens' integer sums stay in
# registers instead of being spilled, and makes the min terms and d_w * d_y for the 8 tokens at once from the
# activation's scales and block-sum pairs laid out per 8-token block (scales8, bsum_pairs8). Against the kernel
# before it (its sub-block loop unrolled, the sums spilled by LLVM) and a variant with two sub-blocks per vpmaddwd:
# docs/PERFORMANCE.md, "What each CPU-path change measured".
@njit(cache=True)
def bsum_pairs8(bsums):
    """(T, 16 nb) -> (T // 8, nb, 64): [g, i, 16 k + 2 t + h] = bsum32_{2k+h} of token 8 g + t in super-block i."""
    n_g, nb = bsums.shape[0] // 8, bsums.shape[1] // 16
    out = np.empty((n_g, nb, 64), np.int16)
    for g in range(n_g):
        for i in range(nb):
            for k in range(4):
                for t in range(8):
                    for h in range(2):
                        j = 16 * i + 2 * (2 * k + h)
                        out[g, i, 16 * k + 2 * t + h] = bsums[8 * g + t, j] + bsums[8 * g + t, j + 1]
    return out


@njit(cache=True)
def scales8(yd):
    """(T, nb) -> (T // 8, nb, 8): the activation scales of each block of 8 tokens, one token per lane."""
    n_g, nb = yd.shape[0] // 8, yd.shape[1]
    out = np.empty((n_g, nb, 8), np.float32)
    for g in range(n_g):
        for i in range(nb):
            for t in range(8):
                out[g, i, t] = yd[8 * g + t, i]
    return out


@njit(cache=True)
def row8_q4_k(w, yq, yd8, ya8, t, out, r):
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    g = t // 8
    yd, ys = yd8[g], ya8[g]
    pairs = yq.shape[1] // yd.shape[0] // 64  # 4 sub-block pairs per super-block, a count LLVM does not see
    a0, a1, a2, a3, a4, a5, a6, a7 = (
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
        int8.fzero(),
    )
    m0, m1, m2, m3 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = intdot.k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3, i4, i5, i6, i7 = (
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
            int8.izero(),
        )
        for j in range(pairs):
            lo, hi = q4_k_quants(w, o, j)
            sl = np.int32((sc >> np.uint64(16 * j)) & np.uint64(0xFF))
            sh = np.int32((sc >> np.uint64(16 * j + 8)) & np.uint64(0xFF))
            e = float_blocks.QK_K * i + 64 * j
            i0, i1 = (
                int8.iadd(i0, inttiles.dot_pair(lo, hi, y0, e, sl, sh)),
                int8.iadd(i1, inttiles.dot_pair(lo, hi, y1, e, sl, sh)),
            )
            i2, i3 = (
                int8.iadd(i2, inttiles.dot_pair(lo, hi, y2, e, sl, sh)),
                int8.iadd(i3, inttiles.dot_pair(lo, hi, y3, e, sl, sh)),
            )
            i4, i5 = (
                int8.iadd(i4, inttiles.dot_pair(lo, hi, y4, e, sl, sh)),
                int8.iadd(i5, inttiles.dot_pair(lo, hi, y5, e, sl, sh)),
            )
            i6, i7 = (
                int8.iadd(i6, inttiles.dot_pair(lo, hi, y6, e, sl, sh)),
                int8.iadd(i7, inttiles.dot_pair(lo, hi, y7, e, sl, sh)),
            )
        ydi = int8.fload8(yd[i], 0)
        dv = int8.fscale(ydi, simd.load_f16(w, o))
        a0, a1 = int8.fma_int(int8.flane(dv, 0), i0, a0), int8.fma_int(int8.flane(dv, 1), i1, a1)
        a2, a3 = int8.fma_int(int8.flane(dv, 2), i2, a2), int8.fma_int(int8.flane(dv, 3), i3, a3)
        a4, a5 = int8.fma_int(int8.flane(dv, 4), i4, a4), int8.fma_int(int8.flane(dv, 5), i5, a5)
        a6, a7 = int8.fma_int(int8.flane(dv, 6), i6, a6), int8.fma_int(int8.flane(dv, 7), i7, a7)
        dmin = int8.fscale(ydi, -simd.load_f16(w, o + 2))
        ysi = ys[i]
        m0 = int8.fma_intv(dmin, int8.kmin_tokens(ysi, 0, u2, u3, 0), m0)
        m1 = int8.fma_intv(dmin, int8.kmin_tokens(ysi, 16, u2, u3, 1), m1)
        m2 = int8.fma_intv(dmin, int8.kmin_tokens(ysi, 32, u2, u3, 2), m2)
        m3 = int8.fma_intv(dmin, int8.kmin_tokens(ysi, 48, u2, u3, 3), m3)
    mins = int8.fadd8(int8.fadd8(m0, m2), int8.fadd8(m1, m3))
    inttiles.store4(
        out,
        r,
        t,
        int8.fsum(a0) + int8.flane(mins, 0),
        int8.fsum(a1) + int8.flane(mins, 1),
        int8.fsum(a2) + int8.flane(mins, 2),
        int8.fsum(a3) + int8.flane(mins, 3),
    )
    inttiles.store4(
        out,
        r,
        t + 4,
        int8.fsum(a4) + int8.flane(mins, 4),
        int8.fsum(a5) + int8.flane(mins, 5),
        int8.fsum(a6) + int8.flane(mins, 6),
        int8.fsum(a7) + int8.flane(mins, 7),
    )


@njit(inline="always", cache=True)
def close8z_q4_k(w, o, i, yd, ys, u2, u3, i0, i1, i2, i3, a, m):
    """Super-block ``i``'s float steps for 8 tokens (:func:`row8_q4_k`'s, two tokens per vector): ``a`` the 4 pair
    accumulators, ``m`` the 4 min accumulators (one token per lane), both updated."""
    ydi = int8.fload8(yd[i], 0)
    dv = int8.fscale(ydi, simd.load_f16(w, o))
    a = (
        zmm.fma_tokens(int8.flane(dv, 0), int8.flane(dv, 1), i0, a[0]),
        zmm.fma_tokens(int8.flane(dv, 2), int8.flane(dv, 3), i1, a[1]),
        zmm.fma_tokens(int8.flane(dv, 4), int8.flane(dv, 5), i2, a[2]),
        zmm.fma_tokens(int8.flane(dv, 6), int8.flane(dv, 7), i3, a[3]),
    )
    dmin = int8.fscale(ydi, -simd.load_f16(w, o + 2))
    ysi = ys[i]
    m = (
        int8.fma_intv(dmin, int8.kmin_tokens(ysi, 0, u2, u3, 0), m[0]),
        int8.fma_intv(dmin, int8.kmin_tokens(ysi, 16, u2, u3, 1), m[1]),
        int8.fma_intv(dmin, int8.kmin_tokens(ysi, 32, u2, u3, 2), m[2]),
        int8.fma_intv(dmin, int8.kmin_tokens(ysi, 48, u2, u3, 3), m[3]),
    )
    return a, m


@njit(inline="always", cache=True)
def store8z_q4_k(out, r, t, a, m):
    """The 8 outputs of tokens ``t .. t + 7`` of row ``r`` from :func:`close8z_q4_k`'s accumulators."""
    mins = int8.fadd8(int8.fadd8(m[0], m[2]), int8.fadd8(m[1], m[3]))
    inttiles.store4(
        out,
        r,
        t,
        zmm.fsum_token(a[0], 0) + int8.flane(mins, 0),
        zmm.fsum_token(a[0], 1) + int8.flane(mins, 1),
        zmm.fsum_token(a[1], 0) + int8.flane(mins, 2),
        zmm.fsum_token(a[1], 1) + int8.flane(mins, 3),
    )
    inttiles.store4(
        out,
        r,
        t + 4,
        zmm.fsum_token(a[2], 0) + int8.flane(mins, 4),
        zmm.fsum_token(a[2], 1) + int8.flane(mins, 5),
        zmm.fsum_token(a[3], 0) + int8.flane(mins, 6),
        zmm.fsum_token(a[3], 1) + int8.flane(mins, 7),
    )


@njit(inline="always", cache=True)
def sub_pair_scales(sc, j):
    """The scales of sub-blocks 2j and 2j+1 from the 8 scale bytes ``sc`` (k4_scales' first two words)."""
    return (
        np.int32((sc >> np.uint64(16 * j)) & np.uint64(0xFF)),
        np.int32((sc >> np.uint64(16 * j + 8)) & np.uint64(0xFF)),
    )


@njit(inline="always", cache=True)
def dots_q4_k(acc, lo, hi, y, e, sl, sh):
    """One token pair's scaled dot products with a Q4_K sub-block pair (scales ``sl``, ``sh``, activations at
    ``e``)."""
    return zmm.scaled_dots(zmm.scaled_dots(acc, lo, y, e, sl), hi, y, e + 64, sh)


@njit(cache=True)
def row8z_q4_k(w, yq2, yd8, ya8, t, out, r):
    """:func:`row8_q4_k` on 512-bit vectors (:mod:`.zmm`): two tokens per vector, so each sub-block pair is unpacked
    once for 4 vectors instead of 8; the same integers and float steps, so the same outputs bit for bit."""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    yd, ys = yd8[t // 8], ya8[t // 8]
    pairs = yq2.shape[1] // 2 // yd.shape[0] // 64  # 4 sub-block pairs per super-block, a count LLVM does not see
    a, m = (
        (simd.vzero(), simd.vzero(), simd.vzero(), simd.vzero()),
        (int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()),
    )
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = intdot.k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3 = zmm.izero16(), zmm.izero16(), zmm.izero16(), zmm.izero16()
        for j in range(pairs):
            lo, hi = zmm.nibbles_both(w, o + 16 + 32 * j)
            sl, sh = sub_pair_scales(sc, j)
            e = 2 * (float_blocks.QK_K * i + 64 * j)
            i0, i1 = dots_q4_k(i0, lo, hi, y0, e, sl, sh), dots_q4_k(i1, lo, hi, y1, e, sl, sh)
            i2, i3 = dots_q4_k(i2, lo, hi, y2, e, sl, sh), dots_q4_k(i3, lo, hi, y3, e, sl, sh)
        a, m = close8z_q4_k(w, o, i, yd, ys, u2, u3, i0, i1, i2, i3, a, m)
    store8z_q4_k(out, r, t, a, m)


@njit(cache=True)
def row16z_q4_k(w, yq2, yd8, ya8, t, out, r):
    """:func:`row8z_q4_k` for 16 tokens (``t`` a multiple of 16): each sub-block pair unpacked once for 8 vectors.
    (Keeping the float state in memory between chunks of super-blocks, so that a chunk's activations stay in L1
    for long rows, measured slower: docs/PERFORMANCE.md.)"""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    y4, y5, y6, y7 = yq2[p + 4], yq2[p + 5], yq2[p + 6], yq2[p + 7]
    yd, ys, yd_, ys_ = yd8[t // 8], ya8[t // 8], yd8[t // 8 + 1], ya8[t // 8 + 1]
    pairs = yq2.shape[1] // 2 // yd.shape[0] // 64
    a, m = (
        (simd.vzero(), simd.vzero(), simd.vzero(), simd.vzero()),
        (int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()),
    )
    a_, m_ = (
        (simd.vzero(), simd.vzero(), simd.vzero(), simd.vzero()),
        (int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()),
    )
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = intdot.k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3 = zmm.izero16(), zmm.izero16(), zmm.izero16(), zmm.izero16()
        i4, i5, i6, i7 = zmm.izero16(), zmm.izero16(), zmm.izero16(), zmm.izero16()
        for j in range(pairs):
            lo, hi = zmm.nibbles_both(w, o + 16 + 32 * j)
            sl, sh = sub_pair_scales(sc, j)
            e = 2 * (float_blocks.QK_K * i + 64 * j)
            i0, i1 = dots_q4_k(i0, lo, hi, y0, e, sl, sh), dots_q4_k(i1, lo, hi, y1, e, sl, sh)
            i2, i3 = dots_q4_k(i2, lo, hi, y2, e, sl, sh), dots_q4_k(i3, lo, hi, y3, e, sl, sh)
            i4, i5 = dots_q4_k(i4, lo, hi, y4, e, sl, sh), dots_q4_k(i5, lo, hi, y5, e, sl, sh)
            i6, i7 = dots_q4_k(i6, lo, hi, y6, e, sl, sh), dots_q4_k(i7, lo, hi, y7, e, sl, sh)
        a, m = close8z_q4_k(w, o, i, yd, ys, u2, u3, i0, i1, i2, i3, a, m)
        a_, m_ = close8z_q4_k(w, o, i, yd_, ys_, u2, u3, i4, i5, i6, i7, a_, m_)
    store8z_q4_k(out, r, t, a, m)
    store8z_q4_k(out, r, t + 8, a_, m_)


@njit(cache=True)
def group_q4_k(w, yq, yd, ya, yd8, ya8, yq2, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 8 tokens by :func:`row8z_q4_k` where ``yq2`` holds the token pairs
    (AVX-512 VNNI), else by :func:`row8_q4_k`; the rest by 4-token tiles."""
    n_tok = out.shape[0]
    full = n_tok - n_tok % inttiles.TILE8_TOKENS
    full16 = n_tok - n_tok % 16 if yq2.shape[0] else 0
    for t in range(0, full16, 16):
        for r in range(lo, hi):
            row16z_q4_k(w[r], yq2, yd8, ya8, t, out, r)
    for t in range(full16, full, inttiles.TILE8_TOKENS):
        for r in range(lo, hi):
            if yq2.shape[0]:
                row8z_q4_k(w[r], yq2, yd8, ya8, t, out, r)
            else:
                row8_q4_k(w[r], yq, yd8, ya8, t, out, r)
    inttiles.tile_rows(tile_q4_k, w, yq, yd, ya, out, lo, hi, full)


@njit(inline="always", cache=True)
def tiled_loop_q4_k(w, yq, yd, ya, out):
    """Row groups split over threads, each by :func:`group_q4_k`."""
    n = out.shape[1]
    yd8, ya8 = scales8(yd), bsum_pairs8(ya)
    ya = intdot.bsum_pairs(ya)
    yq2 = inttiles.token_pairs(yq) if zmm.has_zmm_vnni() else np.empty((0, 0), np.uint8)
    for g in prange((n + inttiles.GROUP_ROWS - 1) // inttiles.GROUP_ROWS):
        group_q4_k(
            w,
            yq,
            yd,
            ya,
            yd8,
            ya8,
            yq2,
            out,
            g * inttiles.GROUP_ROWS,
            min(g * inttiles.GROUP_ROWS + inttiles.GROUP_ROWS, n),
        )


# --- llama.cpp's tiled mat-mul (AVX-512 VNNI, 8 tokens or more: :mod:`..ktiles`) ---------------------------------
@njit(inline="always", cache=True)
def unpack_rows_q4_k(w, r, codes, sc, mn, dd, dm):
    """Rows ``r .. r + 7``: their quants in element order, one a byte (0..15; ggml's ``tiled_unpack_src0``), the
    6-bit sub-block scales and mins as int32, ``d`` and ``dmin`` as float32."""
    nibbles = np.uint64(0x0F0F0F0F0F0F0F0F)
    for j in range(codes.shape[0]):
        row = w[r + j]
        row8, dst8 = row.view(np.uint64), codes[j].view(np.uint64)  # 8 quants a word: 3x faster than a byte loop
        for i in range(dd.shape[1]):
            o, e = 18 * i, 32 * i  # a block is 18 words, its quants 32
            for c in range(4):
                for l in range(4):
                    v = row8[o + 2 + 4 * c + l]
                    dst8[e + 8 * c + l] = v & nibbles
                    dst8[e + 8 * c + 4 + l] = (v >> np.uint64(4)) & nibbles
            ktiles.k4_scales_mins(row, 144 * i, j, i, sc, mn, dd, dm)
