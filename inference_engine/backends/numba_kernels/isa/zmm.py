"""Integer steps on 512-bit vectors (AVX-512 BW + VNNI): four weight rows per step (decode), two tokens (prefill).

**Four rows per step** (the one-token mat-vecs of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: ``types/<type>.py``'s
``matvec_int_loop_<type>``; Q5_0 / Q5_1 through :func:`offset_five_bit_dots` / :func:`five_bit_dots`, their fifth
bits from ``qh`` expanded per row).
:mod:`.intdot` multiplies a row (or a row pair) on 256-bit vectors, as ggml's AVX2 code does: per 32-quant block
about 20 instructions (the nibble unpack, one ``vpdpbusd``, the f16 scales one at a time, the float FMA), so on a
CPU with AVX-512 its one-token mat-vecs are bound by instructions, not by memory. Measured on the Xeon VM (AVX-512
VNNI, Q4_1 1536x576, one thread, cache-resident): ggml's own ``vec_dot`` 51 us, ours 70 us; with these steps 23 us
(Q8_0 4096x576: ggml 155 us, ours 274 -> 102).

The same arithmetic runs on four rows at once. The 16 bytes of one block of each of four rows fill a 512-bit
vector (row ``r`` in 128-bit lane ``r``); one ``vpdpbusd`` against the activation's first 16 bytes, broadcast to the
four lanes, gives each row's int32 lanes 0..3 of ggml's dot product (``lo``), a second one against the last 16
bytes its lanes 4..7 (``hi``). The f16 scales of the four rows are loaded and converted together. Each row's lane
keeps its own float accumulator, fed in block order by the same ``vcvtdq2ps`` + FMA as ggml's, and the final
horizontal sum adds the lanes in ``hsum_float_8``'s order, so every output is the row kernel's (and libggml's)
value bit for bit; only the instruction count changes (~7 a block instead of ~20).

Q8_0 weights are signed: ggml's ``vpsignb`` trick has no 512-bit form, so the weight bytes are flipped to
``w + 128`` (unsigned) and the product is corrected by ``-128 * sum4(y)`` per lane, the accumulator's start value:
the same integers.

**Two tokens per step** (the K-quants' prefill, :func:`.inttiles.row16z_q4_k` / ``row16z_q6_k``): see the section
below.

The vector code is generic LLVM IR except ``vpdpbusd``, ``vpmaddubsw``, ``vpmaddwd`` and ``vpdpwssd``, which are used
where the compile target has them (:func:`has_zmm_vnni` and :func:`compiled_isa`, constants at compile time, choose
the kernels that use these steps). On an AVX2 target the nibble steps (:func:`nibble_dots`,
:func:`offset_nibble_dots`) take ``vpmaddubsw`` + ``vpmaddwd`` per 256-bit half instead of ``vpdpbusd`` (exact: a
nibble times an int8 pair fits int16), and LLVM splits the rest of the 512-bit IR into 256-bit halves: the
four-row mat-vecs of Q4_0 and Q4_1 run there too, faster than :mod:`.intdot`'s row pairs. Elsewhere the intrinsics
lower to portable IR (correct, slow; tested) and the kernels keep :mod:`.intdot`'s and :mod:`.inttiles`' 256-bit
loops.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic, models, register_model

from inference_engine.backends.numba_kernels.isa.int8 import (
    F32x8,
    _call,
    _ptr,
    _vconst,
    lower_lookup16,
    target_features,
)
from inference_engine.backends.numba_kernels.isa.simd import F32x16

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
_B16, _B64 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 64)
_VI16 = ir.VectorType(_I32, 16)
_VF16, _VF8 = ir.VectorType(_F32, 16), ir.VectorType(_F32, 8)
_V16I16, _V8I32 = ir.VectorType(ir.IntType(16), 16), ir.VectorType(_I32, 8)
_ONES16 = ir.Constant(_V16I16, [1] * 16)
ROWS = 4  # weight rows per step


class I32x16Type(types.Type):
    def __init__(self):
        super().__init__(name="I32x16")


I32x16 = I32x16Type()


@register_model(I32x16Type)
class _I32x16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VI16)


def _zmm_vnni(context) -> bool:
    feats = target_features(context)
    return {"+avx512f", "+avx512bw", "+avx512vnni"} <= feats


def _ymm_int8(context) -> bool:
    """AVX2 without AVX-512 VNNI: 256-bit ``vpmaddubsw`` / ``vpmaddwd``, 16 vector registers."""
    return "+avx2" in target_features(context) and not _zmm_vnni(context)


@intrinsic
def compiled_isa(typingctx):
    """The compile target as the 16-token kernels see it: 2 for AVX-512 VNNI, 1 for AVX2 (without it), 0 for
    anything else (portable IR). A constant."""

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(64), 2 if _zmm_vnni(context) else int(_ymm_int8(context)))

    return types.int64(), codegen


@intrinsic
def has_zmm_vnni(typingctx):
    """Whether the code is compiled for AVX-512 VNNI + BW: a constant, so the branch not taken is compiled away."""

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), int(_zmm_vnni(context)))

    return types.boolean(), codegen


def _rows(args_types, what):
    for a in args_types:
        if not isinstance(a, types.Array) or a.ndim != 1 or a.dtype != types.uint8:
            raise TypingError(f"{what} expects four 1-D uint8 rows, got {a}")


def _concat4(builder, parts):
    """Four 16-byte vectors -> one 64-byte vector, part ``r`` in bytes 16r..16r+15."""
    ab = builder.shuffle_vector(parts[0], parts[1], _vconst(ir.VectorType(_I32, 32), range(32)))
    cd = builder.shuffle_vector(parts[2], parts[3], _vconst(ir.VectorType(_I32, 32), range(32)))
    return builder.shuffle_vector(ab, cd, _vconst(ir.VectorType(_I32, 64), range(64)))


def _load16(context, builder, arrty, arr, offset):
    return builder.load(_ptr(context, builder, arrty, arr, offset, _B16), align=1)


def _broadcast16(context, builder, arrty, arr, offset):
    """The 16 bytes at ``offset`` in each of the four 128-bit lanes."""
    v = _load16(context, builder, arrty, arr, offset)
    return builder.shuffle_vector(v, v, _vconst(ir.VectorType(_I32, 64), [i % 16 for i in range(64)]))


def _dot4_acc(context, builder, acc, u, s, small=False):
    """``acc + dot4(u, s)`` on 64 bytes (16 int32 lanes; ``u`` unsigned, ``s`` signed): ``vpdpbusd`` on AVX-512 VNNI;
    on AVX2 where ``small`` (every byte of ``u`` below 129), per 32 bytes ``vpmaddubsw`` (pairs into int16: exact
    while ``2 * 128 * u`` fits) then ``vpmaddwd`` with ones, as ggml's AVX2 code multiplies; portable IR elsewhere."""
    if _zmm_vnni(context):
        return _call(builder, "llvm.x86.avx512.vpdpbusd.512", _VI16,
                     [acc, builder.bitcast(u, _VI16), builder.bitcast(s, _VI16)])
    if small and _ymm_int8(context):
        halves = []
        for h in range(2):
            pick = _vconst(ir.VectorType(_I32, 32), range(32 * h, 32 * h + 32))
            pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16,
                          [builder.shuffle_vector(u, u, pick), builder.shuffle_vector(s, s, pick)])
            halves.append(_call(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, _ONES16]))
        return builder.add(acc, builder.shuffle_vector(halves[0], halves[1], _vconst(_VI16, range(16))))
    wide = ir.VectorType(_I32, 64)
    p = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    for n in (64, 32):
        even = builder.shuffle_vector(p, p, _vconst(ir.VectorType(_I32, n // 2), range(0, n, 2)))
        odd = builder.shuffle_vector(p, p, _vconst(ir.VectorType(_I32, n // 2), range(1, n, 2)))
        p = builder.add(even, odd)
    return builder.add(acc, p)


def _quad_weights(context, builder, sig, args, offset):
    return [_load16(context, builder, sig.args[r], args[r], offset) for r in range(ROWS)]


@intrinsic
def nibble_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset):
    """The integer dot products of one Q4 block of four rows (16 nibble bytes at ``offset`` of each) with the 32
    activation quants at ``yoffset`` of ``yq``: ``(lo, hi)``, I32x16 each; lanes 4r..4r+3 of ``lo`` are row ``r``'s
    lanes 0..3 of :func:`.int8.dot4` (low nibbles . y[0:16]), those of ``hi`` its lanes 4..7."""
    _rows((w0, w1, w2, w3, yq), "nibble_dots")

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_VI16, [0] * 16)
        return _dots_pair(context, builder, sig, args, *_nibble_halves(context, builder, sig, args), zero, zero, True)

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset), codegen


def _nibble_halves(context, builder, sig, args):
    """The four rows' 16 nibble bytes at ``args[4]``: low nibbles (elements 0..15) and high ones (16..31)."""
    q = _concat4(builder, _quad_weights(context, builder, sig, args, args[4]))
    return builder.and_(q, ir.Constant(_B64, [15] * 64)), builder.lshr(q, ir.Constant(_B64, [4] * 64))


def _five_bit_halves(context, builder, sig, args):
    """The four rows' 32 five-bit quants of a Q5_0 / Q5_1 block: the nibbles at ``args[4]`` (``qs``) and, as 16, bit
    ``j`` of the u32 ``qh`` just before them (element ``j``); elements 0..15 and 16..31."""
    lo, hi = _nibble_halves(context, builder, sig, args)
    qh_at = builder.sub(args[4], ir.Constant(args[4].type, 4))
    fifth = []
    for r in range(ROWS):
        word = builder.load(_ptr(context, builder, sig.args[r], args[r], qh_at, _I32), align=1)
        bits = builder.zext(builder.bitcast(word, ir.VectorType(ir.IntType(1), 32)), ir.VectorType(_I8, 32))
        fifth.append(builder.shl(bits, ir.Constant(ir.VectorType(_I8, 32), [4] * 32)))
    picks = [_vconst(ir.VectorType(_I32, 16), range(16 * h, 16 * h + 16)) for h in range(2)]
    half = [_concat4(builder, [builder.shuffle_vector(f, f, pick) for f in fifth]) for pick in picks]
    return builder.or_(lo, half[0]), builder.or_(hi, half[1])


def _dots_pair(context, builder, sig, args, lo, hi, c0, c1, small):
    """``(c0 + dot4(lo, y[0:16]), c1 + dot4(hi, y[16:32]))``, the activation ``y`` at ``args[6]`` of ``args[5]``
    broadcast to the four rows' 128-bit lanes: the tuple the quad steps return (``small``: as :func:`_dot4_acc`)."""
    y0 = _broadcast16(context, builder, sig.args[5], args[5], args[6])
    y1 = _broadcast16(context, builder, sig.args[5], args[5], builder.add(args[6], ir.Constant(args[6].type, 16)))
    return context.make_tuple(builder, sig.return_type, [_dot4_acc(context, builder, c0, lo, y0, small),
                                                          _dot4_acc(context, builder, c1, hi, y1, small)])


@intrinsic
def signed_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset, corr, coffset):
    """As :func:`nibble_dots` for Q8_0's 32 signed weight bytes at ``offset`` of each row: ``lo`` from bytes 0..15,
    ``hi`` from 16..31. The weights enter ``vpdpbusd`` as ``w + 128`` (unsigned) and each lane starts from
    ``corr[coffset + lane]`` (int32, ``-128 * sum4(y)``: :func:`.intdot.q8_corrections`), which takes the 128s back
    out: lane ``i`` = ``sum w * y`` over its four bytes, the same integer as :func:`.int8.dot4_signed`."""
    _rows((w0, w1, w2, w3, yq), "signed_dots")
    _check_starts(corr, "signed_dots")

    def codegen(context, builder, sig, args):
        flip = ir.Constant(_B64, [0x80] * 64)
        off = args[4]
        sixteen = ir.Constant(off.type, 16)
        lo = builder.xor(_concat4(builder, _quad_weights(context, builder, sig, args, off)), flip)
        hi = builder.xor(_concat4(builder, _quad_weights(context, builder, sig, args, builder.add(off, sixteen))),
                         flip)
        c0, c1 = _starts(context, builder, sig.args[7], args[7], args[8])
        return _dots_pair(context, builder, sig, args, lo, hi, c0, c1, False)  # w + 128: not small

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset, corr, coffset), codegen


def _check_starts(corr, what):
    if not isinstance(corr, types.Array) or corr.ndim != 1 or corr.dtype != types.int32:
        raise TypingError(f"{what} expects 1-D int32 start values, got {corr}")


def _starts(context, builder, arrty, arr, index):
    """``arr[index .. index + 7]`` (int32) as the start values of ``lo`` (lanes 0..3) and ``hi`` (4..7), repeated in
    each row's 128-bit lane."""
    c8 = builder.load(_ptr(context, builder, arrty, arr, index, ir.VectorType(_I32, 8)), align=4)
    c0 = builder.shuffle_vector(c8, c8, _vconst(_VI16, [i % 4 for i in range(16)]))
    c1 = builder.shuffle_vector(c8, c8, _vconst(_VI16, [4 + i % 4 for i in range(16)]))
    return c0, c1


@intrinsic
def offset_nibble_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset, corr, coffset):
    """:func:`nibble_dots` with each lane starting from ``corr[coffset + lane]``: Q4_0's ``-8 * sum4(y)``, so that
    the lanes hold ``(q - 8) . y``, the integers of ggml's signed nibbles."""
    _rows((w0, w1, w2, w3, yq), "offset_nibble_dots")
    _check_starts(corr, "offset_nibble_dots")

    def codegen(context, builder, sig, args):
        return _offset_dots(context, builder, sig, args, _nibble_halves)

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset, corr, coffset), codegen


