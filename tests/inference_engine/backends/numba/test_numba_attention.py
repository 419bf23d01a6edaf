"""Prefill attention (``ops.attention_blocked``) gives the same bits as the per-row kernel ``ops.attention``.

``ops.attention`` is the kernel the NumPy reference and libggml comparisons pin (test_numba_backend.py,
validation); the blocked form only rearranges the work (token blocks x query heads of one KV head, four rows per
key / value load, vector exponentials), so every output must be bit-identical, in both numerics, both ggml exp
flavours, F16 and F32 K/V, with sliding windows, odd head sizes, query rows that are not a multiple of four, and
probabilities that underflow to zero (which the sum over values skips).
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.backends import numerics as nx
from inference_engine.backends.numba_cpu import BLOCKED_ATTENTION_TOKENS, NumbaBackend
from inference_engine.backends.numba_kernels import ops

# (tokens, query heads, KV heads, head dim k, head dim v, cached prefix, sliding window)
SHAPES = [
    (37, 6, 2, 64, 64, 5, 0),  # group 6: quads across tokens; a last block of 5 tokens
    (19, 4, 1, 40, 24, 0, 7),  # head dims with a tail past the last 16 lanes; window
    (24, 9, 3, 128, 128, 40, 0),  # SmolLM2's head shape after a cached prefix
    (10, 2, 2, 16, 33, 3, 4),  # group 1: rows of one head; dv tail
    (9, 3, 3, 48, 48, 0, 0),  # odd rows per item
    (6, 4, 2, 80, 80, 30, 0),  # a decode-shaped item's four-vector pass over the values, then one more vector
]
# (numerics is ggml, exp flavour is AVX-512's scalef)
NUMERICS = [(False, False), (True, False), (True, True)]


def _rows(a: np.ndarray, kv_len: int) -> np.ndarray:
    return np.ascontiguousarray(a[:kv_len]).view(np.uint8).reshape(kv_len, -1)


def _both(q, k, v, positions, kv_len, window, ggml, scalef):
    f16 = k.dtype == np.float16
    results = []
    for kernel in (ops.attention, ops.attention_blocked):
        out = np.full((q.shape[0], q.shape[1] * v.shape[2]), np.nan, np.float32)
        args = (_rows(k, kv_len), _rows(v, kv_len), positions, kv_len, np.float32(0.09), window)
        kernel(q, *args, ggml, scalef, f16, out)
        results.append(out)
    return results


def _assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    assert not np.isnan(b).any() or np.array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kv_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("ggml, scalef", NUMERICS)
def test_blocked_attention_is_bit_identical(rng, shape, kv_dtype, ggml, scalef):
    n_tokens, n_head, n_head_kv, dk, dv, prefix, window = shape
    kv_len = prefix + n_tokens
    q = (rng.standard_normal((n_tokens, n_head, dk)) * 2).astype(np.float32)
    k = rng.standard_normal((kv_len, n_head_kv, dk)).astype(kv_dtype)
    v = rng.standard_normal((kv_len, n_head_kv, dv)).astype(kv_dtype)
    positions = np.arange(prefix, kv_len)
    if window:
        positions = rng.permutation(positions)  # rows of a block need not be in order
    _assert_same_bits(*_both(q, k, v, positions, kv_len, window, ggml, scalef))


@pytest.mark.parametrize("ggml, scalef", NUMERICS)
def test_zero_probabilities_are_skipped_as_before(rng, ggml, scalef):
    """Scores far apart: probabilities underflow to 0; the per-row kernel skips those terms of ``p . v``, so an inf
    in a value row that every query gives probability 0 must leave the outputs finite, in both kernels."""
    n_tokens, n_head, n_head_kv, d = 16, 8, 2, 32
    base = rng.standard_normal(d)  # every query leans this way; key 5 points the other way
    q = ((rng.standard_normal((n_tokens, n_head, d)) + 3 * base) * 40).astype(np.float32)
    for kv_dtype in (np.float16, np.float32):
        k = rng.standard_normal((n_tokens, n_head_kv, d))
        k[5, 0] = -base
        k = k.astype(kv_dtype)
        v = rng.standard_normal((n_tokens, n_head_kv, d)).astype(kv_dtype)
        # float64 scores of KV head 0's query heads; a key every query that sees it scores > 120 below its best
        scores = np.einsum("thd,jd->thj", q[:, : n_head // n_head_kv].astype(np.float64), k[:, 0].astype(np.float64))
        scores = np.where(np.tril(np.ones((n_tokens, n_tokens), bool))[:, None], scores * 0.09, -np.inf)
        gap = scores.max(axis=-1, keepdims=True) - scores
        ignored = [j for j in range(1, n_tokens) if np.all(gap[j:, :, j] > 120.0)]
        assert ignored, "the data should give some key probability 0 in every query"
        v[ignored[0], 0, 0] = np.inf
        reference, blocked = _both(q, k, v, np.arange(n_tokens), n_tokens, 0, ggml, scalef)
        _assert_same_bits(reference, blocked)
        assert np.all(np.isfinite(reference))


@pytest.mark.parametrize("simd", ["avx2", "avx512"])
@pytest.mark.parametrize("numerics", ["ggml", "f32"])
def test_the_backend_takes_the_blocked_kernel_for_prefill(rng, threads, numerics, simd):
    """From BLOCKED_ATTENTION_TOKENS query tokens on the backend runs the blocked kernel; on two threads too."""
    n_tokens = BLOCKED_ATTENTION_TOKENS + 3
    q = rng.standard_normal((n_tokens, 6, 64)).astype(np.float32)
    k = rng.standard_normal((n_tokens, 2, 64)).astype(np.float16)
    v = rng.standard_normal((n_tokens, 2, 64)).astype(np.float16)
    positions = np.arange(n_tokens)
    nx.set_ggml_simd(simd)
    try:
        with threads(2):
            got = NumbaBackend(numerics).attention(q, k, v, positions, n_tokens, 0.09)
        reference, _ = _both(q, k, v, positions, n_tokens, 0, numerics == "ggml", simd == "avx512")
    finally:
        nx.set_ggml_simd(None)
    _assert_same_bits(reference, got)


# --- a decoded token's attention in one call (NumbaBackend.decode_attention -> ops.rope_attention) ----------------
# (query heads, KV heads, head dim, RoPE: n_dims, neox, with Llama 3 frequency factors; query scale, window, position)
DECODE_CASES = [
    (9, 3, 64, 64, False, False, None, 0, 11),  # SmolLM2's head layout: NORM RoPE, no query scale
    (4, 1, 32, 24, False, True, None, 0, 0),  # a first position; partial rotation; rope_freqs
    (8, 2, 48, 48, True, False, 0.0625, 5, 17),  # Gemma 3's local layer: NEOX, query scale, sliding window
    (6, 6, 40, 40, True, False, 0.125, 0, 30),  # group 1
]


@pytest.mark.parametrize("case", DECODE_CASES)
@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("numerics", ["ggml", "f32"])
def test_decode_attention_is_the_ops_one_by_one(rng, case, kv_type, numerics):
    """RoPE, the query scale, the cache write and attention in one compiled call give the output and the cache rows
    of the backend's ops one by one (rope, scale, KVCache.update, attention), bit for bit; rows past the token's
    stay untouched."""
    from inference_engine.kv_cache import KVCache

    n_head, n_head_kv, d, n_dims, neox, factors, q_scale, window, position = case
    rope = {"n_dims": n_dims, "freq_base": 10000.0, "neox": neox, "freq_scale": 0.5 if factors else 1.0,
            "freq_factors": rng.uniform(1.0, 8.0, n_dims // 2).astype(np.float32) if factors else None}
    backend = NumbaBackend(numerics)
    caches = [KVCache(backend, [(n_head_kv, d, d)], 64, kv_type) for _ in range(2)]
    history = rng.standard_normal((position, n_head_kv, d)).astype(np.float32)
    for cache in caches:  # the same earlier positions in both
        cache.update(0, 0, history, -history)
    q = rng.standard_normal((1, n_head, d)).astype(np.float32)
    k, v = rng.standard_normal((2, 1, n_head_kv, d)).astype(np.float32)
    positions = np.array([position])
    fused = backend.decode_attention(caches[0], 0, q, k, v, positions, rope, 0.09, q_scale, window)
    qr, kr = backend.rope(q, positions, **rope), backend.rope(k, positions, **rope)
    if q_scale is not None:
        qr = backend.scale(qr, q_scale)
    k_all, v_all = caches[1].update(0, position, kr, v)
    one_by_one = backend.attention(qr, k_all, v_all, positions, position + 1, 0.09, window)
    _assert_same_bits(fused, one_by_one)
    for a, b in ((caches[0].k[0], caches[1].k[0]), (caches[0].v[0], caches[1].v[0])):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_decode_attention_declines_what_it_does_not_fuse(rng):
    """More than one token, a position past the cache or a cache that is not a plain KVCache: None (the caller runs
    the ops, and their errors)."""
    from inference_engine.kv_cache import KVCache

    backend = NumbaBackend("ggml")
    cache = KVCache(backend, [(2, 16, 16)], 8, "f16")
    rope = {"n_dims": 16, "freq_base": 10000.0, "neox": False}
    q, k = rng.standard_normal((2, 2, 4, 16)).astype(np.float32), rng.standard_normal((2, 2, 2, 16)).astype(np.float32)
    assert backend.decode_attention(cache, 0, q, k, k, np.arange(2), rope, 0.1) is None
    assert backend.decode_attention(cache, 0, q[:1], k[:1], k[:1], np.array([8]), rope, 0.1) is None

    class OtherCache(KVCache):
        pass

    other = OtherCache(backend, [(2, 16, 16)], 8, "f16")
    assert backend.decode_attention(other, 0, q[:1], k[:1], k[:1], np.array([0]), rope, 0.1) is None
