"""The element-wise ops of the forward pass (RMSNorm, RoPE, exp / SiLU / GELU, SwiGLU, GEGLU, soft-capping) as
Numba kernels, with the NumPy reference's numerics.

Element-wise ops come in two compiled forms, serial (a decoded token: no thread launch) and ``*_parallel``
(rows split over threads, for prefill); the backend picks by row count. Why these kernels at all: once the
matmuls run near memory speed, a decoded token of a small model is dominated by the per-call cost
of the NumPy ops (30-150 us each for a few hundred values; 30 layers x ~8 ops). These kernels cost a few
microseconds a call. Each follows the same operations in the same order as
:class:`~inference_engine.backends.numpy_ref.NumpyBackend` and :mod:`~inference_engine.backends.numerics`
(float32 products, double sums where ggml sums in double, no ``fastmath``), so the two backends agree bit for bit
except where noted:

- ``rms_norm``: the sum of squares is accumulated in double in order (ggml's loop); NumPy sums pairwise, which can
  differ in the last bits of the double and, rarely, by one float32 ulp of the scale.
- ``attention``: q.k and p.v are float32 sums in another order than BLAS (float rounding).
- ``rope`` (and ggml-numerics SiLU) use a true single-rounding FMA where libggml's compiled code has one; the NumPy
  reference emulates it in double, which differs only when the double result falls exactly halfway between two
  floats (about one case in 2**29).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    f16_bits,
    fma32,
    vadd,
    vdiv,
    vload,
    vmul,
    vsplat,
    vstore,
    vsub,
    vzero,
)
from inference_engine.backends.numba_kernels.ops.vexp import vexp_ggml_kj, vexp_ggml_scalef

_F32 = np.float32


# --- RMSNorm -----------------------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def _rms_norm_row(x, weight, eps, out, t):
    n = x.shape[1]
    total = 0.0  # double, as ggml_float
    for i in range(n):
        sq = x[t, i] * x[t, i]  # float32 product
        total += np.float64(sq)
    mean = _F32(total / n)
    scale = _F32(1.0) / np.sqrt(mean + eps)
    if weight.shape[0]:
        for i in range(n):
            out[t, i] = (x[t, i] * scale) * weight[i]
    else:
        for i in range(n):
            out[t, i] = x[t, i] * scale


@njit(cache=True)
def rms_norm(x, weight, eps, out):
    """``out = x * (1/sqrtf(mean(x*x) + eps)) [* weight]`` per row; x (T, n) float32, weight (n,) or (0,)."""
    for t in range(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, t)


@njit(parallel=True, cache=True)
def rms_norm_parallel(x, weight, eps, out):
    """:func:`rms_norm` with the rows split over threads (prefill)."""
    for t in prange(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, t)


# --- RoPE --------------------------------------------------------------------------------------------------------
@njit(cache=True)
def rope(x, cos, sin, n_dims, neox, out):
    """Rotate the first ``n_dims`` of each head of ``x (T, H, D)``; cos/sin ``(T, n_dims/2)``; the rest copied."""
    half = n_dims // 2
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(n_dims, x.shape[2]):
                out[t, h, i] = x[t, h, i]
            for i in range(half):
                c, s = cos[t, i], sin[t, i]
                # rotate_pairs: x0*cos - x1*sin and x0*sin + x1*cos, each contracted to one FMA by the compiler
                if neox:  # pairs (i, i + n_dims/2)
                    a, b = i, i + half
                else:  # adjacent pairs (2i, 2i+1)
                    a, b = 2 * i, 2 * i + 1
                x0, x1 = x[t, h, a], x[t, h, b]
                out[t, h, a] = fma32(x0, c, -(x1 * s))
                out[t, h, b] = fma32(x0, s, x1 * c)


# --- exp / SiLU / GELU -------------------------------------------------------------------------------------------
def _hexf(literal: str) -> np.float32:
    return _F32(float.fromhex(literal))


# ggml_v_expf's constants, as vec.h writes them
_EXP_SHIFT = _hexf("0x1.8p23")
_EXP_LOG2E = _hexf("0x1.715476p+0")
_EXP_LN2_HI = _hexf("0x1.62e4p-1")
_EXP_LN2_LO = _hexf("0x1.7f7d1cp-20")
_EXP_C5, _EXP_C4 = _hexf("0x1.0e4020p-7"), _hexf("0x1.573e2ep-5")
_EXP_C3, _EXP_C2 = _hexf("0x1.555e66p-3"), _hexf("0x1.fffdb6p-2")
_EXP_C1 = _hexf("0x1.ffffecp-1")


@njit(inline="always", cache=True)
def _exp_reduce(x):
    """The first half every flavour shares: ``z`` (x/ln2 + shift), ``n = round(x/ln2)``, ``b = x - n*ln2``."""
    z = fma32(x, _EXP_LOG2E, _EXP_SHIFT)
    n = z - _EXP_SHIFT
    b = fma32(-n, _EXP_LN2_LO, fma32(-n, _EXP_LN2_HI, x))
    return z, n, b


@njit(inline="always", cache=True)
def _pow2_f32(e):
    """``2**e`` as a float32, exactly (``e`` an integer in the float32 normal range)."""
    return _F32(math.ldexp(1.0, e))


@njit(inline="always", cache=True)
def expf_ggml(x, scalef):
    """``ggml_v_expf`` (vec.h) on one float32: ARM's optimized-routines polynomial, in one of two flavours.

    ``scalef`` (the AVX-512 branch): ``j = 1 + b + ...`` then ``_mm512_scalef_ps(j, n)``. Otherwise (the AVX2 and
    NEON branches): ``j = b + ...`` without the 1, ``k = 2**n`` built in the exponent bits and ``fma(k, j, k)``;
    where ``2**n`` alone would overflow or be denormal (|n| > 126) two factors, ``(s2 + s2*j) * s1``. The powers of
    two are built with ``ldexp`` (exact), which equals the bit arithmetic of the C code.
    """
    _z, n, b = _exp_reduce(x)
    u = b * b
    if scalef:
        j = fma32(fma32(fma32(_EXP_C5, b, _EXP_C4), u, fma32(_EXP_C3, b, _EXP_C2)), u, fma32(_EXP_C1, b, _F32(1.0)))
        if abs(n) > _F32(192.0):
            return _F32(0.0) if n <= _F32(0.0) else _F32(np.inf)
        return _F32(math.ldexp(np.float64(j), int(n)))  # scalef: exact in double, one rounding
    j = fma32(fma32(fma32(_EXP_C5, b, _EXP_C4), u, fma32(_EXP_C3, b, _EXP_C2)), u, _EXP_C1 * b)
    if not abs(n) > _F32(126.0):  # also NaN: the C code's fma(j, k, k) with a NaN j
        if n != n:  # noqa: PLR0124 (NaN)
            return n
        k = _pow2_f32(int(n))
        return fma32(k, j, k)
    if abs(n) > _F32(192.0):  # s1 * s1: 2**-250 -> 0, 2**254 -> inf
        return _F32(0.0) if n <= _F32(0.0) else _F32(np.inf)
    ni = int(n)
    if n <= _F32(0.0):
        s1, s2 = _pow2_f32(-125), _pow2_f32(ni + 125)
    else:
        s1, s2 = _pow2_f32(127), _pow2_f32(ni - 127)
    return fma32(s2, j, s2) * s1


@njit(inline="always", cache=True)
def silu_f32(x):
    """``x / (1 + expf(-x))`` with a correctly rounded expf (f32 numerics, ggml's scalar tail)."""
    return x / (_F32(1.0) + _F32(math.exp(-np.float64(x))))


@njit(inline="always", cache=True)
def silu_libm(x):
    """``ggml_silu_f32`` as llama.cpp's scalar tail runs it: ``x / (1 + expf(-x))`` with the C library's ``expf``
    (``math.exp`` of a float32 compiles to that call; glibc's is not always correctly rounded, so :func:`silu_f32`'s
    float64 route would leave llama.cpp by a bit on ~0.07% of values: numerics.expf_libm)."""
    return x / (_F32(1.0) + _F32(math.exp(_F32(0.0) - x)))


@njit(inline="always", cache=True)
def _silu_times_vectors(g, u, o, n_vec, scalef):
    """``o[:m] = g / (1 + ggml_v_expf(-g)) * u`` on 16 lanes at a time (:mod:`.vexp`, the same bits as the scalar
    form); returns ``m``, the largest multiple of 16 up to ``n_vec``."""
    one, zero = vsplat(1.0), vzero()
    i = 0
    if scalef:
        while i + 16 <= n_vec:
            x = vload(g, i)
            vstore(o, i, vmul(vdiv(x, vadd(one, vexp_ggml_scalef(vsub(zero, x)))), vload(u, i)))
            i += 16
    else:
        while i + 16 <= n_vec:
            x = vload(g, i)
            vstore(o, i, vmul(vdiv(x, vadd(one, vexp_ggml_kj(vsub(zero, x)))), vload(u, i)))
            i += 16
    return i


@njit(inline="always", cache=True)
def _swiglu_row(gate, up, vec_width, scalef, out, t):
    n = gate.shape[1]
    n_vec = n - n % vec_width if vec_width else 0
    done = _silu_times_vectors(gate[t], up[t], out[t], n_vec, scalef) if n_vec else 0
    for i in range(done, n_vec):  # ggml's vectors narrower than 16 lanes: the same exp one value at a time
        x = gate[t, i]
        out[t, i] = (x / (_F32(1.0) + expf_ggml(_F32(0.0) - x, scalef))) * up[t, i]
    for i in range(n_vec, n):  # ggml: the scalar tail (the C library's expf); f32 numerics: every value
        out[t, i] = (silu_libm(gate[t, i]) if vec_width else silu_f32(gate[t, i])) * up[t, i]


@njit(cache=True)
def swiglu(gate, up, vec_width, scalef, out):
    """``silu(gate) * up`` over rows (T, n). ggml numerics (``vec_width`` > 0, the SIMD flavour's floats per vector):
    ``ggml_v_silu`` on the first ``n - n % vec_width``, scalar on the rest; ``vec_width`` 0: f32 numerics."""
    for t in range(gate.shape[0]):
        _swiglu_row(gate, up, vec_width, scalef, out, t)


@njit(parallel=True, cache=True)
def swiglu_parallel(gate, up, vec_width, scalef, out):
    for t in prange(gate.shape[0]):
        _swiglu_row(gate, up, vec_width, scalef, out, t)


_GELU_COEF_A = _F32(0.044715)
_SQRT_2_OVER_PI = _F32(0.79788456080286535587989211986876)
_GELU_LIMIT = _F32(10.0)


@njit(inline="always", cache=True)
def gelu_tanh(x):
    """numerics.gelu_tanh: ``0.5 x (1 + tanh(sqrt(2/pi) x fma(0.044715 x, x, 1)))``, the FMA and tanh in double."""
    inner_fma = _F32(np.float64(_GELU_COEF_A * x) * np.float64(x) + 1.0)
    inner = (_SQRT_2_OVER_PI * x) * inner_fma
    th = _F32(math.tanh(np.float64(inner)))
    return _F32(0.5) * x * (_F32(1.0) + th)


@njit(inline="always", cache=True)
def _geglu_row(gate, up, ggml, table, out, t):
    for i in range(gate.shape[1]):
        x = gate[t, i]
        if ggml:
            if x <= -_GELU_LIMIT:
                g = _F32(0.0)
            elif x >= _GELU_LIMIT:
                g = x
            else:
                g = table[f16_bits(x)]
        else:
            g = gelu_tanh(x)
        out[t, i] = g * up[t, i]


@njit(cache=True)
def geglu(gate, up, ggml, table, out):
    """``gelu(gate) * up`` over rows. ggml: ``ggml_vec_geglu_f32`` (0 below -10, x above 10, else the F16 table)."""
    for t in range(gate.shape[0]):
        _geglu_row(gate, up, ggml, table, out, t)


@njit(parallel=True, cache=True)
def geglu_parallel(gate, up, ggml, table, out):
    for t in prange(gate.shape[0]):
        _geglu_row(gate, up, ggml, table, out, t)


# --- soft-capping (Gemma 2) ----------------------------------------------------------------------------------------
@njit(inline="always", cache=True)
def _softcap_row(x, inv, cap, out, t):
    for i in range(x.shape[1]):
        out[t, i] = math.tanh(x[t, i] * inv) * cap  # tanh of a float32 compiles to the C library's tanhf, as ggml's


@njit(cache=True)
def softcap(x, inv, cap, out):
    """``cap * tanhf(x * inv)`` over rows, float32 (``inv = 1/cap`` rounded once, as ``ggml_scale``'s factor):
    numerics.softcap_f32 bit for bit, at a C call a value instead of a Python one."""
    for t in range(x.shape[0]):
        _softcap_row(x, inv, cap, out, t)


@njit(parallel=True, cache=True)
def softcap_parallel(x, inv, cap, out):
    for t in prange(x.shape[0]):
        _softcap_row(x, inv, cap, out, t)
