"""Q2_K: all of the type's Numba kernels, and its kernel-table entry (:data:`KERNELS`). Layout (ggml-common.h):
Q2_K (84 bytes, 256 weights): ``scales[16] @0`` (lo 4 bits: sc, hi 4 bits: m) ``| qs[64] @16 | d @80 | dmin @82``;
``e = 128n + 32j + l``: ``u = (qs[32n + l] >> 2j) & 3``, sub-block ``8n + 2j + l//16``; ``w = d*sc*u - dmin*m``.
"""

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from inference_engine.backends.numba_kernels import float_blocks
from inference_engine.backends.numba_kernels.float_blocks import superblocks_matvec_float
from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import Kernels

_F32 = np.float32


# --- float mat-vec and dequantization (from k_quants.py) ------------------------------------------------------------
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
def layout_q2_k():
    """(super-block bytes, constant-term factor) for :func:`.float_blocks.superblocks_matvec_float`."""
    return 84, _F32(1.0)


@njit(parallel=True, fastmath=True, cache=True)
def matvec_float_q2_k(w, xv, xs, out):
    superblocks_matvec_float(q2_k_superblock, layout_q2_k, w, xv, xs, out)


@njit(parallel=True, cache=True)
def dequant_q2_k(w, row0, out):
    nsb = out.shape[1] // float_blocks.QK_K
    for r in prange(out.shape[0]):
        row, dst = w[row0 + r], out[r]
        for i in range(nsb):
            o, y = 84 * i, float_blocks.QK_K * i
            d, dmin = simd.load_f16(row, o + 80), simd.load_f16(row, o + 82)
            for n in range(2):
                for j in range(4):
                    for h in range(2):
                        k = 8 * n + 2 * j + h
                        sc = row[o + k]
                        dl, ml = simd.vsplat(d * _F32(sc & 15)), simd.vsplat(dmin * _F32(sc >> 4))
                        u = simd.bto_f32(simd.band(simd.bshr(simd.bload(row, o + 16 + 32 * n + 16 * h), 2 * j), 3))
                        simd.vstore(dst, y + 16 * k, simd.vsub(simd.vmul(dl, u), ml))


QTYPE = T.Q2_K
# the dispatcher's entry for this type (:class:`~..kernel_entry.Kernels`: which kernel serves which path)
KERNELS = Kernels(matvec_float_q2_k, dequant_q2_k, "q8_K", 16)
