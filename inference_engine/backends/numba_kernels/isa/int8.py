"""Integer dot products for Numba kernels: 32-byte vectors of 8-bit quants and the ``maddubs`` / ``madd`` steps.

The ``ggml`` numerics multiply the weight quants with the activation quantized to 8 bits (Q8_0 / Q8_1 / Q8_K, see
:mod:`.activations`), in integers, and apply the float scales once per block: llama.cpp's own way
(ggml-cpu/arch/x86/quants.c). On 256-bit vectors this is what reaches memory speed: 32 weights per
``vpmaddubsw`` against 8 per float multiply-add, no int -> float conversion per weight. Measured here (AVX2 EPYC,
Q4_0 1536x576, 2 threads, best of 7): integer path 18 GB/s of weight bytes, the float path (:mod:`.q4`) 9.5.

Vectors are generic LLVM vectors (``<32 x i8>``, ``<8 x i32>``, ``<8 x float>``). The two steps LLVM does not find
by itself from generic IR are lowered by what the compile target has (Numba's LLVM target, the same one its
cache is keyed by, so a cached kernel never runs on a CPU it was not built for):

- ``dot4(u, s)``: per i32 lane the sum of four adjacent ``u8 * s8`` products (``vpdpbusd`` semantics):
  AVX-512-VNNI + VL or AVX-VNNI: ``vpdpbusd``; AVX2: ``vpmaddubsw`` + ``vpmaddwd`` with ones (ggml's
  ``mul_sum_us8_pairs``); anything else (NEON, SSE): generic IR that LLVM lowers to widening multiplies: correct,
  slower. Callers keep ``|u * s| * 2 < 2**15`` (no ``vpmaddubsw`` saturation), so all three are the same integers.
- ``dot4_scaled(u, s, k)``: ``k * dot4(u, s)`` as ggml's K-quant kernels do it (``vpmaddubsw`` then ``vpmaddwd``
  with the sub-block scale ``k`` as int16); ``dot4_scaled_lanes`` / ``dot4_diff_scaled_lanes`` take the pair of
  scales from a super-block's :data:`I16x16` (Q2_K, Q3_K: one ``vpshufb`` of the scale vector, as ggml).

Every vector value is a register value like a scalar local. Loads are unaligned and take a byte offset into a
``uint8`` array (the GGUF blocks as they are).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

_I1, _I8, _I16, _I32 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
BYTES = 32  # bytes per quant vector: one Q4_0 / Q8_0 block, one 32-element K-quant sub-block
LANES = BYTES // 4  # i32 / f32 lanes of a dot product


class I8x32Type(types.Type):
    def __init__(self):
        super().__init__(name="I8x32")


class I32x8Type(types.Type):
    def __init__(self):
        super().__init__(name="I32x8")


class F32x8Type(types.Type):
    def __init__(self):
        super().__init__(name="F32x8")


class I16x16Type(types.Type):
    """A K-quant super-block's 16 sub-block scales as int16 lanes (made once per super-block)."""

    def __init__(self):
        super().__init__(name="I16x16")


I8x32, I32x8, F32x8, I16x16 = I8x32Type(), I32x8Type(), F32x8Type(), I16x16Type()
_VB = ir.VectorType(_I8, BYTES)
_VI = ir.VectorType(_I32, LANES)
_VF = ir.VectorType(_F32, LANES)
_VS = ir.VectorType(_I16, 16)


@register_model(I8x32Type)
class _I8x32Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VB)


@register_model(I32x8Type)
class _I32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI)


@register_model(F32x8Type)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VF)


@register_model(I16x16Type)
class _I16x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VS)


# --- code generation helpers ---------------------------------------------------------------------------------
def _ptr(context, builder, arrty, arr, index, pointee):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(builder.gep(ary.data, [index]), pointee.as_pointer())


def _check(arr, dtype, what):
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != dtype:
        raise TypingError(f"{what} expects a 1-D {dtype} array, got {arr}")


def _vconst(ty, values):
    return ir.Constant(ty, list(values))


