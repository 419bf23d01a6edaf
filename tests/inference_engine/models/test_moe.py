"""Mixture of experts (qwen2moe, qwen3moe): the fixtures really route, each MoE feature is needed to match llama.cpp,
the experts are loaded as views of the stacked tensor, every backend passes ``validate`` against llama.cpp, and a
malformed MoE file is one line (exit 2). The fixture-parity grid (``test_fixture_parity.py``) and the validation
suites (``tests/validation``) run both architectures like every other."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fixtures.libm import expf_not_correctly_rounded
from llamacpp_parity import llamacpp_capture

from bench_compare.cli import main
from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from validation.diff import diff_captures
from validation.metrics import thresholds_for

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")
from validation.llamacpp import LlamaCppEngine

MOE_ARCHS = ("qwen2moe", "qwen3moe")
IDS = [3, 17, 40, 99, 7, 12, 5, 9, 30, 44, 61, 250]
ROUTING_IDS = [int(i) for i in np.random.default_rng(2).integers(3, 300, 32)]
GGML_NMSE_MAX = thresholds_for("ggml").tensor_nmse_max  # the teacher-forced bound validate uses


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_tokens_are_routed_to_different_experts(tiny_model, arch):
    """In llama.cpp itself, on the fixture: every expert serves some token in every layer, and tokens differ in
    which experts they get (a router that sent every token to the same experts would test nothing). 32 tokens: the
    random router favours some experts (this fixture's layer-1 expert 2 gets 0-5 of 64 slots on a random 32-token
    prompt), so the prompt is one that reaches every expert; 12 tokens did not."""
    theirs = llamacpp_capture(tiny_model(arch, "Q8_0"), ROUTING_IDS)
    f = open_gguf(tiny_model(arch, "Q8_0"))
    n_expert, k = f.arch_value("expert_count"), f.arch_value("expert_used_count")
    for il in range(f.arch_value("block_count")):
        topk = theirs[f"ffn_moe_topk-{il}"].astype(int)  # (T, k), best first
        assert topk.shape == (len(ROUTING_IDS), k)
        assert set(topk.ravel()) == set(range(n_expert))
        assert len({frozenset(row) for row in topk}) > 1
        probs = theirs[f"ffn_moe_probs-{il}"]
        assert (np.argmax(probs, axis=-1) == topk[:, 0]).all()  # best first


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_hparams_and_expert_views(tiny_model, arch):
    """Experts come from the stacked 3-D tensor as one 2-D view per expert (no copy of the whole tensor)."""
    from inference_engine.backends.numpy_ref import NumpyBackend
    from inference_engine.models.base import Weights

    path = tiny_model(arch, "Q4_K")
    hp = OurEngine(path, n_ctx=32).model.hp
    assert (hp.n_expert, hp.n_expert_used, hp.n_ff_exp) == (4, 2, 256)
    f = open_gguf(path)
    seen = []

    class Recording(NumpyBackend):
        def load_matrix(self, t):
            seen.append(t)
            return super().load_matrix(t)

    mats = Weights(f, Recording()).experts("ffn_down_exps", 1)
    stacked = f.tensor("blk.1.ffn_down_exps.weight")
    assert len(mats) == 4 and [t.shape for t in seen] == [(256, 256)] * 4
    assert all(np.shares_memory(t.raw, stacked.raw) for t in seen)
    assert [t.name for t in seen] == [f"blk.1.ffn_down_exps.weight[{e}]" for e in range(4)]


@pytest.mark.parametrize("arch, field, wrong, first", [
    ("qwen2moe", "normalize_weights", True, "ffn_moe_weighted-0"),  # qwen2moe must not renormalize
    ("qwen3moe", "normalize_weights", False, "ffn_moe_weighted-0"),  # qwen3moe must
])
def test_each_moe_feature_is_needed_to_match_llamacpp(tiny_model, arch, field, wrong, first):
    path = tiny_model(arch, "F32")
    theirs = llamacpp_capture(path, IDS)
    ours = OurEngine(path, numerics="ggml", n_ctx=32)
    assert diff_captures(ours.capture(IDS, force=theirs), theirs, GGML_NMSE_MAX).passed
    for layer in ours.model.layers:
        layer.moe = dataclasses.replace(layer.moe, **{field: wrong})
    diff = diff_captures(ours.capture(IDS, force=theirs), theirs, GGML_NMSE_MAX)
    assert diff.first_failure == first, diff.first_failure


def test_shared_expert_gate_is_needed_to_match_llamacpp(tiny_model, monkeypatch):
    from inference_engine.models import moe

    path = tiny_model("qwen2moe", "F32")
    theirs = llamacpp_capture(path, IDS)
    ours = OurEngine(path, numerics="ggml", n_ctx=32)
    monkeypatch.setattr(moe, "_silu", lambda b, g: g)  # silu(g) / g -> 1: the shared expert ungated
    diff = diff_captures(ours.capture(IDS, force=theirs), theirs, GGML_NMSE_MAX)
    assert diff.first_failure == "ffn_shexp_gate-0"


BACKENDS = [("numba", "ggml"), ("mlx", "f32")]


@pytest.mark.parametrize("backend, numerics", BACKENDS)
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_validate_passes_on_every_backend(tiny_model, tmp_path, arch, backend, numerics):
    """``bench-compare validate`` teacher-forced against llama.cpp on the numba and MLX backends (numpy: the
    fixture suites in tests/validation), a quantized fixture, with the logits and greedy smoke checks."""
    if backend == "mlx":
        pytest.importorskip("mlx.core", reason="MLX is not installed (the [mlx] extra)")
    from validation.run import ValidateOptions, validate

    corpus = tmp_path / "one.jsonl"
    corpus.write_text('{"text": "Hello world"}\n')
    result = validate(ValidateOptions(model=str(tiny_model(arch, "Q4_K")), backend=backend, numerics=numerics,
                                      prompt="Hello world, the engines agree on 1234 tokens.", smoke_tokens=4,
                                      threads=1, corpus=str(corpus)))
    assert result["mode"] == "teacher_forced"
    assert result["passed"], (result["checks"], result["first_failure"])
    names = {t["name"] for t in result["tensors"]}
    assert {"ffn_moe_probs-1", "ffn_moe_topk-1", "ffn_moe_down-1", "ffn_moe_out-1"} <= names
    assert ("ffn_shexp_out-1" in names) == (arch == "qwen2moe")
    assert ("ffn_moe_weights_norm-1" in names) == (arch == "qwen3moe")
    assert not result["unmatched"]["ours_only"]


@pytest.mark.parametrize("overrides, problem", [
    ({"n_expert_used": 5}, "qwen2moe.expert_used_count is 5, above qwen2moe.expert_count 4"),
    ({"n_expert_used": 0}, "qwen2moe.expert_used_count is 0 but qwen2moe.expert_count is 4; expected 1..4"),
    ({"n_ff_exp": 512, "tensor_types": {}}, None),  # consistent: a wider expert is fine
])
def test_malformed_moe_fields_are_one_line(tmp_path, overrides, problem, capsys):
    from fixtures.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "moe.gguf", "qwen2moe", "Q8_0", **overrides)
    if problem is None:
        assert OurEngine(path, n_ctx=16).model.hp.n_ff_exp == 512
        return
    with pytest.raises(GGUFParityError) as err:
        OurEngine(path, n_ctx=16)
    message = str(err.value)
    assert problem in message and "\n" not in message
    assert main(["validate", "--model", str(path), "--smoke-tokens", "0"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and problem in err_lines[0]


def test_expert_tensor_of_the_wrong_shape_is_one_line(tmp_path):
    """An expert width that disagrees with the file's expert_feed_forward_length names the tensor."""
    import gguf
    from fixtures.tiny_models import write_tiny_model

    src = open_gguf(write_tiny_model(tmp_path / "ok.gguf", "qwen2moe", "F32"))
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "qwen2moe")
    try:
        for field in src.reader.fields.values():
            if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
                continue
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            value = 128 if field.name == "qwen2moe.expert_feed_forward_length" else field.contents()
            writer.add_key_value(field.name, value, value_type, sub_type=sub_type)
        for name, t in src.tensors.items():
            writer.add_tensor(name, np.asarray(t.raw))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    with pytest.raises(GGUFParityError, match=r"tensor 'blk\.0\.ffn_gate_exps\.weight' has shape \[4, 256, 256\]; "
                                              r"the hyperparameters say \[4, 128, 256\]"):
        OurEngine(tmp_path / "bad.gguf", n_ctx=16)