def _offset_dots(context, builder, sig, args, halves, small=True):
    """The offset quad steps' tuple: ``halves``' two quant vectors (elements 0..15, 16..31) dotted with the
    activation, each lane from its start value ``args[7][args[8] + lane]`` (``small``: as :func:`_dot4_acc`)."""
    lo, hi = halves(context, builder, sig, args)
    c0, c1 = _starts(context, builder, sig.args[7], args[7], args[8])
    return _dots_pair(context, builder, sig, args, lo, hi, c0, c1, small)


@intrinsic
def code_book_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset, corr, coffset, table):
    """:func:`offset_nibble_dots` for a code-book type (IQ4_NL): each nibble stands for ``table[nibble]`` (16
    unsigned bytes, the code book plus 128, as ``vpdpbusd`` takes them) and each lane starts from
    ``corr[coffset + lane]`` (``-128 * sum4(y)``), so the lanes hold the code book's signed values dotted with y:
    the integers of ggml's lookup. The values reach 241, too large for AVX2's ``vpmaddubsw`` pairs (portable IR
    there)."""
    _rows((w0, w1, w2, w3, yq), "code_book_dots")
    _check_starts(corr, "code_book_dots")
    if not isinstance(table, types.Array) or table.ndim != 1 or table.dtype != types.uint8:
        raise TypingError(f"code_book_dots expects a 1-D uint8 table of 16 bytes, got {table}")

    def codegen(context, builder, sig, args):
        return _offset_dots(context, builder, sig, args, _code_book_halves, small=False)

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset, corr, coffset, table), codegen


