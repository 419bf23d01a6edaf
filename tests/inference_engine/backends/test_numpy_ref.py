"""The NumPy reference backend's ops: against direct float64 formulas, and against libggml's own CPU kernels.

libggml (the ``libggml-base`` / ``libggml-cpu`` that llama-cpp-python ships) is run op by op through ctypes: a
tiny ggml graph with one op (``ggml_rms_norm``, ``ggml_rope_ext``, ``ggml_soft_max_ext``, ``ggml_swiglu_split``,
``ggml_geglu_split``; ``ggml_tanh`` between two ``ggml_scale``) computed by ``ggml_graph_compute_with_ctx``. In ggml
numerics our op must reproduce it bit for bit (or to float32 summation order where ggml sums in SIMD lanes).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from inference_engine.backends import get_backend
from inference_engine.backends import numerics as nx
from inference_engine.backends.base import Backend, describe_ops
from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.errors import GGUFParityError

# RoPE angles are built by repeated float32 products (as ggml does): the angle of pair i at position p carries ~i
# roundings of 2**-24 relative, and i * theta_scale**i peaks near 1.3 for the bases used here, so the angle error is
# below ~2e-7 * p radians; the rotated value errs by that times |x|.
ROPE_ANGLE_RTOL = 2e-7
# float32 ops against float64 formulas: a few ulps of O(1) values.
FLOAT32_FORMULA_RTOL = 1e-5
# ggml's softmax sums the exponentials in 16-float SIMD lanes before adding them in double; we add all of them in
# double. The two totals differ in the last float32 bit at most, so probabilities differ by ~1 ulp: NMSE ~1e-14.
SOFTMAX_VS_GGML_NMSE = 1e-12
# Attention against a float64 loop: float32 dot products of length d (64) and sums over <= 32 keys.
ATTENTION_FORMULA_ATOL = 1e-5


# --- libggml, one op at a time ----------------------------------------------------------------------------------
GGML_TYPE_F32 = 0
GGML_TYPE_I32 = 26
GGML_ROPE_TYPE_NORMAL = 0
GGML_ROPE_TYPE_NEOX = 2


class GGMLOps:
    """Build and run one-op ggml graphs on NumPy inputs (ggml order is NumPy's reversed)."""

    def __init__(self):
        from validation.ggml_ctypes import GGMLScratch, GGMLTensor, check_layout, libggml_base

        check_layout()
        self._scratch_cls, self._tensor_cls = GGMLScratch, GGMLTensor
        self.base = libggml_base()
        lib_dir = Path(self.base._name).parent
        self.cpu = ctypes.CDLL(
            str(
                next(
                    p
                    for p in (lib_dir / "libggml-cpu.so.0", lib_dir / "libggml-cpu.so", lib_dir / "libggml-cpu.dylib")
                    if p.exists()
                )
            )
        )
        self.cpu.ggml_cpu_init()
        p, f, i = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        for lib, name, args, res in (
            (self.base, "ggml_rms_norm", [p, p, f], p),
            (self.base, "ggml_rope_ext", [p, p, p, p, i, i, i, f, f, f, f, f, f], p),
            (self.base, "ggml_soft_max_ext", [p, p, p, f, f], p),
            (self.base, "ggml_swiglu_split", [p, p, p], p),
            (self.base, "ggml_geglu_split", [p, p, p], p),
            (self.base, "ggml_scale", [p, p, f], p),
            (self.base, "ggml_tanh", [p, p], p),
            (self.base, "ggml_new_graph", [p], p),
            (self.base, "ggml_build_forward_expand", [p, p], None),
            (self.cpu, "ggml_graph_compute_with_ctx", [p, p, i], i),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, res

    def run(self, build, *inputs: np.ndarray) -> np.ndarray:
        """``build(ctx, *tensor_ptrs) -> result_ptr``; inputs float32 (or int32 for positions)."""
        with self._scratch_cls(mem_size=64 << 20) as scratch:
            ptrs = []
            for a in inputs:
                type_ = GGML_TYPE_I32 if a.dtype == np.int32 else GGML_TYPE_F32
                ptr = scratch.new_tensor(type_, tuple(reversed(a.shape)))
                scratch.fill(ptr, a)
                ptrs.append(ptr)
            out = build(scratch.ctx, *ptrs)
            graph = self.base.ggml_new_graph(scratch.ctx)
            self.base.ggml_build_forward_expand(graph, out)
            assert self.cpu.ggml_graph_compute_with_ctx(scratch.ctx, graph, 1) == 0
            t = self._tensor_cls.from_address(out)
            shape = tuple(reversed([int(n) for n in t.ne]))
            n = int(np.prod(shape))
            values = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), shape=(n,))
            return values.reshape(shape).copy().reshape(shape[-len(inputs[0].shape) :])


