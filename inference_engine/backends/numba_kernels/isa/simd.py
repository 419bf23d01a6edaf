"""Explicit 16-lane vectors for Numba kernels: a tiny SIMD vocabulary written as Numba intrinsics.

Why not let LLVM auto-vectorize plain loops? Measured here (SmolLM2's Q4_1 matrices, 2 threads): the natural
per-block loop (``for j in range(16): s += (q & 15) * x[..]``) came out at 4.2 GB/s because LLVM fully unrolled the
16-wide inner loop and then vectorized the *outer* block loop with gathers; other spellings flipped between 3 and
10 GB/s on small edits, and LLVM keeps 256-bit vectors on this CPU (``prefer-256-bit``). The same arithmetic
written with the explicit vectors below ran at 12-13 GB/s on one thread and 22-24 GB/s on two, every time.

The values here are LLVM vectors (``<16 x float>``, ``<16 x i8>``), emitted as generic LLVM IR, not x86
intrinsics: LLVM lowers them to one zmm instruction each on AVX-512, two ymm ones on AVX2, four on NEON, so the
kernels stay portable. They live in registers like any scalar local. Loads are unaligned (GGUF blocks are 18, 20,
34, 144... bytes, so nothing is aligned) and take a *byte offset* into a ``uint8`` array, which lets the kernels
read the memory-mapped GGUF blocks where they are, without repacking.

Vocabulary (all usable only inside ``@njit`` code):

- ``F32x16``: ``vzero()``, ``vsplat(f)``, ``vload(f32_array, index)``, ``vsplat_at(f32_array, index)``, ``vload_f16(u8, off)``,
  ``vload_bf16(u8, off)``, ``vload_f32(u8, off)``, ``vadd``, ``vsub``, ``vmul``, ``vdiv``, ``vfma(a, b, c) = a*b + c``,
  ``vfma_nonzero(s, b, c)`` (``vfma(vsplat(s), b, c)`` where the float32 ``s`` is not 0, else ``c``),
  ``vsum(v)`` (horizontal sum to a float32), ``vstore(f32_array, index, v)``, ``vlane(v, i)`` (lane i
  broadcast), ``vload_high8(f32_array, index)`` (8 floats into lanes 8..15, zeros below), ``vhalves(a, b)``
  (scalar ``a`` in lanes 0..7, ``b`` in 8..15).
- ``U8x16`` (16 bytes to take apart nibbles and bit fields): ``bload(u8, off)``, ``bstore(u8, off, v)``, ``band(v, k)``, ``bxor(v, k)``, ``bshr(v, k)``,
  ``bshl(v, k)``, ``bor(a, b)``, ``bbits(u8, off, first_bit)`` (16 consecutive bits of the little-endian word at
  ``off``, one per byte as 0/1), ``bto_f32(v)`` (unsigned bytes -> floats), ``bto_f32_signed(v)`` (int8 -> floats),
  ``blookup(table, v)`` (lane i = ``table[v[i] & 15]``),
  and for unpacking scale fields: ``bshuffle(v, pattern)``, ``bshr_lanes(v, amounts)``, ``bselect(mask, a, b)``
  (patterns as string literals of 16 hex digits, one per lane).
- ``prefetch(u8, off)``: a cache hint for the weight stream.
- scalars: ``load_f16(u8, off)`` (an f16 at a byte offset, as float32), ``load_bf16(u8, off)``,
  ``load_f32(u8, off)``, ``round_f16(f)`` (float32 -> nearest half -> float32; ``vround_f16(v)`` on 16 lanes), ``f16_bits(f)`` (its bit pattern),
  ``fma32(a, b, c)`` (one-rounding float32 multiply-add).

Shift and mask amounts are best given as integer literals (vector constants); loop counters work too.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

from inference_engine.backends.numba_kernels.isa.int8 import lower_lookup16

LANES = 16
# How far ahead of the rows being multiplied the mat-vec kernels prefetch (see ``prefetch``): a few KB, several
# rows of a typical matrix. 2 KB to 20 KB measured the same; 4 KB.
PREFETCH_BYTES = 4096
# A mat-vec taking 8 rows a step prefetches the next 8: 40 KB ahead for Q4_0 rows of 8,960 values, more than the L1
# holds (32 KB on Zen 4), so prefetched into the L1 it pushed out the activation the loop reads for every row: one
# thread, Q4_0 1536x8960, 13 GB/s of weights with the prefetch into the L1, 21 into the L2; rows of 1,536 values (7 KB
# ahead) the other way round, 22 against 16 (AMD EPYC VM, Zen 4, 2026-11-27). Past this many bytes ahead: the L2.
PREFETCH_L1_BYTES = 16384

_F32 = ir.FloatType()
_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_VF = ir.VectorType(_F32, LANES)
_VB = ir.VectorType(_I8, LANES)
_VI = ir.VectorType(_I32, LANES)


class F32x16Type(types.Type):
    def __init__(self):
        super().__init__(name="F32x16")


class U8x16Type(types.Type):
    def __init__(self):
        super().__init__(name="U8x16")


F32x16 = F32x16Type()
U8x16 = U8x16Type()


@register_model(F32x16Type)
class _F32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


@register_model(U8x16Type)
class _U8x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VB)


# --- helpers for the code generators ---------------------------------------------------------------------------
def _element_ptr(context, builder, arrty, arr, index):
    """Pointer to ``arr[index]`` of a contiguous 1-D array (no bounds check: callers stay in range)."""
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.gep(ary.data, [index])


def _typed_ptr(context, builder, arrty, arr, index, pointee):
    return builder.bitcast(_element_ptr(context, builder, arrty, arr, index), pointee.as_pointer())


def _check_array(arr, dtype, what):
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != dtype:
        raise TypingError(f"{what} expects a 1-D {dtype} array, got {arr}")


def _literal_int(value, what) -> int:
    if not isinstance(value, types.IntegerLiteral):
        raise TypingError(f"{what}: the amount must be an integer literal, got {value}")
    return int(value.literal_value)


def _splat(builder, scalar, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(_VI, [0] * LANES))


def _call_intrinsic(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fnty, name)
    return builder.call(fn, args)


# --- F32x16 ----------------------------------------------------------------------------------------------------
@intrinsic
def vzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)

    return F32x16(), codegen


@intrinsic
def vsplat(typingctx, value):
    if not isinstance(value, (types.Float, types.Integer)):
        raise TypingError(f"vsplat expects a number, got {value}")

    def codegen(context, builder, sig, args):
        scalar = context.cast(builder, args[0], sig.args[0], types.float32)
        return _splat(builder, scalar, _VF)

    return F32x16(value), codegen


@intrinsic
def vload(typingctx, arr, index):
    """16 float32 starting at element ``index`` of a float32 array."""
    _check_array(arr, types.float32, "vload")

    def codegen(context, builder, sig, args):
        return builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _VF), align=4)

    return F32x16(arr, index), codegen


@intrinsic
def vsplat_at(typingctx, arr, index):
    """``arr[index]`` of a float32 array in all 16 lanes (one broadcast load; no bounds or negative-index check)."""
    _check_array(arr, types.float32, "vsplat_at")

    def codegen(context, builder, sig, args):
        return _splat(builder, builder.load(_element_ptr(context, builder, sig.args[0], args[0], args[1])), _VF)

    return F32x16(arr, index), codegen


@intrinsic
def vstore(typingctx, arr, index, v):
    _check_array(arr, types.float32, "vstore")

    def codegen(context, builder, sig, args):
        builder.store(args[2], _typed_ptr(context, builder, sig.args[0], args[0], args[1], _VF), align=4)
        return context.get_dummy_value()

    return types.void(arr, index, F32x16), codegen


@intrinsic
def vload_f32(typingctx, arr, offset):
    """16 little-endian float32 at byte ``offset`` of a uint8 array."""
    _check_array(arr, types.uint8, "vload_f32")

    def codegen(context, builder, sig, args):
        return builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _VF), align=1)

    return F32x16(arr, offset), codegen


@intrinsic
def vload_f16(typingctx, arr, offset):
    """16 IEEE half floats at byte ``offset`` of a uint8 array, widened to float32 (exact; vcvtph2ps)."""
    _check_array(arr, types.uint8, "vload_f16")

    def codegen(context, builder, sig, args):
        vh = ir.VectorType(ir.HalfType(), LANES)
        h = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], vh), align=1)
        return builder.fpext(h, _VF)

    return F32x16(arr, offset), codegen


@intrinsic
def vload_bf16(typingctx, arr, offset):
    """16 bfloat16 at byte ``offset`` of a uint8 array, widened to float32 (exact: the bits shifted up)."""
    _check_array(arr, types.uint8, "vload_bf16")

    def codegen(context, builder, sig, args):
        vs = ir.VectorType(_I16, LANES)
        h = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], vs), align=1)
        wide = builder.shl(builder.zext(h, _VI), ir.Constant(_VI, [16] * LANES))
        return builder.bitcast(wide, _VF)

    return F32x16(arr, offset), codegen


def _binary(op_name):
    def typer(typingctx, a, b):
        if a != F32x16 or b != F32x16:
            raise TypingError(f"{op_name} expects two F32x16, got {a}, {b}")

        def codegen(context, builder, sig, args):
            return getattr(builder, op_name)(args[0], args[1])

        return F32x16(F32x16, F32x16), codegen

    return typer


vadd = intrinsic(_binary("fadd"))
vsub = intrinsic(_binary("fsub"))
vmul = intrinsic(_binary("fmul"))
vdiv = intrinsic(_binary("fdiv"))


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c`` in one rounding (llvm.fma: vfmadd on x86)."""
    if (a, b, c) != (F32x16, F32x16, F32x16):
        raise TypingError(f"vfma expects three F32x16, got {a}, {b}, {c}")

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "llvm.fma.v16f32", _VF, list(args))

    return F32x16(F32x16, F32x16, F32x16), codegen


