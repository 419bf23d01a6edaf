"""End to end with the real engines: OurEngine against llama.cpp on the tiny fixtures and on the real models.

* Fault injection: our engine with a wrong RoPE base in layer 1, or a permuted ``ffn_up`` weight in layer 1, is
  validated against llama.cpp; the teacher-forced gate must fail with ``first_failure`` naming exactly that layer and
  tensor, and only the tensors the faulty op produces may fail (teacher forcing must not hide a bug, nor smear it).
* The logit lens applied to llama.cpp's own last ``l_out`` must reproduce llama.cpp's ``result_output``.
* Every architecture's fixture, in several tensor types, passes every check teacher-forced at the issue's thresholds
  (ggml numerics: NMSE <= 1e-6 for every tensor), with the free-running comparison and llama.cpp's own noise floor
  reported beside it.
* The real models (``slow``) pass at the issue's thresholds in both numerics modes.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from fixtures.kept_files import kept_file
from fixtures.tiny_models import ARCHITECTURES

from inference_engine.store.digests import file_sha256
from validation.free_running import KV_F16_PLAIN
from validation.metrics import tensor_metrics
from validation.precision import LLAMACPP_DEFAULTS, LLAMACPP_VARIANCE
from validation.run import ValidateOptions, open_ours, open_reference, validate

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")
pytest.importorskip("inference_engine.engine", reason="our engine is not importable")

ARCHS = ARCHITECTURES
# A short prompt (~12-16 tokens): RoPE at positions > 0, both gemma3 window types, fixture runs in about a second.
PROMPT = "Hello world, the engines agree on 1234 tokens."
SMOKE_TOKENS = 4
# llama.cpp's result_output against the lens of its own last l_out on an F32 head: the lens does the same f32 RMS
# norm and f32 matmul, differing only in summation order (float32 rounding: NMSE 8.7e-14..9.3e-14 measured on the
# four F32 fixtures); a missing norm weight or a wrong head matrix changes the logits at order 1.
LENS_VS_LLAMACPP_NMSE_MAX = 1e-10
# The RoPE-base fault: layer 1 rotates with half the model's base.
WRONG_ROPE_FACTOR = 0.5


@pytest.fixture(scope="module")
def one_text_corpus(tmp_path_factory):
    """Tokenizer parity has its own test on the built-in corpus; elsewhere one text keeps the runs short."""
    path = tmp_path_factory.mktemp("corpus") / "one.jsonl"
    path.write_text(json.dumps({"text": PROMPT}) + "\n")
    return str(path)


# One thread per engine: on a busy 2-core machine llama.cpp's spinning thread pool at 2 threads made one tiny
# fixture's validation take 15.8 s instead of 0.55 s. Thread count does not change either engine's numerics.
TEST_THREADS = 1


def _options(model, numerics="ggml", smoke_tokens=SMOKE_TOKENS, **kw):
    return ValidateOptions(model=str(model), backend="numpy", numerics=numerics, prompt=PROMPT,
                           smoke_tokens=smoke_tokens, threads=TEST_THREADS, **kw)


def _with_wrong_rope_base(layer: int):
    """Open our engine, then make its backend's RoPE use a wrong base in ``layer`` (Q and K: two calls per layer)."""

    def opener(options, path):
        engine = open_ours(options, path)
        backend, model = engine.backend, engine.model
        rope, forward = backend.rope, model.forward
        calls = [0]

        def wrong_rope(x, positions, **kw):
            il = calls[0] // 2
            calls[0] += 1
            if il == layer:
                kw = {**kw, "freq_base": kw["freq_base"] * WRONG_ROPE_FACTOR}
            return rope(x, positions, **kw)

        def counted_forward(*args, **kwargs):
            calls[0] = 0
            return forward(*args, **kwargs)

        backend.rope = wrong_rope
        model.forward = counted_forward
        return engine

    return opener


