"""Weights that multiply the same input, fused at load time (a layer's Q/K/V, its FFN gate and up): one buffer, one
pass, and every part's output bit for bit what the part alone gives."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import write_tiny_model
from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_cpu import NumbaBackend
from inference_engine.backends.numba_kernels import dispatch
from inference_engine.engine import OurEngine
from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import quant_for

# Token counts that take each path: the one-token decode fast path, T mat-vecs, the tiles with a mat-vec remainder,
# 8-token K-quant blocks plus 4-token tiles.
TOKEN_COUNTS = (1, 3, 8, 19)


def tensor(rng, name: str, qtype: T, n_out: int, n_in: int) -> TensorInfo:
    raw = quant_for(qtype).random_rows(n_out, n_in, rng)
    return TensorInfo(name, qtype, (n_out, n_in), raw.nbytes, raw)


def test_runs_of_one_type_are_fused_and_others_stay_alone(rng):
    ts = [tensor(rng, "q", T.Q4_K, 512, 256), tensor(rng, "k", T.Q4_K, 256, 256), tensor(rng, "v", T.Q6_K, 256, 256)]
    packed = dispatch.pack_matrices([(t.name, t.qtype, t.raw, t.shape) for t in ts])
    assert isinstance(packed[0], dispatch.FusedMatrices) and isinstance(packed[1], dispatch.QMatrix)
    fused = packed[0]
    assert fused.matrix.n_out == 768 and [p.name for p in fused.parts] == ["q", "k"]
    assert all(np.shares_memory(p.rows, fused.matrix.rows) for p in fused.parts)  # views: one resident copy
    for part, t in zip(fused.parts, ts):
        np.testing.assert_array_equal(part.rows, np.asarray(t.raw).reshape(part.rows.shape))
    assert dispatch.pack_matrices([(t.name, t.qtype, t.raw, t.shape) for t in ts[:2]], copy=False)[0].name == "q"


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K])
@pytest.mark.parametrize("numerics", ["ggml", "f32"])
def test_matmul_many_equals_each_matmul_bit_for_bit(rng, qtype, numerics):
    fused_backend, plain_backend = NumbaBackend(numerics, 1), NumbaBackend(numerics, 1)
    plain_backend.fuse_matrices = False
    ts = [tensor(rng, name, qtype, n_out, 256) for name, n_out in (("q", 512), ("k", 256), ("v", 256))]
    fused, plain = fused_backend.load_matrices(ts), plain_backend.load_matrices(ts)
    assert len(fused_backend._fused) == 1 and not plain_backend._fused
    for n_tokens in TOKEN_COUNTS:
        x = rng.standard_normal((n_tokens, 256)).astype(np.float32)
        for got, want in zip(fused_backend.matmul_many(fused, x), plain_backend.matmul_many(plain, x), strict=True):
            np.testing.assert_array_equal(got, want)


def test_parts_still_multiply_alone_and_in_other_groupings(rng):
    backend = NumbaBackend("ggml", 1)
    q, k = backend.load_matrices([tensor(rng, "q", T.Q8_0, 64, 256), tensor(rng, "k", T.Q8_0, 32, 256)])
    x = rng.standard_normal((2, 256)).astype(np.float32)
    alone = [backend.matmul(q, x), backend.matmul(k, x)]
    for got, want in zip(backend.matmul_many((q, k), x), alone, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(backend.matmul_many((k, q), x), alone[::-1], strict=True):  # not the fused order
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(backend.matmul_many((q,), x)[0], alone[0])  # a run cut short


def test_a_prefill_quantizes_its_input_once_for_the_weights_it_meets(rng, monkeypatch):
    """Beyond FUSED_MAX_TOKENS each weight multiplies alone, but the integer kernels' quantized activation is made
    once per activation type (Q4_K and Q6_K both read Q8_K; Q8_0 its own), with each weight's bits unchanged."""
    from inference_engine.backends.numba_cpu import FUSED_MAX_TOKENS
    from inference_engine.backends.numba_kernels.ops import activations

    backend = NumbaBackend("ggml", 2)
    ws = backend.load_matrices([tensor(rng, "q", T.Q4_K, 256, 256), tensor(rng, "k", T.Q4_K, 256, 256),
                                tensor(rng, "v", T.Q6_K, 128, 256), tensor(rng, "o", T.Q8_0, 64, 256)])
    x = rng.standard_normal((FUSED_MAX_TOKENS + 9, 256)).astype(np.float32)
    alone = [backend.matmul(w, x) for w in ws]
    kinds = []
    real = activations.quantize_int
    monkeypatch.setattr(activations, "quantize_int", lambda x, kind: kinds.append(kind) or real(x, kind))
    for got, want in zip(backend.matmul_many(ws, x), alone, strict=True):
        np.testing.assert_array_equal(got, want)
    assert kinds == ["q8_K", "q8_0"]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_whole_models_give_the_same_logits_fused_or_not(tmp_path, arch, monkeypatch):
    path = write_tiny_model(tmp_path / f"{arch}.gguf", arch, "Q4_K", tensor_types={"attn_v": "Q6_K"})
    ids = [1, 5, 9, 3, 7, 2, 8, 4, 6, 10]
    logits = {}
    for fuse in (True, False):
        monkeypatch.setattr(NumbaBackend, "fuse_matrices", fuse)
        engine = OurEngine(path, backend="numba", numerics="ggml", n_ctx=32, n_threads=1, kv_type="f16")
        assert bool(engine.backend._fused) == fuse
        logits[fuse] = [engine.prefill(ids[:7])] + [engine.decode(t) for t in ids[7:]]
    for got, want in zip(logits[True], logits[False], strict=True):
        np.testing.assert_array_equal(got, want)