def _code_book_halves(context, builder, sig, args):
    """:func:`_nibble_halves` with each nibble replaced by its entry of the 16-byte table ``args[9]``."""
    lut = _broadcast16(context, builder, sig.args[9], args[9], ir.Constant(ir.IntType(64), 0))
    return tuple(_lookup64(context, builder, lut, half) for half in _nibble_halves(context, builder, sig, args))


def _lookup64(context, builder, lut, idx):
    """Byte i = ``lut[idx[i]]`` for indices 0..15, ``lut`` repeated in each 128-bit lane: one ``vpshufb`` on
    AVX-512 BW, else four 16-byte lookups (:func:`.int8.lower_lookup16`)."""
    if "+avx512bw" in target_features(context):
        return _call(builder, "llvm.x86.avx512.pshuf.b.512", _B64, [lut, idx])
    quarters = []
    for q in range(4):
        pick = _vconst(ir.VectorType(_I32, 16), range(16 * q, 16 * q + 16))
        quarters.append(lower_lookup16(context, builder, builder.shuffle_vector(lut, lut, pick),
                                       builder.shuffle_vector(idx, idx, pick)))
    return _concat4(builder, quarters)


@intrinsic
def five_bit_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset):
    """:func:`nibble_dots` for the five-bit quants of Q5_1 (``qs`` at ``offset``, ``qh`` the 4 bytes before)."""
    _rows((w0, w1, w2, w3, yq), "five_bit_dots")

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_VI16, [0] * 16)
        return _dots_pair(context, builder, sig, args, *_five_bit_halves(context, builder, sig, args), zero, zero, True)

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset), codegen