def _with_permuted_ffn_up(layer: int):
    """Open our engine, then reverse the output rows of ``blk.<layer>.ffn_up`` (a row-permuted weight)."""

    def opener(options, path):
        engine = open_ours(options, path)
        backend = engine.backend
        target = engine.model.layers[layer].ffn.ffn_up
        matmul = backend.matmul

        def permuted(w, x, *args, **kwargs):
            out = matmul(w, x, *args, **kwargs)
            return out[..., ::-1].copy() if w is target else out

        backend.matmul = permuted
        return engine

    return opener


@pytest.mark.parametrize("qtype", ("F32", "Q4_K"))
@pytest.mark.parametrize("arch", ("llama", "gemma3"))
def test_wrong_rope_base_in_layer_1_is_named(tiny_model, one_text_corpus, arch, qtype):
    result = validate(_options(tiny_model(arch, qtype), smoke_tokens=0, corpus=one_text_corpus),
                      _with_wrong_rope_base(1))
    assert result["mode"] == "teacher_forced" and result["checks"]["tensors"] is False
    assert result["first_failure"] == "Qcur-1", _worst(result)  # Q is roped (and tapped) before K
    failed = [t["name"] for t in result["tensors"] if not t["passed"]]
    assert failed == ["Qcur-1", "Kcur-1"]  # the rest of layer 1 is computed from llama.cpp's Q and K
    assert not result["passed"]
    assert result["free_running"]["tensors"] and result["free_running"]["gated"] is False


@pytest.mark.parametrize("qtype", ("F32", "Q4_K"))
@pytest.mark.parametrize("arch", ("llama", "qwen3"))
def test_permuted_weight_in_layer_1_is_named(tiny_model, one_text_corpus, arch, qtype):
    result = validate(_options(tiny_model(arch, qtype), smoke_tokens=0, corpus=one_text_corpus),
                      _with_permuted_ffn_up(1))
    assert result["mode"] == "teacher_forced"
    assert result["first_failure"] == "ffn_up-1", _worst(result)
    assert [t["name"] for t in result["tensors"] if not t["passed"]] == ["ffn_up-1"]
    assert not result["passed"]
    # Free running, the fault flows on: it fails the free-running gate against llama.cpp's noise floor too.
    assert result["checks"]["free_running"] is False


@pytest.mark.parametrize("arch", ARCHS)
def test_lens_reproduces_llamacpps_logits(tiny_model, arch):
    from inference_engine.gguf.file import open_gguf
    from validation.logit_lens import LogitLens

    path = tiny_model(arch, "F32")
    reference = open_reference(_options(path), path)
    try:
        cap = reference.capture(reference.tokenize(PROMPT))
    finally:
        reference.close()
    last = max(int(n.rsplit("-", 1)[1]) for n in cap if n.startswith("l_out-"))
    lens = LogitLens(open_gguf(path))
    nmse = tensor_metrics(lens(cap[f"l_out-{last}"]), cap["result_output"])["nmse"]
    assert nmse <= LENS_VS_LLAMACPP_NMSE_MAX


# F32 (nothing quantized), Q8_0 (the activation type itself), Q4_1 (Q8_1 activations, the min term), Q5_0, two
# K-quants (Q8_K activations), the two code-book types (IQ4_NL: Q8_0 activations, IQ4_XS: Q8_K); f32 numerics on
# one quantized type.
FIXTURE_CASES = [("F32", "ggml"), ("Q8_0", "ggml"), ("Q4_1", "ggml"), ("Q5_0", "ggml"), ("Q4_K", "ggml"),
                 ("Q6_K", "ggml"), ("IQ4_NL", "ggml"), ("IQ4_XS", "ggml"), ("Q4_K", "f32")]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype, numerics", FIXTURE_CASES)
