"""validate() end to end on two fake engines: a clean pair passes, an injected fault is named where it starts."""

from __future__ import annotations

import pytest
from validation_fakes import FakeEngine, Faults, TinyWeights, write_tiny_gguf

from inference_engine.errors import GGUFParityError
from validation.run import ValidateOptions, validate

CORPUS = ["hello world", "zigzag 123", "the quick brown fox"]


@pytest.fixture(scope="module")
def weights():
    return TinyWeights(seed=3)


@pytest.fixture(scope="module")
def model_path(weights, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("run") / "tiny.gguf", weights)


def run(model_path, weights, faults=None, **opts):
    options = ValidateOptions(model=model_path, smoke_tokens=opts.pop("smoke_tokens", 6), **opts)
    opened = {}

    def ours(o, path):
        opened["ours"] = FakeEngine(weights, faults, name="ours", extra_taps=("debug",))
        return opened["ours"]

    def reference(o, path):
        opened["reference"] = FakeEngine(weights, name="ref", extra_taps=("kq",))
        return opened["reference"]

    from validation import run as run_module

    texts = opts.pop("corpus_texts", CORPUS)
    original = run_module._load_corpus
    run_module._load_corpus = lambda corpus: (texts, "test")
    try:
        return validate(options, ours, reference), opened
    finally:
        run_module._load_corpus = original


def test_clean_pair_passes(model_path, weights):
    result, opened = run(model_path, weights, logit_lens=True)
    assert result["passed"], result["checks"]
    assert result["first_failure"] is None
    assert all(t["nmse"] == 0.0 for t in result["tensors"])
    assert result["unmatched"]["reference_only"] == ["kq-0", "kq-1", "kq-2"]
    assert result["logits"]["kld_mean"] == 0.0 and result["logits"]["top1_agreement"] == 1.0
    assert result["smoke"]["matched"] == 6 and result["tokenizer"]["mismatches"] == 0
    assert [r["layer"] for r in result["logit_lens"]] == [0, 1, 2]
    assert opened["ours"].closed and opened["reference"].closed


@pytest.mark.parametrize("faults, first", [
    (Faults(rope_base={1: 500.0}), "Qcur-1"),  # RoPE is applied to Q first, then K (llama.cpp's order)
    (Faults(permuted={"ffn_up": 2}), "ffn_up-2"),
    (Faults(permuted={"attn_k": 0}), "Kcur-0"),
])
def test_injected_fault_is_named_where_it_starts(model_path, weights, faults, first):
    result, _ = run(model_path, weights, faults)
    assert not result["passed"]
    assert result["first_failure"] == first
    names = [t["name"] for t in result["tensors"]]
    before = result["tensors"][: names.index(first)]
    assert before and all(t["passed"] and t["nmse"] == 0.0 for t in before)  # bit-identical up to the fault
    assert result["checks"]["tensors"] is False


def test_tokenizer_fault_fails_only_the_tokenizer_check(model_path, weights):
    result, _ = run(model_path, weights, Faults(dropped_char="z"))
    assert result["checks"] == {"tensors": True, "logits": True, "tokenizer": False, "smoke": True}
    assert result["tokenizer"]["mismatches"] == 1
    assert result["tokenizer"]["first_mismatch"]["text"] == "zigzag 123"
    assert not result["passed"]


def test_logits_fault_fails_logits_and_smoke(model_path, weights):
    result, _ = run(model_path, weights, Faults(logit_bias={5: 100.0}))
    assert result["first_failure"] == "result_output"
    assert result["checks"]["logits"] is False and result["checks"]["smoke"] is False
    assert result["logits"]["top1_agreement"] < 1.0


def test_f32_thresholds_are_recorded(model_path, weights):
    result, _ = run(model_path, weights, numerics="f32", smoke_tokens=0)
    assert result["thresholds"]["tensor_nmse_max"] == 1e-2 and result["smoke"] is None
    assert all(t["threshold"] == 1e-2 for t in result["tensors"])
    assert "smoke" not in result["checks"]


def test_zero_token_prompt_is_a_user_error(model_path, weights):
    options = ValidateOptions(model=model_path, prompt="\u20ac\u20ac", smoke_tokens=0)
    no_bos = lambda o, p: FakeEngine(weights, add_bos=False)  # noqa: E731
    with pytest.raises(GGUFParityError, match="tokenizes to zero tokens"):
        validate(options, no_bos, no_bos)


@pytest.mark.parametrize("field, value, message", [
    ("against", "vllm", "unknown --against 'vllm'; supported: llamacpp, numpy"),
    ("backend", "cuda", "unknown --backend 'cuda'; supported: numpy, numba, mlx"),
    ("numerics", "f16", "unknown --numerics 'f16'; supported: ggml, f32"),
    ("prompt", "   ", "--prompt is empty"),
    ("smoke_tokens", -1, "--smoke-tokens must be 0 or more"),
])
def test_bad_options_fail_before_anything_opens(model_path, field, value, message):
    def fail(o, p):
        raise AssertionError("no engine may be opened for bad input")

    with pytest.raises(GGUFParityError, match=message.replace("(", r"\(")):
        validate(ValidateOptions(model=model_path, **{field: value}), fail, fail)


def test_result_records_provenance(model_path, weights):
    result, _ = run(model_path, weights, smoke_tokens=0)
    assert len(result["model"]["sha256"]) == 64
    assert result["versions"]["numpy"] and result["versions"]["python"]
    assert "date" in result and "git_sha" in result
    assert result["engines"]["ours"]["engine"] == "ours"
