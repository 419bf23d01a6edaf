"""Unquantized tensor types: F32, F16, BF16.

ggml's CPU backend rounds the activation to the weight's own type for F16 and BF16 weights
(``vec_dot_type = F16 / BF16`` in ggml-cpu.c's ``type_traits_cpu``), so an F16 matmul sees f16-rounded
activations; F32 weights take F32 activations unchanged.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.quants.activations import round_to_bf16_bits
from inference_engine.quants.base import QuantType


class F32(QuantType, qtype=T.F32, vec_dot_type=T.F32):
    # one element = 4 bytes, IEEE binary32, little endian
    # | sign:1 | exponent:8 | mantissa:23 |
    @classmethod
    def random_rows(cls, n_rows, n_cols, rng):
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint8)


class F16(QuantType, qtype=T.F16, vec_dot_type=T.F16):
    # one element = 2 bytes, IEEE binary16, little endian
    # | sign:1 | exponent:5 | mantissa:10 |
    @classmethod
    def random_rows(cls, n_rows, n_cols, rng):
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).astype(np.float16).view(np.uint8)


class BF16(QuantType, qtype=T.BF16, vec_dot_type=T.BF16):
    # one element = 2 bytes, the top half of an IEEE binary32, little endian
    # | sign:1 | exponent:8 | mantissa:7 |
    @classmethod
    def random_rows(cls, n_rows, n_cols, rng):
        x = rng.standard_normal((n_rows, n_cols), dtype=np.float32)
        return round_to_bf16_bits(x).view(np.uint8)
