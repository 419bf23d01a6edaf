"""The ``numba`` backend: found by the registry, its fused ops equal to the NumPy reference, whole models agree.

The fused ops follow the NumPy reference's operations in the same order, so most are compared bit for bit; the
exceptions (summation order inside attention, RMSNorm's double sum) get named tolerances.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from fixtures.libm import expf_not_correctly_rounded
from fixtures.tiny_models import ARCHITECTURES

from inference_engine.backends import get_backend
from inference_engine.backends import numerics as nx
from inference_engine.backends.numba_cpu import NumbaBackend
from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.errors import GGUFParityError

NUMERICS = ("f32", "ggml")
EPS32 = float(np.finfo(np.float32).eps)
# RMSNorm sums squares in double in order (ggml's loop); NumPy sums pairwise. The doubles differ in their last
# bits, which moves the float32 scale by at most one ulp in rare cases.
RMS_NORM_MAX_ULP = 1
# Attention: q.k and p.v are float32 sums in another order than NumPy's BLAS. Measured worst 3e-7 of max|v|
# (head_dim 64, unit-scale data); the score error (~1e-6 of a score) passes through exp and the weighted sum.
ATTENTION_TOL = 1e-5
# Whole tiny models, f32 numerics: every op is exact or at float rounding, over a few layers. Measured worst
# ~1e-6 of max|logit|; 1e-4 leaves room for the float noise to grow across layers and architectures.
MODEL_LOGITS_TOL = 1e-4
# ggml_v_expf's documented accuracy (vec.h: "maximum error is 1.45358 plus 0.5 ulps"), rounded up.
EXPF_MAX_ULP = 2.0


@pytest.fixture(params=NUMERICS)
def pair(request):
    return NumbaBackend(request.param), NumpyBackend(request.param)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    ia, ib = (
        a.astype(np.float32).view(np.int32).astype(np.int64),
        b.astype(np.float32).view(np.int32).astype(np.int64),
    )
    return int(np.max(np.abs(ia - ib))) if a.size else 0


def test_registry_finds_the_numba_backend():
    backend = get_backend("numba", "ggml", 1)
    assert isinstance(backend, NumbaBackend) and backend.name == "numba" and backend.numerics == "ggml"
    assert "numba" in backend.versions() and "Numba" in backend.description


def test_thread_counts_beyond_numba_are_user_errors():
    import numba

    with pytest.raises(GGUFParityError, match="can use 1 to"):
        get_backend("numba", "f32", numba.config.NUMBA_NUM_THREADS + 1)


def test_rms_norm(pair, rng):
    ours, ref = pair
    x = (rng.standard_normal((5, 3, 64)) * 3).astype(np.float32)  # (T, H, D): per-head q/k norms too
    w = rng.standard_normal(64).astype(np.float32)
    for weight in (w, None):
        assert ulp_distance(ours.rms_norm(x, weight, 1e-6), ref.rms_norm(x, weight, 1e-6)) <= RMS_NORM_MAX_ULP


@pytest.mark.parametrize("neox", [False, True])
def test_rope_is_bit_exact(pair, rng, neox):
    ours, ref = pair
    x = rng.standard_normal((4, 3, 64)).astype(np.float32)
    positions = np.arange(7, 11)
    for n_dims in (64, 32):  # partial rotation: the rest of each head passes through
        args = (positions, n_dims, 10000.0, neox, 0.5, None)
        np.testing.assert_array_equal(ours.rope(x, *args), ref.rope(x, *args))


@pytest.fixture(params=nx.SIMD_WIDTH)
def simd_flavour(request):
    """Each SIMD flavour of ggml's exp / SiLU in turn, whatever this CPU is (the emulation is plain arithmetic)."""
    nx.set_ggml_simd(request.param)
    yield request.param
    nx.set_ggml_simd(None)


