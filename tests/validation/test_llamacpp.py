"""llama.cpp as a reference engine: ggml tensor reading, graph capture, prefill/decode, tokenizer, user errors.

The unit tests build ggml tensors with libggml itself (no model). The ``slow`` tests run the two real models and
hold the engine up against llama-cpp-python's own high-level ``Llama`` and against llama.cpp's graph arithmetic.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from inference_engine.errors import GGUFParityError
from validation import ggml_ctypes as g
from validation.free_running import KV_F16_PLAIN
from validation.llamacpp import LlamaCppEngine, is_graph_name
from validation.metrics import logit_metrics

# Same library, same graph, same kernels, same thread count: the engine must reproduce llama-cpp-python's
# high-level API bit for bit. Any difference means a setting differs.
HIGH_LEVEL_LOGIT_ATOL = 0.0

# The capture context computes node by node (which turns off the CPU backend's RMS_NORM+MUL fusion) with every
# row kept to the end; the run context computes fused whole graphs and keeps only the last row in the last layer.
# The fused kernel multiplies in the same order as the two separate ops, and SmolLM2's Q4_1 / Gemma's matmuls give
# each row the same arithmetic whatever rows sit beside it in the graph, so the last row must be bit-identical.
CAPTURE_VS_RUN_LOGIT_ATOL = 0.0

# Decoding the last token alone, after a prefill of the others, against one prefill of all of them. Measured 0.0
# here for SmolLM2 (Q4_1 weights go through ggml_vec_dot_q4_1_q8_1, one row at a time, whatever the batch). The
# allowance is for CPUs whose kernels pair rows (ARM i8mm vec_dot with nrows=2), which reorders float sums:
# 1e-3 on logits of magnitude ~20 is a relative 5e-5, far below any model-level difference.
BATCH_SPLIT_LOGIT_ATOL = 1e-3

PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"
# One thread: every output element is computed by one thread whatever the count (ggml splits matmuls by rows), so
# results do not depend on it, and on a shared, oversubscribed 2-core machine OpenMP's spinning barriers make two
# threads up to 40x slower (measured: a 14-token prefill took 10.6 s with 2 threads, 0.26 s with 1).
N_THREADS = 1


# --- ggml tensor reading (no model) ------------------------------------------------------------------------------
def test_ctypes_struct_matches_this_libggml():
    g.check_layout()
    assert ctypes.sizeof(g.GGMLTensor) == g.libggml_base().ggml_tensor_overhead() - g.GGML_OBJECT_SIZE
    assert g.GGMLTensor.ne.offset == 16 and g.GGMLTensor.nb.offset == 48 and g.GGMLTensor.name.offset == 256


def test_reads_contiguous_and_transposed_f32():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    with g.GGMLScratch() as s:
        a = s.new_tensor(g.GGML_TYPE_F32, (4, 3), name="a")
        s.fill(a, x)
        header = g.read_header(a)
        assert (header.name, header.type_name, header.ne, header.contiguous) == ("a", "f32", (4, 3, 1, 1), True)
        assert header.numpy_shape == (3, 4)
        np.testing.assert_array_equal(g.tensor_to_numpy(a).reshape(3, 4), x)
        t = s.lib.ggml_transpose(s.ctx, a)
        assert not g.read_header(t).contiguous
        np.testing.assert_array_equal(g.tensor_to_numpy(t).reshape(4, 3), x.T)


def test_reads_permuted_f16_and_offset_view():
    rng = np.random.default_rng(0)
    y = rng.standard_normal((4, 3, 2)).astype(np.float16)  # ggml ne = (2, 3, 4)
    with g.GGMLScratch() as s:
        b = s.new_tensor(g.GGML_TYPE_F16, (2, 3, 4))
        s.fill(b, y)
        # ggml_permute(b, 2, 0, 1, 3): source axis i goes to position axis_i -> ne = (3, 4, 2)
        p = s.lib.ggml_permute(s.ctx, b, 2, 0, 1, 3)
        assert g.read_header(p).numpy_shape == (2, 4, 3)
        np.testing.assert_array_equal(g.tensor_to_numpy(p).reshape(2, 4, 3), np.transpose(y, (2, 0, 1)))
        # rows of 2 elements, 12 bytes apart, starting 4 bytes in: the pairs 1, 4, 7 of the flat array
        v = s.lib.ggml_view_2d(s.ctx, b, 2, 3, 12, 4)
        np.testing.assert_array_equal(g.tensor_to_numpy(v).reshape(3, 2), y.reshape(-1, 2)[[1, 4, 7]])


def test_reads_bf16_as_float32():
    x = np.array([1.5, -2.25, 0.0078125, -0.0, 2.0**100], dtype=np.float32)  # all exact in bf16
    with g.GGMLScratch() as s:
        c = s.new_tensor(g.GGML_TYPE_BF16, (5,))
        s.fill(c, (x.view(np.uint32) >> 16).astype(np.uint16))
        np.testing.assert_array_equal(g.tensor_to_numpy(c).reshape(5), x)


def test_non_float_tensor_is_skipped():
    with g.GGMLScratch() as s:
        i = s.new_tensor(26, (4,))  # GGML_TYPE_I32: positions, token ids
        assert g.tensor_to_numpy(i) is None


def test_shape_convention_drops_only_leading_ones():
    assert g.drop_leading_ones((1, 1, 5, 576)) == (5, 576)
    assert g.drop_leading_ones((1, 6, 1, 256)) == (6, 1, 256)
    assert g.drop_leading_ones((1, 1, 1, 1)) == (1,)


def test_graph_name_filter():
    for name in ("attn_norm-3", "Qcur-0", "Qcur_normed-12", "result_output", "embd", "inp_embd", "norm"):
        assert is_graph_name(name), name
    for name in ("Qcur-0 (reshaped)", "cache_k_l0 (view)", "node_1073", "leaf_4", "", "CPU#embd#0"):
        assert not is_graph_name(name), name


# --- user errors (no model needed) -----------------------------------------------------------------------------
def test_missing_file(tmp_path):
    with pytest.raises(GGUFParityError, match="no such file"):
        LlamaCppEngine(tmp_path / "absent.gguf")


def test_directory(tmp_path):
    with pytest.raises(GGUFParityError, match="is a directory"):
        LlamaCppEngine(tmp_path)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(GGUFParityError, match="file is empty"):
        LlamaCppEngine(path)


def test_not_gguf(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(GGUFParityError, match="not a GGUF file"):
        LlamaCppEngine(path)


def test_gguf_llamacpp_cannot_load_names_file_and_reason(tmp_path):
    import gguf

    path = tmp_path / "no-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_context_length(16)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFParityError) as info:
        LlamaCppEngine(path)
    message = str(info.value)
    assert str(path) in message and "llama.cpp could not load" in message and "tokenizer.ggml.model" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"kv_type": "q8_0"}, "unsupported KV cache type 'q8_0'; supported: f32, f16"),
        ({"flash_attn": "maybe"}, "unsupported flash attention setting 'maybe'; supported: on, off, auto"),
        ({"n_ctx": 0}, "n_ctx must be a positive integer"),
        ({"n_threads": -1}, "n_threads must be a positive integer"),
        ({"n_batch": 2.5}, "n_batch must be a positive integer"),
    ],
)
def test_bad_settings(tmp_path, kwargs, pattern):
    with pytest.raises(GGUFParityError, match=pattern.replace("(", r"\(").replace(")", r"\)")):
        LlamaCppEngine(tmp_path / "whatever.gguf", **kwargs)


def test_rewind_leaves_the_cache_as_a_fresh_prefill_of_the_prefix(tiny_model):
    with LlamaCppEngine(tiny_model("llama"), n_ctx=64, n_threads=1) as engine:
        ids = [(7 * i) % 200 + 20 for i in range(12)]
        engine.reset()
        engine.prefill(ids[:7])
        fresh = engine.prefill(ids[7:])
        engine.reset()
        engine.prefill(ids[:7] + [(11 * i) % 150 + 30 for i in range(9)])
        assert engine.rewind(7) and engine.n_past == 7
        # the freed cells are refilled in order, so llama.cpp computes exactly what a fresh prefill computes
        np.testing.assert_array_equal(engine.prefill(ids[7:]), fresh)
        assert not engine.rewind(13) and engine.n_past == 12


def test_rewind_is_refused_on_a_sliding_window_model(tiny_model):
    """llama.cpp's sliding-window cache evicts positions that a rewound cache would need back."""
    with LlamaCppEngine(tiny_model("gemma3"), n_ctx=64, n_threads=1) as engine:
        engine.prefill([20 + i for i in range(10)])
        assert not engine.rewind(4) and engine.n_past == 10


