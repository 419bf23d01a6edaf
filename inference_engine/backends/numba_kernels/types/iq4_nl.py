"""IQ4_NL: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`; compiled in
:mod:`..entries`). Layout (ggml-common.h): IQ4_NL (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d *
KVALUES[lo(qs[j])]``, ``w[j+16] = d * KVALUES[hi(qs[j])]`` with the 16-value code book
:data:`inference_engine.quants.iquants.KVALUES`. No constant term (the code book is not offset).

The float kernels look the code book up 16 bytes at a time (``simd.blookup``); the ggml-numerics mat-vec takes
integer dots of the looked-up int8 values with the Q8_0 activation (``int8.lookup32``), as llama.cpp's ``vec_dot``
does, in the order llama.cpp takes for the weight: its repacked gemv's for rows a multiple of :data:`REPACKED_ROWS`
on AVX2 / AVX-512, ``vec_dot``'s otherwise; a batch on AVX-512 VNNI goes through :func:`..ktiles.ktiled_blocks` in
its repacked gemm's order (the values plus 128, unsigned, as ``vpdpbusd`` takes them). IQ4_XS unpacks its
sub-blocks the same way.
"""

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels import intdot, ktiles
from inference_engine.backends.numba_kernels.isa import int8, zmm
from inference_engine.backends.numba_kernels.isa.simd import (
    bload,
    blookup,
    bshr,
    bto_f32_signed,
    bxor,
    fma32,
    load_f16,
)
from inference_engine.quants.iquants import KVALUES

# llama.cpp repacks an IQ4_NL weight whose rows are a multiple of this at load (x86 with AVX2: block_iq4_nlx8,
# ggml_repack_get_optimal_repack_type) and multiplies it by the same gemm / gemv as a repacked Q4_0 (a lookup where
# Q4_0 subtracts 8): per block the exact integer dot, then ``acc = fma(float(sum), d_w * d_y, acc)``.
REPACKED_ROWS = 8

CODE_BOOK = KVALUES.view("uint8")  # the int8 table as the bytes blookup indexes (a constant in compiled code)
CODE_BOOK_PLUS_128 = (KVALUES.astype(np.int16) + 128).astype(np.uint8)  # vpdpbusd's unsigned operand (1..241)


@njit(inline="always", cache=True)
def code_book_bytes(row, off):
    """The 32 int8 values the 16 bytes at ``row[off:off+16]`` code for, as two U8x16 (lo nibbles: 0..15, hi:
    16..31)."""
    table = bload(CODE_BOOK, 0)
    q = bload(row, off)
    return blookup(table, q), blookup(table, bshr(q, 4))


@njit(inline="always", cache=True)
def code_book_values(row, off):
    """:func:`code_book_bytes` as two F32x16."""
    lo, hi = code_book_bytes(row, off)
    return bto_f32_signed(lo), bto_f32_signed(hi)


@njit(inline="always", cache=True)
def unpack_iq4_nl(row, o):
    """The block at byte ``o``'s 32 code-book values (before ``d``) as two F32x16 (the float kernels)."""
    return code_book_values(row, o + 2)


# --- integer-dot mat-vec (ggml numerics, one token) ----------------------------------------------------------------
@njit(inline="always", cache=True)
def block_dot_iq4_nl(row, o, yq, b):
    """I32x8: the block at byte ``o``'s code-book values dotted with the Q8_0 activation's block ``b`` (exact)."""
    return int8.dot4_signed(int8.lookup32(CODE_BOOK, row, o + 2), int8.load32(yq, 32 * b))


