"""The non-linear 4-bit types ("i-quants" of 4 bits): IQ4_NL and IQ4_XS.

Layouts from ggml/src/ggml-common.h and ``dequantize_row_iq4_nl`` / ``_iq4_xs`` in ggml/src/ggml-quants.c. A
4-bit code does not scale linearly: it indexes a fixed table of 16 int8 values, :data:`KVALUES`
(``kvalues_iq4nl``), so ``w = d * KVALUES[code]``. llama.cpp's quantizer writes IQ4_XS wherever a row is a
multiple of 256 and falls back to IQ4_NL (same table, a block of 32) where it is not.

ggml pairs IQ4_NL with Q8_0 activations and IQ4_XS with Q8_K (``ggml_vec_dot_iq4_nl_q8_0`` /
``ggml_vec_dot_iq4_xs_q8_K``): per (sub-)block the integer dot of the table values with the activation's int8
quants, times the weight's and the activation's scales. Algebraically that is the dequantized weight times the
fake-quantized activation, as for the linear types (``matmul.py``): nothing rounds in between (``d * (ls - 32)``
and its product with a table value are exact in float32).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.quants.base import QuantType

# kvalues_iq4nl (ggml-common.h): the value each 4-bit code stands for, before the block's scale.
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


class IQ4_NL(QuantType, qtype=T.IQ4_NL, vec_dot_type=T.Q8_0):
    # 18 bytes -> 32 weights, w = d * KVALUES[q], q in 0..15
    # byte  0      2                                  18
    #       | d:f16 | qs[16]: 4-bit q, two per byte    |
    # w[j] = d * KVALUES[lo(qs[j])],  w[j+16] = d * KVALUES[hi(qs[j])],  j = 0..15
    f16_scale_offsets = (0,)


class IQ4_XS(QuantType, qtype=T.IQ4_XS, vec_dot_type=T.Q8_K):
    # 136 bytes -> 256 weights in 8 sub-blocks of 32, w = d * (ls - 32) * KVALUES[q], ls in 0..63, q in 0..15
    # byte  0      2                4              8                      136
    #       | d:f16 | scales_h: u16 LE | scales_l[4]  | qs[128]: 4-bit q     |
    # sub-block s: ls = bits(scales_l[s // 2], 4 * (s % 2), 4) | bits(scales_h, 2s, 2) << 4
    # w[32s + j] = d * (ls - 32) * KVALUES[lo(qs[16s + j])],  w[32s + 16 + j] = ... hi(qs[16s + j]),  j = 0..15
    f16_scale_offsets = (0,)
