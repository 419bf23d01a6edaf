"""Q3_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q3_K (110 bytes, 256 weights): ``hmask[32] @0 | qs[64] @32 | scales[12] @96`` (16 x 6 bits, minus 32) ``| d @108``;
``e = 128n + 32j + l``: ``u = ((qs[32n + l] >> 2j) & 3) | (bit (4n + j) of hmask[l]) << 2``, sub-block ``8n + 2j +
l//16``; ``w = d*sc*(u - 4)``.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels.isa import simd

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
