"""The activation side of a matmul: what every ``matvec_*`` kernel multiplies the weights with.

Every kernel takes two float32 arrays per token: ``xv`` (``K`` values, multiplied element-wise with the weight
quants) and ``xs`` (one sum per weight sub-block, 32 or 16 values, multiplied with the sub-block's constant term:
Q4_1's ``m``, Q4_0's ``-8 d``, the K-quants' mins...). The two numerics differ only here:

- ``f32``: ``xv = x`` and ``xs`` the plain sub-block sums, so the kernel computes ``dequantize(W) @ x``.
- ``ggml``: what llama.cpp's CPU backend multiplies (``from_float`` of the weight's ``vec_dot_type``, quantizers in
  ggml/src/ggml-cpu/arch/x86/quants.c and ggml-quants.c), bit-exact with libggml (tests/ against the oracle):

  ========  ===============================================  ==============================================
  weight    activation as ggml quantizes it                  ``xv`` / ``xs``
  ========  ===============================================  ==============================================
  Q4_0 Q5_0 Q8_0: ``d = amax/127`` (f16), ``q = rint(x*127/amax)``   ``q*d`` / ``d*sum(q)``
  Q8_0
  Q4_1 Q5_1 Q8_1: as Q8_0 plus ``s = f16(d_f32 * sum(q))``           ``q*d`` / ``s`` (ggml uses this f16 sum)
  K-quants  Q8_K: ``iscale = -127/max``, ``q = min(127, rint)``,      ``q*d`` / ``d*bsums`` (16 or 32 wide)
            ``d = 1/iscale`` (f32), int16 ``bsums`` per 16
  F16/BF16  the value rounded to f16 / bf16                           rounded ``x`` / unused
  ========  ===============================================  ==============================================

  ggml then takes an integer dot product per block and scales it by ``d_w * d_a``; the kernels compute the same sum
  as ``d_w * sum(q_w * (d_a q_a))`` in float32, which equals it to float rounding (each product ``d_a q_a`` is exact
  for the f16 ``d_a`` of Q8_0 / Q8_1).

Quantizers run once per call (``T`` rows; from ``PARALLEL_TOKENS`` rows on, the rows split over threads) in plain
Numba loops, without ``fastmath`` (no reciprocal tricks: the divisions and roundings must be the C code's).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import round_f16

_F32 = np.float32
QK8 = 32  # Q8_0 / Q8_1 block
QK_K = 256  # Q8_K super-block


# --- ggml's quantizers, bit-exact ------------------------------------------------------------------------------
@njit(cache=True)
def quantize_q8_0(x, qs, d):
    """x (T, K) -> qs int8 (T, K), d float32 (T, K/32) holding f16 values: AVX2 ``quantize_row_q8_0``."""
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // QK8):
            amax = _F32(0.0)
            for j in range(QK8):
                a = abs(x[t, QK8 * b + j])
                amax = max(amax, a)
            d[t, b] = round_f16(amax / _F32(127.0))
            inv = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            for j in range(QK8):
                qs[t, QK8 * b + j] = np.int8(np.rint(x[t, QK8 * b + j] * inv))


@njit(cache=True)
def quantize_q8_1(x, qs, d, s):
    """As :func:`quantize_q8_0`, plus ``s = f16(d * sum(q))`` with the float32 ``d`` (AVX2 ``quantize_row_q8_1``)."""
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // QK8):
            amax = _F32(0.0)
            for j in range(QK8):
                a = abs(x[t, QK8 * b + j])
                amax = max(amax, a)
            dd = amax / _F32(127.0)
            d[t, b] = round_f16(dd)
            inv = _F32(127.0) / amax if amax != _F32(0.0) else _F32(0.0)
            total = 0
            for j in range(QK8):
                q = np.int8(np.rint(x[t, QK8 * b + j] * inv))
                qs[t, QK8 * b + j] = q
                total += q
            s[t, b] = round_f16(dd * _F32(total))


@njit(cache=True)
def quantize_q8_K(x, qs, d, bsums):
    """x (T, K) -> qs int8 (T, K), d float32 (T, K/256), bsums int16 (T, K/16): ``quantize_row_q8_K_ref``."""
    for t in range(x.shape[0]):
        for b in range(x.shape[1] // QK_K):
            base = QK_K * b
            amax, vmax = _F32(0.0), _F32(0.0)
            for j in range(QK_K):
                a = abs(x[t, base + j])
                if a > amax:  # the first element of largest magnitude, with its sign
                    amax, vmax = a, x[t, base + j]
            if amax == _F32(0.0):
                d[t, b] = _F32(0.0)
                for j in range(QK_K):
                    qs[t, base + j] = 0
                for j in range(QK_K // 16):
                    bsums[t, QK_K // 16 * b + j] = 0
                continue
            iscale = _F32(-127.0) / vmax
            for j in range(QK_K):
                # nearest_int(): + 1.5 * 2**23 rounds half to even, i.e. rint for these magnitudes
                qs[t, base + j] = np.int8(min(127, int(np.rint(iscale * x[t, base + j]))))
            for j in range(QK_K // 16):
                total = 0
                for i in range(16):
                    total += qs[t, base + 16 * j + i]
                bsums[t, QK_K // 16 * b + j] = total
            d[t, b] = _F32(1.0) / iscale


# --- xv / xs for the kernels -----------------------------------------------------------------------------------
@njit(cache=True)
def block_sums(x, sub, xs):
    """``xs[t, k] = sum(x[t, sub*k : sub*(k+1)])`` (float32, in order)."""
    for t in range(x.shape[0]):
        for k in range(xs.shape[1]):
            total = _F32(0.0)
            for i in range(sub):
                total += x[t, sub * k + i]
            xs[t, k] = total


@njit(cache=True)
def ggml_q8_0(x):
    qs = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // QK8), np.float32)
    quantize_q8_0(x, qs, d)
    xv = np.empty(x.shape, np.float32)
    xs = np.empty_like(d)
    for t in range(x.shape[0]):
        for b in range(d.shape[1]):
            total = 0
            for j in range(QK8):
                q = qs[t, QK8 * b + j]
                xv[t, QK8 * b + j] = _F32(q) * d[t, b]
                total += q
            xs[t, b] = d[t, b] * _F32(total)
    return xv, xs


@njit(cache=True)
def ggml_q8_1(x):
    qs = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // QK8), np.float32)
    s = np.empty_like(d)
    quantize_q8_1(x, qs, d, s)
    xv = np.empty(x.shape, np.float32)
    for t in range(x.shape[0]):
        for b in range(d.shape[1]):
            for j in range(QK8):
                xv[t, QK8 * b + j] = _F32(qs[t, QK8 * b + j]) * d[t, b]
    return xv, s


@njit(cache=True)
def ggml_q8_K(x, sub):
    """Q8_K activation; ``xs`` per ``sub`` = 16 or 32 elements (bsums added in pairs for 32, as ggml does), none for
    ``sub`` 0 (a type without constant terms: IQ4_XS)."""
    qs = np.empty(x.shape, np.int8)
    d = np.empty((x.shape[0], x.shape[1] // QK_K), np.float32)
    bsums = np.empty((x.shape[0], x.shape[1] // 16), np.int16)
    quantize_q8_K(x, qs, d, bsums)
    xv = np.empty(x.shape, np.float32)
    per = sub // 16
    xs = np.empty((x.shape[0], x.shape[1] // sub if sub else 0), np.float32)
    for t in range(x.shape[0]):
        for b in range(d.shape[1]):
            for j in range(QK_K):
                xv[t, QK_K * b + j] = _F32(qs[t, QK_K * b + j]) * d[t, b]
        for k in range(xs.shape[1]):
            total = 0
            for i in range(per):
                total += bsums[t, per * k + i]
            xs[t, k] = d[t, (sub * k) // QK_K] * _F32(total)
    return xv, xs


def round_bf16(x: np.ndarray) -> np.ndarray:
    """ggml_compute_fp32_to_bf16 then back to float32: round half to even on the bits, NaN kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    bits = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), rounded).astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32)


