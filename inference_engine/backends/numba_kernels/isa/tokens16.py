"""Sixteen tokens per 512-bit vector (AVX-512 VNNI; on AVX2 two 256-bit halves): the steps of llama.cpp's tiled
K-quant mat-mul (:mod:`.ktiles`).

ggml's ``tiled`` mat-mul (``ggml-cpu/tiled/tiled-kernel.cpp``, ``tiled_run_micro_vnni_8x16``) turns the usual
layout around: an int32 lane holds one *token*, not four positions of one row. The activations of 16 tokens are
laid out so that 64 bytes hold each token's 4 quants at positions ``k .. k + 3`` (token ``t`` in bytes 4t..4t+3,
:func:`.ktiles.token_groups`); a row's 4 weight quants at ``k`` are broadcast to all 16 lanes, and one ``vpdpbusd``
adds ``sum_b w[k + b] * y_t[k + b]`` into each token's lane. One instruction is 64 multiply-adds with no per-block
shuffles, unpacking or float work, which stay per row and sub-block (the scale, as an int32 multiply) or per
row and super-block (the float steps).

Vocabulary (``@njit`` code only; ``I8x64`` / ``I32x16`` are :mod:`.zmm`'s types):

- ``codes64(u8, off)``: 64 bytes as an I8x64 (16 tokens' 4 quants).
- ``dpbusd_row(acc, w_u8, off, codes)``: ``acc`` plus, per token lane, the dot product of the 4 unsigned weight
  bytes at ``w_u8[off:off+4]`` with the token's 4 signed activation bytes (``vpdpbusd`` with a broadcast operand).
- ``iload16(i32, index)``, ``iscale_add(acc, v, bias, k)`` = ``acc + (v - bias) * k``, ``imul_add(acc, v, k)`` =
  ``acc + v * k`` (int32, ``k`` a scalar), ``imul(v, k)``.
- ``block_step(acc, s, bias, dw, dy)`` = ``fma(float(s - bias), dy * dw, acc)``: a 32-weight block's float step
  (llama.cpp's repacked Q4_0 gemm).
- ``lane_step(acc, d, s)`` = ``fma(d, float(s), acc)``: one of ``vec_dot``'s 8 float lanes, for 16 tokens.
- ``superblock_step(acc, s1, d, d1)`` = ``fma(float(s1) * d, d1, acc)`` and ``superblock_step_min(acc, s1, s2, d,
  dmin, d1)`` = ``fma(fnmadd(dmin, float(s2), float(s1) * d), d1, acc)``: the float steps of ggml's VNNI kernel
  per super-block, in its order and with its roundings (its epilogue compiles to ``vcvtdq2ps``, ``vmulps``,
  ``vfnmadd``, ``vfmadd``; seen in the disassembly of the llama.cpp build that ``validate`` runs).

On an AVX2 target (without AVX-512 VNNI) ``dpbusd_row`` is two 8-token halves of ``vpmaddubsw`` + ``vpmaddwd``, as
ggml's AVX2 tiled micro-kernel multiplies; elsewhere portable IR (correct, slow; the tests run it on any machine),
which the engine does not use (:func:`.ktiles.compiled_target`).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from inference_engine.backends.numba_kernels.isa.int8 import _call, _ptr, _splat
from inference_engine.backends.numba_kernels.isa.simd import F32x16
from inference_engine.backends.numba_kernels.isa.zmm import I8x64, I32x16, _dot4_acc

_I8, _I32 = ir.IntType(8), ir.IntType(32)
_F32 = ir.FloatType()
_B64 = ir.VectorType(_I8, 64)
_VI16 = ir.VectorType(_I32, 16)
_VF16 = ir.VectorType(_F32, 16)


def _check(arr, dtype, what):
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != dtype:
        raise TypingError(f"{what} expects a 1-D {dtype} array, got {arr}")


@intrinsic
def codes64(typingctx, arr, offset):
    """The 64 bytes at ``offset`` of a uint8 array."""
    _check(arr, types.uint8, "codes64")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _B64), align=1)

    return I8x64(arr, offset), codegen


@intrinsic
def dpbusd_row(typingctx, acc, w, offset, codes):
    """``acc`` plus, in each int32 lane ``t``, ``sum_b w[offset + b] * codes[4t + b]`` (unsigned weights, signed
    activations): ``vpdpbusd`` with the row's 4 bytes broadcast. On AVX2, per 8 tokens ``vpmaddubsw`` (pairs
    to int16) then ``vpmaddwd`` with ones: exact only while a pair ``2 * w * 127`` fits int16, so callers there keep
    the weights below 129 (every type's quants but Q8_0's ``q + 128``)."""
    if acc != I32x16 or codes != I8x64:
        raise TypingError(f"dpbusd_row expects an I32x16 and an I8x64, got {acc}, {codes}")
    _check(w, types.uint8, "dpbusd_row")

    def codegen(context, builder, sig, args):
        word = builder.load(_ptr(context, builder, sig.args[1], args[1], args[2], _I32), align=1)
        u = _splat(builder, word, _VI16)
        return _dot4_acc(context, builder, args[0], builder.bitcast(u, _B64), args[3], small=True)

    return I32x16(acc, w, offset, codes), codegen


@intrinsic
def iload16(typingctx, arr, index):
    """16 int32 from element ``index`` of an int32 array."""
    _check(arr, types.int32, "iload16")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _VI16), align=4)

    return I32x16(arr, index), codegen


def _int_scalar(context, builder, value, ty):
    return _splat(builder, context.cast(builder, value, ty, types.int32), _VI16)


@intrinsic
def iscale_add(typingctx, acc, v, bias, k):
    """``acc + (v - bias) * k`` per lane (int32; ``k`` a scalar): a sub-block's sum, less its offset, times its
    scale."""
    if acc != I32x16 or v != I32x16 or bias != I32x16 or not isinstance(k, types.Integer):
        raise TypingError(f"iscale_add expects three I32x16 and an int, got {acc}, {v}, {bias}, {k}")

    def codegen(context, builder, sig, args):
        scaled = builder.mul(builder.sub(args[1], args[2]), _int_scalar(context, builder, args[3], sig.args[3]))
        return builder.add(args[0], scaled)

    return I32x16(acc, v, bias, k), codegen


@intrinsic
def imul_add(typingctx, acc, v, k):
    """``acc + v * k`` per lane (int32; ``k`` a scalar)."""
    if acc != I32x16 or v != I32x16 or not isinstance(k, types.Integer):
        raise TypingError(f"imul_add expects two I32x16 and an int, got {acc}, {v}, {k}")

    def codegen(context, builder, sig, args):
        return builder.add(args[0], builder.mul(args[1], _int_scalar(context, builder, args[2], sig.args[2])))

    return I32x16(acc, v, k), codegen


@intrinsic
def imul(typingctx, v, k):
    """``v * k`` per lane (int32; ``k`` a scalar)."""
    if v != I32x16 or not isinstance(k, types.Integer):
        raise TypingError(f"imul expects an I32x16 and an int, got {v}, {k}")

    def codegen(context, builder, sig, args):
        return builder.mul(args[0], _int_scalar(context, builder, args[1], sig.args[1]))

    return I32x16(v, k), codegen


def _fscalar(context, builder, value, ty):
    return _splat(builder, context.cast(builder, value, ty, types.float32), _VF16)


@intrinsic
def superblock_step(typingctx, acc, s1, d, d1):
    """``fma(float(s1) * d, d1, acc)``: a super-block's float step without a min term (Q6_K, Q3_K)."""
    if acc != F32x16 or s1 != I32x16 or d1 != F32x16 or not isinstance(d, types.Float):
        raise TypingError(f"superblock_step expects F32x16, I32x16, a float and F32x16, got {acc}, {s1}, {d}, {d1}")

    def codegen(context, builder, sig, args):
        r = builder.fmul(builder.sitofp(args[1], _VF16), _fscalar(context, builder, args[2], sig.args[2]))
        return _call(builder, "llvm.fma.v16f32", _VF16, [r, args[3], args[0]])

    return F32x16(acc, s1, d, d1), codegen