def test_experts_on_a_dense_architecture_are_refused(tmp_path):
    from fixtures.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path / "llama-moe.gguf", "llama", "F32", n_expert=4, n_expert_used=2)
    with pytest.raises(GGUFParityError, match="mixture-of-experts llama models are not supported .* supported "
                                              "mixture-of-experts architectures: qwen2moe, qwen3moe"):
        OurEngine(path, n_ctx=16)


def test_inspect_shows_the_expert_counts(tiny_model, capsys):
    assert main(["inspect", "--no-tensors", str(tiny_model("qwen2moe", "Q4_K"))]) == 0
    out = capsys.readouterr().out
    assert "experts: 4 per layer, 2 used per token, each 256 wide, plus a shared expert" in out
    assert main(["inspect", str(tiny_model("qwen3moe"))]) == 0
    out = capsys.readouterr().out
    assert "experts: 4 per layer, 2 used per token, each 256 wide\n" in out
    assert "blk.0.ffn_up_exps.weight" in out and "4x256x256" in out


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_decode_steps_on_numba_match_llamacpp(tiny_model, arch):
    """Decode steps (one token each: every expert matmul a single row) and a chunked prefix on the numba backend,
    teacher-forced per tensor against llama.cpp's own decode graphs."""
    from validation.decode_steps import DepthPlan, validate_depths

    path = tiny_model(arch, "Q4_K")
    ref = LlamaCppEngine(str(path), n_ctx=64, n_threads=1, n_batch=4)
    ours = OurEngine(path, backend="numba", numerics="ggml", n_ctx=64)
    try:
        out = validate_depths(ours, ref, ROUTING_IDS[:20], DepthPlan((0, 10), 3), thresholds_for("ggml"))
    finally:
        ref.close()
    assert out["passed"], out["first_failure"]
    assert all(s["tensors"] >= 20 for d in out["depths"] for s in d["steps"])


