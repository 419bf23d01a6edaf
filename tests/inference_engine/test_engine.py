"""OurEngine: the Engine protocol over tiny fixture models (numbers against llama.cpp are in tests/.../models/).

Prefill of N tokens must give the logits of N single-token decode steps: the forward pass is the same math row by
row, and the only thing allowed to differ is float32 summation order between BLAS's matrix-matrix and
matrix-vector paths.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.engine import OurEngine, load_engine
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.protocol import Engine

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

# Batched (gemm) vs one-row (gemv) BLAS products sum in different orders: ~1e-7 relative per op, a few 1e-6 of the
# logit scale after the tiny models' layers (measured: at most 2.3e-6 of max |logit| over every architecture in
# F32 / Q4_K / Q8_0 / F16). Only f32 numerics with an F32 KV cache are compared this way: anything that re-rounds
# intermediates (ggml numerics' activation quantization, an F16 cache) turns a 1e-7 difference into an occasional
# whole rounding step, which is a property of those numerics, not of prefill vs decode.
PREFILL_DECODE_RTOL = 1e-5
# An F16 KV cache keeps 11 significant bits: K and V move by up to 2**-11 relative, which moves the tiny models'
# logits by ~1e-3 of their scale; 5e-3 leaves room, and a cache that dropped or misplaced positions is off by O(1).
F16_KV_LOGIT_RTOL = 5e-3


def random_ids(engine: OurEngine, n: int, seed: int = 0) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, engine.n_vocab, n)]


def logit_scale(logits: np.ndarray) -> float:
    return float(np.abs(logits).max())


@pytest.mark.parametrize("qtype", ["F32", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_equals_single_token_decode_steps(tiny_model, arch, qtype):
    engine = OurEngine(tiny_model(arch, qtype), numerics="f32", n_ctx=64, kv_type="f32")
    ids = random_ids(engine, 12)
    batched = engine.capture(ids, names=["result_output"])["result_output"]  # (12, n_vocab): every position
    engine.reset()
    stepped = np.stack([engine.decode(t) for t in ids])
    engine.reset()
    last = engine.prefill(ids)
    scale = logit_scale(batched)
    np.testing.assert_allclose(stepped, batched, rtol=0, atol=PREFILL_DECODE_RTOL * scale)
    np.testing.assert_allclose(last, batched[-1], rtol=0, atol=PREFILL_DECODE_RTOL * scale)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefill_in_chunks_continues_the_cache(tiny_model, arch):
    engine = OurEngine(tiny_model(arch), n_ctx=64)
    ids = random_ids(engine, 10, seed=1)
    full = engine.capture(ids, names=["result_output"])["result_output"]
    engine.reset()
    engine.prefill(ids[:4])
    assert engine.n_past == 4
    middle = engine.prefill(ids[4:7])
    last = engine.prefill(ids[7:])
    assert engine.n_past == 10
    atol = PREFILL_DECODE_RTOL * logit_scale(full)
    np.testing.assert_allclose(middle, full[6], rtol=0, atol=atol)
    np.testing.assert_allclose(last, full[9], rtol=0, atol=atol)


def test_reset_starts_over(tiny_model):
    engine = OurEngine(tiny_model("qwen3"), n_ctx=32)
    ids = random_ids(engine, 6, seed=2)
    first = engine.prefill(ids)
    engine.decode(5)
    engine.reset()
    assert engine.n_past == 0
    assert np.array_equal(engine.prefill(ids), first)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: sliding-window layers keep every position too
def test_rewind_leaves_the_cache_as_a_fresh_prefill_of_the_prefix(tiny_model, arch):
    engine = OurEngine(tiny_model(arch), n_ctx=32)
    ids = random_ids(engine, 12, seed=3)
    engine.reset()
    engine.prefill(ids[:7])
    fresh = engine.prefill(ids[7:])  # the same two batches as below (a batch's size may change its rounding)
    engine.reset()
    engine.prefill(ids[:7])
    engine.prefill(random_ids(engine, 9, seed=4))  # what a sample appends after its depth
    assert engine.rewind(7) and engine.n_past == 7
    assert np.array_equal(engine.prefill(ids[7:]), fresh)
    assert not engine.rewind(13) and engine.n_past == 12  # more than it holds: refused, nothing changed


def test_engine_follows_the_protocol(tiny_model):
    path = tiny_model("llama", "Q8_0")
    engine = OurEngine(path, numerics="ggml", n_ctx=32, n_threads=1)
    assert isinstance(engine, Engine)
    assert engine.name == "ours:numpy"
    info = engine.model_info
    for key in (
        "file",
        "sha256",
        "arch",
        "quant",
        "n_params",
        "backend",
        "backend_description",
        "numerics",
        "kv_type",
        "n_ctx",
        "threads",
        "versions",
    ):
        assert key in info, key
    assert info["arch"] == "llama" and info["quant"] == "Q8_0" and info["numerics"] == "ggml"
    assert info["sha256"] == open_gguf(path).sha256
    assert info["n_ctx"] == 32 and info["threads"] == 1 and "numpy" in info["versions"]
    assert set(engine.load_timings) == {"gguf_open_s", "weights_ready_s"}
    assert all(v >= 0 for v in engine.load_timings.values())
    logits = engine.prefill([1, 2, 3])
    assert logits.shape == (engine.n_vocab,) and logits.dtype == np.float32


def test_capture_shapes_follow_the_protocol(tiny_model):
    engine = OurEngine(tiny_model("gemma3"), n_ctx=32)
    hp = engine.model.hp
    captured = engine.capture([5, 6, 7, 8])
    T = 4
    assert captured["embd"].shape == (T, hp.n_embd)
    assert captured["inp_scaled"].shape == (T, hp.n_embd)
    assert captured["Qcur-0"].shape == (T, hp.n_head, hp.head_dim_k)
    assert captured["Kcur_normed-0"].shape == (T, hp.n_head_kv, hp.head_dim_k)
    assert captured["kqv_out-0"].shape == (T, hp.n_head * hp.head_dim_v)
    assert captured["ffn_geglu-0"].shape == (T, hp.n_ff)
    assert captured[f"l_out-{hp.n_layer - 1}"].shape == (T, hp.n_embd)  # all rows kept when capturing
    assert captured["result_output"].shape == (T, engine.n_vocab)
    only = engine.capture([5, 6, 7, 8], names=["result_norm", "no-such-name"])
    assert set(only) == {"result_norm"}
    assert np.array_equal(only["result_norm"], captured["result_norm"])
    assert engine.n_past == 4  # capture leaves the prompt in the cache, as prefill does


# --- teacher forcing: capture(ids, force=...) ------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_forcing_our_own_values_changes_nothing(tiny_model, arch):
    """Every tap hands on a value of the right shape at the right place: forced with its own tensors, the engine
    computes exactly what it computes free-running (llama.cpp-side numbers are in tests/.../models/)."""
    engine = OurEngine(tiny_model(arch, "Q4_K"), numerics="ggml", n_ctx=32)
    ids = random_ids(engine, 6)
    free = engine.capture(ids)
    forced = engine.capture(ids, force=free)
    assert forced.keys() == free.keys()
    assert all(np.array_equal(forced[name], free[name]) for name in free)


@pytest.mark.parametrize("arch", ("llama", "gemma3"))
def test_a_forced_value_flows_on_and_ours_is_recorded(tiny_model, arch):
    engine = OurEngine(tiny_model(arch), n_ctx=32)
    ids = random_ids(engine, 5)
    free = engine.capture(ids)
    residual = np.random.default_rng(3).standard_normal(free["l_out-0"].shape).astype(np.float32)
    forced = engine.capture(ids, force={"l_out-0": residual})
    assert np.array_equal(forced["l_out-0"], free["l_out-0"])  # what we computed, not what was forced
    layer1, b, hp = engine.model.layers[1], engine.backend, engine.model.hp
    expected = b.to_numpy(b.rms_norm(b.from_numpy(residual), layer1.attn_norm, hp.rms_eps))
    assert np.array_equal(forced["attn_norm-1"], expected)  # layer 1 reads the forced residual stream
    assert not np.array_equal(forced["result_output"], free["result_output"])


def test_forced_k_and_v_are_what_the_cache_holds(tiny_model):
    engine = OurEngine(tiny_model("qwen2"), n_ctx=32)
    ids = random_ids(engine, 4)
    free = engine.capture(ids)
    rng = np.random.default_rng(5)
    k = rng.standard_normal(free["Kcur-1"].shape).astype(np.float32)
    v = rng.standard_normal(free["Vcur-1"].shape).astype(np.float32)
    forced = engine.capture(ids, force={"Kcur-1": k, "Vcur-1": v})
    b = engine.backend
    assert np.array_equal(b.to_numpy(b.kv_view(engine.cache.k[1], len(ids))), k)
    assert np.array_equal(b.to_numpy(b.kv_view(engine.cache.v[1], len(ids))), v)
    assert np.array_equal(forced["Qcur-1"], free["Qcur-1"])
    assert not np.array_equal(forced["kqv_out-1"], free["kqv_out-1"])  # attention read the forced K and V


def test_forced_arrays_are_reshaped_to_ours(tiny_model):
    """llama.cpp's capture drops leading size-1 axes (a one-token prompt's attn_norm is (n_embd,)): forcing takes
    any array with our element count; one that does not fit is a one-line error."""
    engine = OurEngine(tiny_model("qwen3"), n_ctx=16)
    free = engine.capture([7])
    squeezed = {name: a.reshape(a.shape[1:]) for name, a in free.items()}
    forced = engine.capture([7], force=squeezed)
    assert all(np.array_equal(forced[name], free[name]) for name in free)
    with pytest.raises(GGUFParityError, match="forced tensor Vcur-0 has shape"):
        engine.capture([7], force={"Vcur-0": np.zeros(3, dtype=np.float32)})
    with pytest.raises(GGUFParityError, match="force must map tensor names to arrays"):
        engine.capture([7], force=[("Vcur-0", free["Vcur-0"])])


def test_prompt_longer_than_context_is_refused(tiny_model):
    engine = OurEngine(tiny_model("llama"), n_ctx=8)
    with pytest.raises(GGUFParityError, match="prompt of 9 tokens does not fit the context of 8"):
        engine.prefill(list(range(3, 12)))
    engine.prefill(list(range(3, 11)))
    with pytest.raises(GGUFParityError, match="do not fit the context of 8"):
        engine.decode(3)


@pytest.mark.parametrize(
    "ids, needle",
    [
        ([], "empty prompt"),
        ([1, -1], "not in this model's vocabulary"),
        ([1, 10**9], "not in this model's vocabulary"),
        ([True], "not in this model's vocabulary"),
    ],
)
def test_bad_token_ids_are_refused(tiny_model, ids, needle):
    engine = OurEngine(tiny_model("llama"), n_ctx=8)
    with pytest.raises(GGUFParityError, match=needle):
        engine.prefill(ids)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"backend": "cuda"}, "unknown backend 'cuda'"),
        ({"numerics": "f64"}, "unknown numerics 'f64'"),
        ({"kv_type": "q8_0"}, "unknown KV cache type 'q8_0'"),
        ({"n_ctx": 0}, "context size must be a positive integer"),
        ({"n_threads": 0}, "--threads must be at least 1"),
    ],
)
def test_bad_settings_are_refused(tiny_model, kwargs, needle):
    with pytest.raises(GGUFParityError, match=needle):
        OurEngine(tiny_model("llama"), **kwargs)


def test_bad_model_files_are_refused(bad_model_files):
    for kind in ("truncated", "unknown_arch", "not_gguf", "empty", "directory", "missing"):
        with pytest.raises(GGUFParityError):
            OurEngine(bad_model_files[kind])


def test_load_engine_resolves_paths_and_names(tiny_model):
    engine = load_engine(str(tiny_model("qwen2")), n_ctx=16, progress=False)
    assert engine.gguf.architecture == "qwen2"
    with pytest.raises(GGUFParityError, match="unknown model"):
        load_engine("no-such-model-name", progress=False)


def test_tokenize_and_detokenize_use_the_gguf_vocabulary(tiny_model):
    engine = OurEngine(tiny_model("llama"), n_ctx=16)
    ids = engine.tokenize("hello world", add_bos=False)
    assert ids and engine.detokenize(ids) == "hello world"


def test_f16_kv_cache_stays_close_to_f32(tiny_model):
    path = tiny_model("qwen2")
    ids = [7, 8, 9, 10, 11]
    f32 = OurEngine(path, kv_type="f32", n_ctx=16).prefill(ids)
    f16 = OurEngine(path, kv_type="f16", n_ctx=16).prefill(ids)
    assert OurEngine(path, kv_type="f16", n_ctx=16).model_info["kv_type"] == "f16"
    np.testing.assert_allclose(f16, f32, rtol=0, atol=F16_KV_LOGIT_RTOL * logit_scale(f32))
    assert not np.array_equal(f16, f32)
