"""Q2_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q2_K (84 bytes, 256 weights): ``scales[16] @0`` (lo 4 bits: sc, hi 4 bits: m) ``| qs[64] @16 | d @80 | dmin @82``;
``e = 128n + 32j + l``: ``u = (qs[32n + l] >> 2j) & 3``, sub-block ``8n + 2j + l//16``; ``w = d*sc*u - dmin*m``.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels import intdot, inttiles
from inference_engine.backends.numba_kernels.isa import int8, simd

_F32 = np.float32


@njit(inline="always", cache=True)
def q2_k_superblock(row, o, xv, xs, x0, acc, c):
    b = simd.bload(row, o)
    scales = simd.vmul(simd.vsplat(simd.load_f16(row, o + 80)), simd.bto_f32(simd.band(b, 15)))
    c = simd.vfma(
        simd.vmul(simd.vsplat(simd.load_f16(row, o + 82)), simd.bto_f32(simd.bshr(b, 4))), simd.vload(xs, x0 // 16), c
    )
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                u = simd.bto_f32(simd.band(simd.bshr(simd.bload(row, o + 16 + 32 * n + 16 * h), 2 * j), 3))
                acc = simd.vfma(simd.vlane(scales, k), simd.vmul(u, simd.vload(xv, x0 + 16 * k)), acc)
    return acc, c


@njit(inline="always", cache=True)
def dequant_superblock_q2_k(row, o, dst, y):
    """``dequantize_row_q2_k`` of the super-block at byte ``o`` into ``dst[y : y + 256]``."""
    d, dmin = simd.load_f16(row, o + 80), simd.load_f16(row, o + 82)
    for n in range(2):
        for j in range(4):
            for h in range(2):
                k = 8 * n + 2 * j + h
                sc = row[o + k]
                dl, ml = simd.vsplat(d * _F32(sc & 15)), simd.vsplat(dmin * _F32(sc >> 4))
                u = simd.bto_f32(simd.band(simd.bshr(simd.bload(row, o + 16 + 32 * n + 16 * h), 2 * j), 3))
                simd.vstore(dst, y + 16 * k, simd.vsub(simd.vmul(dl, u), ml))


# --- integer-dot mat-vec (ggml numerics, one token) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def q2_k_sumi(row, o, yq, e):
    """One super-block's integer sums with the activation from element ``e``, in ``ggml_vec_dot_q2_K_q8_K``'s
    (AVX2) lanes: lane L of each 32-quant step (elements ``128j + 32k + 4L .. + 3``) times its sub-block's 4-bit
    scale."""
    scales = int8.low_nibbles16(row, o)
    sumi = int8.izero()
    for j in range(2):
        q2bits = int8.load32(row, o + 16 + 32 * j)
        for k in range(4):
            u = int8.band8(int8.bshr8(q2bits, 2 * k), 3)
            y = int8.load32(yq, e + 128 * j + 32 * k)
            sumi = int8.iadd(sumi, int8.dot4_scaled_lanes(u, y, scales, 8 * j + 2 * k))
    return sumi


@njit(inline="always", cache=True)
def close_q2_k(row, o, ydi, ys, i, sumi, acc):
    """:func:`row_dot_q2_k`'s two multiply-adds of a super-block: the mins' term, then the quants'."""
    acc = int8.fma_int(-ydi * simd.load_f16(row, o + 82), int8.madd16_high_nibbles(ys, 16 * i, row, o), acc)
    return int8.fma_int(ydi * simd.load_f16(row, o + 80), sumi, acc)


@njit(inline="always", cache=True)
def row_dot_q2_k(w0, p0, yq, yd, ya):
    """One row as ``ggml_vec_dot_q2_K_q8_K`` (x86): per super-block first ``fma(-d_y * dmin, float(bsums . mins),
    acc)`` (mins the scale bytes' high nibbles, paired by ``vpmaddwd``), then ``fma(d_y * d, float(sumi), acc)``,
    lane by lane, ``hsum_float_8`` at the end: its values bit for bit."""
    a0 = int8.fzero()
    for i in range(yd.shape[0]):
        o = 84 * i
        intdot.prefetch_span(p0, o, 84)
        a0 = close_q2_k(w0, o, yd[i], ya, i, q2_k_sumi(w0, o, yq, 256 * i), a0)
    return int8.fsum(a0)


