"""Register-tiled integer-dot mat-mat kernels (``ggml`` numerics, prefill and batched decode): ``out (T, N)``.

:mod:`.intdot`'s ``matmul_<type>`` keeps a pair of weight rows in L1 while every token passes by, but unpacks each
weight block again for every token. Here a tile of ``2`` rows x ``TILE_TOKENS = 4`` tokens is computed at once:
each weight block (nibbles, fifth/sixth bits, scales) is unpacked into int8 vectors ONCE and multiplied with the
4 tokens' quantized activations. For Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 both rows share one loop (each activation
load serves both; the hot loop holds 8 float accumulators, the 2 rows' quants and one activation vector in the 16
ymm registers of AVX2). For Q4_K and Q5_K, whose super-blocks carry many more scales, each row of the tile runs a
loop of its own over 4 tokens (4 integer + 4 float accumulator sets, one row's quants and scales): the two rows
interleaved in one loop spilled about a third of the loop's instructions to the stack; measured one row per loop
vs both rows in one (CPU time, 1 thread): Q4_K the same, Q5_K 0-8% faster, Q6_K 5-14% slower (so Q6_K keeps both
rows in one loop). The min terms of Q4_K / Q5_K are computed in vector code (:func:`.int8.kmin_pairs`, ggml's
``madd(mins, hadd(bsums))``), with the ``hadd`` of the activation's block sums done once per token
(:func:`.intdot.bsum_pairs`) instead of once per row and token: 10-15% off the Q4_K tile's CPU time here. The
K-quants then take blocks of 8 tokens per row (:func:`row8_q4_k`...) before the 4-token tiles: see the section below.
On AVX-512 VNNI (:func:`.zmm.has_zmm_vnni`) Q4_K and Q6_K first take blocks of 16 tokens, two tokens per 512-bit
vector (:func:`row16z_q4_k`, :func:`row16z_q6_k`; Q4_K's 8-token remainder :func:`row8z_q4_k`), on activations
laid out in token pairs (:func:`token_pairs`). Measured on the Xeon VM (CPU time, 1 thread, 512 tokens, best of
7-9): Q4_K 8960x1536 122 -> 90 ms; the 1.5B's 512-token prefill (``bench``, 2 threads) 75 -> 91-92 tokens/s.

Every output's arithmetic is :mod:`.intdot`'s ``pair_<type>`` / ``row_dot_<type>``: the same integer block dot
(integer sums in any order are the same integers) and the same float steps in the same order (block scale product,
``fma_int``, the constant terms, ``fsum``), so the outputs equal the mat-vec's bit for bit, hence libggml's AVX2
``vec_dot`` (tested). Remainder tokens (``T`` not a multiple of 4) repeat the last token in the tile (its outputs are
written again with the same value); an odd last row is paired with itself, as in the pair kernels.

Loop order: the rows are split over threads in groups of ``GROUP_ROWS`` (their weights, up to ~120 KB, stay in L2
while all token tiles pass); within a group, for each tile of 4 tokens (its activations: 4 x n_in bytes, in L1
for 1536 inputs), every row pair of the group. Each weight byte comes from memory once per call.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.intdot import QK_K, bsum_pairs, byte, five_bits, k4_scales
from inference_engine.backends.numba_kernels.isa.int8 import (
    band8,
    bor8,
    bshl8,
    bshr8,
    dot4,
    dot4_scaled,
    dot4_signed,
    fadd8,
    flane,
    fload8,
    fma_int,
    fma_intv,
    fscale,
    fsum,
    fzero,
    iadd,
    ihsum,
    iload,
    ishl,
    isub,
    izero,
    kmin_pairs,
    kmin_tokens,
    load32,
    madd16,
    nibbles32,
)
from inference_engine.backends.numba_kernels.isa.simd import fma32, load_f16, vzero
from inference_engine.backends.numba_kernels.isa.zmm import (
    fma_tokens,
    fsum_token,
    has_zmm_vnni,
    izero16,
    minus_bsums32,
    nibbles_both,
    q6_quants_both,
    scaled_dots,
    scaled_dots2,
)

_F32 = np.float32
TILE_TOKENS = 4  # tokens per register tile (the kernels below are written out for 4)
# Rows per thread task: 16 rows of the 1.5B's widest rows (Q6_K, 8960 inputs) are 118 KB, within L2.
GROUP_ROWS = 16


@njit(inline="always", cache=True)
def store_tile(out, r0, r1, t0, t1, t2, t3, v):
    out[t0, r0], out[t1, r0], out[t2, r0], out[t3, r0] = v[0], v[1], v[2], v[3]
    out[t0, r1], out[t1, r1], out[t2, r1], out[t3, r1] = v[4], v[5], v[6], v[7]


# --- Q4_0, Q5_0 (ya: int32 sums of four quants), Q4_1, Q5_1 (ya: float32 block sums s), Q8_0 ----------------------
@njit(inline="always", cache=True)
def step_offset(x0, x1, f0, f1, yq, yd, ya, b, shift, a0, a1):
    """pair_q4_0 / pair_q5_0's block step for one token and both rows: ``(d_w d_y) * (dot4(q, y) - 8|16 sum4)``."""
    y, yo = load32(yq, 32 * b), ishl(iload(ya, 8 * b), shift)
    a0 = fma_int(f0 * yd[b], isub(dot4(x0, y), yo), a0)
    a1 = fma_int(f1 * yd[b], isub(dot4(x1, y), yo), a1)
    return a0, a1


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for b in range(d0.shape[0]):
        o = 18 * b
        x0, x1 = nibbles32(w0, o + 2), nibbles32(w1, o + 2)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_offset(x0, x1, f0, f1, y0, d0, s0, b, 3, a00, a10)
        a01, a11 = step_offset(x0, x1, f0, f1, y1, d1, s1, b, 3, a01, a11)
        a02, a12 = step_offset(x0, x1, f0, f1, y2, d2, s2, b, 3, a02, a12)
        a03, a13 = step_offset(x0, x1, f0, f1, y3, d3, s3, b, 3, a03, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for b in range(d0.shape[0]):
        o = 22 * b
        x0, x1 = five_bits(w0, o + 2, o + 6), five_bits(w1, o + 2, o + 6)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_offset(x0, x1, f0, f1, y0, d0, s0, b, 4, a00, a10)
        a01, a11 = step_offset(x0, x1, f0, f1, y1, d1, s1, b, 4, a01, a11)
        a02, a12 = step_offset(x0, x1, f0, f1, y2, d2, s2, b, 4, a02, a12)
        a03, a13 = step_offset(x0, x1, f0, f1, y3, d3, s3, b, 4, a03, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


@njit(inline="always", cache=True)
def step_min(x0, x1, f0, f1, m0, m1, yq, yd, ya, b, st0, st1):
    """pair_q4_1 / pair_q5_1's block step: ``acc += (d_w d_y) * dot4(q, y)``, ``c += m * s`` (state (acc, c))."""
    y = load32(yq, 32 * b)
    st0 = (fma_int(f0 * yd[b], dot4(x0, y), st0[0]), fma32(m0, ya[b], st0[1]))
    st1 = (fma_int(f1 * yd[b], dot4(x1, y), st1[0]), fma32(m1, ya[b], st1[1]))
    return st0, st1


@njit(inline="always", cache=True)
def close_min(st):
    return fsum(st[0]) + st[1]


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_1(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    z = (fzero(), _F32(0.0))
    a00, a01, a02, a03, a10, a11, a12, a13 = z, z, z, z, z, z, z, z
    for b in range(d0.shape[0]):
        o = 20 * b
        x0, x1 = nibbles32(w0, o + 4), nibbles32(w1, o + 4)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        m0, m1 = load_f16(w0, o + 2), load_f16(w1, o + 2)
        a00, a10 = step_min(x0, x1, f0, f1, m0, m1, y0, d0, s0, b, a00, a10)
        a01, a11 = step_min(x0, x1, f0, f1, m0, m1, y1, d1, s1, b, a01, a11)
        a02, a12 = step_min(x0, x1, f0, f1, m0, m1, y2, d2, s2, b, a02, a12)
        a03, a13 = step_min(x0, x1, f0, f1, m0, m1, y3, d3, s3, b, a03, a13)
    return (close_min(a00), close_min(a01), close_min(a02), close_min(a03),
            close_min(a10), close_min(a11), close_min(a12), close_min(a13))


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_1(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    z = (fzero(), _F32(0.0))
    a00, a01, a02, a03, a10, a11, a12, a13 = z, z, z, z, z, z, z, z
    for b in range(d0.shape[0]):
        o = 24 * b
        x0, x1 = five_bits(w0, o + 4, o + 8), five_bits(w1, o + 4, o + 8)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        m0, m1 = load_f16(w0, o + 2), load_f16(w1, o + 2)
        a00, a10 = step_min(x0, x1, f0, f1, m0, m1, y0, d0, s0, b, a00, a10)
        a01, a11 = step_min(x0, x1, f0, f1, m0, m1, y1, d1, s1, b, a01, a11)
        a02, a12 = step_min(x0, x1, f0, f1, m0, m1, y2, d2, s2, b, a02, a12)
        a03, a13 = step_min(x0, x1, f0, f1, m0, m1, y3, d3, s3, b, a03, a13)
    return (close_min(a00), close_min(a01), close_min(a02), close_min(a03),
            close_min(a10), close_min(a11), close_min(a12), close_min(a13))


@njit(inline="always", cache=True)
def step_q8_0(x0, x1, f0, f1, yq, yd, b, a0, a1):
    y = load32(yq, 32 * b)
    return fma_int(f0 * yd[b], dot4_signed(x0, y), a0), fma_int(f1 * yd[b], dot4_signed(x1, y), a1)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q8_0(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for b in range(d0.shape[0]):
        o = 34 * b
        x0, x1 = load32(w0, o + 2), load32(w1, o + 2)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_q8_0(x0, x1, f0, f1, y0, d0, b, a00, a10)
        a01, a11 = step_q8_0(x0, x1, f0, f1, y1, d1, b, a01, a11)
        a02, a12 = step_q8_0(x0, x1, f0, f1, y2, d2, b, a02, a12)
        a03, a13 = step_q8_0(x0, x1, f0, f1, y3, d3, b, a03, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


# --- K-quants ------------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def sub_scales(t_lo, t_hi, j):
    """Scales of sub-blocks 2j, 2j+1 (Q4_K / Q5_K, as q4_k_sumi reads them)."""
    word = t_lo if j < 2 else t_hi
    return byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)


@njit(inline="always", cache=True)
def dot_pair(lo, hi, yq, e, sl, sh):
    return iadd(dot4_scaled(lo, load32(yq, e), sl, sl), dot4_scaled(hi, load32(yq, e + 32), sh, sh))


@njit(inline="always", cache=True)
def q4_k_quants(row, o, j):
    q = load32(row, o + 16 + 32 * j)
    return band8(q, 15), band8(bshr8(q, 4), 15)


@njit(inline="always", cache=True)
def q5_k_quants(row, o, j):
    hbits = load32(row, o + 16)
    q = load32(row, o + 48 + 32 * j)
    h = bshr8(hbits, 2 * j)
    q0 = bor8(band8(q, 15), bshl8(band8(h, 1), 4))
    q1 = bor8(band8(bshr8(q, 4), 15), bshl8(band8(bshr8(h, 1), 1), 4))
    return q0, q1


@njit(inline="always", cache=True)
def close_q4_k(row, o, ydi, ys, i, t_mlo, t_mhi, sumi, st):
    """row_dot_q4_k's per-super-block float steps for one output; state (acc, macc): ``macc`` holds row_dot_q4_k's
    four min accumulators m0..m3 in lanes 0..3 (lanes 4..7 stay +0, so ``fsum(macc)`` is its
    ``(m0 + m2) + (m1 + m3)``), updated by the same one-rounding ``fma(dmin, s_k, m_k)`` per lane."""
    dmin = -ydi * load_f16(row, o + 2)
    return fma_int(ydi * load_f16(row, o), sumi, st[0]), fma_int(dmin, kmin_pairs(ys, 8 * i, t_mlo, t_mhi), st[1])


@njit(inline="always", cache=True)
def final_q4_k(st):
    return fsum(st[0]) + fsum(st[1])


@njit(inline="always", cache=True)
def close_q5_k(row, o, ydi, ys, i, t_mlo, t_mhi, sumi, st):
    """row_dot_q5_k's per-super-block float steps for one output; state (acc, c)."""
    dmin = -ydi * load_f16(row, o + 2)
    mins = _F32(ihsum(kmin_pairs(ys, 8 * i, t_mlo, t_mhi)))
    return fma_int(ydi * load_f16(row, o), sumi, st[0]), fma32(dmin, mins, st[1])


@njit(inline="always", cache=True)
def row_q4_k(row, o, e, y0, y1, y2, y3, u_lo, u_hi):
    """One row's integer sums of super-block at ``o`` (activations from element ``e``) with 4 tokens."""
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for j in range(4):
        lo, hi = q4_k_quants(row, o, j)
        sl, sh = sub_scales(u_lo, u_hi, j)
        ej = e + 64 * j
        i0, i1 = iadd(i0, dot_pair(lo, hi, y0, ej, sl, sh)), iadd(i1, dot_pair(lo, hi, y1, ej, sl, sh))
        i2, i3 = iadd(i2, dot_pair(lo, hi, y2, ej, sl, sh)), iadd(i3, dot_pair(lo, hi, y3, ej, sl, sh))
    return i0, i1, i2, i3


@njit(inline="always", cache=True)
def row_q5_k(row, o, e, y0, y1, y2, y3, u_lo, u_hi):
    i0, i1, i2, i3 = izero(), izero(), izero(), izero()
    for j in range(4):
        lo, hi = q5_k_quants(row, o, j)
        sl, sh = sub_scales(u_lo, u_hi, j)
        ej = e + 64 * j
        i0, i1 = iadd(i0, dot_pair(lo, hi, y0, ej, sl, sh)), iadd(i1, dot_pair(lo, hi, y1, ej, sl, sh))
        i2, i3 = iadd(i2, dot_pair(lo, hi, y2, ej, sl, sh)), iadd(i3, dot_pair(lo, hi, y3, ej, sl, sh))
    return i0, i1, i2, i3


@njit(inline="always", cache=True)
def row_tile_q4_k(w, yq, yd, ya, t0, t1, t2, t3):
    """One row x 4 tokens, the whole row, in a loop of its own (see the module's docstring)."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a0, a1, a2, a3 = (fzero(), fzero()), (fzero(), fzero()), (fzero(), fzero()), (fzero(), fzero())
    for i in range(d0.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q4_k(w, o, QK_K * i, y0, y1, y2, y3, u0, u1)
        a0 = close_q4_k(w, o, d0[i], s0, i, u2, u3, i0, a0)
        a1 = close_q4_k(w, o, d1[i], s1, i, u2, u3, i1, a1)
        a2 = close_q4_k(w, o, d2[i], s2, i, u2, u3, i2, a2)
        a3 = close_q4_k(w, o, d3[i], s3, i, u2, u3, i3, a3)
    return final_q4_k(a0), final_q4_k(a1), final_q4_k(a2), final_q4_k(a3)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q4_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    v00, v01, v02, v03 = row_tile_q4_k(w0, yq, yd, ya, t0, t1, t2, t3)
    v10, v11, v12, v13 = row_tile_q4_k(w1, yq, yd, ya, t0, t1, t2, t3)
    return v00, v01, v02, v03, v10, v11, v12, v13


@njit(inline="always", cache=True)
def row_tile_q5_k(w, yq, yd, ya, t0, t1, t2, t3):
    """As row_tile_q4_k."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a0, a1, a2, a3 = (fzero(), _F32(0.0)), (fzero(), _F32(0.0)), (fzero(), _F32(0.0)), (fzero(), _F32(0.0))
    for i in range(d0.shape[0]):
        o = 176 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q5_k(w, o, QK_K * i, y0, y1, y2, y3, u0, u1)
        a0 = close_q5_k(w, o, d0[i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, d1[i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, d2[i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, d3[i], s3, i, u2, u3, i3, a3)
    return close_min(a0), close_min(a1), close_min(a2), close_min(a3)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q5_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    v00, v01, v02, v03 = row_tile_q5_k(w0, yq, yd, ya, t0, t1, t2, t3)
    v10, v11, v12, v13 = row_tile_q5_k(w1, yq, yd, ya, t0, t1, t2, t3)
    return v00, v01, v02, v03, v10, v11, v12, v13


@njit(inline="always", cache=True)
def q6_k_quants(row, o, j):
    """The four 32-quant vectors of half ``j`` of a Q6_K super-block (as q6_k_sumi unpacks them)."""
    ql0, ql1 = load32(row, o + 64 * j), load32(row, o + 64 * j + 32)
    qh = load32(row, o + 128 + 32 * j)
    q0 = bor8(band8(ql0, 15), bshl8(band8(qh, 3), 4))
    q1 = bor8(band8(ql1, 15), bshl8(band8(bshr8(qh, 2), 3), 4))
    q2 = bor8(bshr8(ql0, 4), bshl8(band8(bshr8(qh, 4), 3), 4))
    q3 = bor8(bshr8(ql1, 4), bshl8(bshr8(qh, 6), 4))
    return q0, q1, q2, q3


@njit(inline="always", cache=True)
def dot_q6_k(q0, q1, q2, q3, row, sc, yq, y):
    p0 = dot4_scaled(q0, load32(yq, y), np.int8(row[sc]), np.int8(row[sc + 1]))
    p1 = dot4_scaled(q1, load32(yq, y + 32), np.int8(row[sc + 2]), np.int8(row[sc + 3]))
    p2 = dot4_scaled(q2, load32(yq, y + 64), np.int8(row[sc + 4]), np.int8(row[sc + 5]))
    p3 = dot4_scaled(q3, load32(yq, y + 96), np.int8(row[sc + 6]), np.int8(row[sc + 7]))
    return iadd(iadd(p0, p1), iadd(p2, p3))


@njit(inline="always", cache=True)
def close_q6_k(row, o, ydi, ys, i, sumi, acc):
    return fma_int(ydi * load_f16(row, o + 208), isub(sumi, ishl(madd16(ys, 16 * i, row, o + 192), 5)), acc)


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q6_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = fzero(), fzero(), fzero(), fzero()
    a10, a11, a12, a13 = fzero(), fzero(), fzero(), fzero()
    for i in range(d0.shape[0]):
        o = 210 * i
        i00, i01, i02, i03 = izero(), izero(), izero(), izero()
        i10, i11, i12, i13 = izero(), izero(), izero(), izero()
        for j in range(2):
            e, sc = QK_K * i + 128 * j, o + 192 + 8 * j
            q00, q01, q02, q03 = q6_k_quants(w0, o, j)
            q10, q11, q12, q13 = q6_k_quants(w1, o, j)
            i00 = iadd(i00, dot_q6_k(q00, q01, q02, q03, w0, sc, y0, e))
            i01 = iadd(i01, dot_q6_k(q00, q01, q02, q03, w0, sc, y1, e))
            i02 = iadd(i02, dot_q6_k(q00, q01, q02, q03, w0, sc, y2, e))
            i03 = iadd(i03, dot_q6_k(q00, q01, q02, q03, w0, sc, y3, e))
            i10 = iadd(i10, dot_q6_k(q10, q11, q12, q13, w1, sc, y0, e))
            i11 = iadd(i11, dot_q6_k(q10, q11, q12, q13, w1, sc, y1, e))
            i12 = iadd(i12, dot_q6_k(q10, q11, q12, q13, w1, sc, y2, e))
            i13 = iadd(i13, dot_q6_k(q10, q11, q12, q13, w1, sc, y3, e))
        a00 = close_q6_k(w0, o, d0[i], s0, i, i00, a00)
        a01 = close_q6_k(w0, o, d1[i], s1, i, i01, a01)
        a02 = close_q6_k(w0, o, d2[i], s2, i, i02, a02)
        a03 = close_q6_k(w0, o, d3[i], s3, i, i03, a03)
        a10 = close_q6_k(w1, o, d0[i], s0, i, i10, a10)
        a11 = close_q6_k(w1, o, d1[i], s1, i, i11, a11)
        a12 = close_q6_k(w1, o, d2[i], s2, i, i12, a12)
        a13 = close_q6_k(w1, o, d3[i], s3, i, i13, a13)
    return fsum(a00), fsum(a01), fsum(a02), fsum(a03), fsum(a10), fsum(a11), fsum(a12), fsum(a13)


# --- K-quants, 1 row x 8 tokens ---------------------------------------------------------------------------------
# The K-quants' per-row work (scales, mins, unpacking 4 / 5 / 6-bit quants) is a large share of a super-block's
# instructions; 8 tokens per unpacked row halve it per token against the 4-token tiles above. The integer sums of
# the 8 tokens stay in registers; the float states (touched once per super-block) may live on the stack. Measured
# (CPU time, 1 thread, 128 tokens, Qwen2.5-1.5B shapes, best of 15): Q4_K 8960x1536 50 -> 44 ms, Q6_K 1536x8960
# 45 -> 39 ms. Full blocks of 8 tokens go through these; the rest of T through the 4-token tiles (the same outputs).
TILE8_TOKENS = 8


@njit(inline="always", cache=True)
def store4(out, r, t, v0, v1, v2, v3):
    out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = v0, v1, v2, v3


@njit(cache=True)
def row8_q5_k(w, yq, yd, ya, t, out, r):
    """As row8_q4_k."""
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    s0, s1, s2, s3 = ya[t], ya[t + 1], ya[t + 2], ya[t + 3]
    s4, s5, s6, s7 = ya[t + 4], ya[t + 5], ya[t + 6], ya[t + 7]
    z = (fzero(), _F32(0.0))
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 176 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = row_q5_k(w, o, QK_K * i, y0, y1, y2, y3, u0, u1)
        i4, i5, i6, i7 = row_q5_k(w, o, QK_K * i, y4, y5, y6, y7, u0, u1)
        a0 = close_q5_k(w, o, yd[t, i], s0, i, u2, u3, i0, a0)
        a1 = close_q5_k(w, o, yd[t + 1, i], s1, i, u2, u3, i1, a1)
        a2 = close_q5_k(w, o, yd[t + 2, i], s2, i, u2, u3, i2, a2)
        a3 = close_q5_k(w, o, yd[t + 3, i], s3, i, u2, u3, i3, a3)
        a4 = close_q5_k(w, o, yd[t + 4, i], s4, i, u2, u3, i4, a4)
        a5 = close_q5_k(w, o, yd[t + 5, i], s5, i, u2, u3, i5, a5)
        a6 = close_q5_k(w, o, yd[t + 6, i], s6, i, u2, u3, i6, a6)
        a7 = close_q5_k(w, o, yd[t + 7, i], s7, i, u2, u3, i7, a7)
    store4(out, r, t, close_min(a0), close_min(a1), close_min(a2), close_min(a3))
    store4(out, r, t + 4, close_min(a4), close_min(a5), close_min(a6), close_min(a7))


@njit(inline="always", cache=True)
def sumi_q6_k(q0, q1, q2, q3, w, sc, yq, e, acc):
    return iadd(acc, dot_q6_k(q0, q1, q2, q3, w, sc, yq, e))


@njit(cache=True)
def row8_q6_k(w, yq, yd, ya, t, out, r):
    """As row8_q4_k (``ya``: the tokens' block sums)."""
    y0, y1, y2, y3 = yq[t], yq[t + 1], yq[t + 2], yq[t + 3]
    y4, y5, y6, y7 = yq[t + 4], yq[t + 5], yq[t + 6], yq[t + 7]
    s0, s1, s2, s3 = ya[t], ya[t + 1], ya[t + 2], ya[t + 3]
    s4, s5, s6, s7 = ya[t + 4], ya[t + 5], ya[t + 6], ya[t + 7]
    z = fzero()
    a0, a1, a2, a3, a4, a5, a6, a7 = z, z, z, z, z, z, z, z
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3, i4, i5, i6, i7 = izero(), izero(), izero(), izero(), izero(), izero(), izero(), izero()
        for j in range(2):
            e, sc = QK_K * i + 128 * j, o + 192 + 8 * j
            q0, q1, q2, q3 = q6_k_quants(w, o, j)
            i0, i1 = sumi_q6_k(q0, q1, q2, q3, w, sc, y0, e, i0), sumi_q6_k(q0, q1, q2, q3, w, sc, y1, e, i1)
            i2, i3 = sumi_q6_k(q0, q1, q2, q3, w, sc, y2, e, i2), sumi_q6_k(q0, q1, q2, q3, w, sc, y3, e, i3)
            i4, i5 = sumi_q6_k(q0, q1, q2, q3, w, sc, y4, e, i4), sumi_q6_k(q0, q1, q2, q3, w, sc, y5, e, i5)
            i6, i7 = sumi_q6_k(q0, q1, q2, q3, w, sc, y6, e, i6), sumi_q6_k(q0, q1, q2, q3, w, sc, y7, e, i7)
        a0 = close_q6_k(w, o, yd[t, i], s0, i, i0, a0)
        a1 = close_q6_k(w, o, yd[t + 1, i], s1, i, i1, a1)
        a2 = close_q6_k(w, o, yd[t + 2, i], s2, i, i2, a2)
        a3 = close_q6_k(w, o, yd[t + 3, i], s3, i, i3, a3)
        a4 = close_q6_k(w, o, yd[t + 4, i], s4, i, i4, a4)
        a5 = close_q6_k(w, o, yd[t + 5, i], s5, i, i5, a5)
        a6 = close_q6_k(w, o, yd[t + 6, i], s6, i, i6, a6)
        a7 = close_q6_k(w, o, yd[t + 7, i], s7, i, i7, a7)
    store4(out, r, t, fsum(a0), fsum(a1), fsum(a2), fsum(a3))
    store4(out, r, t + 4, fsum(a4), fsum(a5), fsum(a6), fsum(a7))


# --- the kernels ---------------------------------------------------------------------------------------------------
# Written out per type (not made by a factory), for the reason given in intdot.py (Numba's cache and closures).


@njit(parallel=True, cache=True)
def tiled_q4_0(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q4_0(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q4_1(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q4_1(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q5_0(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q5_0(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q5_1(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q5_1(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q8_0(w, yq, yd, ya, out):
    n_tok, n = out.shape
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        for t in range(0, n_tok, TILE_TOKENS):
            t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
            for r0 in range(g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 2):
                r1 = min(r0 + 1, n - 1)
                store_tile(out, r0, r1, t, t1, t2, t3, tile_q8_0(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(cache=True)
def group_q5_k(w, yq, yd, ya, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 8 tokens by :func:`row8_q5_k`, the rest by 4-token tiles."""
    n_tok, n = out.shape
    full = n_tok - n_tok % TILE8_TOKENS
    for t in range(0, full, TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q5_k(w[r], yq, yd, ya, t, out, r)
    for t in range(full, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile_q5_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q5_k(w, yq, yd, ya, out):
    n = out.shape[1]
    ya = bsum_pairs(ya)
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        group_q5_k(w, yq, yd, ya, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n))


@njit(inline="always", cache=True)
def dots_q6_k(acc, q0, q1, q2, q3, w, sc, y, e):
    """One token pair's scaled dot products with half a Q6_K super-block (scales at ``sc``, activations at ``e``)."""
    acc = scaled_dots2(acc, q0, y, e, np.int8(w[sc]), np.int8(w[sc + 1]))
    acc = scaled_dots2(acc, q1, y, e + 64, np.int8(w[sc + 2]), np.int8(w[sc + 3]))
    acc = scaled_dots2(acc, q2, y, e + 128, np.int8(w[sc + 4]), np.int8(w[sc + 5]))
    return scaled_dots2(acc, q3, y, e + 192, np.int8(w[sc + 6]), np.int8(w[sc + 7]))


@njit(inline="always", cache=True)
def close_pair_q6_k(w, o, i, yd, ya, t, sumi, acc):
    """Tokens ``t`` and ``t + 1``'s super-block step (:func:`close_q6_k` for both, two tokens per vector)."""
    dw = load_f16(w, o + 208)
    sumi = minus_bsums32(sumi, ya[t], ya[t + 1], 16 * i, w, o + 192)
    return fma_tokens(yd[t, i] * dw, yd[t + 1, i] * dw, sumi, acc)


@njit(cache=True)
def row16z_q6_k(w, yq2, yd, ya, t, out, r):
    """:func:`row8_q6_k` for 16 tokens on 512-bit vectors (:mod:`.zmm`, two tokens per vector): each half
    super-block unpacked once for 8 vectors; the same integers and float steps, so the same outputs bit for bit."""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    y4, y5, y6, y7 = yq2[p + 4], yq2[p + 5], yq2[p + 6], yq2[p + 7]
    a0, a1, a2, a3, a4, a5, a6, a7 = vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero()
    for i in range(yd.shape[1]):
        o = 210 * i
        i0, i1, i2, i3 = izero16(), izero16(), izero16(), izero16()
        i4, i5, i6, i7 = izero16(), izero16(), izero16(), izero16()
        for j in range(2):
            e, sc = 2 * (QK_K * i + 128 * j), o + 192 + 8 * j
            q0, q1, q2, q3 = q6_quants_both(w, o, j)
            i0, i1 = dots_q6_k(i0, q0, q1, q2, q3, w, sc, y0, e), dots_q6_k(i1, q0, q1, q2, q3, w, sc, y1, e)
            i2, i3 = dots_q6_k(i2, q0, q1, q2, q3, w, sc, y2, e), dots_q6_k(i3, q0, q1, q2, q3, w, sc, y3, e)
            i4, i5 = dots_q6_k(i4, q0, q1, q2, q3, w, sc, y4, e), dots_q6_k(i5, q0, q1, q2, q3, w, sc, y5, e)
            i6, i7 = dots_q6_k(i6, q0, q1, q2, q3, w, sc, y6, e), dots_q6_k(i7, q0, q1, q2, q3, w, sc, y7, e)
        a0, a1 = close_pair_q6_k(w, o, i, yd, ya, t, i0, a0), close_pair_q6_k(w, o, i, yd, ya, t + 2, i1, a1)
        a2, a3 = close_pair_q6_k(w, o, i, yd, ya, t + 4, i2, a2), close_pair_q6_k(w, o, i, yd, ya, t + 6, i3, a3)
        a4, a5 = close_pair_q6_k(w, o, i, yd, ya, t + 8, i4, a4), close_pair_q6_k(w, o, i, yd, ya, t + 10, i5, a5)
        a6, a7 = close_pair_q6_k(w, o, i, yd, ya, t + 12, i6, a6), close_pair_q6_k(w, o, i, yd, ya, t + 14, i7, a7)
    store4(out, r, t, fsum_token(a0, 0), fsum_token(a0, 1), fsum_token(a1, 0), fsum_token(a1, 1))
    store4(out, r, t + 4, fsum_token(a2, 0), fsum_token(a2, 1), fsum_token(a3, 0), fsum_token(a3, 1))
    store4(out, r, t + 8, fsum_token(a4, 0), fsum_token(a4, 1), fsum_token(a5, 0), fsum_token(a5, 1))
    store4(out, r, t + 12, fsum_token(a6, 0), fsum_token(a6, 1), fsum_token(a7, 0), fsum_token(a7, 1))


@njit(cache=True)
def group_q6_k(w, yq, yd, ya, yq2, out, lo, hi):
    """Rows ``lo .. hi`` x every token: blocks of 16 tokens by :func:`row16z_q6_k` where ``yq2`` holds the token
    pairs (AVX-512 VNNI), then blocks of 8 by :func:`row8_q6_k`, the rest by 4-token tiles."""
    n_tok, n = out.shape
    full16 = n_tok - n_tok % 16 if yq2.shape[0] else 0
    for t in range(0, full16, 16):
        for r in range(lo, hi):
            row16z_q6_k(w[r], yq2, yd, ya, t, out, r)
    full = n_tok - n_tok % TILE8_TOKENS
    for t in range(full16, full, TILE8_TOKENS):
        for r in range(lo, hi):
            row8_q6_k(w[r], yq, yd, ya, t, out, r)
    for t in range(full, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile_q6_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q6_k(w, yq, yd, ya, out):
    n = out.shape[1]
    yq2 = token_pairs(yq) if has_zmm_vnni() else np.empty((0, 0), np.uint8)
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        group_q6_k(w, yq, yd, ya, yq2, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n))


# --- Q4_K, 8 tokens at a time, the sub-block loop kept -----------------------------------------------------------
# row8_q4_k keeps the 4 sub-block pairs as a loop (a count LLVM cannot see), so the 8 tokens' integer sums stay in
# registers instead of being spilled, and makes the min terms and d_w * d_y for the 8 tokens at once from the
# activation's scales and block-sum pairs laid out per 8-token block (scales8, bsum_pairs8). Measured (CPU time,
# 1 thread, 128 tokens, 2-core AMD EPYC, AVX2, best of 9): Q4_K 8960x1536 41.1 -> 33.8 ms, 1536x8960 47.4 -> 34.9,
# 1536x1536 7.5 -> 6.1 against the previous kernel (its sub-block loop unrolled, the sums spilled by LLVM; in git
# history before "Q4_K prefill: dispatch the helper's tiledx_q4_k"). A further variant, two sub-blocks per vpmaddwd
# (git history: "EXPERIMENTAL Q4_K 8-token kernels"), measured 0.84x of this one in a single noisy run; it is not
# here until it is measured again and tested.
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
    a0, a1, a2, a3, a4, a5, a6, a7 = fzero(), fzero(), fzero(), fzero(), fzero(), fzero(), fzero(), fzero()
    m0, m1, m2, m3 = fzero(), fzero(), fzero(), fzero()
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3, i4, i5, i6, i7 = izero(), izero(), izero(), izero(), izero(), izero(), izero(), izero()
        for j in range(pairs):
            lo, hi = q4_k_quants(w, o, j)
            sl = np.int32((sc >> np.uint64(16 * j)) & np.uint64(0xFF))
            sh = np.int32((sc >> np.uint64(16 * j + 8)) & np.uint64(0xFF))
            e = QK_K * i + 64 * j
            i0, i1 = iadd(i0, dot_pair(lo, hi, y0, e, sl, sh)), iadd(i1, dot_pair(lo, hi, y1, e, sl, sh))
            i2, i3 = iadd(i2, dot_pair(lo, hi, y2, e, sl, sh)), iadd(i3, dot_pair(lo, hi, y3, e, sl, sh))
            i4, i5 = iadd(i4, dot_pair(lo, hi, y4, e, sl, sh)), iadd(i5, dot_pair(lo, hi, y5, e, sl, sh))
            i6, i7 = iadd(i6, dot_pair(lo, hi, y6, e, sl, sh)), iadd(i7, dot_pair(lo, hi, y7, e, sl, sh))
        ydi = fload8(yd[i], 0)
        dv = fscale(ydi, load_f16(w, o))
        a0, a1 = fma_int(flane(dv, 0), i0, a0), fma_int(flane(dv, 1), i1, a1)
        a2, a3 = fma_int(flane(dv, 2), i2, a2), fma_int(flane(dv, 3), i3, a3)
        a4, a5 = fma_int(flane(dv, 4), i4, a4), fma_int(flane(dv, 5), i5, a5)
        a6, a7 = fma_int(flane(dv, 6), i6, a6), fma_int(flane(dv, 7), i7, a7)
        dmin = fscale(ydi, -load_f16(w, o + 2))
        ysi = ys[i]
        m0 = fma_intv(dmin, kmin_tokens(ysi, 0, u2, u3, 0), m0)
        m1 = fma_intv(dmin, kmin_tokens(ysi, 16, u2, u3, 1), m1)
        m2 = fma_intv(dmin, kmin_tokens(ysi, 32, u2, u3, 2), m2)
        m3 = fma_intv(dmin, kmin_tokens(ysi, 48, u2, u3, 3), m3)
    mins = fadd8(fadd8(m0, m2), fadd8(m1, m3))
    store4(out, r, t, fsum(a0) + flane(mins, 0), fsum(a1) + flane(mins, 1), fsum(a2) + flane(mins, 2),
           fsum(a3) + flane(mins, 3))
    store4(out, r, t + 4, fsum(a4) + flane(mins, 4), fsum(a5) + flane(mins, 5), fsum(a6) + flane(mins, 6),
           fsum(a7) + flane(mins, 7))


@njit(cache=True)
def token_pairs(yq):
    """``(T, K)`` quantized activations -> ``(T // 2, 2 K)``: for each pair of tokens, each 32-byte chunk of the
    first followed by the same chunk of the second (what :func:`row8z_q4_k` loads as one 512-bit vector)."""
    n_pairs, k = yq.shape[0] // 2, yq.shape[1]
    out = np.empty((n_pairs, 2 * k), np.uint8)
    for p in range(n_pairs):
        for c in range(k // 32):
            out[p, 64 * c : 64 * c + 32] = yq[2 * p, 32 * c : 32 * c + 32]
            out[p, 64 * c + 32 : 64 * c + 64] = yq[2 * p + 1, 32 * c : 32 * c + 32]
    return out


@njit(inline="always", cache=True)
def close8z_q4_k(w, o, i, yd, ys, u2, u3, i0, i1, i2, i3, a, m):
    """Super-block ``i``'s float steps for 8 tokens (:func:`row8_q4_k`'s, two tokens per vector): ``a`` the 4 pair
    accumulators, ``m`` the 4 min accumulators (one token per lane), both updated."""
    ydi = fload8(yd[i], 0)
    dv = fscale(ydi, load_f16(w, o))
    a = (fma_tokens(flane(dv, 0), flane(dv, 1), i0, a[0]), fma_tokens(flane(dv, 2), flane(dv, 3), i1, a[1]),
         fma_tokens(flane(dv, 4), flane(dv, 5), i2, a[2]), fma_tokens(flane(dv, 6), flane(dv, 7), i3, a[3]))
    dmin = fscale(ydi, -load_f16(w, o + 2))
    ysi = ys[i]
    m = (fma_intv(dmin, kmin_tokens(ysi, 0, u2, u3, 0), m[0]), fma_intv(dmin, kmin_tokens(ysi, 16, u2, u3, 1), m[1]),
         fma_intv(dmin, kmin_tokens(ysi, 32, u2, u3, 2), m[2]), fma_intv(dmin, kmin_tokens(ysi, 48, u2, u3, 3), m[3]))
    return a, m


@njit(inline="always", cache=True)
def store8z_q4_k(out, r, t, a, m):
    """The 8 outputs of tokens ``t .. t + 7`` of row ``r`` from :func:`close8z_q4_k`'s accumulators."""
    mins = fadd8(fadd8(m[0], m[2]), fadd8(m[1], m[3]))
    store4(out, r, t, fsum_token(a[0], 0) + flane(mins, 0), fsum_token(a[0], 1) + flane(mins, 1),
           fsum_token(a[1], 0) + flane(mins, 2), fsum_token(a[1], 1) + flane(mins, 3))
    store4(out, r, t + 4, fsum_token(a[2], 0) + flane(mins, 4), fsum_token(a[2], 1) + flane(mins, 5),
           fsum_token(a[3], 0) + flane(mins, 6), fsum_token(a[3], 1) + flane(mins, 7))


@njit(inline="always", cache=True)
def sub_pair_scales(sc, j):
    """The scales of sub-blocks 2j and 2j+1 from the 8 scale bytes ``sc`` (k4_scales' first two words)."""
    return (np.int32((sc >> np.uint64(16 * j)) & np.uint64(0xFF)),
            np.int32((sc >> np.uint64(16 * j + 8)) & np.uint64(0xFF)))


@njit(inline="always", cache=True)
def dots_q4_k(acc, lo, hi, y, e, sl, sh):
    """One token pair's scaled dot products with a Q4_K sub-block pair (scales ``sl``, ``sh``, activations at
    ``e``)."""
    return scaled_dots(scaled_dots(acc, lo, y, e, sl), hi, y, e + 64, sh)


@njit(cache=True)
def row8z_q4_k(w, yq2, yd8, ya8, t, out, r):
    """:func:`row8_q4_k` on 512-bit vectors (:mod:`.zmm`): two tokens per vector, so each sub-block pair is unpacked
    once for 4 vectors instead of 8; the same integers and float steps, so the same outputs bit for bit."""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    yd, ys = yd8[t // 8], ya8[t // 8]
    pairs = yq2.shape[1] // 2 // yd.shape[0] // 64  # 4 sub-block pairs per super-block, a count LLVM does not see
    a, m = (vzero(), vzero(), vzero(), vzero()), (fzero(), fzero(), fzero(), fzero())
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3 = izero16(), izero16(), izero16(), izero16()
        for j in range(pairs):
            lo, hi = nibbles_both(w, o + 16 + 32 * j)
            sl, sh = sub_pair_scales(sc, j)
            e = 2 * (QK_K * i + 64 * j)
            i0, i1 = dots_q4_k(i0, lo, hi, y0, e, sl, sh), dots_q4_k(i1, lo, hi, y1, e, sl, sh)
            i2, i3 = dots_q4_k(i2, lo, hi, y2, e, sl, sh), dots_q4_k(i3, lo, hi, y3, e, sl, sh)
        a, m = close8z_q4_k(w, o, i, yd, ys, u2, u3, i0, i1, i2, i3, a, m)
    store8z_q4_k(out, r, t, a, m)


@njit(cache=True)
def row16z_q4_k(w, yq2, yd8, ya8, t, out, r):
    """:func:`row8z_q4_k` for 16 tokens (``t`` a multiple of 16): each sub-block pair unpacked once for 8 vectors.
    (Keeping the float state in memory between chunks of super-blocks, so that a chunk's activations stay in L1
    for long rows, measured slower: 1536x8960 17.7 -> 24.7 ms, and 1536-wide rows 2.5 -> 4.3.)"""
    p = t // 2
    y0, y1, y2, y3 = yq2[p], yq2[p + 1], yq2[p + 2], yq2[p + 3]
    y4, y5, y6, y7 = yq2[p + 4], yq2[p + 5], yq2[p + 6], yq2[p + 7]
    yd, ys, yd_, ys_ = yd8[t // 8], ya8[t // 8], yd8[t // 8 + 1], ya8[t // 8 + 1]
    pairs = yq2.shape[1] // 2 // yd.shape[0] // 64
    a, m = (vzero(), vzero(), vzero(), vzero()), (fzero(), fzero(), fzero(), fzero())
    a_, m_ = (vzero(), vzero(), vzero(), vzero()), (fzero(), fzero(), fzero(), fzero())
    for i in range(yd.shape[0]):
        o = 144 * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        sc = np.uint64(u0) | (np.uint64(u1) << np.uint64(32))
        i0, i1, i2, i3 = izero16(), izero16(), izero16(), izero16()
        i4, i5, i6, i7 = izero16(), izero16(), izero16(), izero16()
        for j in range(pairs):
            lo, hi = nibbles_both(w, o + 16 + 32 * j)
            sl, sh = sub_pair_scales(sc, j)
            e = 2 * (QK_K * i + 64 * j)
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
    n_tok, n = out.shape
    full = n_tok - n_tok % TILE8_TOKENS
    full16 = n_tok - n_tok % 16 if yq2.shape[0] else 0
    for t in range(0, full16, 16):
        for r in range(lo, hi):
            row16z_q4_k(w[r], yq2, yd8, ya8, t, out, r)
    for t in range(full16, full, TILE8_TOKENS):
        for r in range(lo, hi):
            if yq2.shape[0]:
                row8z_q4_k(w[r], yq2, yd8, ya8, t, out, r)
            else:
                row8_q4_k(w[r], yq, yd8, ya8, t, out, r)
    for t in range(full, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile_q4_k(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(parallel=True, cache=True)
def tiled_q4_k(w, yq, yd, ya, out):
    n = out.shape[1]
    yd8, ya8 = scales8(yd), bsum_pairs8(ya)
    ya = bsum_pairs(ya)
    yq2 = token_pairs(yq) if has_zmm_vnni() else np.empty((0, 0), np.uint8)
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        group_q4_k(w, yq, yd, ya, yd8, ya8, yq2, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n))