@lru_cache(maxsize=1)
def ggml_ops() -> GGMLOps:
    return GGMLOps()


@pytest.fixture(scope="module")
def ggml():
    try:
        return ggml_ops()
    except (OSError, ImportError, StopIteration, RuntimeError) as exc:  # pragma: no cover - environment
        pytest.skip(f"libggml from llama-cpp-python not loadable: {exc}")


@pytest.fixture(params=["f32", "ggml"])
def backend(request) -> NumpyBackend:
    return NumpyBackend(numerics=request.param)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- registry -----------------------------------------------------------------------------------------------------
def test_get_backend_returns_numpy_with_description():
    b = get_backend("numpy", "ggml", 1)
    assert isinstance(b, NumpyBackend) and b.numerics == "ggml" and b.n_threads == 1
    assert "NumPy" in b.description and "ggml numerics" in b.description


@pytest.mark.parametrize(
    "name, numerics, needle",
    [
        ("cuda", "f32", "unknown backend 'cuda'; supported: numpy, numba, mlx"),
        ("numpy", "f16", "unknown numerics 'f16'; supported: f32, ggml"),
    ],
)
def test_get_backend_refuses_unknown_choices(name, numerics, needle):
    with pytest.raises(GGUFParityError, match=needle.replace("(", r"\(")):
        get_backend(name, numerics)


@pytest.mark.parametrize(
    "missing, needle",
    [
        ("numba", "backend 'numba' needs the numba package: pip install numba"),
        ("inference_engine.backends.numba_cpu", "backend 'numba' is not part of this installation"),
    ],
)
def test_get_backend_says_what_is_missing(monkeypatch, missing, needle):
    import importlib

    from inference_engine import backends

    real_import = importlib.import_module

    def fake_import(name, *args):
        if name == "inference_engine.backends.numba_cpu":
            raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
        return real_import(name, *args)

    monkeypatch.setattr(backends.importlib, "import_module", fake_import)
    with pytest.raises(GGUFParityError, match=needle):
        get_backend("numba")


def test_numpy_backend_implements_every_op():
    assert not NumpyBackend.__abstractmethods__
    assert {"matmul", "rms_norm", "rope", "attention", "swiglu", "geglu", "kv_store"} <= set(describe_ops())
    assert issubclass(NumpyBackend, Backend)


# --- RMSNorm ------------------------------------------------------------------------------------------------------
def test_rms_norm_matches_formula(backend):
    x = rng(1).standard_normal((5, 3, 64)).astype(np.float32) * 3
    w = rng(2).standard_normal(64).astype(np.float32)
    eps = float(np.float32(1e-6))
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * w
    np.testing.assert_allclose(backend.rms_norm(x, w, eps), ref, rtol=FLOAT32_FORMULA_RTOL, atol=1e-6)
    assert backend.rms_norm(x, None, eps).dtype == np.float32


@pytest.mark.parametrize("numerics", ["f32", "ggml"])
def test_add_rms_norm_is_the_add_then_the_norm(numerics):
    """Backend.add_rms_norm's default (what a pre-norm layer asks for where nothing taps): the same bits as add then
    rms_norm, so a backend without a fused op computes the layer as before."""
    b = NumpyBackend(numerics)
    x, delta = rng(4).standard_normal((3, 576)).astype(np.float32), rng(5).standard_normal((3, 576)).astype(np.float32)
    w = rng(6).standard_normal(576).astype(np.float32)
    total, normed = b.add_rms_norm(delta, x, w, 1e-5)
    assert np.array_equal(total, b.add(delta, x)) and np.array_equal(normed, b.rms_norm(b.add(delta, x), w, 1e-5))


def test_rms_norm_equals_libggml_bit_for_bit(ggml):
    x = rng(3).standard_normal((7, 576)).astype(np.float32) * 5
    eps = float(np.float32(1e-5))
    ref = ggml.run(lambda ctx, a: ggml.base.ggml_rms_norm(ctx, a, eps), x)
    assert np.array_equal(NumpyBackend("ggml").rms_norm(x, None, eps), ref)