@intrinsic
def vfma_nonzero(typingctx, s, b, c):
    """``s * b + c`` in one rounding where the scalar ``s`` is not zero, else ``c`` unchanged (no branch: a select).

    A sum that skips zero weights (attention's ``p . v``): the same result as an ``if s != 0`` around a
    :func:`vfma`, without a branch per term.
    """
    if s != types.float32 or (b, c) != (F32x16, F32x16):
        raise TypingError(f"vfma_nonzero expects a float32 and two F32x16, got {s}, {b}, {c}")

    def codegen(context, builder, sig, args):
        s = _splat(builder, args[0], _VF)
        fused = _call_intrinsic(builder, "llvm.fma.v16f32", _VF, [s, args[1], args[2]])
        nonzero = builder.fcmp_unordered("!=", s, ir.Constant(_VF, [0.0] * LANES))  # a lane mask: vblendvps
        return builder.select(nonzero, fused, args[2])

    return F32x16(types.float32, F32x16, F32x16), codegen


@intrinsic
def vsum(typingctx, v):
    """Horizontal sum of the 16 lanes as a float32, by halving (8+8, 4+4, 2+2, 1+1): a fixed order."""
    if v != F32x16:
        raise TypingError(f"vsum expects an F32x16, got {v}")

    def codegen(context, builder, sig, args):
        x, n = args[0], LANES
        while n > 1:
            half = n // 2
            idx_ty = ir.VectorType(_I32, half)
            lo = builder.shuffle_vector(x, x, ir.Constant(idx_ty, list(range(half))))
            hi = builder.shuffle_vector(x, x, ir.Constant(idx_ty, list(range(half, n))))
            x, n = builder.fadd(lo, hi), half
        return builder.extract_element(x, ir.Constant(_I32, 0))

    return types.float32(F32x16), codegen


