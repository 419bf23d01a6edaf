"""The tensor-type base class, its registry, and whole-tensor dequantization.

One subclass per GGML tensor type (as gguf-py's ``quants.py``): the class header names the type, the sizes come
from gguf-py's ``GGML_QUANT_SIZES`` table, and the block's bit layout is drawn in a comment inside the class.
Dequantization is delegated to ``gguf.quants.dequantize``, which is exact: it equals libggml's
``dequantize_row_<type>`` bit for bit (tests/inference_engine/quants/test_dequantize.py checks that against
libggml itself).

``vec_dot_type`` is the type ggml's CPU backend converts the *activation* row to before the dot product with a
weight row of this type (``type_traits_cpu[type].vec_dot_type`` in ggml/src/ggml-cpu/ggml-cpu.c); the ggml
numerics matmul (``matmul.py``) uses it.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from inference_engine.errors import GGUFParityError
from inference_engine.registries import Registry

# Small finite f16 scales written into random test blocks: random bytes in an f16 scale field can be inf/NaN or
# huge, which makes every product meaningless; 2**-8 .. 2**-4 keeps values O(1) like a real model's weights.
RANDOM_SCALE_RANGE = (2.0**-8, 2.0**-4)



def _qtype_key(qtype: GGMLQuantizationType | int | str) -> GGMLQuantizationType:
    """A tensor type given as the enum, its int value, or its name such as ``"Q4_K"``."""
    if isinstance(qtype, str):
        return GGMLQuantizationType[qtype.upper()]
    return GGMLQuantizationType(int(qtype))


# tensor type -> its QuantType subclass; each subclass registers itself by its class header.
QUANT_TYPES: Registry[type[QuantType]] = Registry("tensor type", normalize=_qtype_key, unknown="unsupported",
                                                  listing="supported", quote=False)


class QuantType:
    """A GGML tensor type: sizes, the activation type ggml pairs it with, and exact dequantization.

    Classes are never instantiated; everything is a class attribute or classmethod (as in gguf-py).
    """

    qtype: ClassVar[GGMLQuantizationType]
    block_size: ClassVar[int]  # elements per block
    type_size: ClassVar[int]  # bytes per block
    vec_dot_type: ClassVar[GGMLQuantizationType]
    # Byte offsets (inside one block) of the f16 scale fields (d, m, dmin). Used to write random but sane blocks.
    f16_scale_offsets: ClassVar[tuple[int, ...]] = ()
    # True for Q4_1 / Q5_1: w = d*q + m, and ggml's dot multiplies m by the activation's f16-rounded block sum.
    has_block_min: ClassVar[bool] = False

    def __init_subclass__(cls, qtype: GGMLQuantizationType, vec_dot_type: GGMLQuantizationType, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.qtype = qtype
        cls.block_size, cls.type_size = GGML_QUANT_SIZES[qtype]
        cls.vec_dot_type = vec_dot_type
        QUANT_TYPES.register(qtype, cls)

    def __init__(self):
        raise TypeError("QuantType classes are used through classmethods, not instances")

    # --- sizes ----------------------------------------------------------------------------------------------
    @classmethod
    def row_bytes(cls, n_cols: int) -> int:
        if n_cols % cls.block_size:
            raise GGUFParityError(f"a {cls.qtype.name} row needs a multiple of {cls.block_size} values, got {n_cols}")
        return n_cols // cls.block_size * cls.type_size

    @classmethod
    def n_cols(cls, row_bytes: int) -> int:
        return row_bytes // cls.type_size * cls.block_size

    # --- values ---------------------------------------------------------------------------------------------
    @classmethod
    def as_byte_rows(cls, raw: np.ndarray) -> np.ndarray:
        """``raw`` (any dtype, last axis one row) as uint8 ``(rows, row_bytes)``."""
        raw = np.ascontiguousarray(raw)
        row = raw.view(np.uint8) if raw.ndim else raw.reshape(1).view(np.uint8)
        return row.reshape(-1, row.shape[-1])

    @classmethod
    def dequantize(cls, raw: np.ndarray) -> np.ndarray:
        """uint8 ``(rows, row_bytes)`` -> float32 ``(rows, cols)``, exactly as libggml's dequantize_row."""
        rows = cls.as_byte_rows(raw)
        return np.ascontiguousarray(gguf_quants.dequantize(rows, cls.qtype), dtype=np.float32)

    @classmethod
    def random_rows(cls, n_rows: int, n_cols: int, rng: np.random.Generator) -> np.ndarray:
        """Random valid rows, uint8 ``(n_rows, row_bytes)``: random quant bits, small finite f16 scales.

        The random-block recipe llama.cpp's own tests use for types gguf-py cannot quantize (the K-quants).
        """
        n_blocks = n_rows * cls.row_bytes(n_cols) // cls.type_size
        blocks = rng.integers(0, 256, size=(n_blocks, cls.type_size), dtype=np.uint8)
        lo, hi = np.log2(RANDOM_SCALE_RANGE)
        for off in cls.f16_scale_offsets:
            scale = np.exp2(rng.uniform(lo, hi, n_blocks)).astype(np.float16)
            blocks[:, off : off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        return blocks.reshape(n_rows, -1)


def supported_qtypes() -> tuple[GGMLQuantizationType, ...]:
    return QUANT_TYPES.names()


def supported_type_names() -> str:
    return QUANT_TYPES.listing()


def quant_for(qtype: GGMLQuantizationType | int | str) -> type[QuantType]:
    """The class for a tensor type (enum, its int value, or its name such as ``"Q4_K"``)."""
    return QUANT_TYPES.get(qtype)


def dequantize_tensor(t) -> np.ndarray:
    """A :class:`~inference_engine.gguf.file.TensorInfo` as float32 of ``t.shape``.

    gguf-py hands F32/F16 tensors over as typed arrays and BF16/quantized ones as uint8 rows; both work here.
    """
    quant = quant_for(t.qtype)
    values = quant.dequantize(np.asarray(t.raw))
    return values.reshape(t.shape)
