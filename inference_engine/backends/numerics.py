"""llama.cpp's CPU numerics for the element-wise parts of the forward pass, in plain NumPy.

Every backend can use these to get exactly the numbers ggml's CPU backend (``ggml/src/ggml-cpu/``) computes; they
are small, so backends usually precompute them on the host and ship the result to their device.

* :func:`visible_keys`: the causal / sliding-window attention mask (``llama_hparams::is_masked_swa``).
* :func:`rope_cos_sin`: RoPE angles built as ``ggml_rope_cache_init`` does (float32 ``theta *= theta_scale``).
* :func:`gelu_f16_table`: ``ggml_table_gelu_f16``, the F16 lookup table ggml's GELU / GEGLU read (GGML_GELU_FP16).
* :func:`gelu_ggml`, :func:`gelu_tanh`: GELU through that table (ggml numerics) or the float formula (f32 numerics).
* :func:`expf_ggml`, :func:`silu_ggml`, :func:`silu_f32`: ggml's vector ``expf`` and SiLU in the SIMD flavour
  llama.cpp was built with (:func:`ggml_simd`, set by the harness), or plain SiLU; :func:`expf_libm`, the C
  library's ``expf`` that ggml's scalar tails call (as :func:`cosf_sinf` for RoPE).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache

import numpy as np

from inference_engine.cpu_features import cpu_features
from inference_engine.errors import GGUFParityError

# --- float32 helpers -------------------------------------------------------------------------------------------


def _hexf(literal: str) -> np.float32:
    """A C hex-float literal such as ``0x1.715476p+0f`` (the constants as vec.h writes them)."""
    return np.float32(float.fromhex(literal))


def fma_f32(a, b, c) -> np.ndarray:
    """float32 fused multiply-add ``a*b + c``, which libggml-cpu's x86 build uses where its source writes a
    multiply then an add (the compiler contracts them). ``a*b`` is exact in float64; the sum is rounded to float64
    and then to float32, which differs from one true FMA rounding only in rare halfway cases."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(np.float32)


# --- attention mask ---------------------------------------------------------------------------------------------


def visible_keys(q_positions: np.ndarray, kv_len: int, sliding_window: int = 0) -> np.ndarray:
    """Boolean ``(n_queries, kv_len)``: may the query at position p see the key at cache position j?

    As llama.cpp's KV-cache mask (src/llama-kv-cache.cpp with ``is_masked_swa``, LLAMA_SWA_TYPE_STANDARD): j is
    visible iff ``j <= p`` and, in a sliding-window layer (``sliding_window > 0``), ``p - j < sliding_window``.
    Cache slot j holds position j (one sequence, filled from 0).
    """
    p = np.asarray(q_positions, dtype=np.int64)[:, None]
    j = np.arange(kv_len, dtype=np.int64)[None, :]
    mask = j <= p
    if sliding_window > 0:
        mask &= (p - j) < sliding_window
    return mask


# --- RoPE -------------------------------------------------------------------------------------------------------