@njit(inline="always", cache=True)
def row_dot_iq4_nl(w0, p0, yq, yd, ya):
    """One row in ``ggml_vec_dot_iq4_nl_q8_0``'s order (x86): blocks in pairs, even ones into one accumulator and
    odd ones into another (``fma(d_y d_w, float(dot), acc)``), ``hsum_float_8`` of their sum, an odd last block
    added as a scalar (``sumf += d * sumi``: two roundings, as libggml is built; ``ya`` unused). For rows llama.cpp
    does not repack (:func:`matvec_int_loop_iq4_nl`)."""
    nb = yd.shape[0]
    a0, a1 = int8.fzero(), int8.fzero()
    b = 0
    while b + 1 < nb:
        o = 18 * b
        intdot.prefetch_span(p0, o, 36)
        a0 = int8.fma_int(yd[b] * load_f16(w0, o), block_dot_iq4_nl(w0, o, yq, b), a0)
        a1 = int8.fma_int(yd[b + 1] * load_f16(w0, o + 18), block_dot_iq4_nl(w0, o + 18, yq, b + 1), a1)
        b += 2
    total = int8.fsum(int8.fadd8(a0, a1))
    if b < nb:
        o = 18 * b
        total += (yd[b] * load_f16(w0, o)) * np.float32(int8.ihsum(block_dot_iq4_nl(w0, o, yq, b)))
    return total


@njit(inline="always", cache=True)
def row_dot_iq4_nl_repacked(w0, p0, yq, yd, ya):
    """One row in llama.cpp's repacked gemv's order (``gemv_q4_b32_8x8_q8_0_lut_avx``): per block the exact integer
    dot, then ``acc = fma(float(sum), d_w * d_y, acc)``, one float accumulator (``ya`` unused)."""
    acc = np.float32(0.0)
    for b in range(yd.shape[0]):
        o = 18 * b
        intdot.prefetch_span(p0, o, 18)
        acc = fma32(np.float32(int8.ihsum(block_dot_iq4_nl(w0, o, yq, b))), load_f16(w0, o) * yd[b], acc)
    return acc


@njit(inline="always", cache=True)
def dots_iq4_nl(w0, w1, w2, w3, o, yq, yo, starts, so):
    """Four rows' block at byte ``o`` (its codes) dotted with the activation: the code book's values ``. y``
    (``starts``: ``-128 * sum4(y)``), the repacked gemv's step (:func:`..intdot.repacked_quad_blocks`)."""
    return zmm.code_book_dots(w0, w1, w2, w3, o, yq, yo, starts, so, CODE_BOOK_PLUS_128)


@njit(inline="always", cache=True)
def matvec_int_loop_iq4_nl(w, yq, yd, ya, out):
    """One token as llama.cpp multiplies the weight: rows a multiple of :data:`REPACKED_ROWS` on AVX-512 VNNI and
    AVX2 (kernels compiled for either) in the repacked gemv's order (on AVX-512 VNNI eight rows a step:
    :func:`..intdot.repacked_quads_matvec`), others in ``vec_dot``'s."""
    n = out.shape[0]
    if zmm.compiled_isa() == 2 and n % REPACKED_ROWS == 0:
        intdot.repacked_quads_matvec(dots_iq4_nl, 128, w, yq, yd, ya, out)
    elif zmm.compiled_isa() >= 1 and n % REPACKED_ROWS == 0:
        intdot.rows_matvec(row_dot_iq4_nl_repacked, w, yq, yd, ya, out)
    else:
        intdot.rows_matvec(row_dot_iq4_nl, w, yq, yd, ya, out)


# --- 16 tokens a vector in the repacked gemm's order (:func:`..ktiles.ktiled_blocks`; AVX-512 VNNI only: the
# values plus 128 reach 241, which ``vpmaddubsw``'s pairs on AVX2 would saturate) ----------------------------------
@njit(inline="always", cache=True)
def halves_iq4_nl(row, o):
    """The block at ``o``'s code-book values plus 128 (unsigned bytes), elements 0..15 and 16..31."""
    lo, hi = code_book_bytes(row, o + 2)
    return bxor(lo, 128), bxor(hi, 128)


@njit(inline="always", cache=True)
def unpack_rows_iq4_nl(w, r, codes, dd, mm):
    """Rows ``r ..`` for :func:`..ktiles.ktiled_blocks` (:func:`..ktiles.unpack_blocks`): values + 128; ``d``."""
    ktiles.unpack_blocks(halves_iq4_nl, 18, 0, w, r, codes, dd, mm)