@pytest.mark.parametrize("kv_type, flash_attn, expected", [
    ("f32", "off", {"flash attention on": ("f32", "on"), KV_F16_PLAIN: ("f16", "off")}),
    ("f32", "on", {"flash attention off": ("f32", "off"), KV_F16_PLAIN: ("f16", "off")}),
    ("f16", "off", {"flash attention on": ("f16", "on")}),  # its cache is F16 already: one draw left
])
def test_rounding_variants_change_only_attention_rounding(tiny_model, kv_type, flash_attn, expected):
    ids = [(7 * i) % 200 + 20 for i in range(12)]
    with LlamaCppEngine(tiny_model("llama", "Q8_0"), n_ctx=64, n_threads=1, kv_type=kv_type,
                        flash_attn=flash_attn) as ref:
        base = ref.capture(ids, names=["result_output"])["result_output"]
        variants = ref.rounding_variants()
        try:
            assert {label: (v.kv_type, v.flash_attn_resolved) for label, v in variants.items()} == expected
            for variant in variants.values():
                assert (variant.n_threads, variant.n_batch, variant.n_ctx) == (ref.n_threads, ref.n_batch, ref.n_ctx)
                kld = logit_metrics(variant.capture(ids, names=["result_output"])["result_output"], base)["kld_mean"]
                # a draw of rounding noise: a change (0 would draw nothing), and a small one (measured 1.3e-4 to
                # 1.5e-4 here; a permuted weight gives KLD of order 1, validation.free_running)
                assert 0 < kld < 1e-2
        finally:
            for variant in variants.values():
                variant.close()


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_variants_share_the_loaded_model_and_compute_what_their_own_copy_does(tiny_model, qtype):
    """The rounding variants and a context-only variant compute with the reference's loaded model: every captured
    tensor equal bit for bit to an engine that loaded the file itself; the model outlives the reference while a
    variant uses it and is freed with the last of them."""
    path, ids = tiny_model("llama", qtype), [(7 * i) % 200 + 20 for i in range(12)]
    ref = LlamaCppEngine(path, n_ctx=64, n_threads=1)
    variants = {**ref.rounding_variants(), "f16 cache": ref.variant(kv_type="f16")}
    loaded = ref._loaded
    assert all(v._loaded is loaded for v in variants.values()) and loaded.users == 1 + len(variants)
    ref.close()  # first: the variants go on computing with the model
    for label, variant in variants.items():
        with LlamaCppEngine(path, n_ctx=64, n_threads=1, kv_type=variant.kv_type,
                            flash_attn=variant.flash_attn) as alone:
            assert alone._loaded is not loaded
            got, expected = variant.capture(ids), alone.capture(ids)
            assert got.keys() == expected.keys() and all(np.array_equal(got[n], expected[n]) for n in got), label
    for variant in variants.values():
        assert loaded.handle is not None
        variant.close()
    assert loaded.users == 0 and loaded.handle is None