@pytest.mark.parametrize("n_rows", [3, 20])  # serial kernels (a decoded token) and the row-parallel ones
def test_swiglu_and_geglu_are_bit_exact(pair, rng, n_rows, simd_flavour):
    ours, ref = pair
    gate = (rng.standard_normal((n_rows, 200)) * 5).astype(np.float32)  # 200 = 12 * 16 + 8: vector part + tail
    # the exp's special ranges: 0 and inf (|n| > 192), two-factor scaling (126 < |n| <= 192), the plain case
    gate[0, :10] = [-100.0, 100.0, 0.0, -10.0, 10.0, 88.9, 95.0, -95.0, 130.0, -130.0]
    up = rng.standard_normal((n_rows, 200)).astype(np.float32)
    np.testing.assert_array_equal(ours.swiglu(gate, up), ref.swiglu(gate, up))
    np.testing.assert_array_equal(ours.geglu(gate, up), ref.geglu(gate, up))


@pytest.mark.parametrize("n_rows", [1, 20])  # a decoded token's logits, and the row-parallel kernel (prefill)
def test_softcap_is_bit_exact(pair, rng, n_rows):
    """Gemma 2's soft-capping: the kernel's tanh of a float32 is the C library's tanhf, as the reference's."""
    ours, ref = pair
    x = (rng.standard_normal((n_rows, 3000)) * rng.choice([0.3, 3.0, 30.0, 300.0], (n_rows, 3000))).astype(np.float32)
    for cap in (30.0, 50.0):  # Gemma 2's logit and attention caps
        np.testing.assert_array_equal(ours.softcap(x, cap), ref.softcap(x, cap))


def test_the_flavours_differ_where_ggml_says_they_do(rng):
    """AVX-512's scalef and AVX2/NEON's ``k + k*j`` round differently in the last bit for some inputs (which is why
    the flavour matters), while every flavour stays within ggml_v_expf's documented 1.45 + 0.5 ulp of expf."""
    x = (rng.standard_normal(1 << 16) * 20).astype(np.float32)
    wide, narrow = nx.expf_ggml(x, "avx512"), nx.expf_ggml(x, "avx2")
    assert np.any(wide != narrow)
    exact = np.exp(x.astype(np.float64))
    finite = np.isfinite(exact) & (exact > np.finfo(np.float32).tiny) & (exact < np.finfo(np.float32).max)
    for got in (wide, narrow):  # one ulp of a normal float32 is at most EPS32 of its value
        relative = np.abs(got[finite] - exact[finite]) / exact[finite]
        assert np.max(relative) <= EXPF_MAX_ULP * EPS32


def _libggml_flavour(oracle) -> str:
    """The SIMD flavour the libggml-cpu under test was compiled for (its own report)."""
    for name, flavour in (("ggml_cpu_has_avx512", "avx512"), ("ggml_cpu_has_neon", "neon")):
        fn = getattr(oracle.cpu, name)
        fn.restype = ctypes.c_int
        if fn():
            return flavour
    return "avx2"


def test_ggml_swiglu_equals_libggml(oracle, rng):
    """The ggml-numerics SiLU against libggml's own ggml_vec_swiglu_f32, bit for bit (true FMA in ggml_v_expf), in
    the flavour this libggml was built for, as the harness sets it from llama.cpp's build; its scalar tail too."""
    fn = oracle.cpu.ggml_vec_swiglu_f32
    fn.restype = None
    # 4096 + 15: a scalar tail on every SIMD flavour, its values gates whose expf(-gate) the C library rounds
    # differently from a float64 exp (ggml_silu_f32 calls the C library's expf); negative gates, so that the
    # exponential outweighs the 1 it is added to and its last bit survives
    tail = -expf_not_correctly_rounded(0.0, 20.0)[:15]
    gate = np.concatenate([rng.standard_normal(4096) * 6, tail, np.full(15 - len(tail), 0.5)]).astype(np.float32)
    gate[:4] = [95.0, -95.0, 130.0, -130.0]  # the exp's two-factor and overflow branches
    up = rng.standard_normal(gate.size).astype(np.float32)
    expected = np.empty_like(gate)
    fn(ctypes.c_int(gate.size), *(a.ctypes.data_as(ctypes.c_void_p) for a in (expected, gate, up)))
    nx.set_ggml_simd(_libggml_flavour(oracle))
    try:
        np.testing.assert_array_equal(NumbaBackend("ggml").swiglu(gate[None], up[None])[0], expected)
        np.testing.assert_array_equal(NumpyBackend("ggml").swiglu(gate[None], up[None])[0], expected)
    finally:
        nx.set_ggml_simd(None)