# --- register-tiled integer-dot kernel (ggml numerics, several tokens; :func:`..inttiles.tiled_pairs`) -------------
@njit(inline="always", cache=True)
def step_q2_k(u0, u1, sc0, sc1, s, yq, e, i0, i1):
    y = int8.load32(yq, e)
    return (int8.iadd(i0, int8.dot4_scaled_lanes(u0, y, sc0, s)),
            int8.iadd(i1, int8.dot4_scaled_lanes(u1, y, sc1, s)))


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_q2_k(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Two rows x four tokens, each output :func:`row_dot_q2_k`'s value bit for bit (``vec_dot``'s, which llama.cpp's
    ``mul_mat`` takes below 8 tokens): a step's quants and a super-block's scales serve the four tokens."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    s0, s1, s2, s3 = ya[t0], ya[t1], ya[t2], ya[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for i in range(d0.shape[0]):
        o = 84 * i
        i00, i01, i02, i03 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        i10, i11, i12, i13 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        sc0, sc1 = int8.low_nibbles16(w0, o), int8.low_nibbles16(w1, o)
        for j in range(2):
            b0, b1 = int8.load32(w0, o + 16 + 32 * j), int8.load32(w1, o + 16 + 32 * j)
            for k in range(4):
                u0, u1 = int8.band8(int8.bshr8(b0, 2 * k), 3), int8.band8(int8.bshr8(b1, 2 * k), 3)
                s, e = 8 * j + 2 * k, 256 * i + 128 * j + 32 * k
                i00, i10 = step_q2_k(u0, u1, sc0, sc1, s, y0, e, i00, i10)
                i01, i11 = step_q2_k(u0, u1, sc0, sc1, s, y1, e, i01, i11)
                i02, i12 = step_q2_k(u0, u1, sc0, sc1, s, y2, e, i02, i12)
                i03, i13 = step_q2_k(u0, u1, sc0, sc1, s, y3, e, i03, i13)
        a00, a10 = close_q2_k(w0, o, d0[i], s0, i, i00, a00), close_q2_k(w1, o, d0[i], s0, i, i10, a10)
        a01, a11 = close_q2_k(w0, o, d1[i], s1, i, i01, a01), close_q2_k(w1, o, d1[i], s1, i, i11, a11)
        a02, a12 = close_q2_k(w0, o, d2[i], s2, i, i02, a02), close_q2_k(w1, o, d2[i], s2, i, i12, a12)
        a03, a13 = close_q2_k(w0, o, d3[i], s3, i, i03, a03), close_q2_k(w1, o, d3[i], s3, i, i13, a13)
    return inttiles.fsums(a00, a01, a02, a03, a10, a11, a12, a13)


# --- llama.cpp's tiled mat-mul (AVX-512 VNNI, 8 tokens or more: :mod:`..ktiles`) ---------------------------------
@njit(inline="always", cache=True)
def unpack_rows_q2_k(w, r, codes, sc, mn, dd, dm):
    """Rows ``r .. r + 7``: their quants in element order, one a byte (0..3; ggml's ``tiled_unpack_src0``), the
    4-bit sub-block scales and mins as int32, ``d`` and ``dmin`` as float32."""
    for j in range(codes.shape[0]):
        row, dst = w[r + j], codes[j]
        for i in range(dd.shape[1]):
            o, e = 84 * i, 256 * i
            for n in range(2):
                for g in range(4):
                    for l in range(32):
                        dst[e + 128 * n + 32 * g + l] = (row[o + 16 + 32 * n + l] >> (2 * g)) & 3
            for s in range(16):
                sc[j, 16 * i + s] = row[o + s] & 15
                mn[j, 16 * i + s] = row[o + s] >> 4
            dd[j, i], dm[j, i] = simd.load_f16(row, o + 80), simd.load_f16(row, o + 82)