def test_fixture_passes_against_llamacpp(tiny_model, one_text_corpus, arch, qtype, numerics):
    result = validate(_options(tiny_model(arch, qtype), numerics=numerics, logit_lens=True, corpus=one_text_corpus))
    checks = result["checks"]
    assert result["mode"] == "teacher_forced"
    assert checks["tensors"] and checks["logits"] and checks["smoke"], _worst(result)
    assert all(t["nmse"] <= t["threshold"] for t in result["tensors"])  # every tensor, teacher-forced
    if numerics == "ggml":  # one strict limit; f32: a band per tensor from llama.cpp's own F32-weights variant
        assert {t["threshold"] for t in result["tensors"]} == {result["thresholds"]["tensor_nmse_max"]}
    else:
        bands = result["thresholds"]["bands"]
        assert all(t["threshold"] == bands[t["name"]]["band"] for t in result["tensors"])
        assert result["precision"] == {"class": "f32", "source": "--numerics (our engine)", "gate": "noise_floor",
                                   "variance": LLAMACPP_VARIANCE}
    assert not result["unmatched"]["ours_only"]  # every tensor we tap, llama.cpp names too
    layers = [row["layer"] for row in result["logit_lens"]]
    assert layers == list(range(len(layers))) and len(layers) >= 2  # every layer's l_out, on both sides
    free = result["free_running"]
    assert free["gated"] is False and free["worst"] and len(free["tensors"]) == len(result["tensors"])
    noise = free["reference_self_kld"]
    variants = {"token by token", "flash attention on", KV_F16_PLAIN}
    if numerics == "f32":  # the f32 class's floor adds llama.cpp's defaults and its F32-weights variant
        variants |= {LLAMACPP_DEFAULTS, "weights F32"}
    assert set(noise["variants"]) == variants and not noise["errors"]
    if numerics == "ggml":  # free-running logits within llama.cpp's own noise floor, a check of its own
        assert checks["free_running"], free["logits"]
    else:  # f32: that noise-floor verdict is the logits gate itself
        assert "free_running" not in checks and checks["logits"] is free["logits"]["passed"] is True
    assert result["passed"], checks


def test_free_running_flag_gates_the_free_running_comparison(tiny_model, one_text_corpus):
    result = validate(_options(tiny_model("qwen2", "Q8_0"), smoke_tokens=0, corpus=one_text_corpus,
                               free_running=True))
    assert result["mode"] == "free_running" and "free_running" not in result["checks"]
    assert result["checks"]["tensors"] == result["free_running"]["passed"]
    assert result["first_failure"] == result["free_running"]["first_failure"]
    tf = result["teacher_forced"]
    assert tf["gated"] is False and tf["passed"] and tf["first_failure"] is None


def test_tokenizer_parity_on_the_builtin_corpus(tiny_model):
    result = validate(_options(tiny_model("llama", "F32"), smoke_tokens=0))
    tok = result["tokenizer"]
    assert tok["cases"] > 0
    assert tok["mismatches"] == 0, tok["first_mismatch"]
    assert tok["special_tokens"]["agree"], tok["special_tokens"]


# Real models: each decode through our NumPy engine costs seconds on gemma3's 262k vocabulary, so two tokens.
REAL_SMOKE_TOKENS = 2


@pytest.mark.slow
@pytest.mark.parametrize("model", ("smollm2-135m", "gemma3-270m"))
@pytest.mark.parametrize("numerics", ("ggml", "f32"))
def test_real_model_passes_against_llamacpp(model, numerics):
    # The full built-in corpus: the real vocabularies (GPT-2 BPE, SentencePiece) are where tokenizers differ.
    result = validate(_options(model, numerics=numerics, smoke_tokens=REAL_SMOKE_TOKENS))
    failed = [name for name, ok in result["checks"].items() if ok is False]
    assert not failed, f"failed: {failed}; {_worst(result)}; tokenizer {result['tokenizer']['special_tokens']}"