# --- RoPE ---------------------------------------------------------------------------------------------------------
def rope_formula(x: np.ndarray, positions, n_dims: int, base: float, neox: bool) -> np.ndarray:
    """RoPE from its definition in float64: pair i rotates by ``p * base**(-2i/n_dims)``."""
    out = x.astype(np.float64).copy()
    half = n_dims // 2
    for t, p in enumerate(positions):
        for i in range(half):
            theta = p * base ** (-2.0 * i / n_dims)
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[t, :, a].astype(np.float64), x[t, :, b].astype(np.float64)
            out[t, :, a] = x0 * np.cos(theta) - x1 * np.sin(theta)
            out[t, :, b] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope_matches_formula(backend, neox, n_dims):
    x = rng(4).standard_normal((6, 3, 64)).astype(np.float32)
    positions = np.array([0, 1, 2, 17, 63, 200])
    out = backend.rope(x, positions, n_dims, 10000.0, neox)
    atol = ROPE_ANGLE_RTOL * positions.max() * np.abs(x).max() + 1e-6
    np.testing.assert_allclose(out, rope_formula(x, positions, n_dims, 10000.0, neox), atol=atol)
    assert np.array_equal(out[..., n_dims:], x[..., n_dims:])  # dims past n_dims pass through
    assert np.array_equal(out[0], x[0])  # position 0 is the identity


def test_rope_freq_scale_and_factors_divide_the_angle(backend):
    x = rng(5).standard_normal((3, 2, 16)).astype(np.float32)
    pos = np.array([3, 5, 9])
    factors = np.full(8, 4.0, dtype=np.float32)
    a = backend.rope(x, pos, 16, 500.0, True, freq_scale=0.25)
    b = backend.rope(x, pos, 16, 500.0, True, freq_factors=factors)
    np.testing.assert_allclose(a, b, atol=1e-6)
    atol = ROPE_ANGLE_RTOL * pos.max() * np.abs(x).max() + 1e-6
    np.testing.assert_allclose(a, rope_formula(x, pos / 4.0, 16, 500.0, True), atol=atol)


@pytest.mark.parametrize("neox, mode", [(False, GGML_ROPE_TYPE_NORMAL), (True, GGML_ROPE_TYPE_NEOX)])
def test_rope_equals_libggml_bit_for_bit(ggml, neox, mode):
    x = rng(6).standard_normal((9, 4, 128)).astype(np.float32)
    positions = np.array([0, 1, 2, 3, 40, 41, 500, 1000, 4095], dtype=np.int32)
    base = 1_000_000.0

    def build(ctx, a, pos):
        return ggml.base.ggml_rope_ext(ctx, a, pos, None, 128, mode, 0, base, 1.0, 0.0, 1.0, 0.0, 0.0)

    ref = ggml.run(build, x, positions)
    assert np.array_equal(NumpyBackend("ggml").rope(x, positions, 128, base, neox), ref)


def test_rope_angles_are_ggml_repeated_products():
    cos, sin = nx.rope_cos_sin(np.array([7]), 8, 10000.0)
    theta, expect = np.float32(7.0), []
    scale = np.float32(np.float32(10000.0) ** np.float32(-2.0 / 8))
    for _ in range(4):
        expect.append(theta)
        theta = np.float32(theta * scale)
    np.testing.assert_allclose(cos[0], np.cos(np.array(expect, np.float64)), atol=1e-7)
    np.testing.assert_allclose(sin[0], np.sin(np.array(expect, np.float64)), atol=1e-7)


# --- attention ----------------------------------------------------------------------------------------------------
def test_visible_keys_causal_and_sliding_window():
    mask = nx.visible_keys(np.array([0, 3, 6]), 7, sliding_window=0)
    assert mask.tolist() == [
        [True, False, False, False, False, False, False],
        [True, True, True, True, False, False, False],
        [True, True, True, True, True, True, True],
    ]
    swa = nx.visible_keys(np.array([0, 3, 6]), 7, sliding_window=3)  # p - j < 3
    assert swa.tolist() == [
        [True, False, False, False, False, False, False],
        [False, True, True, True, False, False, False],
        [False, False, False, False, True, True, True],
    ]


