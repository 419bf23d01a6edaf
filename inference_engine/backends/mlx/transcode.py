"""GGUF quantized blocks -> MLX affine quantization, exactly: same float32 weights, no dequantization.

MLX's affine format (``mx.quantize`` / ``mx.dequantize`` / ``mx.quantized_matmul``, mode ``"affine"``) stores, per
group of ``group_size`` consecutive values of a row, an unsigned ``bits``-bit integer ``q`` per value and a float
``scale`` and ``bias``: ``w = scale * q + bias``. The integers are one little-endian bit stream per row (value 0 in
the lowest bits of the first byte), stored as uint32 words; this holds for every ``bits`` MLX 0.32 accepts (2, 3,
4, 5, 6, 8: checked against ``mx.quantize`` output). Scales and biases keep the dtype we hand over: float32 here.

Every GGUF type whose scales cover 32 values maps onto that format with ``group_size = 32``:

============  =======================================  ====  ===================  ====================
type          ggml's value (dequantize_row_*)          bits  scale                bias
============  =======================================  ====  ===================  ====================
Q4_0          d * (q - 8)                              4     d                    -8 * d
Q4_1          d * q + m                                4     d                    m
Q5_0          d * (q - 16)                             5     d                    -16 * d
Q5_1          d * q + m                                5     d                    m
Q8_0          d * q,  q int8                           8     d                    -128 * d (q + 128)
Q4_K          (d*sc) * q - (dmin*m)                    4     d*sc                 -(dmin*m)
Q5_K          (d*sc) * q - (dmin*m)                    5     d*sc                 -(dmin*m)
============  =======================================  ====  ===================  ====================

Why this is exact, not merely close: ``d``, ``m``, ``dmin`` are f16 (11 significant bits) and ``sc``, ``m`` small
integers, so ``d*sc`` (float32, as ggml computes it) and ``scale * q`` are exact products in float32 (at most 22
significant bits). Then ``scale*q + bias`` is either exactly ``d*(q - k)`` (a representable value: no rounding at
all) or one rounding of the same exact sum ggml rounds (``d*q + m``, ``d1*q - m1``). MLX may or may not fuse the
multiply-add; with an exact product both give the same float. The one difference: where ggml's ``d * (q - k)``
is ``0 * d`` with ``d < 0`` it yields -0.0, while ``scale*q + bias = x + (-x)`` is +0.0. Equal as numbers; no
product or sum changes unless it is exactly zero.

The 16-value sub-block types (Q2_K, Q3_K, Q6_K) cannot be written with groups of 32 (MLX accepts 32, 64, 128);
:func:`affine_values_16` still unpacks them the same way (for the kernels' tests and for anyone who pads), and the
backend runs them with our kernels on the GGUF blocks on a GPU (Metal, or CUDA in MLX's CUDA build:
``block_kernels.py``) or, on MLX's CPU build, as dequantized float32 (``weights.py``).

Everything here is NumPy; the backend turns :class:`AffineTensor` arrays into ``mx.array`` s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T

GROUP_SIZE = 32  # MLX's smallest affine group; every GGUF type below has a scale per 32 values
QK_K = 256  # values per K-quant super-block
ROWS_PER_CHUNK = 4096  # rows transcoded at a time: bounds the temporary uint8 / float32 copies of big tensors

_F32 = np.float32


@dataclass(frozen=True)
class AffineTensor:
    """A matrix in MLX's affine layout (NumPy arrays, ready for ``mx.array``).

    ``packed`` uint32 ``(n_out, n_in * bits / 32)``; ``scales`` and ``biases`` float32 ``(n_out, n_in / 32)``.
    """

    qtype: T
    bits: int
    group_size: int
    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.packed.shape[1] * 32 // self.bits


# --- bit helpers --------------------------------------------------------------------------------------------------


def _f16(blocks: np.ndarray, offset: int) -> np.ndarray:
    """float32 ``(n_blocks,)`` of the f16 at ``offset`` of each block."""
    return np.ascontiguousarray(blocks[:, offset : offset + 2]).view(np.float16)[:, 0].astype(_F32)


def _nibbles_lo_hi(qs: np.ndarray) -> np.ndarray:
    """``qs`` uint8 ``(n, 16)`` -> ``(n, 32)``: the 16 low nibbles, then the 16 high nibbles (ggml's order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _bits_of_u32(qh: np.ndarray) -> np.ndarray:
    """``qh`` uint8 ``(n, 4)`` (a little-endian u32) -> uint8 ``(n, 32)``: bit j of the u32 at column j."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """uint8 ``(rows, n)`` values below ``2**bits`` -> uint32 ``(rows, n * bits / 32)``: MLX's packed layout.

    One little-endian bit stream per row: value ``i`` occupies bits ``[i*bits, (i+1)*bits)``. Eight values make
    exactly ``bits`` bytes, so they are assembled in a uint64 and its low ``bits`` bytes kept.
    """
    rows, n = values.shape
    if n * bits % 32:
        raise ValueError(f"{n} values of {bits} bits do not fill whole uint32 words")
    if bits == 8:  # one byte per value: the bytes are the stream
        return np.ascontiguousarray(values, dtype=np.uint8).view("<u4").astype(np.uint32)
    if bits == 4:  # two values per byte, the first in the low nibble
        nib = np.ascontiguousarray(values[:, 0::2] | (values[:, 1::2] << 4), dtype=np.uint8)
        return nib.view("<u4").astype(np.uint32)
    eight = values.reshape(rows, n // 8, 8).astype(np.uint64)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))[None, None, :]
    word = np.bitwise_or.reduce(eight << shifts, axis=2)  # (rows, n/8) uint64
    as_bytes = word.astype("<u8").view(np.uint8).reshape(rows, n // 8, 8)[:, :, :bits]
    return np.ascontiguousarray(as_bytes).reshape(rows, n * bits // 8).view("<u4").astype(np.uint32)


def unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: uint32 ``(rows, n * bits / 32)`` -> uint8 ``(rows, n)``."""
    rows = packed.shape[0]
    as_bytes = np.ascontiguousarray(packed.astype("<u4")).view(np.uint8).reshape(rows, n // 8, bits)
    word = np.zeros((rows, n // 8, 8), dtype=np.uint8)
    word[:, :, :bits] = as_bytes
    word = word.view("<u8")  # (rows, n/8, 1)
    shifts = (np.arange(8, dtype=np.uint64) * np.uint64(bits))[None, None, :]
    return ((word >> shifts) & np.uint64((1 << bits) - 1)).astype(np.uint8).reshape(rows, n)


# --- per-type unpacking: blocks (n_blocks, type_size) uint8 -> q (n_blocks, values) uint8, scale, bias ------------
# Each returns q in MLX's order (element order of the block), and scale / bias float32 (n_blocks, groups per block).


def _q4_0(b: np.ndarray):
    # | d:f16 | qs[16] |   w[j] = d * (lo(qs[j]) - 8),  w[j+16] = d * (hi(qs[j]) - 8)
    d = _f16(b, 0)
    return _nibbles_lo_hi(b[:, 2:18]), d[:, None], (_F32(-8) * d)[:, None]


def _q4_1(b: np.ndarray):
    # | d:f16 | m:f16 | qs[16] |   w[j] = d * lo(qs[j]) + m,  w[j+16] = d * hi(qs[j]) + m
    return _nibbles_lo_hi(b[:, 4:20]), _f16(b, 0)[:, None], _f16(b, 2)[:, None]


def _q5_0(b: np.ndarray):
    # | d:f16 | qh:u32 | qs[16] |   5th bit of w[j] is bit j of qh;  w = d * (q - 16)
    d = _f16(b, 0)
    q = _nibbles_lo_hi(b[:, 6:22]) | (_bits_of_u32(b[:, 2:6]) << 4)
    return q, d[:, None], (_F32(-16) * d)[:, None]


def _q5_1(b: np.ndarray):
    # | d:f16 | m:f16 | qh:u32 | qs[16] |   w = d * q + m
    q = _nibbles_lo_hi(b[:, 8:24]) | (_bits_of_u32(b[:, 4:8]) << 4)
    return q, _f16(b, 0)[:, None], _f16(b, 2)[:, None]


def _q8_0(b: np.ndarray):
    # | d:f16 | qs[32]: int8 |   w = d * qs;  stored unsigned as qs + 128 with bias -128 d
    d = _f16(b, 0)
    q = b[:, 2:34] ^ np.uint8(0x80)  # int8 q + 128 (two's complement: flip the sign bit)
    return q, d[:, None], (_F32(-128) * d)[:, None]


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K ``scales[12]`` -> the 8 six-bit ``(sc, m)`` pairs (``get_scale_min_k4``), uint8 ``(n, 8)``."""
    s = scales
    sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 0x0F) | ((s[:, 0:4] >> 6) << 4)], axis=1)
    m = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
    return sc, m


def _k_scale_bias(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # dequantize_row_q4_K: d1 = d * sc; m1 = min * m (float32 products, exact); w = d1 * q - m1
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _k_scale_min(b[:, 4:16])
    return d[:, None] * sc.astype(_F32), -(dmin[:, None] * m.astype(_F32))


def _q4_k(b: np.ndarray):
    # | d | dmin | scales[12] | qs[128] |   chunk c: w[64c + l] = lo(qs[32c + l]), w[64c + 32 + l] = hi(qs[32c + l])
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, QK_K)
    return (q, *_k_scale_bias(b))


def _q5_k(b: np.ndarray):
    # | d | dmin | scales[12] | qh[32] | qs[128] |   as Q4_K, plus bit 2c (2c+1) of qh[l] as the 5th bit
    qs = b[:, 48:176].reshape(-1, 4, 32)
    qh = b[:, 16:48]
    low = np.stack([qs & 0x0F, qs >> 4], axis=2)  # (n, 4, 2, 32)
    high = np.stack([(qh >> (2 * c + h)) & 1 for c in range(4) for h in range(2)], axis=1).reshape(-1, 4, 2, 32)
    q = (low | (high << 4)).reshape(-1, QK_K)
    return (q, *_k_scale_bias(b))


# 16-value sub-blocks: scale and bias per 16 values.


def _q2_k(b: np.ndarray):
    # | scales[16] | qs[64] | d | dmin |   w[128h + 32j + l] = bits(qs[32h + l], 2j, 2), l = 0..31, sub-block = i / 16
    # dl = d * (sc & 15); ml = dmin * (sc >> 4); w = dl * q - ml
    qs = b[:, 16:80].reshape(-1, 2, 1, 32)
    q = ((qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3).reshape(-1, QK_K)
    d, dmin = _f16(b, 80), _f16(b, 82)
    sc = b[:, 0:16]
    return q, d[:, None] * (sc & 15).astype(_F32), -(dmin[:, None] * (sc >> 4).astype(_F32))


def _q3_k_scales(s: np.ndarray) -> np.ndarray:
    """Q3_K ``scales[12]`` -> 16 six-bit values (0..63): low 4 bits from bytes 0-7, high 2 bits from bytes 8-11."""
    low = np.concatenate([s[:, 0:8] & 0x0F, s[:, 0:8] >> 4], axis=1)  # s < 8: lo(scales[s]); s >= 8: hi(scales[s-8])
    high = np.concatenate([(s[:, 8:12] >> (2 * k)) & 3 for k in range(4)], axis=1)  # bits(scales[8 + s%4], 2(s/4))
    return low | (high << 4)


def _q3_k(b: np.ndarray):
    # | hmask[32] | qs[64] | scales[12] | d |   w[128h + 32j + l] = dl * (bits(qs[32h + l], 2j, 2) - 4 * !hbit),
    # hbit = bits(hmask[l], 4h + j, 1), dl = d * (scale - 32). Unsigned: q = q2 + 4 * hbit in 0..7, bias -4 dl.
    qs = b[:, 32:96].reshape(-1, 2, 1, 32)
    q2 = (qs >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3  # (n, h, j, l)
    hm = b[:, 0:32][:, None, None, :]
    hbit = (
        hm
        >> (4 * np.arange(2, dtype=np.uint8)[None, :, None, None] + np.arange(4, dtype=np.uint8)[None, None, :, None])
    ) & 1
    q = (q2 + 4 * hbit).reshape(-1, QK_K).astype(np.uint8)
    dl = _f16(b, 108)[:, None] * (_q3_k_scales(b[:, 96:108]).astype(np.int16) - 32).astype(_F32)
    return q, dl, _F32(-4) * dl


def _q6_k(b: np.ndarray):
    # | ql[128] | qh[64] | scales[16]: int8 | d |   half h, l = 0..31, L = ql[64h:], H = qh[32h:]:
    # w[128h + 32k + l] = nibble(L[l + 32(k%2)], k/2) | bits(H[l], 2k, 2) << 4;  w = (d * sc) * (q - 32)
    ql = b[:, 0:128].reshape(-1, 2, 2, 32)  # (n, h, l-half, l)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)
    low = np.stack([ql[:, :, 0] & 0x0F, ql[:, :, 1] & 0x0F, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], axis=2)
    high = (qh >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = (low | (high << 4)).reshape(-1, QK_K)
    scale = _f16(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(_F32)
    return q, scale, _F32(-32) * scale


@dataclass(frozen=True)
class AffineLayout:
    bits: int
    group_size: int  # values per scale in the GGUF block
    unpack: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


AFFINE_32: dict[T, AffineLayout] = {
    T.Q4_0: AffineLayout(4, 32, _q4_0),
    T.Q4_1: AffineLayout(4, 32, _q4_1),
    T.Q5_0: AffineLayout(5, 32, _q5_0),
    T.Q5_1: AffineLayout(5, 32, _q5_1),
    T.Q8_0: AffineLayout(8, 32, _q8_0),
    T.Q4_K: AffineLayout(4, 32, _q4_k),
    T.Q5_K: AffineLayout(5, 32, _q5_k),
}
AFFINE_16: dict[T, AffineLayout] = {
    T.Q2_K: AffineLayout(2, 16, _q2_k),
    T.Q3_K: AffineLayout(3, 16, _q3_k),
    T.Q6_K: AffineLayout(6, 16, _q6_k),
}


def is_transcodable(qtype: T) -> bool:
    """True for the types with a scale per 32 values, which MLX's affine format holds exactly."""
    return qtype in AFFINE_32


def affine_values(rows: np.ndarray, qtype: T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8 rows of GGUF blocks -> ``q`` uint8 ``(n_rows, n_in)``, ``scale``, ``bias`` float32 ``(n_rows,
    n_in / group)`` with ``w = scale * q + bias`` per group (16 or 32 values, as the type's sub-blocks)."""
    layout = AFFINE_32.get(qtype) or AFFINE_16.get(qtype)
    if layout is None:
        raise ValueError(f"{qtype.name} has no affine form")
    type_size = GGML_QUANT_SIZES[qtype][1]
    n_rows = rows.shape[0]
    q, scale, bias = layout.unpack(np.ascontiguousarray(rows).reshape(-1, type_size))
    return q.reshape(n_rows, -1), scale.reshape(n_rows, -1), bias.reshape(n_rows, -1)


def transcode(rows: np.ndarray, qtype: T) -> AffineTensor:
    """uint8 ``(n_out, row_bytes)`` GGUF rows of a group-of-32 type -> :class:`AffineTensor`, exactly.

    Works through the rows in chunks so that a 262144-row embedding never exists as one uint8-per-value copy.
    """
    layout = AFFINE_32.get(qtype)
    if layout is None:
        raise ValueError(f"{qtype.name} cannot be transcoded to MLX affine groups of {GROUP_SIZE}")
    rows = np.asarray(rows)
    n_out = rows.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_in = rows.shape[1] // type_size * block_size
    packed = np.empty((n_out, n_in * layout.bits // 32), dtype=np.uint32)
    scales = np.empty((n_out, n_in // GROUP_SIZE), dtype=_F32)
    biases = np.empty_like(scales)
    for start in range(0, n_out, ROWS_PER_CHUNK):
        stop = min(start + ROWS_PER_CHUNK, n_out)
        q, s, b = affine_values(rows[start:stop], qtype)
        packed[start:stop] = pack_bits(q, layout.bits)
        scales[start:stop] = s
        biases[start:stop] = b
    return AffineTensor(qtype, layout.bits, GROUP_SIZE, packed, scales, biases)


def dequantize_affine(q: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``scale * q + bias`` per group in float32 (a NumPy mirror of ``mx.dequantize``, for tests)."""
    n_rows, n = q.shape
    group = n // scale.shape[1]
    qf = q.reshape(n_rows, -1, group).astype(_F32)
    return (scale[:, :, None] * qf + bias[:, :, None]).reshape(n_rows, n)
