"""16 tokens a vector on AVX-512 VNNI and AVX2 (ggml numerics, prefill): ``out (T, N) = x (T, K) @ W.T`` as llama.cpp
computes it there for a batch, bit for bit: its tiled K-quant mat-mul, its repacked Q4_0 gemm, ``vec_dot``'s order.
On AVX2 each step is two 8-token halves (:func:`.tokens16.dpbusd_row`) and a K-quant band's 8 rows go in two passes
of 4 (:func:`band_group8`: 16 registers); ggml's AVX2 micro-kernel (``tiled_run_microtile_avx2``) sums the same
integers and takes the same float steps as its VNNI one, so the values are the same on both (:func:`compiled_target`).

**K-quants** (:func:`ktiled`). Since late 2026 ggml multiplies a batch of 8 or more tokens with a Q2_K..Q6_K weight
by its ``tiled`` mat-mul (``ggml-cpu/tiled/``; Q4_K and Q2_K only where their weights are not repacked at load),
not by ``vec_dot`` row by row. Its VNNI micro-kernel (``tiled_run_micro_vnni_8x16``) holds 16 tokens in a vector
(:mod:`.isa.tokens16`): per sub-block of 16 or 32 weights, 8 rows x 16 tokens of exact int32 dot products (one
``vpdpbusd`` per row and 4 positions), less ``BIAS`` times the activation's block sums, times the sub-block's scale,
summed over the super-block (``s1``; the min terms ``s2`` likewise); then once per super-block, for each row and
token, ``acc = fma(float(s1) * d - dmin * float(s2), d_y, acc)`` (:func:`.tokens16.superblock_step`). The integers
are ``vec_dot``'s; the float steps are the tiled kernel's, in its order (super-blocks in order, from 0), so these
outputs are llama.cpp's own prefill values, not its ``vec_dot``'s (which the 4-token tiles of :mod:`.inttiles`
reproduce): the two differ by float32 rounding.

**Q4_0** (:func:`ktiled_blocks`). llama.cpp repacks a model's Q4_0 weights at load (rows a multiple of 8) and
multiplies them, at every token count, by ``ggml_gemm_q4_0_8x8_q8_0`` / ``gemv``: per 32-weight block, the exact
integer dot product, then ``acc = fma(float(s), d_w * d_y, acc)`` (:func:`.tokens16.block_step`). The same layout
computes that.

**Q4_1, Q5_0, Q5_1, Q8_0** (:func:`ktiled_lanes`). llama.cpp multiplies these by ``vec_dot`` or, for a batch of
Q8_0 / Q5_0, llamafile's sgemm, which keeps ``vec_dot``'s float order: 8 float lanes per output, lane ``i`` fed
``fma(d_w * d_y, float(the block's positions 4i..4i+3), lane)`` block by block, then ``hsum_float_8`` (plus the
``m * s`` terms of Q4_1 / Q5_1). Each ``vpdpbusd`` here is one such lane for 16 tokens, so 2 rows keep their 16
lane vectors in registers (:func:`band_group_lanes`, compiled per type on its own: the parfor pass rejects its
tuple states inlined): the 4-token tiles' values, bit for bit, at 1.4-3x their speed.

Work per call: the activations are laid out once, 16 tokens per group (:func:`token_groups`, :func:`group_sums`,
:func:`group_scales`). Threads take bands of ``BAND`` = 8 rows; a band's weights are unpacked once into one
quant per byte, int32 scales and float32 ``d`` / ``dmin`` (the type's ``unpack_rows_<type>``, in ``types/``),
then every token group passes, all blocks of a row band accumulating in registers. A band past the last row
starts at ``N - BAND`` (the rows it shares with the band before get the same values); tokens past ``T`` are
zeros, computed and not stored.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.intdot import byte, k4_scales
from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.isa.simd import (
    load_f16,
    vadd,
    vfma,
    vload,
    vmul,
    vsplat,
    vstore,
    vzero,
)
from inference_engine.backends.numba_kernels.isa.tokens16 import (
    block_step,
    codes64,
    dpbusd_row,
    iload16,
    imul,
    imul_add,
    iscale_add,
    lane_step,
    superblock_step,
    superblock_step_min,
)
from inference_engine.backends.numba_kernels.isa.zmm import compiled_isa, izero16

QK_K = 256
GROUP = 16  # tokens per vector
BAND = 8  # weight rows per pass (ggml's 8x16 band: 8 int32 sums, 8 scaled sums, 8 float sums in registers)
MIN_TOKENS = 8  # ggml_tiled_min_batch: ggml takes its tiled kernel from this many tokens on, vec_dot below


@njit(cache=True)
def _compiled_isa():
    return compiled_isa()


TARGETS = ("portable", "avx2", "avx512_vnni")  # compiled_isa()'s 0, 1, 2


@cache
def compiled_target() -> str:
    """What Numba compiles these kernels for (the compile target's features, not just the CPU's): "avx512_vnni"
    (``vpdpbusd``, 16 tokens a register), "avx2" (``vpmaddubsw`` + ``vpmaddwd``, 8 tokens a register, two per
    step; no Q8_0: its quants would saturate ``vpmaddubsw``) or "portable" (IR any target compiles: the same values,
    slowly; the engine does not use it). ggml's tiled kernel computes the same values with either instruction set
    (its AVX2 and VNNI micro-kernels sum the same integers and take the same float steps; checked against an AVX2
    build of llama.cpp, docs/PERFORMANCE.md). Asked once."""
    return TARGETS[_compiled_isa()]


@njit(cache=True)
def token_groups(yq):
    """``(T, K)`` int8 quants -> ``(ceil(T / 16), 16 K)`` uint8: for each group of 16 tokens and each 4 positions
    ``k .. k + 3``, 64 bytes: token ``t``'s 4 quants at ``4t``. Tokens past ``T`` are zeros."""
    n_tok, k = yq.shape
    n_groups = (n_tok + GROUP - 1) // GROUP
    out = np.zeros((n_groups, GROUP * k), np.uint8)
    src = yq.view(np.uint8)
    for g in range(n_groups):
        for t in range(min(GROUP, n_tok - GROUP * g)):
            row = src[GROUP * g + t]
            dst = out[g]
            for q in range(k // 4):
                for b in range(4):
                    dst[64 * q + 4 * t + b] = row[4 * q + b]
    return out


@njit(cache=True)
def group_sums(sums, per):
    """``(T, n)`` block sums of the activation's quants (Q8_K's int16 per 16, Q8_0's int32 per 4) -> ``(G, 16 n /
    per)`` int32: each run of ``per`` of them added (a sub-block's or block's sum), token ``t`` of a group in lane
    ``t``."""
    n_tok, n = sums.shape
    n_groups = (n_tok + GROUP - 1) // GROUP
    out = np.zeros((n_groups, GROUP * (n // per)), np.int32)
    for g in range(n_groups):
        for t in range(min(GROUP, n_tok - GROUP * g)):
            for s in range(n // per):
                acc = np.int32(0)
                for u in range(per):
                    acc += np.int32(sums[GROUP * g + t, per * s + u])
                out[g, GROUP * s + t] = acc
    return out


@njit(cache=True)
def group_scales(yd):
    """``(T, n)`` float32 per-block values (scales ``d``; Q8_1's sums ``s``) -> ``(G, 16 n)``: block ``i``'s of the
    group's 16 tokens at ``16 i``, token ``t`` in lane ``t`` (past ``T``: zeros)."""
    n_tok, nsb = yd.shape
    n_groups = (n_tok + GROUP - 1) // GROUP
    out = np.zeros((n_groups, GROUP * nsb), np.float32)
    for g in range(n_groups):
        for t in range(min(GROUP, n_tok - GROUP * g)):
            for i in range(nsb):
                out[g, GROUP * i + t] = yd[GROUP * g + t, i]
    return out


@njit(inline="always", cache=True)
def k4_scales_mins(row, o, j, i, sc, mn, dd, dm):
    """Q4_K / Q5_K: super-block ``i`` of row ``j`` (block at byte ``o``): its 8 six-bit scales and mins as int32 and
    its ``d``, ``dmin`` as float32 (ggml's ``utmp`` unpacking, :func:`.intdot.k4_scales`)."""
    t0, t1, t2, t3 = k4_scales(row, o + 4)
    for s in range(4):
        sc[j, 8 * i + s], sc[j, 8 * i + 4 + s] = byte(t0, s), byte(t1, s)
        mn[j, 8 * i + s], mn[j, 8 * i + 4 + s] = byte(t2, s), byte(t3, s)
    dd[j, i], dm[j, i] = load_f16(row, o), load_f16(row, o + 2)


# --- a band's rows as tuples of vectors: four rows a helper (AVX2: 16 registers), eight as two fours ---------------
@njit(inline="always", cache=True)
def _dots4(a, codes, w, o):
    """``a[j] += `` row ``j``'s 4 quants at ``o`` dotted with each token's 4 activation quants."""
    return (
        dpbusd_row(a[0], w[0], o, codes),
        dpbusd_row(a[1], w[1], o, codes),
        dpbusd_row(a[2], w[2], o, codes),
        dpbusd_row(a[3], w[3], o, codes),
    )


@njit(inline="always", cache=True)
def _dots8(a, codes, w, o):
    return _dots4(a[:4], codes, w[:4], o) + _dots4(a[4:], codes, w[4:], o)


@njit(inline="always", cache=True)
def _scaled4(s1, a, bias, sc, j):
    return (
        iscale_add(s1[0], a[0], bias, sc[0, j]),
        iscale_add(s1[1], a[1], bias, sc[1, j]),
        iscale_add(s1[2], a[2], bias, sc[2, j]),
        iscale_add(s1[3], a[3], bias, sc[3, j]),
    )


@njit(inline="always", cache=True)
def _scaled8(s1, a, bias, sc, j):
    return _scaled4(s1[:4], a[:4], bias, sc[:4], j) + _scaled4(s1[4:], a[4:], bias, sc[4:], j)


@njit(inline="always", cache=True)
def _mins4(s2, bs, mn, j):
    return (
        imul_add(s2[0], bs, mn[0, j]),
        imul_add(s2[1], bs, mn[1, j]),
        imul_add(s2[2], bs, mn[2, j]),
        imul_add(s2[3], bs, mn[3, j]),
    )


@njit(inline="always", cache=True)
def _mins8(s2, bs, mn, j):
    return _mins4(s2[:4], bs, mn[:4], j) + _mins4(s2[4:], bs, mn[4:], j)


@njit(inline="always", cache=True)
def _zeros4():
    z = izero16()
    return z, z, z, z


@njit(inline="always", cache=True)
def _zeros8():
    return _zeros4() + _zeros4()


@njit(inline="always", cache=True)
def _fzeros4():
    f = vzero()
    return f, f, f, f


@njit(inline="always", cache=True)
def _fzeros8():
    return _fzeros4() + _fzeros4()


@njit(inline="always", cache=True)
def _step4(acc, s1, s2, dd, dm, i, d1, has_min):
    if has_min:
        return (
            superblock_step_min(acc[0], s1[0], s2[0], dd[0, i], dm[0, i], d1),
            superblock_step_min(acc[1], s1[1], s2[1], dd[1, i], dm[1, i], d1),
            superblock_step_min(acc[2], s1[2], s2[2], dd[2, i], dm[2, i], d1),
            superblock_step_min(acc[3], s1[3], s2[3], dd[3, i], dm[3, i], d1),
        )
    return (
        superblock_step(acc[0], s1[0], dd[0, i], d1),
        superblock_step(acc[1], s1[1], dd[1, i], d1),
        superblock_step(acc[2], s1[2], dd[2, i], d1),
        superblock_step(acc[3], s1[3], dd[3, i], d1),
    )


@njit(inline="always", cache=True)
def _step8(acc, s1, s2, dd, dm, i, d1, has_min):
    lo = _step4(acc[:4], s1[:4], s2[:4], dd[:4], dm[:4], i, d1, has_min)
    return lo + _step4(acc[4:], s1[4:], s2[4:], dd[4:], dm[4:], i, d1, has_min)


@njit(inline="always", cache=True)
def band_group(zeros, fzeros, dots, scaled, mins, step, w, sc, mn, dd, dm, yg, bg, dg, sub, bias_k, has_min):
    """Rows ``w`` (their quants, one a byte: 4 or 8 rows, ``zeros`` .. ``step`` the helpers for that many rows;
    ``sc`` / ``mn``: int32 sub-block scales / mins; ``dd`` / ``dm``: float32 super-block ``d`` / ``dmin``) x one
    group of 16 tokens (``yg``, ``bg``, ``dg``: its row of :func:`token_groups`, :func:`group_sums`,
    :func:`group_scales`): an F32x16 of outputs a row, token ``t`` in lane ``t``."""
    nb = QK_K // sub
    acc = fzeros()
    for i in range(dd.shape[1]):
        s1, s2 = zeros(), zeros()
        for s in range(nb):
            j = nb * i + s
            bias = imul(iload16(bg, GROUP * j), bias_k)
            a = zeros()
            for q in range(sub // 4):
                o = QK_K * i + sub * s + 4 * q
                a = dots(a, codes64(yg, GROUP * o), w, o)
            s1 = scaled(s1, a, bias, sc, j)
        if has_min:  # after the sums, as ggml does: 8 more vectors live in the loop above would not fit in 32
            for s in range(nb):
                j = nb * i + s
                s2 = mins(s2, iload16(bg, GROUP * j), mn, j)
        acc = step(acc, s1, s2, dd, dm, i, vload(dg, GROUP * i), has_min)
    return acc


@njit(inline="always", cache=True)
def band_group8(codes, sc, mn, dd, dm, yg, bg, dg, sub, bias_k, has_min):
    """A band's 8 rows x one group of 16 tokens (:func:`band_group`): in one pass on AVX-512 (8 rows share each
    load of the tokens' quants; 32 registers hold 8 rows' sums), in two passes of 4 rows on AVX2 (16 registers)."""
    if compiled_isa() == 1:  # each pass's rows and arrays sliced with constants (a computed slice was slower)
        w0 = (codes[0], codes[1], codes[2], codes[3])
        w1 = (codes[4], codes[5], codes[6], codes[7])
        lo = band_group(_zeros4, _fzeros4, _dots4, _scaled4, _mins4, _step4, w0, sc[:4], mn[:4], dd[:4], dm[:4],
                        yg, bg, dg, sub, bias_k, has_min)  # fmt: skip
        hi = band_group(_zeros4, _fzeros4, _dots4, _scaled4, _mins4, _step4, w1, sc[4:], mn[4:], dd[4:], dm[4:],
                        yg, bg, dg, sub, bias_k, has_min)  # fmt: skip
        return lo + hi
    w = (codes[0], codes[1], codes[2], codes[3], codes[4], codes[5], codes[6], codes[7])
    return band_group(_zeros8, _fzeros8, _dots8, _scaled8, _mins8, _step8, w, sc, mn, dd, dm,
                      yg, bg, dg, sub, bias_k, has_min)  # fmt: skip


@njit(inline="always", cache=True)
def _store8(out, r, t0, acc, tmp):
    n = min(GROUP, out.shape[0] - t0)
    for j in range(BAND):
        vstore(tmp, 0, acc[j])
        for t in range(n):
            out[t0 + t, r + j] = tmp[t]


@njit(inline="always", cache=True)
def ktiled(unpack_rows, sub, bias_k, has_min, w, yq, yd, ya, out):
    """``out = yq @ W.T`` by the tiled kernel for a K-quant with ``unpack_rows(w, r, codes, sc, mn, dd, dm)`` (its
    rows ``r .. r + 7`` unpacked), sub-blocks of ``sub`` weights, offset ``bias_k`` and min terms or not. Inlined
    into each type's compiled entry point."""
    n_out, k = out.shape[1], yq.shape[1]
    nsb = k // QK_K
    yg, bg, dg = token_groups(yq), group_sums(ya, sub // 16), group_scales(yd)
    n_bands = (n_out + BAND - 1) // BAND
    for band in prange(n_bands):
        r = min(BAND * band, n_out - BAND)
        codes = np.empty((BAND, k), np.uint8)
        sc = np.empty((BAND, nsb * (QK_K // sub)), np.int32)
        mn = np.empty((BAND, nsb * (QK_K // sub)), np.int32)
        dd = np.empty((BAND, nsb), np.float32)
        dm = np.empty((BAND, nsb), np.float32)
        unpack_rows(w, r, codes, sc, mn, dd, dm)
        tmp = np.empty(GROUP, np.float32)
        for g in range(yg.shape[0]):
            acc = band_group8(codes, sc, mn, dd, dm, yg[g], bg[g], dg[g], sub, bias_k, has_min)
            _store8(out, r, GROUP * g, acc, tmp)


# --- 32-weight blocks: one byte a quant ------------------------------------------------------------------------
@njit(inline="always", cache=True)
def nibble_halves(row, off):
    """The 32 four-bit quants of the 16 bytes at ``off``: elements 0..15 (low nibbles) and 16..31 (high nibbles), a
    byte each."""
    v = simd.bload(row, off)
    return simd.band(v, 15), simd.bshr(v, 4)


@njit(inline="always", cache=True)
def five_bit_halves(row, qh_off, qs_off):
    """Q5_0 / Q5_1: the nibbles at ``qs_off`` with the fifth bits of the 32-bit ``qh`` at ``qh_off`` (element j: bit
    j), elements 0..15 and 16..31, a byte each."""
    lo, hi = nibble_halves(row, qs_off)
    return (
        simd.bor(lo, simd.bshl(simd.bbits(row, qh_off, 0), 4)),
        simd.bor(hi, simd.bshl(simd.bbits(row, qh_off, 16), 4)),
    )


@njit(inline="always", cache=True)
def unpack_blocks(halves, block_bytes, m_at, w, r, codes, dd, mm):
    """Rows ``r .. r + len(codes) - 1`` of a 32-weight type, for :func:`ktiled_blocks` / :func:`ktiled_lanes`:
    ``halves(row, o)`` gives the block at byte ``o``'s quants 0..15 and 16..31, a byte each; ``d`` is the block's
    first f16, ``m`` its f16 at byte ``m_at`` (0: the type has none, and ``mm`` is 0)."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for b in range(dd.shape[1]):
            o = block_bytes * b
            lo, hi = halves(row, o)
            simd.bstore(dst, 32 * b, lo)
            simd.bstore(dst, 32 * b + 16, hi)
            dd[j, b] = load_f16(row, o)
            mm[j, b] = load_f16(row, o + m_at) if m_at else np.float32(0.0)


# --- 32-weight blocks: Q4_0 as llama.cpp multiplies it in a model (repacked at load: ggml_gemm_q4_0_8x8_q8_0) -------
@njit(inline="always", cache=True)
def _blocks8(acc, a, bias, dd, b, dy):
    return (
        block_step(acc[0], a[0], bias, dd[0, b], dy),
        block_step(acc[1], a[1], bias, dd[1, b], dy),
        block_step(acc[2], a[2], bias, dd[2, b], dy),
        block_step(acc[3], a[3], bias, dd[3, b], dy),
        block_step(acc[4], a[4], bias, dd[4, b], dy),
        block_step(acc[5], a[5], bias, dd[5, b], dy),
        block_step(acc[6], a[6], bias, dd[6, b], dy),
        block_step(acc[7], a[7], bias, dd[7, b], dy),
    )


@njit(inline="always", cache=True)
def band_group_blocks(codes, dd, yg, bg, dg, offset):
    """:func:`band_group` for 32-weight blocks: per block, 8 rows x 16 tokens of exact dot products less ``offset``
    times the block's activation sum, then ``acc = fma(float(s), d_y * d_w, acc)`` (ggml's repacked Q4_0 gemm and
    gemv, every token count). In one pass of 8 rows on AVX2 too (measured: two passes of 4, as the K-quants take
    there, were slower: 1 thread, 8960x1536, 64 tokens, 9.3 -> 11.4 ms)."""
    w = (codes[0], codes[1], codes[2], codes[3], codes[4], codes[5], codes[6], codes[7])
    acc = _fzeros8()
    for b in range(dd.shape[1]):
        a = _zeros8()
        for q in range(8):
            o = 32 * b + 4 * q
            a = _dots8(a, codes64(yg, GROUP * o), w, o)
        acc = _blocks8(acc, a, imul(iload16(bg, GROUP * b), offset), dd, b, vload(dg, GROUP * b))
    return acc


@njit(inline="always", cache=True)
def ktiled_blocks(unpack_rows, offset, w, yq, yd, ya, out):
    """``out = yq @ W.T`` for a 32-weight type with ``unpack_rows(w, r, codes, dd, mm)`` (rows ``r .. r + 7``:
    :func:`unpack_blocks`) and quants stored ``offset`` above their value (Q4_0: 8). ``ya``: the activation's int32
    sums of 4 quants (``q8_0_sum4``)."""
    n_out, k = out.shape[1], yq.shape[1]
    yg, bg, dg = token_groups(yq), group_sums(ya, 8), group_scales(yd)
    for band in prange((n_out + BAND - 1) // BAND):
        r = min(BAND * band, n_out - BAND)
        codes = np.empty((BAND, k), np.uint8)
        dd = np.empty((BAND, k // 32), np.float32)
        mm = np.empty((BAND, k // 32), np.float32)  # Q4_0 has no m: zeros, unread
        unpack_rows(w, r, codes, dd, mm)
        tmp = np.empty(GROUP, np.float32)
        for g in range(yg.shape[0]):
            _store8(out, r, GROUP * g, band_group_blocks(codes, dd, yg[g], bg[g], dg[g], offset), tmp)


# --- 32-weight blocks in vec_dot's float order (Q4_1, Q5_0, Q5_1, Q8_0; llamafile's sgemm has the same) ----------
LANE_BAND = 2  # rows per pass: 8 lane accumulators a row (vec_dot's 8 float lanes), 16 vectors for 2 rows
LANE_TASK_ROWS = 8  # rows per thread task (ktiles.BAND: the dispatcher's floor on rows holds for both loops)


@njit(cache=True)
def group_offsets(yq, offset):
    """``-offset`` times each token's sum of 4 quants ``(G, 4 K)`` int32, token ``t`` in lane ``t`` (the start of each
    4-position dot product: quants stored ``offset`` above their value)."""
    n_tok, k = yq.shape
    n_groups = (n_tok + GROUP - 1) // GROUP
    out = np.zeros((n_groups, GROUP * (k // 4)), np.int32)
    src = yq.view(np.int8)
    for g in range(n_groups):
        for t in range(min(GROUP, n_tok - GROUP * g)):
            row = src[GROUP * g + t]
            for q in range(k // 4):
                s = (
                    np.int32(row[4 * q])
                    + np.int32(row[4 * q + 1])
                    + np.int32(row[4 * q + 2])
                    + np.int32(row[4 * q + 3])
                )
                out[g, GROUP * q + t] = -offset * s
    return out


@njit(inline="always", cache=True)
def _hsum8(a):
    """``hsum_float_8``'s order over vec_dot's 8 lanes: ``((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))``."""
    return vadd(vadd(vadd(a[0], a[4]), vadd(a[2], a[6])), vadd(vadd(a[1], a[5]), vadd(a[3], a[7])))


@njit(inline="always", cache=True)
def _lane2(x, y, d0, d1, w0, w1, o, yg, og):
    """Lane ``o / 4 % 8`` of a block (positions ``o .. o + 3``) of two rows for 16 tokens."""
    codes = codes64(yg, GROUP * o)
    start = iload16(og, GROUP * (o // 4))
    return lane_step(x, d0, dpbusd_row(start, w0, o, codes)), lane_step(y, d1, dpbusd_row(start, w1, o, codes))


@njit(inline="always", cache=True)
def _block2(a, b, d0, d1, w0, w1, e, yg, og):
    """One 32-weight block (from element ``e``) of two rows: vec_dot's 8 lanes each."""
    a0, b0 = _lane2(a[0], b[0], d0, d1, w0, w1, e, yg, og)
    a1, b1 = _lane2(a[1], b[1], d0, d1, w0, w1, e + 4, yg, og)
    a2, b2 = _lane2(a[2], b[2], d0, d1, w0, w1, e + 8, yg, og)
    a3, b3 = _lane2(a[3], b[3], d0, d1, w0, w1, e + 12, yg, og)
    a4, b4 = _lane2(a[4], b[4], d0, d1, w0, w1, e + 16, yg, og)
    a5, b5 = _lane2(a[5], b[5], d0, d1, w0, w1, e + 20, yg, og)
    a6, b6 = _lane2(a[6], b[6], d0, d1, w0, w1, e + 24, yg, og)
    a7, b7 = _lane2(a[7], b[7], d0, d1, w0, w1, e + 28, yg, og)
    return (a0, a1, a2, a3, a4, a5, a6, a7), (b0, b1, b2, b3, b4, b5, b6, b7)


@njit(inline="always", cache=True)
def band_group_lanes(has_min, codes, dd, mm, yg, og, dg, sg):
    """Two rows x one group of 16 tokens in ``vec_dot``'s float order: per block ``d = d_w * d_y``, each of its 8
    lanes ``fma(d, float(partial), lane)``, then ``hsum_float_8`` (plus, with min terms, ``fma(m, s, c)`` per block
    added last, as ``*s = hsum_float_8(acc) + summs``)."""
    w0 = codes[0]
    w1 = codes[1]
    f = vzero()
    a = (f, f, f, f, f, f, f, f)
    b = (f, f, f, f, f, f, f, f)
    c0 = f
    c1 = f
    for blk in range(dd.shape[1]):
        dy = vload(dg, GROUP * blk)
        d0, d1 = vmul(vsplat(dd[0, blk]), dy), vmul(vsplat(dd[1, blk]), dy)
        ab = _block2(a, b, d0, d1, w0, w1, 32 * blk, yg, og)
        a = ab[0]
        b = ab[1]
        if has_min:
            s = vload(sg, GROUP * blk)
            c0, c1 = vfma(vsplat(mm[0, blk]), s, c0), vfma(vsplat(mm[1, blk]), s, c1)
    if has_min:
        return vadd(_hsum8(a), c0), vadd(_hsum8(b), c1)
    return _hsum8(a), _hsum8(b)


@njit(inline="always", cache=True)
def ktiled_lanes(unpack_rows, lanes, offset, has_min, w, yq, yd, ya, out):
    """``out = yq @ W.T`` for a 32-weight type in ``vec_dot``'s float order, 16 tokens a vector: ``unpack_rows(w, r,
    codes, dd, mm)`` (rows ``r``, ``r + 1``: quants one a byte, block ``d`` and ``m`` as float32), ``lanes`` the
    type's compiled :func:`band_group_lanes`, quants stored ``offset`` above their value, ``has_min``: ``ya`` holds
    the activation's block sums ``s`` (``q8_1``)."""
    n_out, k = out.shape[1], yq.shape[1]
    yg, dg = token_groups(yq), group_scales(yd)
    og = group_offsets(yq, offset)  # all zeros without an offset (Q4_1, Q5_1): the dot products start at 0
    sg = group_scales(ya) if has_min else dg
    for task in prange((n_out + LANE_TASK_ROWS - 1) // LANE_TASK_ROWS):
        first = min(LANE_TASK_ROWS * task, n_out - LANE_TASK_ROWS)  # the last task overlaps the one before
        # a task's rows unpacked at once, its buffers allocated once (per 2-row band it cost more than the work)
        codes = np.empty((LANE_TASK_ROWS, k), np.uint8)
        dd = np.empty((LANE_TASK_ROWS, k // 32), np.float32)
        mm = np.empty((LANE_TASK_ROWS, k // 32), np.float32)
        for r in range(0, LANE_TASK_ROWS, LANE_BAND):
            unpack_rows(w, first + r, codes[r : r + LANE_BAND], dd[r : r + LANE_BAND], mm[r : r + LANE_BAND])
        tmp = np.empty(GROUP, np.float32)
        for g in range(yg.shape[0]):
            n = min(GROUP, out.shape[0] - GROUP * g)
            for r in range(0, LANE_TASK_ROWS, LANE_BAND):
                v0, v1 = lanes(
                    codes[r : r + LANE_BAND], dd[r : r + LANE_BAND], mm[r : r + LANE_BAND], yg[g], og[g], dg[g], sg[g]
                )
                vstore(tmp, 0, v0)
                for t in range(n):
                    out[GROUP * g + t, first + r] = tmp[t]
                vstore(tmp, 0, v1)
                for t in range(n):
                    out[GROUP * g + t, first + r + 1] = tmp[t]