def attention_formula(q, k, v, positions, scale, window, softcap=0.0):
    """Per query and head in float64: softmax over visible keys of scale * q.k (soft-capped to
    ``softcap * tanh(s / softcap)`` where given), weights applied to v."""
    T, H, _ = q.shape
    Hkv, dv = k.shape[1], v.shape[2]
    out = np.zeros((T, H, dv))
    for t, p in enumerate(positions):
        for h in range(H):
            kh = h // (H // Hkv)
            keys = [j for j in range(k.shape[0]) if j <= p and (window == 0 or p - j < window)]
            s = np.array([scale * np.dot(q[t, h].astype(np.float64), k[j, kh]) for j in keys])
            s = softcap * np.tanh(s / softcap) if softcap else s
            w = np.exp(s - s.max())
            w /= w.sum()
            out[t, h] = sum(wi * v[j, kh].astype(np.float64) for wi, j in zip(w, keys))
    return out.reshape(T, H * dv)


@pytest.mark.parametrize("window", [0, 3])
def test_attention_gqa_causal_window_matches_formula(backend, window):
    r = rng(7)
    S, H, Hkv, d = 12, 4, 2, 16
    k = r.standard_normal((S, Hkv, d)).astype(np.float32)
    v = r.standard_normal((S, Hkv, d)).astype(np.float32)
    positions = np.arange(8, 12)  # 4 new queries after 8 cached positions
    q = r.standard_normal((4, H, d)).astype(np.float32)
    out = backend.attention(q, k, v, positions, S, 0.25, window)
    assert out.shape == (4, H * d)
    np.testing.assert_allclose(out, attention_formula(q, k, v, positions, 0.25, window), atol=ATTENTION_FORMULA_ATOL)
    # scores of a few units, against a cap of 2: the tanh bends them
    capped = backend.attention(q * np.float32(8), k, v, positions, S, 0.25, window, softcap=2.0)
    np.testing.assert_allclose(capped, attention_formula(q * np.float32(8), k, v, positions, 0.25, window, 2.0),
                               atol=ATTENTION_FORMULA_ATOL)


def test_attention_reads_only_kv_len_slots(backend):
    r = rng(8)
    k = r.standard_normal((10, 1, 8)).astype(np.float32)
    v = r.standard_normal((10, 1, 8)).astype(np.float32)
    q = r.standard_normal((1, 2, 8)).astype(np.float32)
    garbage = k.copy()
    garbage[5:] = 1e6
    a = backend.attention(q, k, v, np.array([4]), 5, 0.3)
    b = backend.attention(q, garbage, v, np.array([4]), 5, 0.3)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("ggml_numerics", [False, True])
def test_softmax_matches_libggml(ggml, ggml_numerics):
    r = rng(9)
    T, S, H = 5, 32, 3
    scores = (r.standard_normal((H, T, S)) * 4).astype(np.float32)
    visible = nx.visible_keys(np.arange(S - T, S), S, sliding_window=20)
    mask = np.where(visible, 0.0, -np.inf).astype(np.float32)
    scale = 0.125
    ref = ggml.run(lambda ctx, a, m: ggml.base.ggml_soft_max_ext(ctx, a, m, scale, 0.0), scores, mask)
    ours = NumpyBackend._softmax(np.where(visible, scores * np.float32(scale), -np.inf), ggml_numerics)
    nmse = ((ours.astype(np.float64) - ref) ** 2).sum() / (ref.astype(np.float64) ** 2).sum()
    assert nmse < SOFTMAX_VS_GGML_NMSE
    assert np.array_equal(ours == 0, ref == 0)


# --- soft-capping (Gemma 2) ---------------------------------------------------------------------------------------
FINAL_SOFTCAP = 30.0  # Gemma 2's final_logit_softcapping (its attention's is 50)


def test_softcap_equals_libggml_bit_for_bit(ggml):
    """llama.cpp's ``ggml_scale``, ``ggml_tanh`` (the C library's ``tanhf``), ``ggml_scale``, in both numerics.
    NumPy's own float32 tanh is another approximation: with it, 33% of these values differed (NumPy 2 on glibc 2.36,
    AVX2)."""
    x = np.concatenate([rng(14).standard_normal(20_000) * s for s in (0.3, 3, 30, 300)]).astype(np.float32)
    inv = float(np.float32(1.0) / np.float32(FINAL_SOFTCAP))
    b = ggml.base
    ref = ggml.run(lambda ctx, a: b.ggml_scale(ctx, b.ggml_tanh(ctx, b.ggml_scale(ctx, a, inv)), FINAL_SOFTCAP), x)
    numpy_tanh = np.tanh(x * np.float32(inv)) * np.float32(FINAL_SOFTCAP)
    assert np.count_nonzero(numpy_tanh != ref) > 0  # the inputs tell the C library's tanhf from another
    for numerics in ("f32", "ggml"):
        assert np.array_equal(NumpyBackend(numerics).softcap(x, FINAL_SOFTCAP), ref)