@intrinsic
def vlane(typingctx, v, lane):
    """All 16 lanes set to lane ``lane`` of ``v`` (a broadcast; one vpermps / vbroadcastss)."""
    if v != F32x16 or not isinstance(lane, types.Integer):
        raise TypingError(f"vlane expects an F32x16 and a lane index, got {v}, {lane}")

    def codegen(context, builder, sig, args):
        if isinstance(sig.args[1], types.IntegerLiteral):
            idx = ir.Constant(_VI, [int(sig.args[1].literal_value)] * LANES)
            return builder.shuffle_vector(args[0], ir.Constant(_VF, ir.Undefined), idx)
        scalar = builder.extract_element(args[0], builder.trunc(args[1], _I32))
        return _splat(builder, scalar, _VF)

    return F32x16(v, lane), codegen


@intrinsic
def vhalves(typingctx, low, high):
    """``low`` in lanes 0..7 and ``high`` in lanes 8..15."""
    if not isinstance(low, types.Float) or not isinstance(high, types.Float):
        raise TypingError(f"vhalves expects two floats, got {low}, {high}")

    def codegen(context, builder, sig, args):
        a = _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), _VF)
        b = _splat(builder, context.cast(builder, args[1], sig.args[1], types.float32), _VF)
        return builder.shuffle_vector(a, b, ir.Constant(_VI, list(range(8)) + list(range(24, 32))))

    return F32x16(low, high), codegen


