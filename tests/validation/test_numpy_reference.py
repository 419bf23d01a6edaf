"""``--against numpy`` (validation.numpy_reference): in ggml numerics our NumPy engine stands in for llama.cpp's clean
reference and computes its variants, so an engine that is not ours gets a noise floor against it (llama.cpp itself
passes, its noisy twin and a planted bug fail); in f32 numerics it is a float32 twin with no variants."""

from __future__ import annotations

import gguf
import pytest
from test_precision import LOGITS_PLUGIN, NOISE_SIGMA, PROMPT, THREADS, _plugin

from bench_compare.cli import main
from bench_compare.engines import make_engine
from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from validation.free_running import KV_F16_PLAIN
from validation.metrics import NMSE_MIN_F32, thresholds_for
from validation.numpy_reference import VARIANCE, NumpyReference, open_numpy_reference
from validation.precision import LLAMACPP_DEFAULTS, LLAMACPP_VARIANCE, open_variants, variance_source
from validation.report import precision_lines, variance_words
from validation.run import ValidateOptions, validate

llama_cpp = pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")


def _reference(path, numerics="ggml", kv_type="f32"):
    return open_numpy_reference(path, numerics=numerics, n_ctx=256, n_threads=THREADS, kv_type=kv_type)


def test_the_ggml_reference_has_llamacpps_variants_where_ours_can_compute_them(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_PARITY_CACHE", str(tmp_path))  # the F16 / BF16 copies are written here
    ref = _reference(tiny_model("llama", "Q4_1"))
    opened = []
    try:
        assert isinstance(ref, NumpyReference) and variance_source(ref) == VARIANCE
        ggml, errors = open_variants(ref, thresholds_for("ggml"))
        opened += ggml.values()
        assert set(ggml) == {KV_F16_PLAIN} and not errors  # the strict class: the rounding variant only
        assert ggml[KV_F16_PLAIN].kv_type == "f16" and ggml[KV_F16_PLAIN].numerics == "ggml"
        f32, errors = open_variants(ref, thresholds_for("f32"))
        opened += f32.values()
        assert set(f32) == {KV_F16_PLAIN, "weights F32"}
        # ggml's product of F32 matrices: float32 throughout, which is our f32 numerics on the same file
        assert f32["weights F32"].numerics == "f32" and f32["weights F32"].gguf.path == ref.gguf.path
        # llama.cpp's defaults are flash attention on its CPU: said to be missing, not computed as something else
        assert set(errors) == {LLAMACPP_DEFAULTS} and "no flash attention" in errors[LLAMACPP_DEFAULTS]
        bf16, errors = open_variants(ref, thresholds_for("bf16"))
        opened += bf16.values()
        assert set(bf16) == {KV_F16_PLAIN, "weights BF16"}
        assert set(errors) == {LLAMACPP_DEFAULTS, "K/V BF16 (flash attention on)"}
        copy = gguf.GGUFReader(str(bf16["weights BF16"].gguf.path))
        assert {t.tensor_type.name for t in copy.tensors if len(t.shape) >= 2} == {"BF16"}
        assert bf16["weights BF16"].numerics == "ggml"  # ggml's BF16 product: activations rounded to bf16
    finally:
        for engine in opened:
            engine.close()
        ref.close()


def test_the_f32_reference_is_a_twin_with_no_variants(tiny_model):
    ref = _reference(tiny_model("llama", "Q4_1"), numerics="f32")
    try:
        assert type(ref) is OurEngine and variance_source(ref) is None
        engines, errors = open_variants(ref, thresholds_for("f32"))
        assert engines == {} and "offers no variants" in errors["precision variants"]
    finally:
        ref.close()


def test_a_variant_it_cannot_compute_is_one_line(tiny_model):
    ref = _reference(tiny_model("llama", "Q4_1"), kv_type="f16")
    try:
        assert ref.rounding_variants() == {}  # its cache is already F16: no rounding variant left to make
        for setting in ("on", "auto", True):
            with pytest.raises(GGUFParityError, match="our NumPy reference has no flash attention"):
                ref.variant(flash_attn=setting)
        with ref.variant(kv_type="F32", flash_attn="off") as plain:
            assert plain.kv_type == "f32"
    finally:
        ref.close()


def _llamacpp(options, path):
    """``--engine llamacpp`` as validate opens it: llama.cpp with tensors, its own defaults."""
    return make_engine("llamacpp", path, n_threads=options.threads, n_ctx=options.n_ctx)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_llamacpp_passes_against_the_numpy_reference(tiny_model, arch):
    """The case this module is for: llama.cpp itself (F16 K/V, flash attention auto) judged against our NumPy
    reference failed at every tensor when that reference had no variants (SmolLM2: 5 of 393 within 1e-10)."""
    options = ValidateOptions(model=str(tiny_model(arch, "Q4_1")), engine="llamacpp", against="numpy", prompt=PROMPT,
                              threads=THREADS, smoke_tokens=4)
    result = validate(options, ours_opener=_llamacpp)
    assert result["passed"], (result["checks"], result["first_failure"])
    assert result["precision"] == {"class": "f32", "source": result["precision"]["source"], "gate": "noise_floor",
                                   "variance": VARIANCE}
    assert result["checks"]["tensors"] and len(result["tensors"]) > 10
    assert {b["variant"] for b in result["thresholds"]["bands"].values()} - {None} <= {KV_F16_PLAIN, "weights F32"}


def test_noisy_logits_fail_against_the_numpy_reference(tiny_model):
    options = ValidateOptions(model=str(tiny_model("llama", "Q4_1")), engine=LOGITS_PLUGIN, against="numpy",
                              prompt=PROMPT, threads=THREADS, smoke_tokens=0)
    assert validate(options, ours_opener=_plugin(LOGITS_PLUGIN))["passed"]
    noisy = validate(options, ours_opener=_plugin(LOGITS_PLUGIN, NOISE_SIGMA))
    assert noisy["checks"]["logits"] is False
    assert noisy["logits"]["kld_mean"] > noisy["logits"]["kld_mean_limit"]


def test_a_planted_bug_fails_against_the_numpy_reference_at_its_tensor(tiny_model, tmp_path):
    from test_precision import _planted

    src, planted = _planted(tiny_model, tmp_path, "rope 10x")

    def opener(options, path):
        return OurEngine(str(planted), backend="numpy", numerics="f32", n_threads=THREADS)

    options = ValidateOptions(model=str(src), engine="planted", against="numpy", threads=THREADS, smoke_tokens=0)
    result = validate(options, ours_opener=opener)
    assert result["checks"]["tensors"] is False and result["first_failure"] == "Qcur-0"
    failing = next(t for t in result["tensors"] if t["name"] == "Qcur-0")
    assert failing["nmse"] > failing["threshold"] >= NMSE_MIN_F32


def test_the_cli_says_whose_variance_the_gates_are(tiny_model, tmp_path, capsys):
    model = str(tiny_model("llama", "Q4_1"))
    code = main(["validate", "--model", model, "--engine", "llamacpp", "--against", "numpy", "--prompt", PROMPT,
                 "--threads", "1", "--smoke-tokens", "2", "--report", str(tmp_path / "a")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"gates from {VARIANCE} for this class" in " ".join(out.split())
    code = main(["validate", "--model", model, "--backend", "numpy", "--numerics", "f32", "--against", "numpy",
                 "--prompt", PROMPT, "--threads", "1", "--smoke-tokens", "2", "--report", str(tmp_path / "b")])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    assert "the reference offers no variants, so each gate is the class's least limit" in out
    assert f"pass NMSE <= {NMSE_MIN_F32:.3e} (the class's least limit: the reference offers no variants)" in out


def test_the_words_for_results_written_before_the_field():
    """A result from before ``precision.variance`` was recorded was judged against llama.cpp's own variance."""
    old = {"precision": {"class": "f32", "source": "x", "gate": "noise_floor"}}
    assert variance_words(old) == LLAMACPP_VARIANCE
    assert "gates from llama.cpp's own variance" in precision_lines(old)[0]
    assert variance_words({"precision": {"gate": "noise_floor", "variance": None}}) is None
