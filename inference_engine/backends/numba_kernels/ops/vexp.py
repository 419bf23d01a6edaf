"""``ggml_v_expf`` on 16 lanes at once: the vector form of :func:`~.ops.expf_ggml`, bit for bit, for SiLU and softmax.

ggml's SwiGLU and softmax exponentiate with ``ggml_v_expf`` (vec.h), ARM's optimized-routines polynomial, whose last
step differs by SIMD flavour (:mod:`inference_engine.backends.numerics` explains the two). The scalar emulation in
:mod:`.ops` follows it one value at a time with branches and ``ldexp``: ~9 ns a value. These intrinsics compute the
same operations on an ``F32x16`` (:mod:`.simd`) as the C code does on its vectors, each lane exactly as the scalar
form (tests/ compare them over the whole float range and the special cases), so a row costs a few instructions per
value. Like the rest of :mod:`.simd` they are generic LLVM IR (``llvm.fma``, integer shifts on the bits, selects),
lowered to AVX-512, AVX2 or NEON instructions by LLVM; the flavour they follow is the reference's, not this CPU's.

- :func:`vexp_ggml_kj`: the AVX2 / NEON form: ``j = b + ...`` (without the 1), ``k = 2**n`` built in the exponent
  bits, ``fma(k, j, k)``; the two-factor ``(s2 + s2*j) * s1`` where ``|n| > 126``, ``s1 * s1`` beyond 192.
- :func:`vexp_ggml_scalef`: the AVX-512 form: ``j = 1 + b + ...`` then ``scalef(j, n)``: ``j * 2**n`` with one
  rounding, computed as ``(j * 2**n1) * 2**n2`` with ``n1 = n >> 1``, ``n2 = n - n1`` (the first product is exact,
  both factors normal for ``|n| <= 192``); 0 or inf beyond 192, as ggml's explicit check.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core.errors import TypingError
from numba.extending import intrinsic

from inference_engine.backends.numba_kernels.isa.simd import LANES, F32x16, _call_intrinsic

_F32, _I32 = ir.FloatType(), ir.IntType(32)
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)


def _f(value: float) -> ir.Constant:
    return ir.Constant(_VF, [value] * LANES)


def _i(value: int) -> ir.Constant:
    return ir.Constant(_VI, [value] * LANES)


def _hex(literal: str) -> ir.Constant:
    return _f(float.fromhex(literal))


# ggml_v_expf's constants, as vec.h writes them (float32-exact)
_SHIFT = _hex("0x1.8p23")
_LOG2E = _hex("0x1.715476p+0")
_LN2_HI, _LN2_LO = _hex("0x1.62e4p-1"), _hex("0x1.7f7d1cp-20")
_C5, _C4 = _hex("0x1.0e4020p-7"), _hex("0x1.573e2ep-5")
_C3, _C2 = _hex("0x1.555e66p-3"), _hex("0x1.fffdb6p-2")
_C1 = _hex("0x1.ffffecp-1")


def _fma(builder, a, b, c):
    return _call_intrinsic(builder, f"llvm.fma.v{LANES}f32", _VF, [a, b, c])


def _fabs(builder, a):
    return _call_intrinsic(builder, f"llvm.fabs.v{LANES}f32", _VF, [a])


def _reduce(builder, x):
    """``z = x/ln2 + shift``, ``n = z - shift`` (x/ln2 rounded to an integer), ``b = x - n*ln2``, ``u = b*b``."""
    z = _fma(builder, x, _LOG2E, _SHIFT)
    n = builder.fsub(z, _SHIFT)
    neg_n = builder.fneg(n)
    b = _fma(builder, neg_n, _LN2_LO, _fma(builder, neg_n, _LN2_HI, x))
    return z, n, b, builder.fmul(b, b)


def _poly_head(builder, b, u):
    """``(c5 b + c4) u + (c3 b + c2)``: the part both flavours share."""
    return _fma(builder, _fma(builder, _C5, b, _C4), u, _fma(builder, _C3, b, _C2))


def _exp_kj(builder, x):
    z, n, b, u = _reduce(builder, x)
    j = _fma(builder, _poly_head(builder, b, u), u, builder.fmul(_C1, b))
    e = builder.shl(builder.bitcast(z, _VI), _i(23))
    k = builder.bitcast(builder.add(e, _i(0x3F800000)), _VF)
    plain = _fma(builder, k, j, k)
    abs_n = _fabs(builder, n)
    big = builder.fcmp_ordered(">", abs_n, _f(126.0))
    # as the C code: only when some lane needs it (rare: |x| > 87), the two factors s1 (2**127 or 2**-125) and
    # s2 = 2**n / s1 where 2**n alone is not a normal float
    any_big = builder.icmp_unsigned("!=", builder.bitcast(big, ir.IntType(LANES)), ir.Constant(ir.IntType(LANES), 0))
    entry = builder.basic_block
    with builder.if_then(any_big, likely=False):
        g = builder.select(builder.fcmp_ordered("<=", n, _f(0.0)), _i(0x82000000 - (1 << 32)), _i(0))
        s1 = builder.bitcast(builder.add(g, _i(0x7F000000)), _VF)
        s2 = builder.bitcast(builder.sub(e, g), _VF)
        scaled = builder.fmul(_fma(builder, s2, j, s2), s1)
        far = builder.select(builder.fcmp_ordered(">", abs_n, _f(192.0)), builder.fmul(s1, s1), scaled)
        fixed = builder.select(big, far, plain)
        fixed_block = builder.basic_block
    result = builder.phi(_VF)
    result.add_incoming(plain, entry)
    result.add_incoming(fixed, fixed_block)
    return result


def _exp_scalef(builder, x):
    _, n, b, u = _reduce(builder, x)
    j = _fma(builder, _poly_head(builder, b, u), u, _fma(builder, _C1, b, _f(1.0)))
    abs_n = _fabs(builder, n)
    in_range = builder.fcmp_ordered("<=", abs_n, _f(192.0))  # false for NaN: its j is NaN, any scale keeps it
    ni = builder.fptosi(builder.select(in_range, n, _f(0.0)), _VI)
    n1 = builder.ashr(ni, _i(1))
    n2 = builder.sub(ni, n1)
    pow2 = lambda m: builder.bitcast(builder.shl(builder.add(m, _i(127)), _i(23)), _VF)
    res = builder.fmul(builder.fmul(j, pow2(n1)), pow2(n2))
    beyond = builder.select(builder.fcmp_ordered("<=", n, _f(0.0)), _f(0.0), _f(float("inf")))
    return builder.select(builder.fcmp_ordered(">", abs_n, _f(192.0)), beyond, res)


def _unary(name, body):
    def typer(typingctx, v):
        if v != F32x16:
            raise TypingError(f"{name} expects an F32x16, got {v}")

        def codegen(context, builder, sig, args):
            return body(builder, args[0])

        return F32x16(F32x16), codegen

    return intrinsic(typer)


vexp_ggml_kj = _unary("vexp_ggml_kj", _exp_kj)
vexp_ggml_scalef = _unary("vexp_ggml_scalef", _exp_scalef)