def _splat(builder, scalar, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, _vconst(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def target_features(context) -> frozenset[str]:
    """The features Numba's LLVM target compiles for (``+avx2``, ``+avx512vnni``...): what code may be emitted.

    Not a CPU detector (kernels are *chosen* by :mod:`inference_engine.cpu_features`): this only keeps each
    lowering legal for the target the code is compiled for, which is also part of Numba's cache key.
    """
    try:
        return frozenset(context.codegen()._tm_features.split(","))
    except AttributeError:  # a codegen without the attribute: generic IR only
        return frozenset()


def _even_odd(builder, v, n):
    ev = _vconst(ir.VectorType(_I32, n // 2), range(0, n, 2))
    od = _vconst(ir.VectorType(_I32, n // 2), range(1, n, 2))
    return builder.shuffle_vector(v, v, ev), builder.shuffle_vector(v, v, od)


def _generic_dot4(builder, u, s):
    """Sum of 4 adjacent ``zext(u) * sext(s)`` products per i32 lane (portable IR)."""
    wide = ir.VectorType(_I32, BYTES)
    p = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    a, b = _even_odd(builder, p, BYTES)
    pairs = builder.add(a, b)
    c, d = _even_odd(builder, pairs, BYTES // 2)
    return builder.add(c, d)


def _maddubs(builder, u, s):
    return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", ir.VectorType(_I16, 16), [u, s])


def _madd(builder, a, b):
    return _call(builder, "llvm.x86.avx2.pmadd.wd", _VI, [a, b])


def lower_dot4(context, builder, u, s):
    feats = target_features(context)
    if "+avxvnni" in feats or ("+avx512vnni" in feats and "+avx512vl" in feats):
        name = "llvm.x86.avx512.vpdpbusd.256"
        zero = ir.Constant(_VI, [0] * LANES)
        return _call(builder, name, _VI, [zero, builder.bitcast(u, _VI), builder.bitcast(s, _VI)])
    if "+avx2" in feats:
        return _madd(builder, _maddubs(builder, u, s), ir.Constant(ir.VectorType(_I16, 16), [1] * 16))
    return _generic_dot4(builder, u, s)


def lower_dot4_scaled(context, builder, u, s, k_lo, k_hi):
    """``dot4(u, s)`` times ``k_lo`` in lanes 0..3 and ``k_hi`` in lanes 4..7 (int16 scalars)."""
    if "+avx2" in target_features(context):
        v8 = ir.VectorType(_I16, 8)
        k = builder.shuffle_vector(_splat(builder, k_lo, v8), _splat(builder, k_hi, v8),
                                   _vconst(ir.VectorType(_I32, 16), range(16)))
        return _madd(builder, _maddubs(builder, u, s), k)
    half = ir.VectorType(_I32, 4)
    k = builder.shuffle_vector(_splat(builder, builder.sext(k_lo, _I32), half),
                               _splat(builder, builder.sext(k_hi, _I32), half), _vconst(_VI, range(8)))
    return builder.mul(_generic_dot4(builder, u, s), k)


def lower_abs_sign(context, builder, a, s):
    """``(|a|, s * sign(a))`` bytewise (``vpsignb``), so that ``dot4`` of the pair is the signed ``a . s``."""
    if "+avx2" in target_features(context):
        ab = _call(builder, "llvm.x86.avx2.psign.b", _VB, [a, a])
        sb = _call(builder, "llvm.x86.avx2.psign.b", _VB, [s, a])
        return ab, sb
    zero = ir.Constant(_VB, [0] * BYTES)
    neg = builder.icmp_signed("<", a, zero)
    is_zero = builder.icmp_signed("==", a, zero)
    ab = builder.select(neg, builder.sub(zero, a), a)
    sb = builder.select(is_zero, zero, builder.select(neg, builder.sub(zero, s), s))
    return ab, sb


def lower_lookup16(context, builder, lut, idx):
    """``<16 x i8>``: lane i = ``lut[idx[i]]`` for indices 0..15 (a code book by nibble): one ``pshufb`` where the
    target has SSSE3, one ``tbl`` on Arm, elsewhere 16 element moves (portable IR, the same values)."""
    feats = target_features(context)
    v16 = ir.VectorType(_I8, 16)
    if "+ssse3" in feats:
        return _call(builder, "llvm.x86.ssse3.pshuf.b.128", v16, [lut, idx])
    if "+neon" in feats:
        return _call(builder, "llvm.aarch64.neon.tbl1.v16i8", v16, [lut, idx])
    out = ir.Constant(v16, ir.Undefined)
    for i in range(16):
        lane = ir.Constant(_I32, i)
        out = builder.insert_element(out, builder.extract_element(lut, builder.extract_element(idx, lane)), lane)
    return out


# --- I8x32 ---------------------------------------------------------------------------------------------------------
@intrinsic
def load32(typingctx, arr, offset):
    """32 bytes at byte ``offset`` of a uint8 array."""
    _check(arr, types.uint8, "load32")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _VB), align=1)

    return I8x32(arr, offset), codegen


@intrinsic
def nibbles32(typingctx, arr, offset):
    """The 16 bytes at ``offset`` as 32 nibbles: low nibbles in bytes 0..15, high ones in 16..31 (a Q4_0 block)."""
    _check(arr, types.uint8, "nibbles32")

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I8, 16)
        q = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], v16), align=1)
        hi = builder.lshr(q, ir.Constant(v16, [4] * 16))
        both = builder.shuffle_vector(q, hi, _vconst(ir.VectorType(_I32, BYTES), range(BYTES)))
        return builder.and_(both, ir.Constant(_VB, [15] * BYTES))

    return I8x32(arr, offset), codegen


@intrinsic
def lookup32(typingctx, table, arr, offset):
    """The code-book values the 16 bytes at ``offset`` index by nibble: lane j = ``table[lo(arr[offset + j])]``,
    lane 16 + j = ``table[hi(arr[offset + j])]`` (an IQ4_NL block, an IQ4_XS sub-block: ggml's ``vpshufb`` on
    ``kvalues_iq4nl``). ``table``: 16 bytes (the int8 values as uint8)."""
    _check(table, types.uint8, "lookup32")
    _check(arr, types.uint8, "lookup32")

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I8, 16)
        lut = builder.load(_ptr(context, builder, sig.args[0], args[0], context.get_constant(types.intp, 0), v16),
                           align=1)
        q = builder.load(_ptr(context, builder, sig.args[1], args[1], args[2], v16), align=1)
        m = ir.Constant(v16, [15] * 16)
        lo = lower_lookup16(context, builder, lut, builder.and_(q, m))
        hi = lower_lookup16(context, builder, lut, builder.and_(builder.lshr(q, ir.Constant(v16, [4] * 16)), m))
        return builder.shuffle_vector(lo, hi, _vconst(ir.VectorType(_I32, BYTES), range(BYTES)))

    return I8x32(table, arr, offset), codegen


