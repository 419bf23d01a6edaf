"""IQ4_XS: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`; compiled in
:mod:`..entries`). Layout (ggml-common.h): IQ4_XS (136 bytes, 256 weights in 8 sub-blocks of 32): ``| d f16 |
scales_h u16 | scales_l[4] | qs[128] |``; sub-block ``s`` has the 6-bit ``ls = nibble s%2 of scales_l[s/2] |
bits(scales_h, 2s, 2) << 4`` and its 32 weights ``d * (ls - 32) * KVALUES[code]``, the codes as IQ4_NL's block
(:func:`.iq4_nl.code_book_values`). No constant term. The ggml-numerics mat-vec is llama.cpp's integer one.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels import intdot, inttiles
from inference_engine.backends.numba_kernels.float_blocks import QK_K
from inference_engine.backends.numba_kernels.isa import int8
from inference_engine.backends.numba_kernels.isa.simd import load_f16, vfma, vload, vmul, vsplat, vstore
from inference_engine.backends.numba_kernels.types.iq4_nl import CODE_BOOK, code_book_values

_F32 = np.float32


@njit(inline="always", cache=True)
def sub_block_code(row, o, s):
    """``ls - 32`` of sub-block ``s`` of the super-block at byte ``o`` (-32..31)."""
    low = (row[o + 4 + s // 2] >> (4 * (s % 2))) & 15
    high = ((row[o + 2 + s // 4] >> (2 * (s % 4))) & 3) << 4
    return np.int32(low | high) - 32


@njit(inline="always", cache=True)
def sub_block_scale(row, o, d, s):
    """``d * (ls - 32)`` of sub-block ``s`` (ggml's ``dl``: exact in float32)."""
    return d * _F32(sub_block_code(row, o, s))


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


# --- integer-dot mat-vec (ggml numerics, one token) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def row_dot_iq4_xs(w0, p0, yq, yd, ya):
    """One row as ``ggml_vec_dot_iq4_xs_q8_K`` (x86): per super-block the exact integer sum over its 8 sub-blocks of
    ``(ls - 32) * dot(values, q8)`` (``vpmaddubsw`` then ``vpmaddwd`` with the scale), then ``fma(d_w * d_y,
    float(sum), acc)``, ``hsum_float_8`` at the end: its values bit for bit (``ya``, the block sums, unused)."""
    a0 = int8.fzero()
    for i in range(yd.shape[0]):
        o = 136 * i
        intdot.prefetch_span(p0, o, 136)
        sumi = int8.izero()
        for s in range(8):
            q = int8.lookup32(CODE_BOOK, w0, o + 8 + 16 * s)
            y = int8.load32(yq, QK_K * i + 32 * s)
            sumi = int8.iadd(sumi, int8.dot4_signed_scaled(q, y, sub_block_code(w0, o, s)))
        a0 = int8.fma_int(load_f16(w0, o) * yd[i], sumi, a0)
    return int8.fsum(a0)


# --- register-tiled integer-dot kernel (ggml numerics, several tokens; :func:`..inttiles.tiled_pairs`) -------------
@njit(inline="always", cache=True)
def step_iq4_xs(x0, x1, k0, k1, y, e, i0, i1):
    q = int8.load32(y, e)
    return (int8.iadd(i0, int8.dot4_signed_scaled(x0, q, k0)), int8.iadd(i1, int8.dot4_signed_scaled(x1, q, k1)))


@njit(cache=True)  # not inlined: the parfor pass's array analysis rejects its tuple states
def tile_iq4_xs(w0, w1, yq, yd, ya, t0, t1, t2, t3):
    """Two rows x four tokens, each output :func:`row_dot_iq4_xs`'s value bit for bit (``vec_dot``'s, which llama.cpp
    takes at every token count for IQ4_XS): a sub-block's code-book lookup and scale serve the four tokens."""
    y0, y1, y2, y3 = yq[t0], yq[t1], yq[t2], yq[t3]
    d0, d1, d2, d3 = yd[t0], yd[t1], yd[t2], yd[t3]
    a00, a01, a02, a03 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    a10, a11, a12, a13 = int8.fzero(), int8.fzero(), int8.fzero(), int8.fzero()
    for i in range(d0.shape[0]):
        o = 136 * i
        i00, i01, i02, i03 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        i10, i11, i12, i13 = int8.izero(), int8.izero(), int8.izero(), int8.izero()
        for s in range(8):
            x0 = int8.lookup32(CODE_BOOK, w0, o + 8 + 16 * s)
            x1 = int8.lookup32(CODE_BOOK, w1, o + 8 + 16 * s)
            k0, k1 = sub_block_code(w0, o, s), sub_block_code(w1, o, s)
            e = QK_K * i + 32 * s
            i00, i10 = step_iq4_xs(x0, x1, k0, k1, y0, e, i00, i10)
            i01, i11 = step_iq4_xs(x0, x1, k0, k1, y1, e, i01, i11)
            i02, i12 = step_iq4_xs(x0, x1, k0, k1, y2, e, i02, i12)
            i03, i13 = step_iq4_xs(x0, x1, k0, k1, y3, e, i03, i13)
        f0, f1 = load_f16(w0, o), load_f16(w1, o)
        a00, a10 = int8.fma_int(f0 * d0[i], i00, a00), int8.fma_int(f1 * d0[i], i10, a10)
        a01, a11 = int8.fma_int(f0 * d1[i], i01, a01), int8.fma_int(f1 * d1[i], i11, a11)
        a02, a12 = int8.fma_int(f0 * d2[i], i02, a02), int8.fma_int(f1 * d2[i], i12, a12)
        a03, a13 = int8.fma_int(f0 * d3[i], i03, a03), int8.fma_int(f1 * d3[i], i13, a13)
    return inttiles.fsums(a00, a01, a02, a03, a10, a11, a12, a13)
