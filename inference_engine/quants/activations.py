"""ggml's activation quantizers, bit-exact with what llama.cpp's CPU backend runs on x86-64.

Before a matmul with a quantized weight, ggml converts each activation row to the weight's ``vec_dot_type``
(``from_float`` in ggml-cpu.c's ``type_traits_cpu``). On this x86-64 build (AVX2 / AVX-512 / AMX) those are:

- Q8_0 and Q8_1: the AVX2 ``quantize_row_q8_0`` / ``quantize_row_q8_1`` in ggml/src/ggml-cpu/arch/x86/quants.c, not
  the ``*_ref`` versions: ``d = amax / 127`` (stored as f16), multiplier ``id = 127 / amax`` (float32, not
  ``1/d``), ``q = round_half_even(x * id)`` (``_mm256_round_ps``), and for Q8_1 ``s = f16(d * sum(q))`` with the
  float32 ``d`` before its f16 rounding. The AMX path (amx/mmq.cpp, used for Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K weights
  on this machine) calls the same two functions.
- Q8_K: ``quantize_row_q8_K`` is ``quantize_row_q8_K_ref`` (ggml-quants.c, compiled without FMA): ``max`` is the
  first element of largest magnitude, ``iscale = -127 / max``, ``q = min(127, nearest_int(iscale * x))`` where
  ``nearest_int`` is the ``+ 1.5 * 2**23`` bit trick (round half to even), ``d = 1 / iscale`` kept as float32,
  ``bsums`` = int16 sums of 16 quants. An all-zero block gets ``d = 0`` and zero quants.
- F16: ``_mm512_cvtps_ph`` round to nearest even; BF16: ``ggml_compute_fp32_to_bf16`` (round half to even on the
  bit pattern, NaN forced quiet).

One more variant exists: with extra buffer types on, Q2_K weights on AVX-512 are repacked (repack.cpp) and batches
of 4+ rows are quantized by ``ggml_quantize_mat_q8_K_4x8`` (arch/x86/repack.cpp). It matches the Q8_K rule above
except when a block holds +max and -max of equal magnitude (it takes the positive one, not the first): rare enough
to leave unmodelled. NaN inputs are not emulated (``_mm256_max_ps`` and ``np.max`` treat NaN differently).

Everything is float32 NumPy arithmetic in the same order as the C code, vectorised over rows and blocks; each
result also packs into ggml's block bytes (``to_bytes``) so libggml's own ``vec_dot`` can consume it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.errors import GGUFParityError

QK8 = 32  # elements per Q8_0 / Q8_1 block
QK_K = 256  # elements per Q8_K super-block

# ggml's block structs as NumPy dtypes (packed, little endian), ggml/src/ggml-common.h.
Q8_0_BLOCK = np.dtype([("d", "<f2"), ("qs", "i1", (QK8,))])  # 34 bytes
Q8_1_BLOCK = np.dtype([("d", "<f2"), ("s", "<f2"), ("qs", "i1", (QK8,))])  # 36 bytes
Q8_K_BLOCK = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))])  # 292 bytes

# (elements, bytes) per block of each activation type. Not gguf-py's GGML_QUANT_SIZES for Q8_1: that table still
# says 40 bytes (float d, s), while ggml 0.3.36's block_q8_1 holds two f16 (36 bytes).
ACTIVATION_BLOCKS: dict[T, tuple[int, int]] = {
    T.F16: (1, 2),
    T.BF16: (1, 2),
    T.Q8_0: (QK8, Q8_0_BLOCK.itemsize),
    T.Q8_1: (QK8, Q8_1_BLOCK.itemsize),
    T.Q8_K: (QK_K, Q8_K_BLOCK.itemsize),
}

_F127 = np.float32(127.0)
_MINUS_F127 = np.float32(-127.0)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: nearest_int()'s rounding constant
_INT32_MIN = np.int64(-(2**31))


# --- result containers ---------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Q8Rows:
    """Quantized activation rows: int8 quants ``qs`` (..., nb, block) and float32 block scales ``d`` (..., nb),
    plus each type's extra fields; ``BLOCK`` is ggml's block struct, whose fields are named as the dataclass's."""

    qs: np.ndarray
    d: np.ndarray
    BLOCK: ClassVar[np.dtype]

    def dequantize(self) -> np.ndarray:
        return (self.qs * self.d[..., None]).reshape(*self.qs.shape[:-2], -1)

    def to_bytes(self) -> np.ndarray:
        """ggml's block bytes (..., nb * BLOCK.itemsize); the float fields are rounded to the block's float type."""
        blocks = np.empty(self.qs.shape[:-1], self.BLOCK)
        for field in fields(self):
            blocks[field.name] = getattr(self, field.name)
        return np.ascontiguousarray(blocks).view(np.uint8).reshape(*blocks.shape[:-1], -1)

    @classmethod
    def from_bytes(cls, raw: np.ndarray) -> Q8Rows:
        """Rows from ggml's block bytes (..., nb * BLOCK.itemsize): the float fields as float32, the rest as stored."""
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        blocks = raw.view(cls.BLOCK).reshape(*raw.shape[:-1], -1)
        values = (blocks[field.name] for field in fields(cls))
        return cls(*(v.astype(np.float32) if v.dtype.kind == "f" else v.copy() for v in values))