def test_the_default_flavour_is_this_cpus_own():
    from inference_engine.cpu_features import cpu_features

    nx.set_ggml_simd(None)
    assert nx.ggml_simd() == cpu_features().simd_flavour
    with pytest.raises(GGUFParityError, match="unknown SIMD flavour 'sse9'; supported: avx512, avx2, neon"):
        nx.set_ggml_simd("sse9")


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("window", [0, 5])
def test_attention(pair, rng, kv_dtype, window):
    ours, ref = pair
    n_ctx, n_head_kv, n_head, d = 24, 2, 6, 64
    k = rng.standard_normal((n_ctx, n_head_kv, d)).astype(kv_dtype)
    v = rng.standard_normal((n_ctx, n_head_kv, d)).astype(kv_dtype)
    for positions in (np.arange(10, 14), np.array([17])):  # a prefill chunk after a cached prefix, a decode step
        q = rng.standard_normal((positions.size, n_head, d)).astype(np.float32)
        kv_len = int(positions[-1]) + 1
        got = ours.attention(q, k, v, positions, kv_len, 0.125, window)
        want = ref.attention(q, k, v, positions, kv_len, 0.125, window)
        assert got.shape == want.shape == (positions.size, n_head * d)
        assert np.max(np.abs(got - want)) <= ATTENTION_TOL * np.max(np.abs(v[:kv_len].astype(np.float32)))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_tiny_models_agree_with_the_numpy_backend(tiny_model, arch):
    from inference_engine.engine import OurEngine

    path = tiny_model(arch, "Q4_K")
    logits = {}
    for backend in ("numpy", "numba"):
        engine = OurEngine(path, backend=backend, numerics="f32", n_ctx=64, n_threads=1)
        ids = list(range(3, 19))
        prefill = engine.prefill(ids)
        decoded = engine.decode(int(np.argmax(prefill)))
        logits[backend] = np.stack([prefill, decoded])
        engine.close()
    scale = np.max(np.abs(logits["numpy"]))
    assert np.max(np.abs(logits["numba"] - logits["numpy"])) <= MODEL_LOGITS_TOL * scale


def test_embed_is_ggml_dequantization(tiny_model):
    from inference_engine.gguf.file import GGUFFile
    from inference_engine.quants import quant_for

    t = GGUFFile(tiny_model("llama", "Q6_K")).tensor("token_embd.weight")
    ids = np.array([5, 6, 7, 2, 5])
    got = NumbaBackend("f32").embed(NumbaBackend("f32").load_embedding(t), ids)
    np.testing.assert_array_equal(got, quant_for(t.qtype).dequantize(np.asarray(t.raw))[ids])


# Real models, f32 numerics and F32 KV cache: measured 1.4e-6 (SmolLM2) and 7.5e-7 (Gemma 3) of max|logit| against
# the NumPy backend after a 6-token prefill; 1e-4 leaves room for other prompts while catching a numerics error.
# (Not with an F16 cache: rounding K/V to f16 turns 1e-7 differences into occasional f16-ulp (5e-4) flips.)
REAL_MODEL_LOGITS_TOL = 1e-4
# ggml_v_expf's documented accuracy (vec.h: "maximum error is 1.45358 plus 0.5 ulps"), rounded up.
EXPF_MAX_ULP = 2.0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_real_models_agree_with_the_numpy_backend(model):
    from inference_engine.engine import OurEngine
    from inference_engine.store.named_models import fetch

    path = fetch(model, progress=False)
    logits = {}
    for backend in ("numpy", "numba"):
        engine = OurEngine(path, backend=backend, numerics="f32", n_ctx=64, n_threads=2, kv_type="f32")
        prefill = engine.prefill(engine.tokenize("The capital of France is", add_bos=True))
        logits[backend] = np.stack([prefill, engine.decode(int(np.argmax(prefill)))])
        engine.close()
    scale = np.max(np.abs(logits["numpy"]))
    assert np.max(np.abs(logits["numba"] - logits["numpy"])) <= REAL_MODEL_LOGITS_TOL * scale
    assert np.array_equal(np.argmax(logits["numba"], axis=1), np.argmax(logits["numpy"], axis=1))