@pytest.fixture(scope="module")
def smollm2_iq4_xs(tmp_path_factory, pytestconfig) -> Path:
    """smollm2-135m re-quantized to IQ4_XS by llama.cpp's own quantizer (``llama_model_quantize``, as
    ``llama-quantize --allow-requantize``): its 576-wide rows are not a multiple of 256, so llama.cpp writes them as
    IQ4_NL and the rest as IQ4_XS, as it does for real IQ4_XS files of such models (20 s on 2 cores; kept in
    pytest's cache under the source file's digest and llama-cpp-python's version)."""
    import ctypes

    import llama_cpp

    from inference_engine.store.named_models import resolve_model

    src = resolve_model("smollm2-135m", progress=False)

    def make() -> Path:
        out = tmp_path_factory.mktemp("iq4") / "smollm2-135m-IQ4_XS.gguf"
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS, True, 2
        assert llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params)) == 0
        return out

    inputs = [file_sha256(src).encode(), llama_cpp.__version__.encode(), b"LLAMA_FTYPE_MOSTLY_IQ4_XS"]
    return kept_file(pytestconfig, "smollm2_iq4_xs", ".gguf", inputs, make)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ("numba", "numpy"))
def test_real_iq4_model_passes_against_llamacpp(smollm2_iq4_xs, backend):
    """A real model's weights in IQ4_NL and IQ4_XS (llama.cpp's own quantization of them), ggml numerics: every
    tensor teacher-forced within the strict gate."""
    from inference_engine.gguf.file import open_gguf

    types = Counter(t.qtype.name for t in open_gguf(smollm2_iq4_xs).tensors.values())
    assert types["IQ4_NL"] and types["IQ4_XS"], types
    options = ValidateOptions(model=str(smollm2_iq4_xs), backend=backend, numerics="ggml", prompt=PROMPT,
                              smoke_tokens=REAL_SMOKE_TOKENS, threads=TEST_THREADS)
    result = validate(options)
    failed = [name for name, ok in result["checks"].items() if ok is False]
    assert not failed, f"failed: {failed}; {_worst(result)}"
    assert all(t["nmse"] <= t["threshold"] for t in result["tensors"])


@pytest.mark.heavy
def test_the_1_5b_model_passes_against_llamacpp_on_numba():
    """qwen2.5-coder-1.5b (qwen2, QKV bias, 1.1 GB), the numba backend in ggml numerics: what
    ``bench-compare validate --model qwen2.5-coder-1.5b --backend numba`` runs."""
    options = ValidateOptions(model="qwen2.5-coder-1.5b", backend="numba", numerics="ggml", prompt=PROMPT,
                              smoke_tokens=REAL_SMOKE_TOKENS, threads=TEST_THREADS)
    result = validate(options)
    failed = [name for name, ok in result["checks"].items() if ok is False]
    assert not failed, f"failed: {failed}; {_worst(result)}; tokenizer {result['tokenizer']['special_tokens']}"


def _worst(result) -> str:
    """The failure message: where it starts, the worst tensor, the logits summary."""
    tensors = [t for t in result["tensors"] if isinstance(t["nmse"], float)]
    worst = max(tensors, key=lambda t: t["nmse"]) if tensors else {"name": None, "nmse": None}
    lg = result.get("logits", {})
    return (f"first failure {result['first_failure']}, worst {worst['name']} NMSE {worst['nmse']}, threshold "
            f"{result['thresholds']['tensor_nmse_max']}; KLD mean {lg.get('kld_mean')} max {lg.get('kld_max')}, "
            f"top-1 {lg.get('top1_agreement')}; smoke {result.get('smoke') and result['smoke']['first_divergence']}")


def test_numpy_against_numpy_is_exact(tiny_model, one_text_corpus):
    """--against numpy: the same code path with two of our engines; identical backends agree bit for bit."""
    result = validate(_options(tiny_model("qwen2", "Q4_K"), against="numpy", corpus=one_text_corpus))
    assert result["passed"], result["checks"]
    assert all(t["nmse"] == 0.0 for t in result["tensors"])
    assert result["against"] == "numpy" and not result["unmatched"]["ours_only"]
    assert not result["unmatched"]["reference_only"]
    assert np.isclose(result["logits"]["kld_mean"], 0.0)
