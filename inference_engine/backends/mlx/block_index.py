"""The NumPy twin of ``gpu_kernels/gguf_blocks.h``: for value ``i`` of a block, which bytes, which bits, which scale.

The GPU kernels decode Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS and IQ4_NL blocks with the C functions of
``gguf_blocks.h`` (one text for Metal, CUDA and the host compiler). This module states the same index arithmetic as
data, line for line with the header, so that it can be checked on every machine without a compiler: :func:`values`
rebuilds every value of a block from these positions alone, and the tests hold it to gguf-py's dequantization
(ggml's ``dequantize_row_<type>``) bit for bit, and check that the fields of the 256 values use every bit of the
quant bytes exactly once.

A block holds ``QK = 256`` values in 16 sub-blocks of ``SUB = 16``. Value ``i`` is

* an integer code ``q(i) = sum_f (bits(byte_f, shift_f, width_f) << dest_f) + offset`` (:attr:`Layout.quant`;
  IQ4_XS's and IQ4_NL's bits index a code book first: ``q(i) = book[bits]``),
* in sub-block ``s = i // 16`` with a scale code ``sc(s)`` and, for Q2_K, Q4_K and Q5_K, a min code ``m(s)`` built
  the same way, and f16 factors ``d`` (and ``dmin``) at fixed offsets (IQ4_NL: each of its eight 32-value file
  blocks' own ``d``, scale code 1);
* ``value = (d * sc) * q - (dmin * m)`` in float32, in ggml's order (Q3_K and Q6_K have no min term).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.quants.iquants import KVALUES

QK = 256  # values per block (GQ_QK)
SUB = 16  # values per sub-block (GQ_SUB): one scale
_F32 = np.float32


@dataclass(frozen=True)
class Field:
    """``width`` bits from bit ``shift`` of byte ``byte`` of the block, placed at bit ``dest`` of the code.
    ``byte`` and ``shift`` are arrays over the values (or sub-blocks) they serve."""

    byte: np.ndarray
    shift: np.ndarray
    width: int
    dest: int = 0


@dataclass(frozen=True)
class Code:
    """An integer made of bit fields plus ``offset``; ``signed``: the result is an int8 (two's complement)."""

    fields: tuple[Field, ...]
    offset: int = 0
    signed: bool = False
    book: np.ndarray | None = None  # a code book: the code is an index into it (IQ4_XS's kvalues_iq4nl)

    def read(self, blocks: np.ndarray) -> np.ndarray:
        """uint8 ``(n_blocks, type_size)`` -> int64 ``(n_blocks, len)`` codes."""
        code = np.zeros((blocks.shape[0], len(self.fields[0].byte)), dtype=np.int64)
        for f in self.fields:
            bits = (blocks[:, f.byte].astype(np.int64) >> f.shift) & ((1 << f.width) - 1)
            code |= bits << f.dest
        if self.signed:
            code = code - ((code & 0x80) << 1)
        if self.book is not None:
            code = self.book.astype(np.int64)[code]
        return code + self.offset


@dataclass(frozen=True)
class Layout:
    """One block type: its size, the f16 factors' offsets, the codes per value and per sub-block."""

    qtype: T
    type_size: int
    d_offset: int | np.ndarray  # one offset, or one per sub-block (IQ4_NL: each file block's own d)
    quant: Code  # per value i = 0..255
    scale: Code  # per sub-block s = 0..15
    min_offset: int | None = None  # dmin's offset (Q2_K, Q4_K, Q5_K), None: no min term
    min: Code | None = None

    def values(self, blocks: np.ndarray) -> np.ndarray:
        """uint8 ``(n_blocks, type_size)`` -> float32 ``(n_blocks, 256)``, in ggml's float32 operations."""
        q = self.quant.read(blocks).astype(_F32)  # (n, 256)
        sub = np.arange(QK) // SUB
        d = (_f16(blocks, self.d_offset)[:, None] if np.ndim(self.d_offset) == 0
             else np.stack([_f16(blocks, int(o)) for o in self.d_offset], axis=1))
        scale = (d * self.scale.read(blocks).astype(_F32))[:, sub]
        value = scale * q  # exact for Q2_K and Q3_K; Q6_K's one rounding, as ggml's
        if self.min is not None:
            minimum = _f16(blocks, self.min_offset)[:, None] * self.min.read(blocks).astype(_F32)
            value = value - minimum[:, sub]
        return value.astype(_F32)


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16)[:, 0].astype(_F32)


