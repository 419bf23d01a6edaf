"""Q3_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q3_K (110 bytes, 256 weights): ``hmask[32] @0 | qs[64] @32 | scales[12] @96`` (16 x 6 bits, minus 32) ``| d @108``;
``e = 128n + 32j + l``: ``u = ((qs[32n + l] >> 2j) & 3) | (bit (4n + j) of hmask[l]) << 2``, sub-block ``8n + 2j +
l//16``; ``w = d*sc*(u - 4)``.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels import intdot, inttiles
from inference_engine.backends.numba_kernels.isa import int8, simd

_F32 = np.float32


@njit(inline="always", cache=True)
def scale_q3_k(row, off, k):
    """Q3_K's signed 6-bit scale of sub-block ``k`` (0..15) from its 12 scale bytes at ``off``."""
    low = (row[off + (k & 7)] >> (4 * (k >> 3))) & 15
    high = (row[off + 8 + (k & 3)] >> (2 * (k >> 2))) & 3
    return (low | (high << 4)) - 32


@njit(inline="always", cache=True)
def q3_k_scales(row, off, d):
    """Q3_K: the 16 ``d * (sc_k - 32)`` from the 12 scale bytes at ``off`` (reads off-2 .. off+14)."""
    b = simd.bload(row, off - 2)  # scale byte i is b[i + 2]; starting 2 early keeps the load inside the block
    low = simd.band(simd.bshr_lanes(simd.bshuffle(b, "2345 6789 2345 6789"), "0000 0000 4444 4444"), 15)
    high = simd.band(simd.bshr_lanes(simd.bshuffle(b, "abcd abcd abcd abcd"), "0000 2222 4444 6666"), 3)
    return simd.vmul(
        simd.vsplat(d), simd.vsub(simd.bto_f32(simd.bor(low, simd.bshl(high, 4))), simd.vsplat(_F32(32.0)))
    )


