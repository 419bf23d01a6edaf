"""The 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Layouts from ggml/src/ggml-common.h and ``dequantize_row_*`` in ggml/src/ggml-quants.c. ``d`` and ``m`` are
f16. Element ``j`` of a block is ``w[j]``; ``lo(b)`` / ``hi(b)`` are the low / high nibble of byte ``b``.

ggml pairs Q4_0 / Q5_0 / Q8_0 with Q8_0 activations (one f16 scale per 32) and Q4_1 / Q5_1 with Q8_1 activations,
whose block also carries ``s = f16(d_a * sum(q_a))``: the dot product adds ``m_w * s_a`` per block, which is why
those two classes can split their dequantized value into a scale part and a min part.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.quants.base import QuantType


class _WithBlockMin:
    """Mixin for ``w = d*q + m`` types whose min ggml applies through the activation's block sum."""

    has_block_min = True
    min_offset = 2  # byte offset of the f16 ``m`` inside a block

    @classmethod
    def dequantize_scale_part(cls, raw: np.ndarray) -> np.ndarray:
        """float32 ``(rows, cols)``: ``d*q`` without the min (exact: the min bytes are zeroed first)."""
        rows = cls.as_byte_rows(raw)
        blocks = rows.reshape(rows.shape[0], -1, cls.type_size).copy()
        blocks[:, :, cls.min_offset : cls.min_offset + 2] = 0  # f16 +0.0
        return cls.dequantize(blocks.reshape(rows.shape))

    @classmethod
    def block_mins(cls, raw: np.ndarray) -> np.ndarray:
        """float32 ``(rows, n_blocks)``: each block's ``m``."""
        rows = cls.as_byte_rows(raw)
        blocks = rows.reshape(rows.shape[0], -1, cls.type_size)
        m = np.ascontiguousarray(blocks[:, :, cls.min_offset : cls.min_offset + 2]).view(np.float16)
        return m[:, :, 0].astype(np.float32)


class Q4_0(QuantType, qtype=T.Q4_0, vec_dot_type=T.Q8_0):
    # 18 bytes -> 32 weights, w = d * (q - 8), q in 0..15
    # byte  0      2                                  18
    #       | d:f16 | qs[16]: 4-bit q, two per byte    |
    # w[j] = d * (lo(qs[j]) - 8),  w[j+16] = d * (hi(qs[j]) - 8),  j = 0..15
    f16_scale_offsets = (0,)


class Q4_1(_WithBlockMin, QuantType, qtype=T.Q4_1, vec_dot_type=T.Q8_1):
    # 20 bytes -> 32 weights, w = d * q + m, q in 0..15
    # byte  0      2      4                           20
    #       | d:f16 | m:f16 | qs[16]: 4-bit q           |
    # w[j] = d * lo(qs[j]) + m,  w[j+16] = d * hi(qs[j]) + m,  j = 0..15
    f16_scale_offsets = (0, 2)


class Q5_0(QuantType, qtype=T.Q5_0, vec_dot_type=T.Q8_0):
    # 22 bytes -> 32 weights, w = d * (q - 16), q in 0..31
    # byte  0      2            6                     22
    #       | d:f16 | qh: u32 LE | qs[16]: low 4 bits   |
    # qh bit j is the 5th bit of w[j] (j = 0..31)
    # w[j] = d * ((lo(qs[j]) | bit(qh, j) << 4) - 16),  w[j+16] = d * ((hi(qs[j]) | bit(qh, j+16) << 4) - 16)
    f16_scale_offsets = (0,)


class Q5_1(_WithBlockMin, QuantType, qtype=T.Q5_1, vec_dot_type=T.Q8_1):
    # 24 bytes -> 32 weights, w = d * q + m, q in 0..31
    # byte  0      2      4            8              24
    #       | d:f16 | m:f16 | qh: u32 LE | qs[16]       |
    # w[j] = d * (lo(qs[j]) | bit(qh, j) << 4) + m,  w[j+16] = d * (hi(qs[j]) | bit(qh, j+16) << 4) + m
    f16_scale_offsets = (0, 2)


class Q8_0(QuantType, qtype=T.Q8_0, vec_dot_type=T.Q8_0):
    # 34 bytes -> 32 weights, w = d * q, q int8
    # byte  0      2                                  34
    #       | d:f16 | qs[32]: int8                     |
    # w[j] = d * qs[j]
    f16_scale_offsets = (0,)
