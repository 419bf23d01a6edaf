"""Register-tiled integer-dot mat-mat kernels (``ggml`` numerics, prefill and batched decode): ``out (T, N)``: how they
work, and the helpers the per-type ``tiled_<type>`` kernels (in :mod:`.types`) share.

The untiled mat-mat (``bench_compare.untiled_int``) keeps a pair of weight rows in L1 while every token passes by,
but unpacks each weight block again for every token. Here a tile of ``2`` rows x ``TILE_TOKENS = 4`` tokens is computed at once:
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
laid out in token pairs (:func:`token_pairs`). What each of these choices measured: docs/PERFORMANCE.md,
"What each CPU-path change measured".

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

from inference_engine.backends.numba_kernels.intdot import byte, k4_scales
from inference_engine.backends.numba_kernels.isa import int8
from inference_engine.backends.numba_kernels.isa.simd import fma32, load_f16

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
    """pair_q4_0 / pair_q5_0's block step for one token and both rows: ``(d_w d_y) * (int8.dot4(q, y) - 8|16 sum4)``."""
    y, yo = int8.load32(yq, 32 * b), int8.ishl(int8.iload(ya, 8 * b), shift)
    a0 = int8.fma_int(f0 * yd[b], int8.isub(int8.dot4(x0, y), yo), a0)
    a1 = int8.fma_int(f1 * yd[b], int8.isub(int8.dot4(x1, y), yo), a1)
    return a0, a1


@njit(inline="always", cache=True)
def step_min(x0, x1, f0, f1, m0, m1, yq, yd, ya, b, st0, st1):
    """pair_q4_1 / pair_q5_1's block step: ``acc += (d_w d_y) * int8.dot4(q, y)``, ``c += m * s`` (state (acc, c))."""
    y = int8.load32(yq, 32 * b)
    st0 = (int8.fma_int(f0 * yd[b], int8.dot4(x0, y), st0[0]), fma32(m0, ya[b], st0[1]))
    st1 = (int8.fma_int(f1 * yd[b], int8.dot4(x1, y), st1[0]), fma32(m1, ya[b], st1[1]))
    return st0, st1


@njit(inline="always", cache=True)
def close_min(st):
    return int8.fsum(st[0]) + st[1]


# --- K-quants ------------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def sub_scales(t_lo, t_hi, j):
    """Scales of sub-blocks 2j, 2j+1 (Q4_K / Q5_K, as q4_k_sumi reads them)."""
    word = t_lo if j < 2 else t_hi
    return byte(word, (2 * j) % 4), byte(word, (2 * j + 1) % 4)


@njit(inline="always", cache=True)
def dot_pair(lo, hi, yq, e, sl, sh):
    return int8.iadd(
        int8.dot4_scaled(lo, int8.load32(yq, e), sl, sl), int8.dot4_scaled(hi, int8.load32(yq, e + 32), sh, sh)
    )


# --- K-quants, 1 row x 8 tokens ---------------------------------------------------------------------------------
# The K-quants' per-row work (scales, mins, unpacking 4 / 5 / 6-bit quants) is a large share of a super-block's
# instructions; 8 tokens per unpacked row halve it per token against the 4-token tiles above. The integer sums of
# the 8 tokens stay in registers; the float states (touched once per super-block) may live on the stack. Full
# blocks of 8 tokens go through these; the rest of T through the 4-token tiles (the same outputs).
TILE8_TOKENS = 8


@njit(inline="always", cache=True)
def k4_rows4(quants, row, o, e, y0, y1, y2, y3, u_lo, u_hi):
    """Q4_K / Q5_K: one row's integer sums of the super-block at ``o`` (activations from element ``e``) with 4 tokens
    (``quants``: as :func:`.intdot.k4_sumi`'s)."""
    i0, i1, i2, i3 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
    for j in range(4):
        lo, hi = quants(row, o, j)
        sl, sh = sub_scales(u_lo, u_hi, j)
        ej = e + 64 * j
        i0, i1 = int8.iadd(i0, dot_pair(lo, hi, y0, ej, sl, sh)), int8.iadd(i1, dot_pair(lo, hi, y1, ej, sl, sh))
        i2, i3 = int8.iadd(i2, dot_pair(lo, hi, y2, ej, sl, sh)), int8.iadd(i3, dot_pair(lo, hi, y3, ej, sl, sh))
    return i0, i1, i2, i3


@njit(inline="always", cache=True)
def k4_row_tile(quants, close, final, zero, block_bytes, w, yq, yd, ya, t0, t1, t2, t3):
    """Q4_K / Q5_K: one row x 4 tokens, the whole row in a loop of its own: :func:`k4_rows4`'s integers, then the
    type's float steps per super-block (``close``, from the state ``zero()``) and its outputs (``final``)."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a0, a1, a2, a3 = zero(), zero(), zero(), zero()
    for i in range(d0.shape[0]):
        o = block_bytes * i
        u0, u1, u2, u3 = k4_scales(w, o + 4)
        i0, i1, i2, i3 = k4_rows4(quants, w, o, 256 * i, y0, y1, y2, y3, u0, u1)
        a0 = close(w, o, d0[i], s0, i, u2, u3, i0, a0)
        a1 = close(w, o, d1[i], s1, i, u2, u3, i1, a1)
        a2 = close(w, o, d2[i], s2, i, u2, u3, i2, a2)
        a3 = close(w, o, d3[i], s3, i, u2, u3, i3, a3)
    return final(a0), final(a1), final(a2), final(a3)


@njit(inline="always", cache=True)
def k4_tile(quants, close, final, zero, block_bytes, w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Q4_K / Q5_K: a 2-row x 4-token tile, each row by :func:`k4_row_tile`."""
    v00, v01, v02, v03 = k4_row_tile(quants, close, final, zero, block_bytes, w0, yq, yd, ya, t0, t1, t2, t3)
    v10, v11, v12, v13 = k4_row_tile(quants, close, final, zero, block_bytes, w1, yq, yd, ya, t0, t1, t2, t3)
    return v00, v01, v02, v03, v10, v11, v12, v13