@intrinsic
def bits32(typingctx, arr, offset):
    """Bit ``j`` of the little-endian uint32 at byte ``offset``, as byte ``j`` (0 or 1): Q5_0 / Q5_1's fifth bits
    (ggml's ``bytes_from_bits_32``)."""
    _check(arr, types.uint8, "bits32")

    def codegen(context, builder, sig, args):
        word = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)
        return builder.zext(builder.bitcast(word, ir.VectorType(_I1, BYTES)), _VB)

    return I8x32(arr, offset), codegen


def _byte_op(op_name):
    def typer(typingctx, v, amount):
        if v != I8x32 or not isinstance(amount, types.Integer):
            raise TypingError(f"{op_name} expects an I8x32 and an int, got {v}, {amount}")

        def codegen(context, builder, sig, args):
            if isinstance(sig.args[1], types.IntegerLiteral):
                k = ir.Constant(_VB, [int(sig.args[1].literal_value)] * BYTES)
            else:  # a loop counter: LLVM folds it once the loop is unrolled
                k = _splat(builder, builder.trunc(args[1], _I8), _VB)
            return getattr(builder, op_name)(args[0], k)

        return I8x32(v, amount), codegen

    return typer


band8 = intrinsic(_byte_op("and_"))
bshr8 = intrinsic(_byte_op("lshr"))
bshl8 = intrinsic(_byte_op("shl"))
bxor8 = intrinsic(_byte_op("xor"))


@intrinsic
def bor8(typingctx, a, b):
    if a != I8x32 or b != I8x32:
        raise TypingError(f"bor8 expects two I8x32, got {a}, {b}")

    def codegen(context, builder, sig, args):
        return builder.or_(args[0], args[1])

    return I8x32(I8x32, I8x32), codegen