_EMPTY_SUMS: dict[int, np.ndarray] = {}


def prepare(x: np.ndarray, numerics: str, vec_dot_type: str, sub: int) -> tuple[np.ndarray, np.ndarray]:
    """``(xv, xs)`` for activations ``x (T, K)`` float32 C-contiguous.

    ``vec_dot_type``: ``"q8_0" | "q8_1" | "q8_K" | "f16" | "bf16" | "f32"`` (the weight's, used only for ``ggml``);
    ``sub``: the weight's sub-block length for ``xs`` (32, 16, or 0 when the type has no constant terms).
    """
    if numerics == "f32" or vec_dot_type == "f32":
        if sub == 0:
            return x, _no_sums(x.shape[0])
        xs = np.empty((x.shape[0], x.shape[1] // sub), np.float32)
        block_sums(x, sub, xs)
        return x, xs
    if vec_dot_type == "q8_0":
        xv, xs = ggml_q8_0(x)
    elif vec_dot_type == "q8_1":
        xv, xs = ggml_q8_1(x)
    elif vec_dot_type == "q8_K":
        xv, xs = ggml_q8_K(x, sub)
    elif vec_dot_type == "f16":
        with np.errstate(over="ignore"):  # beyond 65504 becomes inf, as _mm512_cvtps_ph does
            xv, xs = x.astype(np.float16).astype(np.float32), _no_sums(x.shape[0])
    elif vec_dot_type == "bf16":
        xv, xs = round_bf16(x), _no_sums(x.shape[0])
    else:
        raise ValueError(f"unknown vec_dot_type {vec_dot_type!r}")
    if sub == 0:
        xs = _no_sums(x.shape[0])
    return xv, xs


def _no_sums(n_rows: int) -> np.ndarray:
    sums = _EMPTY_SUMS.get(n_rows)
    if sums is None:
        sums = _EMPTY_SUMS[n_rows] = np.zeros((n_rows, 0), np.float32)
    return sums


# --- the quantized activation itself, for the integer-dot kernels (:mod:`.intdot`) ------------------------------
INT_ACTIVATIONS = ("q8_0", "q8_0_sum4", "q8_1", "q8_K")


@njit(cache=True)
def _sum4(qs, out):
    for t in range(qs.shape[0]):
        for i in range(out.shape[1]):
            out[t, i] = np.int32(qs[t, 4 * i]) + qs[t, 4 * i + 1] + qs[t, 4 * i + 2] + qs[t, 4 * i + 3]


def quantize_int_row(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`quantize_int` of one contiguous float32 token ``x (K,)``: its row of each array, 1-D, allocated and
    filled in one compiled call (``row_<kind>``, which the one-token kernels ``intdot.token_<type>`` call from
    compiled code; this is their Python entry)."""
    row = _ROW_QUANTIZERS.get(kind)
    if row is None:
        raise ValueError(f"unknown integer activation {kind!r}; known: {', '.join(INT_ACTIVATIONS)}")
    return row(x)


@njit(cache=True)
def row_q8_0(x):
    qs, d = np.empty((1, x.shape[0]), np.int8), np.empty((1, x.shape[0] // QK8), np.float32)
    quantize_q8_0(x.reshape(1, -1), qs, d)
    return qs[0].view(np.uint8), d[0], np.zeros(0, np.int32)


@njit(cache=True)
def row_q8_0_sum4(x):
    qs, d = np.empty((1, x.shape[0]), np.int8), np.empty((1, x.shape[0] // QK8), np.float32)
    sums = np.empty((1, x.shape[0] // 4), np.int32)
    quantize_q8_0(x.reshape(1, -1), qs, d)
    _sum4(qs, sums)
    return qs[0].view(np.uint8), d[0], sums[0]


@njit(cache=True)
def row_q8_1(x):
    qs, d, s = np.empty((1, x.shape[0]), np.int8), np.empty((1, x.shape[0] // QK8), np.float32), \
        np.empty((1, x.shape[0] // QK8), np.float32)
    quantize_q8_1(x.reshape(1, -1), qs, d, s)
    return qs[0].view(np.uint8), d[0], s[0]


@njit(cache=True)
def row_q8_K(x):
    qs, d = np.empty((1, x.shape[0]), np.int8), np.empty((1, x.shape[0] // QK_K), np.float32)
    bsums = np.empty((1, x.shape[0] // 16), np.int16)
    quantize_q8_K(x.reshape(1, -1), qs, d, bsums)
    return qs[0].view(np.uint8), d[0], bsums[0]


_ROW_QUANTIZERS = {"q8_0": row_q8_0, "q8_0_sum4": row_q8_0_sum4, "q8_1": row_q8_1, "q8_K": row_q8_K}


# From this many tokens on, quantize_int splits the tokens over threads (a prefill's 512 x 8960 activation took 2.8 ms
# on one thread, 7% of the 1.5B's prefill); below (a decode step, a few batched tokens) one thread is quicker.
PARALLEL_TOKENS = 8


@njit(parallel=True, cache=True)
def quantize_q8_0_parallel(x, qs, d):
    """:func:`quantize_q8_0`, the tokens split over threads (each token's values are its own: the same bits)."""
    for t in prange(x.shape[0]):
        quantize_q8_0(x[t : t + 1], qs[t : t + 1], d[t : t + 1])


@njit(parallel=True, cache=True)
def quantize_q8_1_parallel(x, qs, d, s):
    """:func:`quantize_q8_1`, the tokens split over threads."""
    for t in prange(x.shape[0]):
        quantize_q8_1(x[t : t + 1], qs[t : t + 1], d[t : t + 1], s[t : t + 1])


@njit(parallel=True, cache=True)
def quantize_q8_K_parallel(x, qs, d, bsums):
    """:func:`quantize_q8_K`, the tokens split over threads."""
    for t in prange(x.shape[0]):
        quantize_q8_K(x[t : t + 1], qs[t : t + 1], d[t : t + 1], bsums[t : t + 1])


def quantize_int(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(yq, yd, ya)`` for activations ``x (T, K)``: ggml's quantized activation as the integer kernels read it.

    ``yq`` uint8 (T, K) the int8 quants' bytes; ``yd`` float32 block scales (T, K/32), or (T, K/256) for Q8_K;
    ``ya`` the type's auxiliary array: ``q8_0``: none (T, 0) int32; ``q8_0_sum4``: int32 (T, K/4) the sum of
    each four quants (for the ``- 8`` / ``- 16`` offsets of Q4_0 / Q5_0, per lane); ``q8_1``: float32 (T, K/32)
    the f16 block sums ``s``; ``q8_K``: int16 (T, K/16) the ``bsums``.
    """
    n_tokens, k = x.shape
    qs = np.empty(x.shape, np.int8)
    parallel = n_tokens >= PARALLEL_TOKENS
    if kind == "q8_K":
        d = np.empty((n_tokens, k // QK_K), np.float32)
        bsums = np.empty((n_tokens, k // 16), np.int16)
        (quantize_q8_K_parallel if parallel else quantize_q8_K)(x, qs, d, bsums)
        return qs.view(np.uint8), d, bsums
    d = np.empty((n_tokens, k // QK8), np.float32)
    if kind == "q8_1":
        s = np.empty_like(d)
        (quantize_q8_1_parallel if parallel else quantize_q8_1)(x, qs, d, s)
        return qs.view(np.uint8), d, s
    (quantize_q8_0_parallel if parallel else quantize_q8_0)(x, qs, d)
    if kind == "q8_0_sum4":
        sums = np.empty((n_tokens, k // 4), np.int32)
        _sum4(qs, sums)
        return qs.view(np.uint8), d, sums
    if kind == "q8_0":
        return qs.view(np.uint8), d, np.zeros((n_tokens, 0), np.int32)
    raise ValueError(f"unknown integer activation {kind!r}; known: {', '.join(INT_ACTIVATIONS)}")