@njit(inline="always", cache=True)
def q3_k_superblock(row, o, xv, xs, x0, acc, c):
    scales = q3_k_scales(row, o + 96, simd.load_f16(row, o + 108))
    c = simd.vfma(scales, simd.vload(xs, x0 // 16), c)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                low = simd.band(simd.bshr(simd.bload(row, o + 32 + 32 * n + 16 * h), 2 * j), 3)
                high = simd.bshl(simd.band(simd.bshr(simd.bload(row, o + 16 * h), 4 * n + j), 1), 2)
                acc = simd.vfma(
                    simd.vlane(scales, k),
                    simd.vmul(simd.bto_f32(simd.bor(low, high)), simd.vload(xv, x0 + 16 * k)),
                    acc,
                )
    return acc, c


@njit(inline="always", cache=True)
def dequant_superblock_q3_k(row, o, dst, y):
    """``dequantize_row_q3_k`` of the super-block at byte ``o`` into ``dst[y : y + 256]``."""
    d = simd.load_f16(row, o + 108)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                dl = simd.vsplat(d * _F32(scale_q3_k(row, o + 96, k)))
                low = simd.band(simd.bshr(simd.bload(row, o + 32 + 32 * n + 16 * h), 2 * j), 3)
                high = simd.bshl(simd.band(simd.bshr(simd.bload(row, o + 16 * h), 4 * n + j), 1), 2)
                q = simd.vsub(simd.bto_f32(simd.bor(low, high)), simd.vsplat(_F32(4.0)))
                simd.vstore(dst, y + 16 * k, simd.vmul(dl, q))


# --- integer-dot mat-vec (ggml numerics, one token) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def quants_q3_k(bits, clear, j, k):
    """Step ``(j, k)``'s low 2 bits and its 4s where the high bit is clear (:func:`q3_k_sumi`)."""
    return (int8.band8(int8.bshr8(bits, 2 * k), 3),
            int8.bshl8(int8.band8(int8.bshr8(clear, 4 * j + k), 1), 2))


@njit(inline="always", cache=True)
def q3_k_sumi(row, o, yq, e):
    """One super-block's integer sums with the activation from element ``e``, in ``ggml_vec_dot_q3_K_q8_K``'s
    (AVX2) lanes: lane L of each 32-quant step (elements ``128j + 32k + 4L .. + 3``) times its sub-block's scale,
    the value ``u - 4`` formed as ``low - 4 * (1 - high bit)`` (:func:`~..isa.int8.dot4_diff_scaled_lanes`)."""
    scales = int8.q3_k_scales16(row, o + 94)
    clear = int8.bxor8(int8.load32(row, o), 255)  # the high bits inverted: 1 where the value is low - 4
    sumi = int8.izero()
    for j in range(2):
        q3bits = int8.load32(row, o + 32 + 32 * j)
        for k in range(4):
            low, minus4 = quants_q3_k(q3bits, clear, j, k)
            y = int8.load32(yq, e + 128 * j + 32 * k)
            sumi = int8.iadd(sumi, int8.dot4_diff_scaled_lanes(low, minus4, y, scales, 8 * j + 2 * k))
    return sumi


@njit(inline="always", cache=True)
def row_dot_q3_k(w0, p0, yq, yd, ya):
    """One row as ``ggml_vec_dot_q3_K_q8_K`` (x86): per super-block ``fma(d_y * d_w, float(sumi), acc)`` lane by
    lane, ``hsum_float_8`` at the end: its values bit for bit (``ya``, the block sums, unused: the offset is in
    the lanes)."""
    a0 = int8.fzero()
    for i in range(yd.shape[0]):
        o = 110 * i
        intdot.prefetch_span(p0, o, 110)
        a0 = int8.fma_int(yd[i] * simd.load_f16(w0, o + 108), q3_k_sumi(w0, o, yq, 256 * i), a0)
    return int8.fsum(a0)


# --- register-tiled integer-dot kernel (ggml numerics, several tokens; :func:`..inttiles.tiled_pairs`) -------------
@njit(inline="always", cache=True)
def step_q3_k(l0, m0, l1, m1, sc0, sc1, s, yq, e, i0, i1):
    y = int8.load32(yq, e)
    return (int8.iadd(i0, int8.dot4_diff_scaled_lanes(l0, m0, y, sc0, s)),
            int8.iadd(i1, int8.dot4_diff_scaled_lanes(l1, m1, y, sc1, s)))


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q3_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Two rows x four tokens, each output :func:`row_dot_q3_k`'s value bit for bit (``vec_dot``'s, which llama.cpp
    takes below its tiled kernel's floor): a step's quants and a super-block's scales serve the four tokens."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for i in range(d0.shape[0]):
        o = 110 * i
        i00, i01, i02, i03 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        i10, i11, i12, i13 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        sc0, sc1 = int8.q3_k_scales16(w0, o + 94), int8.q3_k_scales16(w1, o + 94)
        c0, c1 = int8.bxor8(int8.load32(w0, o), 255), int8.bxor8(int8.load32(w1, o), 255)
        for j in range(2):
            b0, b1 = int8.load32(w0, o + 32 + 32 * j), int8.load32(w1, o + 32 + 32 * j)
            for k in range(4):
                l0, m0 = quants_q3_k(b0, c0, j, k)
                l1, m1 = quants_q3_k(b1, c1, j, k)
                s, e = 8 * j + 2 * k, 256 * i + 128 * j + 32 * k
                i00, i10 = step_q3_k(l0, m0, l1, m1, sc0, sc1, s, y0, e, i00, i10)
                i01, i11 = step_q3_k(l0, m0, l1, m1, sc0, sc1, s, y1, e, i01, i11)
                i02, i12 = step_q3_k(l0, m0, l1, m1, sc0, sc1, s, y2, e, i02, i12)
                i03, i13 = step_q3_k(l0, m0, l1, m1, sc0, sc1, s, y3, e, i03, i13)
        f0, f1 = simd.load_f16(w0, o + 108), simd.load_f16(w1, o + 108)
        a00, a10 = int8.fma_int(d0[i] * f0, i00, a00), int8.fma_int(d0[i] * f1, i10, a10)
        a01, a11 = int8.fma_int(d1[i] * f0, i01, a01), int8.fma_int(d1[i] * f1, i11, a11)
        a02, a12 = int8.fma_int(d2[i] * f0, i02, a02), int8.fma_int(d2[i] * f1, i12, a12)
        a03, a13 = int8.fma_int(d3[i] * f0, i03, a03), int8.fma_int(d3[i] * f1, i13, a13)
    return inttiles.fsums(a00, a01, a02, a03, a10, a11, a12, a13)


# --- llama.cpp's tiled mat-mul (AVX-512 VNNI, 8 tokens or more: :mod:`..ktiles`) ---------------------------------
@njit(inline="always", cache=True)
def unpack_rows_q3_k(w, r, codes, sc, mn, dd, dm):
    """Rows ``r .. r + 7``: their quants in element order, one a byte (0..7, 4 above the value; ggml's
    ``tiled_unpack_src0``), the signed 6-bit sub-block scales as int32, ``d`` as float32 (no min terms)."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for i in range(dd.shape[1]):
            o, e = 110 * i, 256 * i
            for n in range(2):
                for g in range(4):
                    for l in range(32):
                        low = (row[o + 32 + 32 * n + l] >> (2 * g)) & 3
                        high = (row[o + l] >> (4 * n + g)) & 1
                        dst[e + 128 * n + 32 * g + l] = low | (high << 2)
            for s in range(16):
                sc[j, 16 * i + s] = scale_q3_k(row, o + 96, s)
            dd[j, i] = simd.load_f16(row, o + 108)
            dm[j, i] = _F32(0.0)