@intrinsic
def superblock_step_min(typingctx, acc, s1, s2, d, dmin, d1):
    """``fma(fma(-dmin, float(s2), float(s1) * d), d1, acc)``: a super-block's float step with the min term (Q4_K,
    Q5_K, Q2_K): ggml's ``_mm512_fnmadd_ps(dmin, f2, f1 * d)``, one rounding."""
    if acc != F32x16 or s1 != I32x16 or s2 != I32x16 or d1 != F32x16:
        raise TypingError(f"superblock_step_min expects F32x16, I32x16, I32x16, ..., F32x16, got {acc}, {s1}, {s2}")
    if not isinstance(d, types.Float) or not isinstance(dmin, types.Float):
        raise TypingError(f"superblock_step_min expects float scales, got {d}, {dmin}")

    def codegen(context, builder, sig, args):
        r = builder.fmul(builder.sitofp(args[1], _VF16), _fscalar(context, builder, args[3], sig.args[3]))
        neg_dmin = builder.fneg(_fscalar(context, builder, args[4], sig.args[4]))
        r = _call(builder, "llvm.fma.v16f32", _VF16, [neg_dmin, builder.sitofp(args[2], _VF16), r])
        return _call(builder, "llvm.fma.v16f32", _VF16, [r, args[5], args[0]])

    return F32x16(acc, s1, s2, d, dmin, d1), codegen


@intrinsic
def block_step(typingctx, acc, s, bias, dw, dy):
    """``fma(float(s - bias), dy * dw, acc)``: a 32-weight block's float step for 16 tokens (``dw`` the row's block
    scale, ``dy`` the tokens'): ggml's repacked Q4_0 gemm / gemv (``_mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc),
    _mm512_mul_ps(col_scale, row_scale), acc)``)."""
    if acc != F32x16 or s != I32x16 or bias != I32x16 or dy != F32x16 or not isinstance(dw, types.Float):
        raise TypingError(f"block_step expects F32x16, I32x16, I32x16, a float and F32x16, got {acc}, {s}, {dw}")

    def codegen(context, builder, sig, args):
        d = builder.fmul(_fscalar(context, builder, args[3], sig.args[3]), args[4])
        return _call(
            builder, "llvm.fma.v16f32", _VF16, [builder.sitofp(builder.sub(args[1], args[2]), _VF16), d, args[0]]
        )

    return F32x16(acc, s, bias, dw, dy), codegen


@intrinsic
def lane_step(typingctx, acc, d, s):
    """``fma(d, float(s), acc)``: one of ``vec_dot``'s 8 float lanes (its 4-position partial sum ``s``) for 16
    tokens: ggml's ``_mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc)``."""
    if acc != F32x16 or d != F32x16 or s != I32x16:
        raise TypingError(f"lane_step expects F32x16, F32x16, I32x16, got {acc}, {d}, {s}")

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v16f32", _VF16, [args[1], builder.sitofp(args[2], _VF16), args[0]])

    return F32x16(acc, d, s), codegen