@intrinsic
def offset_five_bit_dots(typingctx, w0, w1, w2, w3, offset, yq, yoffset, corr, coffset):
    """:func:`offset_nibble_dots` for Q5_0's five-bit quants (``qs`` at ``offset``, ``qh`` the 4 bytes before): with
    the start values ``-16 * sum4(y)`` the lanes hold ``(q - 16) . y``, the integers of ggml's ``vec_dot_q5_0_q8_0``
    (quants up to 31: exact on AVX2's ``vpmaddubsw`` too)."""
    _rows((w0, w1, w2, w3, yq), "offset_five_bit_dots")
    _check_starts(corr, "offset_five_bit_dots")

    def codegen(context, builder, sig, args):
        return _offset_dots(context, builder, sig, args, _five_bit_halves)

    return types.UniTuple(I32x16, 2)(w0, w1, w2, w3, offset, yq, yoffset, corr, coffset), codegen


@intrinsic
def block_sums(typingctx, lo, hi):
    """Each row's whole-block integer sum (its four lanes of ``lo`` and of ``hi`` added), in all four of its
    lanes."""
    if lo != I32x16 or hi != I32x16:
        raise TypingError(f"block_sums expects two I32x16, got {lo}, {hi}")

    def codegen(context, builder, sig, args):
        s = builder.add(args[0], args[1])
        for step in (1, 2):
            s = builder.add(s, builder.shuffle_vector(s, s, _vconst(_VI16, [i ^ step for i in range(16)])))
        return s

    return I32x16(lo, hi), codegen


@intrinsic
def f16_pairs(typingctx, w0, w1, w2, w3, offset):
    """The two f16 at ``offset`` of each row as float32: ``[a0, b0, a1, b1, a2, b2, a3, b3]`` (Q4_1's ``d, m``)."""
    _rows((w0, w1, w2, w3), "f16_pairs")

    def codegen(context, builder, sig, args):
        v = ir.Constant(ir.VectorType(_I32, 4), ir.Undefined)
        for r in range(ROWS):
            word = builder.load(_ptr(context, builder, sig.args[r], args[r], args[4], _I32), align=1)
            v = builder.insert_element(v, word, ir.Constant(_I32, r))
        return builder.fpext(builder.bitcast(v, ir.VectorType(ir.HalfType(), 8)), _VF8)

    return F32x8(w0, w1, w2, w3, offset), codegen