@intrinsic
def vload_high8(typingctx, arr, index):
    """``arr[index:index+8]`` in lanes 8..15 and zeros in lanes 0..7 (reads only those 8 floats)."""
    _check_array(arr, types.float32, "vload_high8")

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(_F32, 8)
        half = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], v8), align=4)
        return builder.shuffle_vector(ir.Constant(v8, [0.0] * 8), half, ir.Constant(_VI, list(range(16))))

    return F32x16(arr, index), codegen


@intrinsic
def bshuffle(typingctx, v, pattern):
    """Bytes of ``v`` rearranged: lane i takes byte ``pattern[i]`` (16 hex digits, e.g. ``"0123 89ab 4567 89ab"``)."""
    if v != U8x16:
        raise TypingError(f"bshuffle expects a U8x16, got {v}")
    indices = _literal_tuple(pattern, 16, "bshuffle")

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], ir.Constant(_VB, ir.Undefined), ir.Constant(_VI, indices))

    return U8x16(v, pattern), codegen


@intrinsic
def blookup(typingctx, table, v):
    """Lane i = ``table[v[i] & 15]``: a 16-entry byte table indexed by nibbles (the IQ4 types' code book).

    Lowered by :func:`.int8.lower_lookup16` (``pshufb`` / ``tbl`` / portable IR)."""
    if table != U8x16 or v != U8x16:
        raise TypingError(f"blookup expects two U8x16, got {table}, {v}")

    def codegen(context, builder, sig, args):
        idx = builder.and_(args[1], ir.Constant(_VB, [15] * LANES))
        return lower_lookup16(context, builder, args[0], idx)

    return U8x16(U8x16, U8x16), codegen


@intrinsic
def bshr_lanes(typingctx, v, amounts):
    """Each byte shifted right by its own amount: lane i by ``amounts[i]`` (16 hex digits, as ``bshuffle``)."""
    if v != U8x16:
        raise TypingError(f"bshr_lanes expects a U8x16, got {v}")
    shifts = _literal_tuple(amounts, 16, "bshr_lanes")

    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(_VB, shifts))

    return U8x16(v, amounts), codegen


@intrinsic
def bselect(typingctx, take_b, a, b):
    """Lane i from ``b`` where ``take_b[i]`` is 1, else from ``a`` (``take_b``: 16 digits 0/1, as ``bshuffle``)."""
    if a != U8x16 or b != U8x16:
        raise TypingError(f"bselect expects two U8x16, got {a}, {b}")
    mask = _literal_tuple(take_b, 16, "bselect")

    def codegen(context, builder, sig, args):
        cond = ir.Constant(ir.VectorType(ir.IntType(1), LANES), [bool(m) for m in mask])
        return builder.select(cond, args[2], args[1])

    return U8x16(take_b, a, b), codegen


def _literal_tuple(value, n, what) -> list[int]:
    """A lane pattern written as a string literal of ``n`` hex digits (spaces allowed): ``"0123 89ab 4567 89ab"``.

    (Numba keeps string constants as literals through typing; tuples of integers lose their literal values.)
    """
    if not isinstance(value, types.StringLiteral):
        raise TypingError(f"{what}: expects a string literal of {n} hex digits, got {value}")
    digits = value.literal_value.replace(" ", "")
    if len(digits) != n:
        raise TypingError(f"{what}: expects {n} hex digits, got {value.literal_value!r}")
    return [int(c, 16) for c in digits]


@intrinsic
def prefetch(typingctx, arr, offset):
    """Hint the cache line holding byte ``offset`` of a uint8 array into the caches (llvm.prefetch; never faults).

    The mat-vec kernels prefetch a few KB ahead in the weight stream (the hardware prefetcher alone falls short). The
    hint keeps the line in every level (``prefetcht0``), not non-temporal (``prefetchnta``): where a model (or much
    of it) fits in the last-level cache, lines fetched non-temporally are not kept there for the next token. Both
    measured: docs/PERFORMANCE.md, "What each CPU-path change measured".
    """
    _check_array(arr, types.uint8, "prefetch")
    return types.void(arr, offset), _prefetch_codegen(3)  # keep in all levels (T0)