# --- dot products --------------------------------------------------------------------------------------------
@intrinsic
def dot4(typingctx, u, s):
    """I32x8: lane i = sum of ``u[4i+k] * s[4i+k]``, ``u`` unsigned, ``s`` signed bytes."""
    if u != I8x32 or s != I8x32:
        raise TypingError(f"dot4 expects two I8x32, got {u}, {s}")

    def codegen(context, builder, sig, args):
        return lower_dot4(context, builder, args[0], args[1])

    return I32x8(I8x32, I8x32), codegen


@intrinsic
def dot4_signed(typingctx, a, s):
    """As :func:`dot4` with both operands signed (Q8_0 weights): ggml's ``vpsignb`` trick, then ``dot4``."""
    if a != I8x32 or s != I8x32:
        raise TypingError(f"dot4_signed expects two I8x32, got {a}, {s}")

    def codegen(context, builder, sig, args):
        ab, sb = lower_abs_sign(context, builder, args[0], args[1])
        return lower_dot4(context, builder, ab, sb)

    return I32x8(I8x32, I8x32), codegen


@intrinsic
def dot4_scaled(typingctx, u, s, k_lo, k_hi):
    """``dot4(u, s)`` times the int ``k_lo`` in lanes 0..3 and ``k_hi`` in lanes 4..7 (K-quant sub-block scales,
    |k| < 2**15): ggml's ``vpmaddubsw`` then ``vpmaddwd`` with the scales as int16."""
    if u != I8x32 or s != I8x32 or not isinstance(k_lo, types.Integer) or not isinstance(k_hi, types.Integer):
        raise TypingError(f"dot4_scaled expects two I8x32 and two ints, got {u}, {s}, {k_lo}, {k_hi}")

    def codegen(context, builder, sig, args):
        lo = context.cast(builder, args[2], sig.args[2], types.int16)
        hi = context.cast(builder, args[3], sig.args[3], types.int16)
        return lower_dot4_scaled(context, builder, args[0], args[1], lo, hi)

    return I32x8(I8x32, I8x32, k_lo, k_hi), codegen


@intrinsic
def dot4_signed_scaled(typingctx, a, s, k):
    """``k * dot4_signed(a, s)`` (|k| < 2**15): ggml's ``mul_add_epi8`` (``vpsignb`` twice, ``vpmaddubsw``) then
    ``vpmaddwd`` with the sub-block scale ``k`` as int16 (IQ4_XS)."""
    if a != I8x32 or s != I8x32 or not isinstance(k, types.Integer):
        raise TypingError(f"dot4_signed_scaled expects two I8x32 and an int, got {a}, {s}, {k}")

    def codegen(context, builder, sig, args):
        ab, sb = lower_abs_sign(context, builder, args[0], args[1])
        k16 = context.cast(builder, args[2], sig.args[2], types.int16)
        return lower_dot4_scaled(context, builder, ab, sb, k16, k16)

    return I32x8(I8x32, I8x32, k), codegen


def _scale_pair(builder, scales, k):
    """int16 ``scales[k]`` in lanes 0..7 and ``scales[k + 1]`` in lanes 8..15 (one shuffle once ``k`` is a constant:
    the callers' loops are unrolled)."""
    k = builder.trunc(k, _I32) if k.type.width > 32 else k
    lo = builder.extract_element(scales, k)
    hi = builder.extract_element(scales, builder.add(k, ir.Constant(k.type, 1)))
    v8 = ir.VectorType(_I16, 8)
    return builder.shuffle_vector(_splat(builder, lo, v8), _splat(builder, hi, v8),
                                  _vconst(ir.VectorType(_I32, 16), range(16)))


def _pair_scaled_dot(context, builder, u, h, s, pair):
    """``dot4(u, s)``, less ``dot4(h, s)`` where ``h`` is given, times the scale ``pair`` (:func:`_scale_pair`): on
    AVX2 ggml's ``vpmaddubsw`` (the two subtracted as int16), then ``vpmaddwd`` with the pair; elsewhere portable
    int32 IR. The same integers either way."""
    if "+avx2" in target_features(context):
        p16 = _maddubs(builder, u, s)
        if h is not None:
            p16 = builder.sub(p16, _maddubs(builder, h, s))
        return _madd(builder, p16, pair)
    dots = _generic_dot4(builder, u, s)
    if h is not None:
        dots = builder.sub(dots, _generic_dot4(builder, h, s))
    even, _ = _even_odd(builder, builder.sext(pair, ir.VectorType(_I32, 16)), 16)  # an int32 lane's one scale
    return builder.mul(dots, even)