@njit(inline="always", cache=True)
def store4(out, r, t, v0, v1, v2, v3):
    out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = v0, v1, v2, v3


# --- the kernels ---------------------------------------------------------------------------------------------------
# Written out per type (not made by a factory), for the reason given in intdot.py (Numba's cache and closures).


# --- Q4_K, 8 tokens at a time, the sub-block loop kept -----------------------------------------------------------


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


# --- the tile loop of the 32-weight types: each one's ``tiled_<type>`` is this loop with its ``tile_<type>`` ----------
@njit(inline="always", cache=True)
def tile_rows(tile, w, yq, yd, ya, out, lo, hi, start):
    """Rows ``lo .. hi`` x tokens ``start ..`` by 2-row x 4-token tiles (``tile``: a type's ``tile_<type>``; a
    tile past the last token or row repeats it, and stores it once)."""
    n_tok, n = out.shape
    for t in range(start, n_tok, TILE_TOKENS):
        t1, t2, t3 = min(t + 1, n_tok - 1), min(t + 2, n_tok - 1), min(t + 3, n_tok - 1)
        for r0 in range(lo, hi, 2):
            r1 = min(r0 + 1, n - 1)
            store_tile(out, r0, r1, t, t1, t2, t3, tile(w[r0], w[r1], yq, yd, ya, t, t1, t2, t3))


@njit(inline="always", cache=True)
def tiled_pairs(tile, w, yq, yd, ya, out):
    """Row pairs x 4-token tiles, rows in groups of ``GROUP_ROWS`` split over threads (``tile``: a type's
    ``tile_<type>``). Inlined into each type's ``@njit(parallel=True, cache=True)`` kernel, as :mod:`.intdot`'s
    mat-vec loops are."""
    n = out.shape[1]
    for g in prange((n + GROUP_ROWS - 1) // GROUP_ROWS):
        tile_rows(tile, w, yq, yd, ya, out, g * GROUP_ROWS, min(g * GROUP_ROWS + GROUP_ROWS, n), 0)


@njit(inline="always", cache=True)
def fsums(a0, a1, a2, a3, a4, a5, a6, a7):
    """A tile's 8 outputs from its 8 accumulators."""
    return (
        int8.fsum(a0),
        int8.fsum(a1),
        int8.fsum(a2),
        int8.fsum(a3),
        int8.fsum(a4),
        int8.fsum(a5),
        int8.fsum(a6),
        int8.fsum(a7),
    )


# --- the tile arithmetic of the 32-weight types: ``tile_<type>`` is one of these with its quants and constants ------
@njit(inline="always", cache=True)
def tile_offset(quants, block_bytes, shift, w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Q4_0 / Q5_0: 2 rows x 4 tokens, each block's quants unpacked once (``quants(row, o)``)."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for b in range(d0.shape[0]):
        o = block_bytes * b
        x0, x1 = quants(w0, o), quants(w1, o)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = step_offset(x0, x1, f0, f1, y0, d0, s0, b, shift, a00, a10)
        a01, a11 = step_offset(x0, x1, f0, f1, y1, d1, s1, b, shift, a01, a11)
        a02, a12 = step_offset(x0, x1, f0, f1, y2, d2, s2, b, shift, a02, a12)
        a03, a13 = step_offset(x0, x1, f0, f1, y3, d3, s3, b, shift, a03, a13)
    return fsums(a00, a01, a02, a03, a10, a11, a12, a13)


@njit(inline="always", cache=True)
def tile_min(quants, block_bytes, w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Q4_1 / Q5_1: 2 rows x 4 tokens, each block's quants unpacked once, the ``m * s`` terms beside."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    z = (int8.fzero(), _F32(0.0))
    a00, a01, a02, a03, a10, a11, a12, a13 = z, z, z, z, z, z, z, z
    for b in range(d0.shape[0]):
        o = block_bytes * b
        x0, x1 = quants(w0, o), quants(w1, o)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        m0, m1 = load_f16(w0, o + 2), load_f16(w1, o + 2)
        a00, a10 = step_min(x0, x1, f0, f1, m0, m1, y0, d0, s0, b, a00, a10)
        a01, a11 = step_min(x0, x1, f0, f1, m0, m1, y1, d1, s1, b, a01, a11)
        a02, a12 = step_min(x0, x1, f0, f1, m0, m1, y2, d2, s2, b, a02, a12)
        a03, a13 = step_min(x0, x1, f0, f1, m0, m1, y3, d3, s3, b, a03, a13)
    return (
        close_min(a00),
        close_min(a01),
        close_min(a02),
        close_min(a03),
        close_min(a10),
        close_min(a11),
        close_min(a12),
        close_min(a13),
    )