@intrinsic
def quad_scales(typingctx, w0, w1, w2, w3, offset, dy):
    """Lanes 4r..4r+3 = the f16 at ``offset`` of row ``r`` as float32, times ``dy`` (one float32 product: the block
    scale ``d_w * d_y`` of Q8_0, Q5_0, Q4_0 and IQ4_NL), the four halves gathered in a general register (integer
    loads, shifts and ors) and converted once: inserted into a vector one by one, as before, they cost the repacked
    Q4_0 mat-vec's inner loop 5 more of its ~32 vector instructions a block, 15% of its speed on one thread
    (8960x1536, the AMD EPYC VM, Zen 4)."""
    _rows((w0, w1, w2, w3), "quad_scales")
    if dy != types.float32:
        raise TypingError(f"quad_scales expects a float32 scale, got {dy}")

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        word = ir.Constant(i64, 0)
        for r in range(ROWS):
            h = builder.load(_ptr(context, builder, sig.args[r], args[r], args[4], _I16), align=1)
            word = builder.or_(word, builder.shl(builder.zext(h, i64), ir.Constant(i64, 16 * r)))
        d = builder.fpext(builder.bitcast(word, ir.VectorType(ir.HalfType(), ROWS)), ir.VectorType(_F32, ROWS))
        dy4 = builder.insert_element(ir.Constant(ir.VectorType(_F32, ROWS), ir.Undefined), args[5],
                                     ir.Constant(_I32, 0))
        d = builder.fmul(d, builder.shuffle_vector(dy4, dy4, _vconst(ir.VectorType(_I32, ROWS), [0] * ROWS)))
        return builder.shuffle_vector(d, d, _vconst(_VI16, [i // 4 for i in range(16)]))

    return F32x16(w0, w1, w2, w3, offset, dy), codegen


@intrinsic
def row_scales(typingctx, pairs, dy):
    """Lanes 4r..4r+3 = ``pairs[2r] * dy``: each row's block scale times the activation's, in its four lanes."""
    if pairs != F32x8 or dy != types.float32:
        raise TypingError(f"row_scales expects an F32x8 and a float32, got {pairs}, {dy}")

    def codegen(context, builder, sig, args):
        splat = builder.shuffle_vector(builder.insert_element(ir.Constant(_VF8, ir.Undefined), args[1],
                                                              ir.Constant(_I32, 0)),
                                       ir.Constant(_VF8, ir.Undefined), _vconst(ir.VectorType(_I32, 8), [0] * 8))
        d = builder.fmul(args[0], splat)
        return builder.shuffle_vector(d, d, _vconst(_VI16, [2 * (i // 4) for i in range(16)]))

    return F32x16(pairs, dy), codegen


@intrinsic
def fma_lanes(typingctx, d, v, acc):
    """``acc + d * float(v)`` per lane, one rounding (ggml's ``vcvtdq2ps`` + ``vfmadd``)."""
    if d != F32x16 or v != I32x16 or acc != F32x16:
        raise TypingError(f"fma_lanes expects F32x16, I32x16, F32x16, got {d}, {v}, {acc}")

    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v16f32", _VF16, [args[0], builder.sitofp(args[1], _VF16), args[2]])

    return F32x16(d, v, acc), codegen


@intrinsic
def fma_splat8(typingctx, a, s, acc):
    """``acc + a * s`` per lane of an F32x8, ``s`` a float32, one rounding (Q4_1's ``m * s`` term, odd lanes)."""
    if a != F32x8 or s != types.float32 or acc != F32x8:
        raise TypingError(f"fma_splat8 expects F32x8, float32, F32x8, got {a}, {s}, {acc}")

    def codegen(context, builder, sig, args):
        v = builder.insert_element(ir.Constant(_VF8, ir.Undefined), args[1], ir.Constant(_I32, 0))
        splat = builder.shuffle_vector(v, v, _vconst(ir.VectorType(_I32, 8), [0] * 8))
        return _call(builder, "llvm.fma.v8f32", _VF8, [args[0], splat, args[2]])

    return F32x8(a, s, acc), codegen


def _row_sums(builder, lo, hi):
    """Row ``r``'s 8 lanes (``lo``, ``hi`` lanes 4r..4r+3) summed in ``hsum_float_8``'s order: lanes i + i+4, then
    (0 + 2) + (1 + 3)."""
    s = builder.fadd(lo, hi)
    q = ir.VectorType(_I32, 4)
    a = builder.shuffle_vector(s, s, _vconst(q, [0, 4, 8, 12]))
    b = builder.shuffle_vector(s, s, _vconst(q, [1, 5, 9, 13]))
    c = builder.shuffle_vector(s, s, _vconst(q, [2, 6, 10, 14]))
    d = builder.shuffle_vector(s, s, _vconst(q, [3, 7, 11, 15]))
    return builder.fadd(builder.fadd(a, c), builder.fadd(b, d))


def _store4(context, builder, arrty, arr, index, v):
    builder.store(v, _ptr(context, builder, arrty, arr, index, v.type), align=4)
    return context.get_dummy_value()


def _check_out(out, what):
    if not isinstance(out, types.Array) or out.ndim != 1 or out.dtype != types.float32:
        raise TypingError(f"{what} expects a 1-D float32 output, got {out}")


@intrinsic
def store_rows(typingctx, out, index, lo, hi):
    """``out[index + r]`` = row ``r``'s horizontal sum of its ``lo`` / ``hi`` lanes (:func:`_row_sums`)."""
    _check_out(out, "store_rows")

    def codegen(context, builder, sig, args):
        return _store4(context, builder, sig.args[0], args[0], args[1], _row_sums(builder, args[2], args[3]))

    return types.void(out, index, lo, hi), codegen


@intrinsic
def store_first_lanes(typingctx, out, index, v):
    """``out[index + r]`` = lane ``4r`` of ``v`` (a row's value held in each of its four lanes)."""
    _check_out(out, "store_first_lanes")
    if v != F32x16:
        raise TypingError(f"store_first_lanes expects an F32x16, got {v}")

    def codegen(context, builder, sig, args):
        firsts = builder.shuffle_vector(args[2], args[2], _vconst(ir.VectorType(_I32, 4), [0, 4, 8, 12]))
        return _store4(context, builder, sig.args[0], args[0], args[1], firsts)

    return types.void(out, index, v), codegen


@intrinsic
def store_rows_plus(typingctx, out, index, lo, hi, c):
    """As :func:`store_rows`, plus lane ``2r + 1`` of the F32x8 ``c`` (Q4_1's ``sum m * s``) on row ``r``."""
    _check_out(out, "store_rows_plus")

    def codegen(context, builder, sig, args):
        odd = builder.shuffle_vector(args[4], args[4], _vconst(ir.VectorType(_I32, 4), [1, 3, 5, 7]))
        sums = builder.fadd(_row_sums(builder, args[2], args[3]), odd)
        return _store4(context, builder, sig.args[0], args[0], args[1], sums)

    return types.void(out, index, lo, hi, c), codegen



@intrinsic
def istore16(typingctx, arr, index, v):
    """Store the 16 lanes of an I32x16 at element ``index`` of an int32 array."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != types.int32 or v != I32x16:
        raise TypingError(f"istore16 expects a 1-D int32 array, an index and an I32x16, got {arr}, {v}")

    def codegen(context, builder, sig, args):
        return _store4(context, builder, sig.args[0], args[0], args[1], args[2])

    return types.void(arr, index, v), codegen


# --- two tokens per step: the K-quants' prefill (inttiles' 8-token blocks) ---------------------------------------
# ggml's Q4_K dot product multiplies each 32-quant sub-block in 8 int32 lanes (``vpmaddubsw``, then ``vpmaddwd``
# with the sub-block's scale) and sums the 8 sub-blocks' lanes before one float step per super-block. Here one
# 512-bit vector holds those 8 lanes for two tokens (lanes 0..7 token ``t``, 8..15 token ``t + 1``): the weight
# quants are unpacked once into both halves, the two tokens' activation bytes sit side by side
# (:func:`.inttiles.token_pairs` lays them out so), and ``vpdpwssd`` (AVX-512 VNNI) adds the scaled pairs into the
# sums. The integers are ggml's; the float steps stay per token and lane.
class I8x64Type(types.Type):
    def __init__(self):
        super().__init__(name="I8x64")


I8x64 = I8x64Type()


@register_model(I8x64Type)
class _I8x64Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _B64)


@intrinsic
def nibbles_both(typingctx, arr, offset):
    """The 32 bytes at ``offset`` as two I8x64: their low nibbles in both 32-byte halves, their high nibbles in both
    (one Q4_K / Q5_K sub-block pair, for two tokens)."""
    _rows((arr,), "nibbles_both")

    def codegen(context, builder, sig, args):
        v32 = ir.VectorType(_I8, 32)
        q = builder.load(_ptr(context, builder, sig.args[0], args[0], args[1], v32), align=1)
        both = builder.shuffle_vector(q, q, _vconst(ir.VectorType(_I32, 64), [i % 32 for i in range(64)]))
        lo = builder.and_(both, ir.Constant(_B64, [15] * 64))
        hi = builder.lshr(both, ir.Constant(_B64, [4] * 64))
        return context.make_tuple(builder, sig.return_type, [lo, hi])

    return types.UniTuple(I8x64, 2)(arr, offset), codegen


def _scales16(builder, k_lo, k_hi):
    """32 int16: ``k_lo`` for the words of bytes 0..15 of each 32-byte half, ``k_hi`` for bytes 16..31."""
    both = builder.insert_element(builder.insert_element(ir.Constant(ir.VectorType(_I16, 2), ir.Undefined), k_lo,
                                                         ir.Constant(_I32, 0)), k_hi, ir.Constant(_I32, 1))
    return builder.shuffle_vector(both, both, _vconst(ir.VectorType(_I32, 32), [(i % 16) // 8 for i in range(32)]))


def _scaled_pairs(context, builder, acc, u, s, k32):
    """``acc + madd(maddubs(u, s), k32)`` on 64 bytes: lane i += k * (sum of ``u * s`` over bytes 4i..4i+3), ``k``
    the int16 of ``k32`` (32 of them) at words 2i, 2i+1."""
    feats = target_features(context)
    if {"+avx512f", "+avx512bw"} <= feats:
        p16 = _call(builder, "llvm.x86.avx512.pmaddubs.w.512", ir.VectorType(_I16, 32), [u, s])
        if "+avx512vnni" in feats:
            return _call(builder, "llvm.x86.avx512.vpdpwssd.512", _VI16,
                         [acc, builder.bitcast(p16, _VI16), builder.bitcast(k32, _VI16)])
        return builder.add(acc, _call(builder, "llvm.x86.avx512.pmaddw.d.512", _VI16, [p16, k32]))
    dots = _dot4_acc(context, builder, ir.Constant(_VI16, [0] * 16), u, s)  # portable IR (no AVX-512 BW)
    k_lanes = builder.shuffle_vector(k32, k32, _vconst(_VI16, range(0, 32, 2)))  # a lane's two words hold one k
    return builder.add(acc, builder.mul(dots, builder.sext(k_lanes, _VI16)))


@intrinsic
def scaled_dots(typingctx, acc, u, y, yoffset, k):
    """``acc`` plus, per int32 lane ``i``, ``k * sum(u[4i + b] * y[yoffset + 4i + b])`` (``u`` unsigned quants, the
    64 activation bytes at ``yoffset`` signed, ``k`` an int16 sub-block scale): ggml's ``vpmaddubsw`` +
    ``vpmaddwd`` with the scale, summed into the sub-block sums (``vpdpwssd`` on AVX-512 VNNI)."""
    if acc != I32x16 or u != I8x64 or not isinstance(k, types.Integer):
        raise TypingError(f"scaled_dots expects I32x16, I8x64, an array, an offset and an int, got {acc}, {u}, {k}")
    _rows((y,), "scaled_dots")

    def codegen(context, builder, sig, args):
        s = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], _B64), align=1)
        k16 = context.cast(builder, args[4], sig.args[4], types.int16)
        return _scaled_pairs(context, builder, args[0], args[1], s, _scales16(builder, k16, k16))

    return I32x16(acc, u, y, yoffset, k), codegen


@intrinsic
def scaled_dots2(typingctx, acc, u, y, yoffset, k_lo, k_hi):
    """:func:`scaled_dots` with the scale ``k_lo`` on bytes 0..15 of each token's 32 and ``k_hi`` on 16..31 (Q6_K's
    16-quant sub-blocks)."""
    if acc != I32x16 or u != I8x64 or not isinstance(k_lo, types.Integer) or not isinstance(k_hi, types.Integer):
        raise TypingError(f"scaled_dots2 expects I32x16, I8x64, an array, an offset and two ints, got {acc}, {u}")
    _rows((y,), "scaled_dots2")

    def codegen(context, builder, sig, args):
        s = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], _B64), align=1)
        lo = context.cast(builder, args[4], sig.args[4], types.int16)
        hi = context.cast(builder, args[5], sig.args[5], types.int16)
        return _scaled_pairs(context, builder, args[0], args[1], s, _scales16(builder, lo, hi))

    return I32x16(acc, u, y, yoffset, k_lo, k_hi), codegen


def _both(context, builder, arrty, arr, offset):
    """The 32 bytes at ``offset`` in both halves of a 64-byte vector."""
    v32 = ir.VectorType(_I8, 32)
    q = builder.load(_ptr(context, builder, arrty, arr, offset, v32), align=1)
    return builder.shuffle_vector(q, q, _vconst(ir.VectorType(_I32, 64), [i % 32 for i in range(64)]))


@intrinsic
def q6_quants_both(typingctx, row, offset, j):
    """Half ``j`` of the Q6_K super-block at ``offset``: its four 32-quant vectors (:func:`.inttiles.q6_k_quants`'
    6-bit values), each in both 32-byte halves of an I8x64."""
    _rows((row,), "q6_quants_both")

    def codegen(context, builder, sig, args):
        o = context.cast(builder, args[1], sig.args[1], types.int64)
        jj = context.cast(builder, args[2], sig.args[2], types.int64)
        i64 = ir.IntType(64)
        base = builder.add(o, builder.mul(jj, ir.Constant(i64, 64)))
        ql0 = _both(context, builder, sig.args[0], args[0], base)
        ql1 = _both(context, builder, sig.args[0], args[0], builder.add(base, ir.Constant(i64, 32)))
        qh = _both(context, builder, sig.args[0], args[0],
                   builder.add(o, builder.add(ir.Constant(i64, 128), builder.mul(jj, ir.Constant(i64, 32)))))
        k = lambda v: ir.Constant(_B64, [v] * 64)
        q0 = builder.or_(builder.and_(ql0, k(15)), builder.shl(builder.and_(qh, k(3)), k(4)))
        q1 = builder.or_(builder.and_(ql1, k(15)), builder.shl(builder.and_(builder.lshr(qh, k(2)), k(3)), k(4)))
        q2 = builder.or_(builder.lshr(ql0, k(4)), builder.shl(builder.and_(builder.lshr(qh, k(4)), k(3)), k(4)))
        q3 = builder.or_(builder.lshr(ql1, k(4)), builder.shl(builder.lshr(qh, k(6)), k(4)))
        return context.make_tuple(builder, sig.return_type, [q0, q1, q2, q3])

    return types.UniTuple(I8x64, 4)(row, offset, j), codegen


@intrinsic
def minus_bsums32(typingctx, sumi, ya0, ya1, index, row, offset):
    """``sumi - 32 * madd16`` per token half: lanes 0..7 less 32 times :func:`.int8.madd16` of token ``t``'s 16 int16
    block sums ``ya0[index:]`` with the 16 int8 scales at ``offset`` of ``row``, lanes 8..15 the same for ``ya1``
    (token ``t + 1``): Q6_K's ``-32`` offset, as :func:`.intdot.q6_k_sumi` takes it off."""
    if sumi != I32x16:
        raise TypingError(f"minus_bsums32 expects an I32x16, got {sumi}")
    for a in (ya0, ya1):
        if not isinstance(a, types.Array) or a.ndim != 1 or a.dtype != types.int16:
            raise TypingError(f"minus_bsums32 expects 1-D int16 block sums, got {a}")
    _rows((row,), "minus_bsums32")

    def codegen(context, builder, sig, args):
        v16 = ir.VectorType(_I16, 16)
        b0 = builder.load(_ptr(context, builder, sig.args[1], args[1], args[3], v16), align=2)
        b1 = builder.load(_ptr(context, builder, sig.args[2], args[2], args[3], v16), align=2)
        b = builder.shuffle_vector(b0, b1, _vconst(ir.VectorType(_I32, 32), range(32)))
        sc = builder.sext(builder.load(_ptr(context, builder, sig.args[4], args[4], args[5], _B16), align=1), v16)
        scales = builder.shuffle_vector(sc, sc, _vconst(ir.VectorType(_I32, 32), [i % 16 for i in range(32)]))
        if {"+avx512f", "+avx512bw"} <= target_features(context):
            m = _call(builder, "llvm.x86.avx512.pmaddw.d.512", _VI16, [b, scales])
        else:
            wide = ir.VectorType(_I32, 32)
            p = builder.mul(builder.sext(b, wide), builder.sext(scales, wide))
            m = builder.add(builder.shuffle_vector(p, p, _vconst(_VI16, range(0, 32, 2))),
                            builder.shuffle_vector(p, p, _vconst(_VI16, range(1, 32, 2))))
        return builder.sub(args[0], builder.shl(m, ir.Constant(_VI16, [5] * 16)))

    return I32x16(sumi, ya0, ya1, index, row, offset), codegen


@intrinsic
def izero16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_VI16, [0] * 16)

    return I32x16(), codegen


@intrinsic
def fma_tokens(typingctx, d0, d1, v, acc):
    """``acc + d * float(v)`` per lane with ``d`` = ``d0`` in lanes 0..7 (token ``t``), ``d1`` in 8..15 (``t + 1``):
    each token's super-block step (``vcvtdq2ps`` + FMA, one rounding)."""
    if d0 != types.float32 or d1 != types.float32 or v != I32x16 or acc != F32x16:
        raise TypingError(f"fma_tokens expects float32, float32, I32x16, F32x16, got {d0}, {d1}, {v}, {acc}")

    def codegen(context, builder, sig, args):
        d = ir.Constant(_VF16, ir.Undefined)
        for i in range(16):
            d = builder.insert_element(d, args[0] if i < 8 else args[1], ir.Constant(_I32, i))
        return _call(builder, "llvm.fma.v16f32", _VF16, [d, builder.sitofp(args[2], _VF16), args[3]])

    return F32x16(d0, d1, v, acc), codegen


@intrinsic
def fsum_token(typingctx, acc, half):
    """The float sum of lanes ``8 half .. 8 half + 7`` of ``acc`` in ``hsum_float_8``'s order (:func:`.int8.fsum`)."""
    if acc != F32x16 or not isinstance(half, types.IntegerLiteral):
        raise TypingError(f"fsum_token expects an F32x16 and an integer literal, got {acc}, {half}")

    def codegen(context, builder, sig, args):
        base = 8 * int(sig.args[1].literal_value)
        x, n = builder.shuffle_vector(args[0], args[0], _vconst(ir.VectorType(_I32, 8), range(base, base + 8))), 8
        while n > 1:
            half_n = n // 2
            ity = ir.VectorType(_I32, half_n)
            lo = builder.shuffle_vector(x, x, _vconst(ity, range(half_n)))
            hi = builder.shuffle_vector(x, x, _vconst(ity, range(half_n, n)))
            x, n = builder.fadd(lo, hi), half_n
        return builder.extract_element(x, ir.Constant(_I32, 0))

    return types.float32(acc, half), codegen