def test_a_weight_type_variant_loads_its_own_copy_and_a_mismatched_share_is_refused(tiny_model, tmp_path,
                                                                                    monkeypatch):
    monkeypatch.setenv("GGUF_PARITY_CACHE", str(tmp_path / "cache"))
    path, other = tiny_model("llama", "Q8_0"), tiny_model("llama", "Q8_0", seed=1)
    with LlamaCppEngine(path, n_ctx=64, n_threads=1) as ref:
        with ref.variant(weight_type="F32") as f32:
            assert f32._loaded is not ref._loaded and f32.path != ref.path
        with pytest.raises(ValueError, match="cannot share the model"):
            LlamaCppEngine(other, n_ctx=64, n_threads=1, sharing=ref)
        with pytest.raises(ValueError, match="cannot share the model"):
            LlamaCppEngine(path, n_ctx=64, n_threads=1, extra_bufts=True, sharing=ref)
        assert ref._loaded.users == 1


# --- SmolLM2 (llama architecture) --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_path():
    from inference_engine.store.named_models import fetch

    return fetch("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with LlamaCppEngine(smollm2_path, n_ctx=256, n_threads=N_THREADS) as engine:
        yield engine


@pytest.fixture(scope="module")
def smollm2_capture(smollm2):
    ids = smollm2.tokenize(PROMPT)
    return ids, dict(smollm2.capture(ids))


@pytest.mark.slow
def test_prefill_equals_high_level_llama(smollm2, smollm2_path, monkeypatch):
    import llama_cpp
    import llama_cpp.llama as high_level

    # The high-level Llama cannot set use_extra_bufts; on a CPU that reports AMX but cannot run its tile kernels
    # (this build machine) its default would crash the process on the first prompt. Give it the engine's setting.
    default_params = high_level.llama_cpp.llama_model_default_params

    def model_params_without_extra_bufts():
        params = default_params()
        params.use_extra_bufts = False
        return params

    monkeypatch.setattr(high_level.llama_cpp, "llama_model_default_params", model_params_without_extra_bufts)
    llm = llama_cpp.Llama(
        str(smollm2_path),
        n_ctx=256,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        logits_all=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
    )
    try:
        ids = llm.tokenize(PROMPT.encode(), add_bos=True, special=True)
        assert smollm2.tokenize(PROMPT) == ids
        llm.eval(ids)
        reference = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
        smollm2.reset()
        logits = smollm2.prefill(ids)
        assert logits.dtype == np.float32 and logits.shape == (smollm2.n_vocab,)
        np.testing.assert_allclose(logits, reference, rtol=0, atol=HIGH_LEVEL_LOGIT_ATOL)
        for text in ("<|im_start|>user\nHi<|im_end|>", " leading space", "héllo wörld 😀\n\n", ""):
            for add_bos in (True, False):
                assert smollm2.tokenize(text, add_bos) == llm.tokenize(text.encode(), add_bos=add_bos, special=True)
    finally:
        llm.close()


@pytest.mark.slow
def test_decode_after_prefill_equals_longer_prefill(smollm2):
    ids = smollm2.tokenize(PROMPT)
    smollm2.reset()
    whole = smollm2.prefill(ids)
    smollm2.reset()
    smollm2.prefill(ids[:-3])
    for token in ids[-3:-1]:
        smollm2.decode(token)
    assert smollm2.n_past == len(ids) - 1
    last = smollm2.decode(ids[-1])
    np.testing.assert_allclose(last, whole, rtol=0, atol=BATCH_SPLIT_LOGIT_ATOL)
    assert int(last.argmax()) == int(whole.argmax())


@pytest.mark.slow
def test_prefill_in_chunks_equals_one_batch(smollm2, smollm2_path):
    ids = smollm2.tokenize(PROMPT)
    smollm2.reset()
    whole = smollm2.prefill(ids)
    with LlamaCppEngine(smollm2_path, n_ctx=256, n_threads=N_THREADS, n_batch=4) as chunked:
        np.testing.assert_allclose(chunked.prefill(ids), whole, rtol=0, atol=BATCH_SPLIT_LOGIT_ATOL)


@pytest.mark.slow
def test_capture_names_and_shapes(smollm2, smollm2_capture):
    ids, cap = smollm2_capture
    n = len(ids)
    info = smollm2.model_info
    n_embd, n_layer, n_vocab = info["n_embd"], info["n_layer"], info["n_vocab"]
    n_head = int(smollm2.meta("llama.attention.head_count"))
    n_head_kv = int(smollm2.meta("llama.attention.head_count_kv"))
    head_dim = n_embd // n_head
    n_ff = int(smollm2.meta("llama.feed_forward_length"))
    last = n_layer - 1
    expected = {
        "attn_norm-0": (n, n_embd),
        "Qcur-0": (n, n_head, head_dim),
        "Kcur-0": (n, n_head_kv, head_dim),
        "Vcur-0": (n, n_head_kv, head_dim),
        "kqv_out-0": (n, n_embd),
        "attn_out-0": (n, n_embd),
        "ffn_inp-0": (n, n_embd),
        "ffn_norm-0": (n, n_embd),
        "ffn_gate-0": (n, n_ff),
        "ffn_up-0": (n, n_ff),
        "ffn_swiglu-0": (n, n_ff),
        "ffn_out-0": (n, n_embd),
        "l_out-0": (n, n_embd),
        # the last layer keeps every row when every position asks for logits
        f"ffn_inp-{last}": (n, n_embd),
        f"l_out-{last}": (n, n_embd),
        "result_norm": (n, n_embd),
        "result_output": (n, n_vocab),
    }
    for name, shape in expected.items():
        assert cap[name].shape == shape, name
        assert cap[name].dtype == np.float32 and np.isfinite(cap[name]).all(), name
    assert "embd" in cap or "inp_embd" in cap
    assert all(is_graph_name(name) for name in cap)
    assert sum(name.startswith("l_out-") for name in cap) == n_layer


@pytest.mark.slow
def test_captured_logits_equal_run_logits(smollm2, smollm2_capture):
    ids, cap = smollm2_capture
    smollm2.reset()
    logits = smollm2.prefill(ids)
    np.testing.assert_allclose(cap["result_output"][-1], logits, rtol=0, atol=CAPTURE_VS_RUN_LOGIT_ATOL)
    np.testing.assert_array_equal(smollm2.capture_logits(), cap["result_output"])


@pytest.mark.slow
def test_captured_residual_stream_adds_up(smollm2_capture):
    # llama.cpp computes l_out = ffn_out + ffn_inp and ffn_inp = attn_out + layer input with one float32 add each:
    # the same add in NumPy reproduces them exactly, which checks that names, rows and strides were read right.
    _, cap = smollm2_capture
    np.testing.assert_array_equal(cap["l_out-0"], cap["ffn_out-0"] + cap["ffn_inp-0"])
    embd = cap.get("embd", cap.get("inp_embd"))
    np.testing.assert_array_equal(cap["ffn_inp-0"], cap["attn_out-0"] + embd)
    np.testing.assert_array_equal(cap["ffn_inp-1"], cap["attn_out-1"] + cap["l_out-0"])


@pytest.mark.slow
def test_capture_subset_and_graph_listing(smollm2, smollm2_capture):
    ids, cap = smollm2_capture
    some = smollm2.capture(ids, names=["attn_norm-0", "l_out-3", "no-such-name"])
    assert list(some) == ["attn_norm-0", "l_out-3"]
    np.testing.assert_array_equal(some["l_out-3"], cap["l_out-3"])
    names = smollm2.graph_names(ids)
    assert names == list(cap)
    nodes = smollm2.graph_nodes(ids)
    assert any(node.name.endswith("(view)") and not node.kept for node in nodes)
    # Qcur is named three times (matmul, reshape, RoPE): capture keeps the last, the RoPE output
    qcur = [node for node in nodes if node.name == "Qcur-0"]
    assert [node.op for node in qcur] == ["MUL_MAT", "RESHAPE", "ROPE"]


@pytest.mark.slow
def test_capture_leaves_run_cache_alone(smollm2):
    ids = smollm2.tokenize(PROMPT)
    smollm2.reset()
    smollm2.prefill(ids[:-1])
    smollm2.capture(ids[:3])
    smollm2.capture(ids)  # larger than the previous capture: a new capture context
    after = smollm2.decode(ids[-1])
    smollm2.reset()
    np.testing.assert_allclose(after, smollm2.prefill(ids), rtol=0, atol=BATCH_SPLIT_LOGIT_ATOL)


@pytest.mark.slow
def test_run_errors_are_one_line(smollm2):
    smollm2.reset()
    with pytest.raises(GGUFParityError, match="no tokens given"):
        smollm2.prefill([])
    with pytest.raises(GGUFParityError, match=r"not in this model's vocabulary \(0..49151\)"):
        smollm2.decode(smollm2.n_vocab)
    with pytest.raises(GGUFParityError, match="do not fit the context of 256"):
        smollm2.prefill([1] * 257)
    with pytest.raises(GGUFParityError, match="does not fit the context of 256"):
        smollm2.capture([1] * 257)
    smollm2.prefill([1] * 200)
    with pytest.raises(GGUFParityError, match="60 more tokens after 200"):
        smollm2.prefill([1] * 60)
    smollm2.reset()
    assert smollm2.n_past == 0


@pytest.mark.slow
def test_model_info_and_timings(smollm2, smollm2_path):
    info = smollm2.model_info
    assert info["architecture"] == "llama" and info["quant"] == "Q4_1"
    assert info["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert info["n_vocab"] == 49152 and info["n_layer"] == 30 and info["n_params"] > 100_000_000
    assert (info["kv_type"], info["flash_attn"], info["n_threads"]) == ("f32", "off", N_THREADS)
    assert info["llama_cpp_python"] == "0.3.36"
    assert set(smollm2.load_timings) == {"model_load_s", "context_create_s"}
    assert smollm2.detokenize(smollm2.tokenize(PROMPT)) == PROMPT
    assert info["flash_attn_resolved"] == "off"
    # "auto" is decided by llama.cpp at context creation; the CPU backend runs FLASH_ATTN_EXT, so it turns it on
    closed = LlamaCppEngine(smollm2_path, n_ctx=64, n_threads=1, flash_attn="auto")
    assert closed.model_info["flash_attn_resolved"] == "on"
    closed.close()
    closed.close()  # idempotent
    with pytest.raises(GGUFParityError, match="closed"):
        closed.prefill([1])


# --- Gemma 3 ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_gemma3_capture_extras():
    from inference_engine.store.named_models import fetch

    with LlamaCppEngine(fetch("gemma3-270m", progress=False), n_ctx=64, n_threads=N_THREADS) as gemma:
        ids = gemma.tokenize(PROMPT)
        n = len(ids)
        cap = gemma.capture(ids)
        n_embd, n_vocab = gemma.model_info["n_embd"], gemma.n_vocab
        n_head = int(gemma.meta("gemma3.attention.head_count"))
        n_head_kv = int(gemma.meta("gemma3.attention.head_count_kv"))
        head_dim = int(gemma.meta("gemma3.attention.key_length"))
        expected = {
            "inp_scaled": (n, n_embd),
            "Qcur_normed-0": (n, n_head, head_dim),
            "Kcur_normed-0": (n, n_head_kv, head_dim),
            "Qcur-0": (n, n_head, head_dim),
            "attn_post_norm-0": (n, n_embd),
            "sa_out-0": (n, n_embd),
            "ffn_geglu-0": cap["ffn_up-0"].shape,
            "ffn_post_norm-0": (n, n_embd),
            "l_out-0": (n, n_embd),
            "result_output": (n, n_vocab),
        }
        for name, shape in expected.items():
            assert cap[name].shape == shape, name
        # Gemma's residual: l_out = ffn_post_norm + sa_out, sa_out = attn_post_norm + layer input
        np.testing.assert_array_equal(cap["l_out-0"], cap["ffn_post_norm-0"] + cap["sa_out-0"])
        np.testing.assert_array_equal(cap["sa_out-1"], cap["attn_post_norm-1"] + cap["l_out-0"])
        logits = gemma.prefill(ids)
        np.testing.assert_allclose(cap["result_output"][-1], logits, rtol=0, atol=CAPTURE_VS_RUN_LOGIT_ATOL)


@pytest.mark.parametrize(
    "system_info, flavour",
    [
        ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | REPACK = 1 | ", "avx2"),
        ("CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | ", "avx512"),
        ("CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 | ", "neon"),
        ("CPU : SSE3 = 1 | ", "avx2"),
    ],
)
def test_simd_flavour_is_read_from_llamacpps_build(monkeypatch, system_info, flavour):
    """The flavour our ggml-numerics emulation follows comes from how llama.cpp was compiled, not from this CPU."""
    from validation.llamacpp import library

    monkeypatch.setattr(library.ll, "llama_print_system_info", lambda: system_info.encode())
    library.simd_flavour.cache_clear()
    try:
        assert library.simd_flavour() == flavour
    finally:
        library.simd_flavour.cache_clear()