@intrinsic
def dot4_scaled_lanes(typingctx, u, s, scales, k):
    """``dot4_scaled(u, s, scales[k], scales[k + 1])``: the two sub-block scales taken from a super-block's
    :data:`I16x16` (Q2_K), ggml's ``vpshufb`` of its scale vector then ``vpmaddwd``."""
    if u != I8x32 or s != I8x32 or scales != I16x16 or not isinstance(k, types.Integer):
        raise TypingError(f"dot4_scaled_lanes expects two I8x32, an I16x16 and an int, got {u}, {s}, {scales}, {k}")

    def codegen(context, builder, sig, args):
        return _pair_scaled_dot(context, builder, args[0], None, args[1], _scale_pair(builder, args[2], args[3]))

    return I32x8(I8x32, I8x32, I16x16, k), codegen


@intrinsic
def dot4_diff_scaled_lanes(typingctx, u, h, s, scales, k):
    """``dot4_scaled_lanes(u, s, scales, k) - dot4_scaled_lanes(h, s, scales, k)`` as Q3_K's ``vec_dot`` forms
    it: the two ``vpmaddubsw`` subtracted as int16, then one ``vpmaddwd`` with the pair of sub-block scales (``u``
    the low 2 bits, ``h`` 4 where the high bit is clear: ``u - h`` the signed 3-bit value). The same integers as
    two scaled dots; one multiply by the scales."""
    if u != I8x32 or h != I8x32 or s != I8x32 or scales != I16x16 or not isinstance(k, types.Integer):
        raise TypingError(f"dot4_diff_scaled_lanes expects three I8x32, an I16x16 and an int, got {u}, {h}, {s}, "
                          f"{scales}, {k}")

    def codegen(context, builder, sig, args):
        return _pair_scaled_dot(context, builder, args[0], args[1], args[2], _scale_pair(builder, args[3], args[4]))

    return I32x8(I8x32, I8x32, I8x32, I16x16, k), codegen


def _bytes16(context, builder, sig, args):
    return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I8, 16)), align=1)


def _shift_mask(builder, v, shifts, mask):
    """``(v >> shifts) & mask`` lane by lane on int16 lanes (``shifts`` a list of constants)."""
    return builder.and_(builder.lshr(v, ir.Constant(_VS, list(shifts))), ir.Constant(_VS, [mask] * 16))


@intrinsic
def low_nibbles16(typingctx, row, offset):
    """The low nibbles of the 16 bytes at ``offset``, as int16 lanes: Q2_K's sub-block scales."""
    _check(row, types.uint8, "low_nibbles16")

    def codegen(context, builder, sig, args):
        return builder.and_(builder.zext(_bytes16(context, builder, sig, args), _VS), ir.Constant(_VS, [15] * 16))

    return I16x16(row, offset), codegen