def _prefetch_codegen(locality: int):
    """``llvm.prefetch`` of the byte at ``args[1]`` of a uint8 array: a read, into the data cache, ``locality`` 3 (T0:
    every level) .. 0 (non-temporal)."""

    def codegen(context, builder, sig, args):
        p = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        i32 = lambda v: ir.Constant(_I32, v)
        fnty = ir.FunctionType(ir.VoidType(), [p.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, i32(0), i32(locality), i32(1)])
        return context.get_dummy_value()

    return codegen


@intrinsic
def prefetch_l2(typingctx, arr, offset):
    """:func:`prefetch` into the L2 and below only (``prefetcht1``): for a stream prefetched so far ahead that
    keeping it in the L1 would push out what the loop reads again (the activation), see :func:`far_ahead`."""
    _check_array(arr, types.uint8, "prefetch_l2")
    return types.void(arr, offset), _prefetch_codegen(2)  # the L2 and below (T1)


@njit(inline="always", cache=True)
def far_ahead(w, ahead):
    """Whether prefetching ``ahead`` rows of ``w`` ahead reaches past :data:`PREFETCH_L1_BYTES`: then the prefetch
    goes to the L2 (:func:`prefetch_l2`)."""
    return ahead * w.shape[1] > PREFETCH_L1_BYTES


@njit(inline="always", cache=True)
def rows_ahead(w, step=2):
    """Rows between the first row being multiplied and the first to prefetch: ``PREFETCH_BYTES`` of a 2-D weight,
    and at least the ``step`` rows a loop takes at once (a closer prefetch would fetch rows already being read)."""
    return max(step, PREFETCH_BYTES // max(1, w.shape[1]))


# --- scalars at byte offsets -------------------------------------------------------------------------------------
@intrinsic
def load_f16(typingctx, arr, offset):
    """The IEEE half at byte ``offset`` of a uint8 array, as float32 (a GGUF block's ``d`` / ``m`` / ``dmin``)."""
    _check_array(arr, types.uint8, "load_f16")

    def codegen(context, builder, sig, args):
        h = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], ir.HalfType()), align=1)
        return builder.fpext(h, _F32)

    return types.float32(arr, offset), codegen


@intrinsic
def load_f32(typingctx, arr, offset):
    _check_array(arr, types.uint8, "load_f32")

    def codegen(context, builder, sig, args):
        return builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _F32), align=1)

    return types.float32(arr, offset), codegen


@intrinsic
def load_bf16(typingctx, arr, offset):
    """The bfloat16 at byte ``offset`` of a uint8 array, as float32 (exact)."""
    _check_array(arr, types.uint8, "load_bf16")

    def codegen(context, builder, sig, args):
        h = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _I16), align=1)
        return builder.bitcast(builder.shl(builder.zext(h, _I32), ir.Constant(_I32, 16)), _F32)

    return types.float32(arr, offset), codegen


@intrinsic
def round_f16(typingctx, value):
    """``value`` rounded to the nearest IEEE half (ties to even, as ``_mm512_cvtps_ph``), back as float32."""
    if value != types.float32:
        raise TypingError(f"round_f16 expects a float32, got {value}")

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), _F32)

    return types.float32(types.float32), codegen


@intrinsic
def vround_f16(typingctx, v):
    """Each lane rounded to the nearest IEEE half (ties to even, vcvtps2ph), back as float32: :func:`round_f16`."""
    if v != F32x16:
        raise TypingError(f"vround_f16 expects an F32x16, got {v}")

    def codegen(context, builder, sig, args):
        return builder.fpext(builder.fptrunc(args[0], ir.VectorType(ir.HalfType(), LANES)), _VF)

    return F32x16(F32x16), codegen