# Index arrays, as the header names them: value i = 128h + 32j + l (j is also Q6_K's k), sub-block s.
_i = np.arange(QK)
_h, _j, _l = _i >> 7, (_i >> 5) & 3, _i & 31
_s = np.arange(QK // SUB)


def _const(v: int, n: int) -> np.ndarray:
    return np.full(n, v, dtype=np.int64)


# Q2_K: 84 bytes | scales[16] | qs[64] | d @80 | dmin @82 |; q = bits(qs[32h + l], 2j, 2);
# scale code lo(scales[s]), min code hi(scales[s]).
Q2_K = Layout(
    T.Q2_K,
    84,
    d_offset=80,
    quant=Code((Field(16 + 32 * _h + _l, 2 * _j, 2),)),
    scale=Code((Field(_s, _const(0, 16), 4),)),
    min_offset=82,
    min=Code((Field(_s, _const(4, 16), 4),)),
)

# Q3_K: 110 bytes | hmask[32] | qs[64] | scales[12] | d @108 |; q = bits(qs[32h + l], 2j, 2) | hbit << 2, minus 4
# (hbit = bits(hmask[l], 4h + j, 1): a clear bit subtracts 4); six-bit scale: nibble s/8 of scales[s % 8] |
# bits(scales[8 + s%4], 2(s/4), 2) << 4, minus 32.
Q3_K = Layout(
    T.Q3_K,
    110,
    d_offset=108,
    quant=Code((Field(32 + 32 * _h + _l, 2 * _j, 2), Field(_l, 4 * _h + _j, 1, dest=2)), offset=-4),
    scale=Code((Field(96 + (_s & 7), 4 * (_s >> 3), 4), Field(104 + (_s & 3), 2 * (_s >> 2), 2, dest=4)), offset=-32),
)

# Q4_K / Q5_K's six-bit codes of ggml's 32-value sub-block j = s/2 (get_scale_min_k4), as two fields each: for j < 4
# sc = bits(scales[j], 0, 6) (its low nibble, then bits 4-5), m the same of scales[j + 4]; for j >= 4 sc =
# lo(scales[j + 4]) | bits(scales[j - 4], 6, 2) << 4 and m = hi(scales[j + 4]) | bits(scales[j], 6, 2) << 4.
_k = _s >> 1
_low4 = _k < 4
K4_SCALE = Code((Field(4 + np.where(_low4, _k, _k + 4), _const(0, 16), 4),
                 Field(4 + np.where(_low4, _k, _k - 4), np.where(_low4, 4, 6), 2, dest=4)))
K4_MIN = Code((Field(4 + _k + 4, np.where(_low4, 0, 4), 4),
               Field(4 + np.where(_low4, _k + 4, _k), np.where(_low4, 4, 6), 2, dest=4)))

# Q4_K: 144 bytes | d @0 | dmin @2 | scales[12] @4 | qs[128] @16 |; value i = 64h + 32k + l: q = nibble k of
# qs[32h + l].
_h64, _k32 = _i >> 6, (_i >> 5) & 1
Q4_K = Layout(
    T.Q4_K,
    144,
    d_offset=0,
    quant=Code((Field(16 + 32 * _h64 + _l, 4 * _k32, 4),)),
    scale=K4_SCALE,
    min_offset=2,
    min=K4_MIN,
)

# Q5_K: 176 bytes | d @0 | dmin @2 | scales[12] @4 | qh[32] @16 | qs[128] @48 |; q = nibble k of qs[32h + l] |
# bits(qh[l], i/32, 1) << 4.
Q5_K = Layout(
    T.Q5_K,
    176,
    d_offset=0,
    quant=Code((Field(48 + 32 * _h64 + _l, 4 * _k32, 4), Field(16 + _l, _i >> 5, 1, dest=4))),
    scale=K4_SCALE,
    min_offset=2,
    min=K4_MIN,
)

# Q6_K: 210 bytes | ql[128] | qh[64] | scales[16]: int8 | d @208 |; q = nibble k/2 of ql[64h + 32(k%2) + l] |
# bits(qh[32h + l], 2k, 2) << 4, minus 32; scale code: the int8 scales[s].
Q6_K = Layout(
    T.Q6_K,
    210,
    d_offset=208,
    quant=Code(
        (Field(64 * _h + 32 * (_j & 1) + _l, 4 * (_j >> 1), 4), Field(128 + 32 * _h + _l, 2 * _j, 2, dest=4)),
        offset=-32,
    ),
    scale=Code((Field(192 + _s, _const(0, 16), 8),), signed=True),
)

# IQ4_XS: 136 bytes | d @0 | scales_h: u16 @2 | scales_l[4] @4 | qs[128] @8 |; value i = 32t + 16k + j: code = nibble
# k of qs[16t + j] looked up in kvalues_iq4nl; our sub-block s is ggml's t = s/2: six-bit scale nibble t%2 of
# scales_l[t/2] | bits(scales_h, 2t, 2) << 4, minus 32.
_t = _s >> 1
IQ4_XS = Layout(
    T.IQ4_XS,
    136,
    d_offset=0,
    quant=Code((Field(8 + 16 * (_i >> 5) + (_i & 15), 4 * ((_i >> 4) & 1), 4),), book=KVALUES),
    scale=Code((Field(4 + (_t >> 1), 4 * (_t & 1), 4), Field(2 + (_t >> 2), 2 * (_t & 3), 2, dest=4)), offset=-32),
)

# IQ4_NL: blocks of 32 values, 18 bytes | d @0 | qs[16] @2 |, read eight at a time as one block of 256 (144 bytes):
# value i = 32t + 16k + j: code = nibble k of qs[j] of file block t (byte 18t + 2 + j) looked up in kvalues_iq4nl;
# sub-block s takes file block t = s/2's d, scale code 1 (no bits).
IQ4_NL = Layout(
    T.IQ4_NL,
    144,
    d_offset=18 * (_s >> 1),
    quant=Code((Field(18 * (_i >> 5) + 2 + (_i & 15), 4 * ((_i >> 4) & 1), 4),), book=KVALUES),
    scale=Code((Field(_const(0, 16), _const(0, 16), 0),), offset=1),
)

LAYOUTS: dict[T, Layout] = {layout.qtype: layout for layout in (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ4_NL)}


def row_bytes(qtype: T, n_in: int) -> int:
    """Bytes of a row of ``n_in`` values: ``n_in * type_size / 256`` (IQ4_NL: whole 32-value file blocks, so its
    last block of 256 may be partial), as gguf_kernels.h's GQ_ROW_BYTES."""
    return n_in * LAYOUTS[qtype].type_size // QK


def values(rows: np.ndarray, qtype: T) -> np.ndarray:
    """uint8 GGUF rows (2-D, or one row) -> float32 values ``(n_rows, n_in)``; a partial last block of 256 (IQ4_NL)
    is read with zero bytes after the row's end and those values left out, as the kernels leave them."""
    layout = LAYOUTS[qtype]
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    rows = rows.reshape(rows.shape[0] if rows.ndim > 1 else 1, -1)
    n_in = rows.shape[1] * QK // layout.type_size
    padded = np.pad(rows, ((0, 0), (0, -rows.shape[1] % layout.type_size)))
    out = layout.values(padded.reshape(-1, layout.type_size))
    return out.reshape(rows.shape[0], -1)[:, :n_in]


def bit_owners(qtype: T) -> np.ndarray:
    """int ``(type_size * 8,)``: for each bit of a block, how many value codes read it (the quant bytes' bits: 1)."""
    layout = LAYOUTS[qtype]
    count = np.zeros(layout.type_size * 8, dtype=np.int64)
    for f in layout.quant.fields:
        for b in range(f.width):
            np.add.at(count, f.byte * 8 + f.shift + b, 1)
    return count