@intrinsic
def q3_k_scales16(typingctx, row, offset):
    """Q3_K's 16 sub-block scales from its 12 scale bytes at ``offset + 2``, minus 32, as int16 lanes: scale ``k``
    = the nibble ``k // 8`` of byte ``k % 8`` | bits ``2 (k // 4)`` .. of byte ``8 + k % 4``, << 4 (ggml's ``aux``
    words). The 16 bytes read start 2 before the scales so that the load stays inside the block."""
    _check(row, types.uint8, "q3_k_scales16")

    def codegen(context, builder, sig, args):
        b = builder.zext(_bytes16(context, builder, sig, args), _VS)  # scale byte i is lane i + 2
        idx = ir.VectorType(_I32, 16)
        low_src = builder.shuffle_vector(b, b, _vconst(idx, [2 + (k % 8) for k in range(16)]))
        high_src = builder.shuffle_vector(b, b, _vconst(idx, [10 + (k % 4) for k in range(16)]))
        low = _shift_mask(builder, low_src, [4 * (k // 8) for k in range(16)], 15)
        high = _shift_mask(builder, high_src, [2 * (k // 4) for k in range(16)], 3)
        packed = builder.or_(low, builder.shl(high, ir.Constant(_VS, [4] * 16)))
        return builder.sub(packed, ir.Constant(_VS, [32] * 16))

    return I16x16(row, offset), codegen


# --- I32x8 ---------------------------------------------------------------------------------------------------
@intrinsic
def izero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VI, [0] * LANES)

    return I32x8(), codegen


def _int_binary(op_name):
    def typer(typingctx, a, b):
        if a != I32x8 or b != I32x8:
            raise TypingError(f"{op_name} expects two I32x8, got {a}, {b}")

        def codegen(context, builder, sig, args):
            return getattr(builder, op_name)(args[0], args[1])

        return I32x8(I32x8, I32x8), codegen

    return typer


iadd = intrinsic(_int_binary("add"))
isub = intrinsic(_int_binary("sub"))


@intrinsic
def iload(typingctx, arr, index):
    """8 int32 starting at element ``index`` of an int32 array."""
    _check(arr, types.int32, "iload")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _VI), align=4)

    return I32x8(arr, index), codegen


@intrinsic
def madd16(typingctx, a, a_index, s, s_offset):
    """I32x8: lane i = ``a[2i] * s[2i] + a[2i+1] * s[2i+1]`` for 16 int16 ``a`` (from element ``a_index``) and 16
    int8 ``s`` (from byte ``s_offset`` of a uint8 array): Q6_K's ``bsums . scales`` (``vpmaddwd``)."""
    _check(a, types.int16, "madd16")
    _check(s, types.uint8, "madd16")

    def codegen(context, builder, sig, args):
        return _lower_madd16(context, builder, sig, args, lambda s8: builder.sext(s8, _VS))

    return I32x8(a, a_index, s, s_offset), codegen


def _lower_madd16(context, builder, sig, args, widen):
    """``vpmaddwd`` of the 16 int16 at ``args[0][args[1]:]`` with ``widen`` of the 16 bytes at ``args[2][args[3]:]``
    (an int16 vector), or the same integers in portable IR."""
    av = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _VS), align=2)
    sv = widen(builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], ir.VectorType(_I8, 16)), align=1))
    if "+avx2" in target_features(context):
        return _madd(builder, av, sv)
    wide = ir.VectorType(_I32, 16)
    e, o = _even_odd(builder, builder.mul(builder.sext(av, wide), builder.sext(sv, wide)), 16)
    return builder.add(e, o)


@intrinsic
def madd16_high_nibbles(typingctx, a, a_index, s, s_offset):
    """As :func:`madd16` with the high nibbles of the 16 bytes (0..15) for ``s``: Q2_K's ``bsums . mins``
    (``vpmovsxbw`` of ``(scales >> 4) & 15``, then ``vpmaddwd``)."""
    _check(a, types.int16, "madd16_high_nibbles")
    _check(s, types.uint8, "madd16_high_nibbles")

    def codegen(context, builder, sig, args):
        four = ir.Constant(ir.VectorType(_I8, 16), [4] * 16)
        return _lower_madd16(context, builder, sig, args, lambda s8: builder.zext(builder.lshr(s8, four), _VS))

    return I32x8(a, a_index, s, s_offset), codegen


@intrinsic
def ishl(typingctx, v, amount):
    if v != I32x8 or not isinstance(amount, types.IntegerLiteral):
        return None

    def codegen(context, builder, sig, args):
        return builder.shl(args[0], ir.Constant(_VI, [int(sig.args[1].literal_value)] * LANES))

    return I32x8(v, amount), codegen


# --- F32x8 ---------------------------------------------------------------------------------------------------
@intrinsic
def fzero(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VF, [0.0] * LANES)

    return F32x8(), codegen


@intrinsic
def fma_int(typingctx, d, v, acc):
    """``acc + d * float(v)``, one rounding per lane (``vcvtdq2ps`` + ``vfmadd``: ggml's block accumulation)."""
    if v != I32x8 or acc != F32x8 or d != types.float32:
        raise TypingError(f"fma_int expects float32, I32x8, F32x8, got {d}, {v}, {acc}")

    def codegen(context, builder, sig, args):
        f = builder.sitofp(args[1], _VF)
        return _call(builder, "llvm.fma.v8f32", _VF, [_splat(builder, args[0], _VF), f, args[2]])

    return F32x8(types.float32, I32x8, F32x8), codegen