@dataclass(frozen=True, eq=False)
class Q8_0Rows(Q8Rows):
    """qs int8 (..., nb, 32); d float32 (..., nb), f16-representable."""

    BLOCK: ClassVar[np.dtype] = Q8_0_BLOCK


@dataclass(frozen=True, eq=False)
class Q8_1Rows(Q8Rows):
    """As Q8_0Rows, plus s float32 (..., nb): f16(d_float32 * sum(qs))."""

    s: np.ndarray
    BLOCK: ClassVar[np.dtype] = Q8_1_BLOCK


@dataclass(frozen=True, eq=False)
class Q8_KRows(Q8Rows):
    """qs int8 (..., nb, 256); d float32 (..., nb), a full float32 (not f16); bsums int16 (..., nb, 16)."""

    bsums: np.ndarray
    BLOCK: ClassVar[np.dtype] = Q8_K_BLOCK


# --- quantizers ------------------------------------------------------------------------------------------------
def _blocks(x: np.ndarray, block: int, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        raise GGUFParityError(f"{name} quantizes rows whose length is a multiple of {block}; got shape {x.shape}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _q8_rounded(xb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The AVX2 q8_0 / q8_1 arithmetic for blocks ``xb`` (..., nb, 32).

    Returns (float32 ``d``, its f16 rounding as float32, the rounded values ``r`` as float32 before the int8
    packing). ``r`` is within [-127, 127] unless ``127 / amax`` overflows (subnormal block maximum) or the input
    holds inf/NaN; then the int8 packing step is emulated exactly by :func:`_pack_int8`.
    """
    amax = np.max(np.abs(xb), axis=-1)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d = amax / _F127
        inv = np.where(amax != 0, _F127 / amax, np.float32(0)).astype(np.float32, copy=False)
        r = np.rint(xb * inv[..., None])  # _mm256_round_ps(_MM_ROUND_NEAREST): half to even
        d16 = d.astype(np.float16).astype(np.float32)
    return d, d16, r


def _pack_int8(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 quants, int32 block sums) as the AVX2 code makes them from the rounded floats ``r``.

    ``_mm256_cvtps_epi32`` turns NaN, inf and out-of-range values into INT32_MIN; the block sum adds those int32
    lanes with wrap-around; ``_mm256_packs_epi32`` + ``_mm256_packs_epi16`` saturate to int8.
    """
    with np.errstate(invalid="ignore"):
        in_range = np.abs(r) <= np.float32(127)
    if in_range.all():  # the normal case: exact small integers
        return r.astype(np.int8), r.sum(axis=-1, dtype=np.float32).astype(np.int32)
    with np.errstate(invalid="ignore"):
        ok = np.abs(r) < np.float32(2.0**31)
    ints = np.where(ok, r, np.float32(0)).astype(np.int64) + np.where(ok, 0, _INT32_MIN)
    return np.clip(ints, -128, 127).astype(np.int8), ints.sum(axis=-1).astype(np.int32)


def quantize_q8_0(x: np.ndarray) -> Q8_0Rows:
    """x float32 (..., K), K % 32 == 0 -> Q8_0Rows(qs int8 (..., K/32, 32), d float32 (..., K/32))."""
    _, d16, r = _q8_rounded(_blocks(x, QK8, "Q8_0"))
    return Q8_0Rows(_pack_int8(r)[0], d16)


def quantize_q8_1(x: np.ndarray) -> Q8_1Rows:
    """x float32 (..., K) -> Q8_1Rows(qs, d, s) with ``s = f16(d * sum(q))`` from the unsaturated int32 sum."""
    d, d16, r = _q8_rounded(_blocks(x, QK8, "Q8_1"))
    qs, isum = _pack_int8(r)
    with np.errstate(over="ignore", invalid="ignore"):
        s = (d * isum.astype(np.float32)).astype(np.float16).astype(np.float32)
    return Q8_1Rows(qs, d16, s)


def quantize_q8_K(x: np.ndarray) -> Q8_KRows:
    """x float32 (..., K), K % 256 == 0 -> Q8_KRows(qs int8 (..., nb, 256), d float32 (..., nb), bsums int16)."""
    xb = _blocks(x, QK_K, "Q8_K")
    first_max = np.argmax(np.abs(xb), axis=-1)[..., None]  # the C loop keeps the first strict maximum
    signed_max = np.take_along_axis(xb, first_max, axis=-1)[..., 0]
    nonzero = signed_max != 0
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        iscale = np.where(nonzero, _MINUS_F127 / signed_max, np.float32(1)).astype(np.float32)
        shifted = (iscale[..., None] * xb) + _MAGIC  # two float32 roundings, no FMA (as compiled)
        d = np.where(nonzero, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    v = (shifted.view(np.int32) & 0x007FFFFF) - 0x00400000
    qs = np.minimum(v, 127).astype(np.int8)  # C's int -> int8_t keeps the low byte, as astype does
    qs = np.where(nonzero[..., None], qs, np.int8(0))
    bsums = qs.reshape(*qs.shape[:-1], QK_K // 16, 16).sum(axis=-1, dtype=np.int32).astype(np.int16)
    return Q8_KRows(qs, d, bsums)


def round_to_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest f16 (ties to even, overflow to inf), returned as float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def round_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), exactly ``ggml_compute_fp32_to_bf16``."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet_nan = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(nan, quiet_nan, rounded).astype(np.uint16)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest bf16 as float32 values."""
    return (round_to_bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32)


ACTIVATION_TYPES: tuple[T, ...] = (T.F32, T.F16, T.BF16, T.Q8_0, T.Q8_1, T.Q8_K)


# The q8 activation types: their quantizer, and the rows type it returns (whose from_bytes reads ggml's blocks).
Q8_QUANTIZERS: dict[T, tuple[Callable[[np.ndarray], Q8Rows], type[Q8Rows]]] = {
    T.Q8_0: (quantize_q8_0, Q8_0Rows),
    T.Q8_1: (quantize_q8_1, Q8_1Rows),
    T.Q8_K: (quantize_q8_K, Q8_KRows),
}


def quantize_activation(x: np.ndarray, vec_dot_type: T):
    """The quantized form ggml builds: Q8_*Rows for the q8 types, a float32 array for F32/F16/BF16."""
    if vec_dot_type in Q8_QUANTIZERS:
        return Q8_QUANTIZERS[vec_dot_type][0](x)
    return fake_quantize(x, vec_dot_type)


def fake_quantize(x: np.ndarray, vec_dot_type: T) -> np.ndarray:
    """The float32 values ggml's dot product sees for activation ``x`` (..., K) converted to ``vec_dot_type``."""
    vec_dot_type = T(int(vec_dot_type))
    if vec_dot_type == T.F32:
        return np.asarray(x, dtype=np.float32)
    if vec_dot_type == T.F16:
        return round_to_f16(x)
    if vec_dot_type == T.BF16:
        return round_to_bf16(x)
    if vec_dot_type in Q8_QUANTIZERS:
        return quantize_activation(x, vec_dot_type).dequantize()
    raise GGUFParityError(
        f"unsupported activation type {vec_dot_type.name}; supported: {', '.join(t.name for t in ACTIVATION_TYPES)}"
    )
