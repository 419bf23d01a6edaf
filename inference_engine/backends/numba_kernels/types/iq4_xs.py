"""IQ4_XS: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`; compiled in
:mod:`..entries`). Layout (ggml-common.h): IQ4_XS (136 bytes, 256 weights in 8 sub-blocks of 32): ``| d f16 |
scales_h u16 | scales_l[4] | qs[128] |``; sub-block ``s`` has the 6-bit ``ls = nibble s%2 of scales_l[s/2] |
bits(scales_h, 2s, 2) << 4`` and its 32 weights ``d * (ls - 32) * KVALUES[code]``, the codes as IQ4_NL's block
(:func:`.iq4_nl.code_book_values`). No constant term; float kernels only, as IQ4_NL.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels.isa.simd import load_f16, vfma, vload, vmul, vsplat, vstore
from inference_engine.backends.numba_kernels.types.iq4_nl import code_book_values

_F32 = np.float32


@njit(inline="always", cache=True)
def sub_block_scale(row, o, d, s):
    """``d * (ls - 32)`` of sub-block ``s`` of the super-block at byte ``o`` (ggml's ``dl``: exact in float32)."""
    low = (row[o + 4 + s // 2] >> (4 * (s % 2))) & 15
    high = ((row[o + 2 + s // 4] >> (2 * (s % 4))) & 3) << 4
    return d * _F32(np.int32(low | high) - 32)


@njit(inline="always", cache=True)
def iq4_xs_superblock(row, o, xv, xs, x0, acc, c):
    """One super-block for :func:`..float_blocks.superblocks_matvec_float` (``xs``, ``c``: no constant term)."""
    d = load_f16(row, o)
    for s in range(8):
        lo, hi = code_book_values(row, o + 8 + 16 * s)
        e = x0 + 32 * s
        acc = vfma(vsplat(sub_block_scale(row, o, d, s)), vfma(hi, vload(xv, e + 16), vmul(lo, vload(xv, e))), acc)
    return acc, c


@njit(inline="always", cache=True)
def dequant_superblock_iq4_xs(row, o, dst, y):
    """``dequantize_row_iq4_xs`` of the super-block at byte ``o`` into ``dst[y : y + 256]`` (``dl * value``)."""
    d = load_f16(row, o)
    for s in range(8):
        dl = vsplat(sub_block_scale(row, o, d, s))
        lo, hi = code_book_values(row, o + 8 + 16 * s)
        vstore(dst, y + 32 * s, vmul(dl, lo))
        vstore(dst, y + 32 * s + 16, vmul(dl, hi))