@intrinsic
def fma32(typingctx, a, b, c):
    """Scalar float32 ``a * b + c`` with one rounding (llvm.fma.f32), as ggml's compiled FMAs."""
    if (a, b, c) != (types.float32, types.float32, types.float32):
        raise TypingError(f"fma32 expects three float32, got {a}, {b}, {c}")

    def codegen(context, builder, sig, args):
        return _call_intrinsic(builder, "llvm.fma.f32", _F32, list(args))

    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def f16_bits(typingctx, value):
    """The IEEE half nearest to the float32 ``value`` (ties to even), as its uint16 bit pattern."""
    if value != types.float32:
        raise TypingError(f"f16_bits expects a float32, got {value}")

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), _I16)

    return types.uint16(types.float32), codegen


# --- U8x16 -------------------------------------------------------------------------------------------------------
@intrinsic
def bload(typingctx, arr, offset):
    """16 bytes at byte ``offset`` of a uint8 array."""
    _check_array(arr, types.uint8, "bload")

    def codegen(context, builder, sig, args):
        return builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _VB), align=1)

    return U8x16(arr, offset), codegen


@intrinsic
def bstore(typingctx, arr, offset, v):
    """Store the 16 bytes of ``v`` at byte ``offset`` of a uint8 array."""
    _check_array(arr, types.uint8, "bstore")
    if v != U8x16:
        raise TypingError(f"bstore expects a U8x16, got {v}")

    def codegen(context, builder, sig, args):
        builder.store(args[2], _typed_ptr(context, builder, sig.args[0], args[0], args[1], _VB), align=1)
        return context.get_dummy_value()

    return types.void(arr, offset, U8x16), codegen


def _byte_op(op_name):
    def typer(typingctx, v, amount):
        if v != U8x16 or not isinstance(amount, types.Integer):
            raise TypingError(f"{op_name} expects a U8x16 and an integer, got {v}, {amount}")

        def codegen(context, builder, sig, args):
            if isinstance(sig.args[1], types.IntegerLiteral):
                k = ir.Constant(_VB, [int(sig.args[1].literal_value)] * LANES)
            else:  # a run-time amount (a loop counter): LLVM folds it once the loop is unrolled
                k = _splat(builder, builder.trunc(args[1], _I8), _VB)
            return getattr(builder, op_name)(args[0], k)

        return U8x16(v, amount), codegen

    return typer


band = intrinsic(_byte_op("and_"))
bxor = intrinsic(_byte_op("xor"))
bshr = intrinsic(_byte_op("lshr"))
bshl = intrinsic(_byte_op("shl"))


@intrinsic
def bor(typingctx, a, b):
    if a != U8x16 or b != U8x16:
        raise TypingError(f"bor expects two U8x16, got {a}, {b}")

    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])

    return U8x16(U8x16, U8x16), codegen


@intrinsic
def bbits(typingctx, arr, offset, first_bit):
    """Bits ``first_bit .. first_bit+15`` of the little-endian 32-bit word at byte ``offset``, one per byte (0/1).

    This is how Q5_0 / Q5_1 keep their fifth bits (``qh``: bit j belongs to element j of the block).
    """
    _check_array(arr, types.uint8, "bbits")
    shift = _literal_int(first_bit, "bbits")
    if not 0 <= shift <= 16:
        raise TypingError("bbits: first_bit must be in 0..16")

    def codegen(context, builder, sig, args):
        word = builder.load(_typed_ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
        bits16 = builder.trunc(builder.lshr(word, ir.Constant(_I32, shift)), _I16)
        mask = builder.bitcast(bits16, ir.VectorType(ir.IntType(1), LANES))
        return builder.zext(mask, _VB)

    return U8x16(arr, offset, first_bit), codegen


@intrinsic
def bto_f32(typingctx, v):
    """16 unsigned bytes -> 16 float32 (vpmovzxbd + vcvtdq2ps)."""
    if v != U8x16:
        raise TypingError(f"bto_f32 expects a U8x16, got {v}")

    def codegen(context, builder, sig, args):
        return builder.sitofp(builder.zext(args[0], _VI), _VF)

    return F32x16(U8x16), codegen


@intrinsic
def bto_f32_signed(typingctx, v):
    """16 bytes read as int8 -> 16 float32 (vpmovsxbd + vcvtdq2ps)."""
    if v != U8x16:
        raise TypingError(f"bto_f32_signed expects a U8x16, got {v}")

    def codegen(context, builder, sig, args):
        return builder.sitofp(builder.sext(args[0], _VI), _VF)

    return F32x16(U8x16), codegen
