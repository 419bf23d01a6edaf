"""IQ4_NL: the type's own arithmetic (which loops its kernels are: :data:`..kernel_specs.SPECS`; compiled in
:mod:`..entries`). Layout (ggml-common.h): IQ4_NL (18 bytes, 32 weights): ``| d f16 | qs[16] |``; ``w[j] = d *
KVALUES[lo(qs[j])]``, ``w[j+16] = d * KVALUES[hi(qs[j])]`` with the 16-value code book
:data:`inference_engine.quants.iquants.KVALUES`. No constant term (the code book is not offset).

Float kernels only (the ``float`` family in ggml numerics too: the fake-quantized Q8_0 activation times the
looked-up values, llama.cpp's integer dot to float summation order); IQ4_XS unpacks its sub-blocks the same way.
"""

from numba import njit

from inference_engine.backends.numba_kernels.isa.simd import bload, blookup, bshr, bto_f32_signed
from inference_engine.quants.iquants import KVALUES

_CODE_BOOK = KVALUES.view("uint8")  # the int8 table as the bytes blookup indexes (a constant in compiled code)


@njit(inline="always", cache=True)
def code_book_values(row, off):
    """The 32 values the 16 bytes at ``row[off:off+16]`` code for, as two F32x16 (lo nibbles: 0..15, hi: 16..31)."""
    table = bload(_CODE_BOOK, 0)
    q = bload(row, off)
    return bto_f32_signed(blookup(table, q)), bto_f32_signed(blookup(table, bshr(q, 4)))


@njit(inline="always", cache=True)
def unpack_iq4_nl(row, o):
    """The block at byte ``o``'s 32 code-book values (before ``d``) as two F32x16 (the float kernels)."""
    return code_book_values(row, o + 2)