@intrinsic
def fsum(typingctx, v):
    """Horizontal sum of the 8 lanes, ggml's ``hsum_float_8`` order: ``((0+4)+(2+6)) + ((1+5)+(3+7))``."""
    if v != F32x8:
        raise TypingError(f"fsum expects an F32x8, got {v}")

    def codegen(context, builder, sig, args):
        x, n = args[0], LANES
        while n > 1:  # halves: lanes (0..3)+(4..7), then (0,1)+(2,3), then 0+1
            half = n // 2
            ity = ir.VectorType(_I32, half)
            lo = builder.shuffle_vector(x, x, _vconst(ity, range(half)))
            hi = builder.shuffle_vector(x, x, _vconst(ity, range(half, n)))
            x, n = builder.fadd(lo, hi), half
        return builder.extract_element(x, ir.Constant(_I32, 0))

    return types.float32(F32x8), codegen


@intrinsic
def load_u32(typingctx, arr, offset):
    """The little-endian uint32 at byte ``offset`` of a uint8 array."""
    _check(arr, types.uint8, "load_u32")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _I32), align=1)

    return types.uint32(arr, offset), codegen


@intrinsic
def istore(typingctx, arr, index, v):
    """Store the 8 lanes of ``v`` at element ``index`` of an int32 array."""
    _check(arr, types.int32, "istore")
    if v != I32x8:
        raise TypingError(f"istore expects an I32x8, got {v}")

    def codegen(context, builder, sig, args):
        builder.store(args[2], _ptr(context, builder, sig.args[0], args[0], args[1], _VI), align=4)
        return context.get_dummy_value()

    return types.void(arr, index, I32x8), codegen



@intrinsic
def kmin_pairs(typingctx, pairs, index, mlo, mhi):
    """Q4_K / Q5_K's four ``min_2k * bsum32_2k + min_2k+1 * bsum32_2k+1`` (k = 0..3) of one super-block, in lanes
    0..3 of an I32x8 (lanes 4..7 zero): ggml's ``madd(mins, hadd(bsums))``, where ``pairs`` already holds the
    ``hadd``: the 8 int16 ``bsum32_j = bsums[2j] + bsums[2j+1]`` of the super-block from element ``index`` (made
    once per token by :func:`.intdot.bsum_pairs`, not once per weight row); the 8 6-bit mins are the bytes of
    ``mlo`` (0..3) and ``mhi`` (4..7). AVX2: one ``vpmaddwd`` as ggml; elsewhere generic IR (the test checks
    both against scalar integer arithmetic)."""
    _check(pairs, types.int16, "kmin_pairs")
    if not all(isinstance(m, types.Integer) for m in (mlo, mhi)):
        raise TypingError(f"kmin_pairs expects two uint32 words of mins, got {mlo}, {mhi}")

    def codegen(context, builder, sig, args):
        v8 = ir.VectorType(_I16, 8)
        quad = ir.VectorType(_I32, 4)
        b = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], v8), align=2)
        words = ir.Constant(ir.VectorType(_I32, 2), ir.Undefined)
        lo = context.cast(builder, args[2], sig.args[2], types.uint32)
        hi = context.cast(builder, args[3], sig.args[3], types.uint32)
        words = builder.insert_element(words, lo, ir.Constant(_I32, 0))
        words = builder.insert_element(words, hi, ir.Constant(_I32, 1))
        mins = builder.zext(builder.bitcast(words, ir.VectorType(_I8, 8)), v8)
        if "+avx2" in target_features(context):
            quads = _call(builder, "llvm.x86.sse2.pmadd.wd", quad, [mins, b])
        else:
            wide = ir.VectorType(_I32, 8)
            a, c = _even_odd(builder, builder.mul(builder.zext(mins, wide), builder.sext(b, wide)), 8)
            quads = builder.add(a, c)
        zero = ir.Constant(quad, [0] * 4)
        return builder.shuffle_vector(quads, zero, _vconst(_VI, range(8)))

    return I32x8(pairs, index, mlo, mhi), codegen


@intrinsic
def ihsum(typingctx, v):
    """The int32 sum of the 8 lanes (integer: any order gives the same value)."""
    if v != I32x8:
        raise TypingError(f"ihsum expects an I32x8, got {v}")

    def codegen(context, builder, sig, args):
        x, n = args[0], LANES
        while n > 1:
            half = n // 2
            ity = ir.VectorType(_I32, half)
            x = builder.add(builder.shuffle_vector(x, x, _vconst(ity, range(half))),
                            builder.shuffle_vector(x, x, _vconst(ity, range(half, n))))
            n = half
        return builder.extract_element(x, ir.Constant(_I32, 0))

    return types.int32(I32x8), codegen


