"""validate() end to end on two fake engines: a clean pair passes, an injected fault is named where it starts.

``FakeEngine`` cannot be teacher-forced, so those runs gate the free-running comparison (and say so);
``TeacherForcedFakeEngine`` can, and those runs gate the teacher-forced one with free running reported beside it.
"""

from __future__ import annotations

import pytest
from validation_fakes import FakeEngine, Faults, TeacherForcedFakeEngine, TinyWeights, write_tiny_gguf

from inference_engine.errors import GGUFParityError
from validation.metrics import NMSE_MIN_F32
from validation.report import markdown
from validation.run import ValidateOptions, validate

CORPUS = ["hello world", "zigzag 123", "the quick brown fox"]


@pytest.fixture(scope="module")
def weights():
    return TinyWeights(seed=3)


@pytest.fixture(scope="module")
def model_path(weights, tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("run") / "tiny.gguf", weights)


def run(model_path, weights, faults=None, forcible=False, **opts):
    options = ValidateOptions(model=model_path, smoke_tokens=opts.pop("smoke_tokens", 6), **opts)
    opened = {}
    engine_class = TeacherForcedFakeEngine if forcible else FakeEngine

    def ours(o, path):
        opened["ours"] = engine_class(weights, faults, name="ours", extra_taps=("debug",))
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
    assert result["thresholds"]["gate"] == "noise_floor" and result["smoke"] is None
    bands = result["thresholds"]["bands"]  # a fake reference with no variants: every band is the least limit
    assert all(t["threshold"] == bands[t["name"]]["band"] == NMSE_MIN_F32 for t in result["tensors"])
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
    ("precision", "fp8", "unknown --precision 'fp8'; supported: ggml, f32, f16, bf16"),
    ("top_k", 0, "--top-k must be 1 or more"),
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
    from inference_engine.cpu_features import cpu_features

    assert result["machine"]["isa"] == cpu_features().label and result["machine"]["cpu"] == cpu_features().name
    assert result["machine"]["cpu_isa"] in markdown(result)


# --- teacher forcing ----------------------------------------------------------------------------------------------


def test_an_engine_without_force_is_compared_free_running_and_says_so(model_path, weights):
    result, _ = run(model_path, weights, smoke_tokens=0)
    assert result["mode"] == "free_running" and "cannot be teacher-forced" in result["mode_reason"]
    assert result["teacher_forced"] is None
    assert result["free_running"]["gated"] is True
    assert "free_running" not in result["checks"]  # the free-running diff *is* the tensors/logits check


def test_clean_forcible_pair_passes_teacher_forced(model_path, weights):
    result, _ = run(model_path, weights, forcible=True, smoke_tokens=0)
    assert result["passed"], result["checks"]
    assert result["mode"] == "teacher_forced" and result["teacher_forced"]["gated"] is True
    assert set(result["checks"]) == {"tensors", "logits", "free_running", "tokenizer"}
    assert all(t["nmse"] == 0.0 for t in result["tensors"])
    free = result["free_running"]
    assert free["gated"] is False and free["worst"]["nmse"] == 0.0 and free["logits"]["kld_mean"] == 0.0
    noise = free["reference_self_kld"]
    assert noise["variants"]["token by token"]["positions"] == result["prompt"]["n_tokens"]
    assert noise["worst_variant"] == "token by token" and noise["errors"] == {}  # the fake offers no other variant


@pytest.mark.parametrize("faults, failing", [
    (Faults(rope_base={1: 500.0}), ["Qcur-1", "Kcur-1"]),
    (Faults(permuted={"ffn_up": 2}), ["ffn_up-2"]),
    (Faults(permuted={"attn_k": 0}), ["Kcur-0"]),
])
def test_teacher_forcing_names_the_faulty_tensor_and_only_it(model_path, weights, faults, failing):
    """Forced inputs keep a fault from spreading: exactly the tensors the faulty op produces fail, every other
    tensor is bit-identical; free running names the same first failure, then fails everything downstream."""
    result, _ = run(model_path, weights, faults, forcible=True, smoke_tokens=0)
    assert not result["passed"] and result["checks"]["tensors"] is False
    assert result["mode"] == "teacher_forced"
    assert result["first_failure"] == failing[0]
    assert [t["name"] for t in result["tensors"] if not t["passed"]] == failing
    assert all(t["nmse"] == 0.0 for t in result["tensors"] if t["name"] not in failing)
    free = result["free_running"]
    assert free["first_failure"] == failing[0]
    assert sum(not t["passed"] for t in free["tensors"]) > len(failing)


def test_free_running_flag_gates_free_running_and_reports_teacher_forced(model_path, weights):
    result, _ = run(model_path, weights, Faults(permuted={"ffn_up": 2}), forcible=True, smoke_tokens=0,
                    free_running=True)
    assert result["mode"] == "free_running" and result["mode_reason"].startswith("--free-running")
    assert result["free_running"]["gated"] is True and result["teacher_forced"]["gated"] is False
    assert result["teacher_forced"]["first_failure"] == "ffn_up-2"
    assert result["first_failure"] == "ffn_up-2" and "free_running" not in result["checks"]
    downstream = [t for t in result["tensors"] if t["layer"] == 2 and t["kind"] in ("ffn_out", "l_out")]
    assert downstream and not any(t["passed"] for t in downstream)  # free running lets the fault flow on


def test_logits_fault_fails_both_the_forced_logits_and_the_free_running_gate(model_path, weights):
    result, _ = run(model_path, weights, Faults(logit_bias={5: 100.0}), forcible=True, smoke_tokens=0)
    assert result["first_failure"] == "result_output"
    assert result["checks"]["logits"] is False and result["checks"]["free_running"] is False
    free = result["free_running"]["logits"]
    assert free["kld_mean"] > free["kld_mean_limit"]
    assert any(not d["excused_by"] for d in free["top1_disagreements"])