def rope_cos_sin(
    positions: np.ndarray,
    n_dims: int,
    freq_base: float,
    freq_scale: float = 1.0,
    freq_factors: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin`` float32 ``(n_positions, n_dims // 2)`` exactly as ggml's CPU RoPE builds its cache.

    ``ggml_compute_forward_rope_flt``: ``theta_scale = powf(freq_base, -2.0f/n_dims)``; per position,
    ``theta = (float) p`` and for pair i ``cos = cosf(freq_scale * (theta / ff[i]))``, then
    ``theta *= theta_scale`` in float32 (a repeated product, not ``p * theta_scale**i``: the rounding differs).
    No YaRN (ext_factor 0) and ``attn_factor`` 1, as for every model we run. cos/sin come from the C library's
    ``cosf``/``sinf``, as in ggml (see :func:`cosf_sinf`).
    """
    theta_scale = np.float32(np.float32(freq_base) ** np.float32(-2.0 / n_dims))
    half = n_dims // 2
    theta = np.asarray(positions, dtype=np.float32).copy()
    thetas = np.empty((theta.shape[0], half), dtype=np.float32)
    for i in range(half):
        thetas[:, i] = theta
        theta = (theta * theta_scale).astype(np.float32)
    if freq_factors is not None:
        thetas = (thetas / np.asarray(freq_factors, dtype=np.float32)[:half]).astype(np.float32)
    return cosf_sinf((np.float32(freq_scale) * thetas).astype(np.float32))


@lru_cache(maxsize=1)
def _libm() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if lib is not None:
        for fn in (lib.cosf, lib.sinf, lib.expf, lib.tanhf):
            fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lib


def cosf_sinf(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The C library's ``cosf`` / ``sinf`` of float32 ``theta`` (what ggml calls), element by element.

    They are not always correctly rounded (glibc's differ from the rounded exact value in ~1 of 1000 RoPE angles),
    so rounding a float64 ``cos`` would differ from llama.cpp there; the float64 route is the fallback when no
    C math library can be loaded.
    """
    return _libm_each("cosf", theta, np.cos), _libm_each("sinf", theta, np.sin)


def _libm_each(name: str, x: np.ndarray, float64_fn) -> np.ndarray:
    """The C library's float function ``name`` on every float32 of ``x``, one call a value; where no C math library
    can be loaded, ``float64_fn`` of ``x`` in float64 rounded once to float32 (overflow to inf allowed)."""
    x = np.asarray(x, dtype=np.float32)
    lib = _libm()
    if lib is None:
        with np.errstate(over="ignore"):
            return float64_fn(x.astype(np.float64)).astype(np.float32)
    fn = getattr(lib, name)
    flat = x.ravel().tolist()
    return np.fromiter((fn(v) for v in flat), dtype=np.float32, count=len(flat)).reshape(x.shape)


def expf_libm(x: np.ndarray) -> np.ndarray:
    """The C library's ``expf`` of float32 ``x`` (what ggml's scalar loops call: the tails of
    ``ggml_vec_soft_max_f32`` and ``ggml_vec_swiglu_f32``), element by element.

    Not always correctly rounded either: glibc 2.36's differs from the rounded exact value on ~0.07% of inputs in
    (-20, 0) (measured, 200,000 values; e.g. ``expf(-0.10083604f)`` is 0.9040813, the rounded value 0.9040812), where
    an MoE router's softmax over 4 experts (all tail) then left llama.cpp by one bit. The float64 route is the
    fallback when no C math library can be loaded. For the tails only: a Python call per value.
    """
    return _libm_each("expf", x, np.exp)


def tanhf_libm(x: np.ndarray) -> np.ndarray:
    """The C library's ``tanhf`` of float32 ``x``, element by element: what ggml's ``tanh`` op runs
    (``op_tanh``: ``tanhf``), hence Gemma 2's soft-capping.

    NumPy's vectorized float32 tanh is another approximation: it differs from glibc 2.36's ``tanhf`` on 37% of
    normal(0, 0.01..10) inputs, by up to 3 ulps (measured, 1,000,000 values; libggml's ``ggml_tanh`` equals the C
    library's on all of them). The float64 route is the fallback when no C math library can be loaded.
    """
    return _libm_each("tanhf", x, np.tanh)


def softcap_f32(x: np.ndarray, cap: float) -> np.ndarray:
    """``cap * tanhf(x * (1/cap))`` in float32: llama.cpp's soft-capping (``ggml_scale``, ``ggml_tanh``,
    ``ggml_scale``; Gemma 2's attention scores and logits), with the C library's ``tanhf`` (:func:`tanhf_libm`)."""
    inv = np.float32(1.0) / np.float32(cap)
    return tanhf_libm(np.asarray(x, dtype=np.float32) * inv) * np.float32(cap)


# --- GELU -------------------------------------------------------------------------------------------------------

GELU_COEF_A = np.float32(0.044715)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
# ggml_vec_gelu_f32 / ggml_vec_geglu_f32 (GGML_GELU_FP16) bypass the table outside (-10, 10).
GELU_TABLE_LIMIT = np.float32(10.0)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """``ggml_gelu_f32`` in float32: ``0.5*x*(1 + tanh(sqrt(2/pi)*x*(1 + 0.044715*x*x)))`` (f32 numerics).

    As compiled in libggml-cpu: ``1 + (0.044715*x)*x`` is contracted to one FMA (with it, the F16 table this
    builds equals libggml's ``ggml_table_gelu_f16`` in all 65536 entries; without it one entry differs).
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        inner = (SQRT_2_OVER_PI * x) * fma_f32(GELU_COEF_A * x, x, np.float32(1.0))
        t = np.tanh(inner.astype(np.float64)).astype(np.float32)  # tanhf, correctly rounded
        return np.float32(0.5) * x * (np.float32(1.0) + t)


@lru_cache(maxsize=1)
def gelu_f16_table() -> np.ndarray:
    """``ggml_table_gelu_f16`` as float32 values, indexed by the float16 bit pattern of the input.

    ggml-cpu.c ``ggml_cpu_init``: ``table[i] = fp32_to_fp16(ggml_gelu_f32(fp16_to_fp32(i)))`` for all 2**16 i.
    """
    inputs = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        table = gelu_tanh(inputs).astype(np.float16)
    return table.astype(np.float32)


def gelu_ggml(x: np.ndarray) -> np.ndarray:
    """GELU as ggml's CPU backend computes it (``ggml_vec_gelu_f32`` with GGML_GELU_FP16).

    ``x <= -10 -> 0``; ``x >= 10 -> x``; otherwise the F16 table at ``fp16(x)`` (round to nearest even).
    """
    x = np.asarray(x, dtype=np.float32)
    idx = x.astype(np.float16).view(np.uint16)
    y = gelu_f16_table()[idx]
    y = np.where(x >= GELU_TABLE_LIMIT, x, y)
    return np.where(x <= -GELU_TABLE_LIMIT, np.float32(0.0), y).astype(np.float32)


# --- exp and SiLU -----------------------------------------------------------------------------------------------
#
# ggml's vector SiLU / SwiGLU and softmax use ``ggml_v_expf`` (vec.h), ARM's optimized-routines polynomial, in the
# SIMD flavour libggml-cpu was compiled for. The AVX-512 version finishes with ``scalef(j, n)`` where ``j`` already
# includes the +1; the AVX2 and NEON versions (same arithmetic) finish with ``k + k*j`` (``k = 2**n``). The last
# bit differs between the two, so we follow the one llama.cpp was built with (:func:`ggml_simd`).

# ggml_v_expf's constants, as vec.h writes them (C hex floats).
_EXP_SHIFT = _hexf("0x1.8p23")  # adding it rounds x/ln2 to an integer n
_INV_LN2 = _hexf("0x1.715476p+0")
_LN2_HI, _LN2_LO = _hexf("0x1.62E4p-1"), _hexf("0x1.7F7D1Cp-20")
_C4, _C3, _C2, _C1, _C0 = (
    _hexf(c) for c in ("0x1.0E402p-7", "0x1.573E2Ep-5", "0x1.555E66p-3", "0x1.FFFDB6p-2", "0x1.FFFFECp-1")
)
# Floats per vector in ggml_vec_silu_f32 / ggml_vec_swiglu_f32; the rest of a row takes scalar expf.
SIMD_WIDTH = {"avx512": 16, "avx2": 8, "neon": 4}


# The flavour the emulation follows: the CPU's own by default (what a llama.cpp built natively here runs); the
# harness sets llama.cpp's actual build flavour with :func:`set_ggml_simd` (a portable or cross-ISA build differs).
_simd_flavour: str | None = None


def ggml_simd() -> str:
    """The SIMD flavour of ggml's CPU kernels that the ``ggml`` numerics follow: ``"avx512"``, ``"avx2"``, ``"neon"``.

    Set by the harness from llama.cpp's build (:func:`set_ggml_simd`); until then, this CPU's own flavour
    (:attr:`~inference_engine.cpu_features.CPUFeatures.simd_flavour`). The engine never loads llama.cpp's libraries.
    """
    return _simd_flavour or cpu_features().simd_flavour


def set_ggml_simd(flavour: str | None) -> None:
    """Follow ``flavour`` (one of :data:`SIMD_WIDTH`) from now on; ``None`` goes back to this CPU's own."""
    global _simd_flavour
    if flavour is not None and flavour not in SIMD_WIDTH:
        raise GGUFParityError(f"unknown SIMD flavour '{flavour}'; supported: {', '.join(SIMD_WIDTH)}")
    _simd_flavour = flavour


def silu_f32(x: np.ndarray) -> np.ndarray:
    """``x / (1 + exp(-x))`` in float32 (f32 numerics; ggml's scalar ``ggml_silu_f32``)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore"):
        e = np.exp((-x).astype(np.float64)).astype(np.float32)  # expf, correctly rounded
    return x / (np.float32(1.0) + e)


def expf_ggml(x: np.ndarray, simd: str | None = None) -> np.ndarray:
    """``ggml_v_expf`` of float32 ``x`` in the given (default: llama.cpp's) SIMD flavour.

    Max error 1.45 ulp + 0.5; results above 88.38 overflow to inf, below -103.97 flush to zero; -inf gives 0.
    """
    flavour = simd or ggml_simd()
    with np.errstate(all="ignore"):  # -inf inputs (masked scores) pass through NaN and come out as 0
        x = np.asarray(x, dtype=np.float32)
        return _expf_scalef(x) if flavour == "avx512" else _expf_k_plus_kj(x)


def _exp_reduce(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The shared first half: ``n = round(x/ln2)``, ``b = x - n*ln2`` and the polynomial's parts."""
    z = fma_f32(x, _INV_LN2, _EXP_SHIFT)
    n = (z - _EXP_SHIFT).astype(np.float32)
    b = fma_f32(-n, _LN2_LO, fma_f32(-n, _LN2_HI, x))  # x - n*ln2, ln2 in two parts
    u = (b * b).astype(np.float32)
    return z, n, b, u


def _expf_scalef(x: np.ndarray) -> np.ndarray:
    """AVX-512: ``j = 1 + b + ...`` then ``scalef(j, n) = j * 2**n``."""
    _, n, b, u = _exp_reduce(x)
    j = fma_f32(fma_f32(fma_f32(_C4, b, _C3), u, fma_f32(_C2, b, _C1)), u, fma_f32(_C0, b, np.float32(1.0)))
    res = np.ldexp(j, np.nan_to_num(n, nan=0.0, posinf=0.0, neginf=0.0).astype(np.int32)).astype(np.float32)
    too_far = np.abs(n) > np.float32(192)
    return np.where(too_far, np.where(n <= 0, np.float32(0.0), np.float32(np.inf)), res).astype(np.float32)


def _expf_k_plus_kj(x: np.ndarray) -> np.ndarray:
    """AVX2 / NEON: ``j = b + ...`` (no 1), ``k = 2**n`` built in the exponent bits, result ``k + k*j``; two
    scale factors ``s1 * s1`` or ``(s2 + s2*j) * s1`` where ``2**n`` alone would overflow or be denormal."""
    z, n, b, u = _exp_reduce(x)
    j = fma_f32(fma_f32(fma_f32(_C4, b, _C3), u, fma_f32(_C2, b, _C1)), u, (_C0 * b).astype(np.float32))
    e = z.view(np.uint32) << np.uint32(23)
    k = (e + np.float32(1.0).view(np.uint32)).view(np.float32)
    res = fma_f32(k, j, k)
    big = np.abs(n) > np.float32(126)
    if np.any(big):
        g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0))
        s1 = (g + np.uint32(0x7F000000)).view(np.float32)
        s2 = (e - g).view(np.float32)
        scaled = (fma_f32(s2, j, s2) * s1).astype(np.float32)
        res = np.where(np.abs(n) > np.float32(192), (s1 * s1).astype(np.float32), np.where(big, scaled, res))
    return res.astype(np.float32)


def silu_ggml(x: np.ndarray, simd: str | None = None) -> np.ndarray:
    """SiLU along the last axis as ``ggml_vec_silu_f32`` / ``ggml_vec_swiglu_f32`` compute it.

    The first ``n - n % width`` values of each row go through ``ggml_v_silu`` (``x / (1 + ggml_v_expf(-x))``), the
    tail through scalar ``x / (1 + expf(-x))`` (the C library's ``expf``, :func:`expf_libm`).
    """
    flavour = simd or ggml_simd()
    x = np.asarray(x, dtype=np.float32)
    n_vec = x.shape[-1] - x.shape[-1] % SIMD_WIDTH[flavour]
    out = np.empty_like(x)
    head = x[..., :n_vec]
    out[..., :n_vec] = head / (np.float32(1.0) + expf_ggml(-head, flavour))
    if n_vec < x.shape[-1]:  # ggml_silu_f32: x / (1 + expf(-x)), the C library's expf
        tail = x[..., n_vec:]
        out[..., n_vec:] = tail / (np.float32(1.0) + expf_libm(-tail))
    return out


def soft_max_ggml(x: np.ndarray, simd: str | None = None) -> np.ndarray:
    """Softmax along the last axis as ``ggml_compute_forward_soft_max_f32`` computes it (no mask, scale 1).

    ``ggml_vec_soft_max_f32``: the row max is subtracted in float32; the first ``n - n % width`` values go through
    ``ggml_v_expf``, each vector's values summed in float32 by the SIMD reduction (halves folded onto each other,
    then ``(v0 + v2) + (v1 + v3)``; NEON's ``vaddvq_f32`` pairwise) and accumulated in double; the tail takes the C
    library's scalar ``expf`` (:func:`expf_libm`), added in double. Then ``y *= (float)(1.0 / sum)``. A row shorter
    than one vector (an MoE router over 4 experts on AVX2) is all tail.
    """
    flavour = simd or ggml_simd()
    width = SIMD_WIDTH[flavour]
    x = np.asarray(x, dtype=np.float32)
    shifted = (x - x.max(axis=-1, keepdims=True)).astype(np.float32)
    n = x.shape[-1]
    n_vec = n - n % width
    y = np.empty_like(shifted)
    total = np.zeros(x.shape[:-1] + (1,), dtype=np.float64)
    if n_vec:
        y[..., :n_vec] = expf_ggml(shifted[..., :n_vec], flavour)
        vectors = y[..., :n_vec].reshape(*x.shape[:-1], n_vec // width, width)
        for v in range(vectors.shape[-2]):
            total[..., 0] += _simd_reduce_add(vectors[..., v, :], flavour).astype(np.float64)
    tail = expf_libm(shifted[..., n_vec:])  # scalar expf: the C library's
    y[..., n_vec:] = tail
    for i in range(n - n_vec):  # one double add per value, in order
        total[..., 0] += tail[..., i].astype(np.float64)
    return (y * (1.0 / total).astype(np.float32)).astype(np.float32)


def _simd_reduce_add(v: np.ndarray, flavour: str) -> np.ndarray:
    """One vector's float32 horizontal sum in the order the flavour's reduction adds (last axis: the lanes)."""
    v = np.asarray(v, dtype=np.float32)
    if flavour == "neon":  # vaddvq_f32: (v0 + v1) + (v2 + v3)
        return ((v[..., 0] + v[..., 1]) + (v[..., 2] + v[..., 3])).astype(np.float32)
    while v.shape[-1] > 4:  # fold the upper half onto the lower: 512 -> 256 -> 128 bits
        half = v.shape[-1] // 2
        v = (v[..., :half] + v[..., half:]).astype(np.float32)
    return ((v[..., 0] + v[..., 2]) + (v[..., 1] + v[..., 3])).astype(np.float32)


def soft_max_f32(x: np.ndarray) -> np.ndarray:
    """Softmax along the last axis in f32 numerics: the row max subtracted, correctly rounded ``expf``, the sum in
    double, ``y *= (float)(1.0 / sum)`` (ggml's arithmetic with every exponential by libm's ``expf``)."""
    x = np.asarray(x, dtype=np.float32)
    shifted = (x - x.max(axis=-1, keepdims=True)).astype(np.float32)
    with np.errstate(over="ignore"):
        e = np.exp(shifted.astype(np.float64)).astype(np.float32)
    total = e.sum(axis=-1, dtype=np.float64, keepdims=True)
    return (e * (1.0 / total).astype(np.float32)).astype(np.float32)