# 4: all scalar tail (the fixtures); 8: one AVX2 vector; 60 (Qwen1.5-MoE): vectors and a tail; 128 (Qwen3-MoE)
@pytest.mark.parametrize("n_expert", [4, 8, 60, 128])
def test_router_softmax_equals_libggml_bit_for_bit(n_expert):
    """The router's softmax in ggml numerics against llama.cpp's own ``ggml_vec_soft_max_f32`` (its SIMD flavour),
    row by row, on routers wider than the fixtures' 4 experts (the SIMD part of the kernel), and on tails whose
    inputs the C library's ``expf`` rounds differently from a float64 exp (an AVX2 machine's 4-expert fixture once
    left llama.cpp by a bit there)."""
    from inference_engine.backends import numerics as nx
    from validation.ggml_oracle import get_oracle, oracle_available
    from validation.llamacpp.library import simd_flavour

    available, why = oracle_available()
    if not available:
        pytest.skip(why)
    oracle = get_oracle()
    logits = (np.random.default_rng(n_expert).standard_normal((16, n_expert)) * 3).astype(np.float32)
    # rows whose last 3 values are inputs on which the C library's expf, which ggml's scalar tail calls, is not the
    # correctly rounded value (the tail on every SIMD flavour for 4 and 60 experts; 8 and 128 have none on AVX2 and
    # AVX-512): a row's max is 0, so each value is its own exp's input
    hard = expf_not_correctly_rounded()
    n_tail = min(3, n_expert - 1)
    rows = np.zeros((len(hard) // n_tail, n_expert), np.float32)
    rows[:, :-n_tail] = -20.0
    rows[:, 0] = 0.0
    rows[:, -n_tail:] = hard[: len(rows) * n_tail].reshape(len(rows), n_tail)
    logits = np.concatenate([logits, rows])
    ours = nx.soft_max_ggml(logits, simd_flavour())
    theirs = np.stack([oracle.soft_max_row(row) for row in logits])
    np.testing.assert_array_equal(ours, theirs)
