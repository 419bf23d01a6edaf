"""Q2_K: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`;
compiled in :mod:`..entries`). Layout (ggml-common.h):
Q2_K (84 bytes, 256 weights): ``scales[16] @0`` (lo 4 bits: sc, hi 4 bits: m) ``| qs[64] @16 | d @80 | dmin @82``;
``e = 128n + 32j + l``: ``u = (qs[32n + l] >> 2j) & 3``, sub-block ``8n + 2j + l//16``; ``w = d*sc*u - dmin*m``.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels.isa import simd

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