# --- gated activations --------------------------------------------------------------------------------------------
def test_swiglu_and_geglu_match_formulas_in_f32():
    b = NumpyBackend("f32")
    x = np.linspace(-12, 12, 1000, dtype=np.float32).reshape(2, 500)
    g = rng(10).standard_normal((2, 500)).astype(np.float32)
    x64 = x.astype(np.float64)
    silu = x64 / (1 + np.exp(-x64))
    gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64**3)))
    np.testing.assert_allclose(b.swiglu(x, g), silu * g, rtol=FLOAT32_FORMULA_RTOL, atol=1e-6)
    np.testing.assert_allclose(b.geglu(x, g), gelu * g, rtol=FLOAT32_FORMULA_RTOL, atol=1e-6)


@pytest.mark.parametrize("n_cols", [512, 500])  # 500: a row whose last 4 values take ggml's scalar path
def test_swiglu_equals_libggml_bit_for_bit(ggml, n_cols):
    x = (rng(11).standard_normal((3, n_cols)) * 6).astype(np.float32)
    g = rng(12).standard_normal((3, n_cols)).astype(np.float32)
    ref = ggml.run(lambda ctx, a, b: ggml.base.ggml_swiglu_split(ctx, a, b), x, g)
    assert np.array_equal(NumpyBackend("ggml").swiglu(x, g), ref)


def test_geglu_equals_libggml_bit_for_bit(ggml):
    x = np.concatenate([np.linspace(-12, 12, 4000), [-10.0, 10.0, -9.999, 9.999]]).astype(np.float32)[None]
    g = rng(13).standard_normal(x.shape).astype(np.float32)
    ref = ggml.run(lambda ctx, a, b: ggml.base.ggml_geglu_split(ctx, a, b), x, g)
    assert np.array_equal(NumpyBackend("ggml").geglu(x, g), ref)


def test_gelu_table_equals_libggml_table(ggml):
    table = (ctypes.c_uint16 * 65536).in_dll(ggml.cpu, "ggml_table_gelu_f16")
    ref = np.frombuffer(table, dtype=np.uint16).view(np.float16)
    ours = nx.gelu_f16_table().astype(np.float16)
    same = (ours.view(np.uint16) == ref.view(np.uint16)) | (np.isnan(ours) & np.isnan(ref))
    assert same.all()


# --- KV cache storage ---------------------------------------------------------------------------------------------
def test_kv_store_rounds_to_f16_and_views_prefix(backend):
    buf = backend.kv_alloc(8, 2, 4, "f16")
    x = rng(14).standard_normal((3, 2, 4)).astype(np.float32)
    buf = backend.kv_store(buf, 2, x)
    view = backend.kv_view(buf, 5)
    assert view.shape == (5, 2, 4) and view.dtype == np.float16
    assert np.array_equal(view[2:5], x.astype(np.float16))
    with pytest.raises(GGUFParityError, match="supported: f32, f16"):
        backend.kv_alloc(8, 2, 4, "q8_0")


def test_f16_cache_attention_rounds_operands_in_ggml_numerics():
    r = rng(15)
    k = r.standard_normal((6, 1, 8)).astype(np.float16)
    v = r.standard_normal((6, 1, 8)).astype(np.float16)
    q = r.standard_normal((1, 2, 8)).astype(np.float32)
    pos = np.array([5])
    f32 = NumpyBackend("f32").attention(q, k, v, pos, 6, 0.35)
    ggml = NumpyBackend("ggml").attention(q, k, v, pos, 6, 0.35)
    q16 = q.astype(np.float16).astype(np.float32)
    assert np.array_equal(ggml, NumpyBackend("ggml").attention(q16, k, v, pos, 6, 0.35))
    assert not np.array_equal(f32, ggml)
    np.testing.assert_allclose(f32, ggml, atol=1e-2)