# --- F32x8 / I32x8 with one lane per token (the K-quants' 8-token blocks, :mod:`.inttiles`) -----------------------
@intrinsic
def fload8(typingctx, arr, index):
    """8 float32 from element ``index`` of a float32 array."""
    _check(arr, types.float32, "fload8")

    def codegen(context, builder, sig, args):
        return builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], _VF), align=4)

    return F32x8(arr, index), codegen


@intrinsic
def fscale(typingctx, v, s):
    """``v * s`` lane by lane (``s`` a float32)."""
    if v != F32x8 or s != types.float32:
        raise TypingError(f"fscale expects an F32x8 and a float32, got {v}, {s}")

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], _splat(builder, args[1], _VF))

    return F32x8(F32x8, types.float32), codegen


@intrinsic
def fadd8(typingctx, a, b):
    if a != F32x8 or b != F32x8:
        raise TypingError(f"fadd8 expects two F32x8, got {a}, {b}")

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return F32x8(F32x8, F32x8), codegen


@intrinsic
def flane(typingctx, v, k):
    """Lane ``k`` of an F32x8 as a float32."""
    if v != F32x8 or not isinstance(k, types.Integer):
        raise TypingError(f"flane expects an F32x8 and an int, got {v}, {k}")

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], context.cast(builder, args[1], sig.args[1], types.int32))

    return types.float32(F32x8, k), codegen


@intrinsic
def fma_intv(typingctx, d, v, acc):
    """``acc + d * float(v)`` lane by lane, one rounding (:func:`fma_int` with a vector ``d``)."""
    if d != F32x8 or v != I32x8 or acc != F32x8:
        raise TypingError(f"fma_intv expects F32x8, I32x8, F32x8, got {d}, {v}, {acc}")

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v8f32", _VF, [args[0], builder.sitofp(args[1], _VF), args[2]])

    return F32x8(F32x8, I32x8, F32x8), codegen


@intrinsic
def kmin_tokens(typingctx, pairs, index, mlo, mhi, k):
    """Q4_K / Q5_K's min products of pair ``k`` (0..3) of one super-block for 8 tokens, one token per lane:
    lane ``t`` = ``min_2k * pairs[index + 2t] + min_2k+1 * pairs[index + 2t + 1]`` with the 16 int16 from
    ``index`` holding each token's ``bsum32_2k, bsum32_2k+1`` (:func:`.inttiles.bsum_pairs8`) and the 8 6-bit mins
    the bytes of ``mlo`` (0..3) and ``mhi`` (4..7). Lane ``t`` is the integer that lane ``k`` of
    :func:`kmin_pairs` gives for token ``t`` (AVX2: one ``vpmaddwd``; elsewhere generic IR)."""
    _check(pairs, types.int16, "kmin_tokens")
    if not all(isinstance(m, types.Integer) for m in (mlo, mhi, k)):
        raise TypingError(f"kmin_tokens expects two uint32 words of mins and an int, got {mlo}, {mhi}, {k}")

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I16, 16)
        b = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], v16), align=2)
        words = ir.Constant(ir.VectorType(_I32, 2), ir.Undefined)
        lo = context.cast(builder, args[2], sig.args[2], types.uint32)
        hi = context.cast(builder, args[3], sig.args[3], types.uint32)
        words = builder.insert_element(words, lo, ir.Constant(_I32, 0))
        words = builder.insert_element(words, hi, ir.Constant(_I32, 1))
        # the 8 mins as int16, seen as 4 int32 words (min_2k | min_2k+1 << 16); word k in every lane
        pair_words = builder.bitcast(builder.zext(builder.bitcast(words, ir.VectorType(_I8, 8)),
                                                  ir.VectorType(_I16, 8)), ir.VectorType(_I32, 4))
        kk = context.cast(builder, args[4], sig.args[4], types.int32)
        mk = builder.bitcast(_splat(builder, builder.extract_element(pair_words, kk), _VI), v16)
        if "+avx2" in target_features(context):
            return _madd(builder, b, mk)
        wide = ir.VectorType(_I32, 16)
        e, o = _even_odd(builder, builder.mul(builder.sext(b, wide), builder.sext(mk, wide)), 16)
        return builder.add(e, o)

    return I32x8(pairs, index, mlo, mhi, k), codegen
