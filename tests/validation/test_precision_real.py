"""Verdicts for engines that are not ours, on the real models: llama.cpp's own high-level API as a logits-only
plugin passes `validate` with the default flags; the same with N(0, 0.3) on its logits fails on the logits check;
transformers in bf16 passes (heavy: minutes per model)."""

from __future__ import annotations

import pytest
from test_precision import LOGITS_PLUGIN, NOISE_SIGMA, _plugin

from validation.precision import LLAMACPP_VARIANCE
from validation.run import ValidateOptions, validate

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")

SMOKE_TOKENS = 8


def _run(model: str, spec: str, noise: float = 0.0, threads: int = 2, smoke_tokens: int = SMOKE_TOKENS, **kw):
    options = ValidateOptions(model=model, engine=spec, threads=threads, smoke_tokens=smoke_tokens, **kw)
    return validate(options, ours_opener=_plugin(spec, noise))


MODELS = [pytest.param("smollm2-135m", marks=pytest.mark.slow), pytest.param("gemma3-270m", marks=pytest.mark.slow),
          pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.heavy)]


@pytest.mark.parametrize("model", MODELS)
def test_llamacpp_plugin_passes_and_its_noisy_twin_fails(model):
    result = _run(model, LOGITS_PLUGIN)
    logits = result["logits"]
    assert result["passed"], (result["checks"], logits.get("kld_mean"), logits.get("kld_mean_limit"))
    assert result["precision"]["class"] == "f32" and result["checks"]["tensors"] is None
    noisy = _run(model, LOGITS_PLUGIN, NOISE_SIGMA, smoke_tokens=0)  # its logits check is the point: no smoke
    assert noisy["checks"]["logits"] is False
    # the typical position moves: N(0, 0.3) is off everywhere, llama.cpp's variants at a few uncertain positions
    assert noisy["logits"]["kld_median"] > noisy["logits"]["kld_median_limit"]


@pytest.mark.heavy
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_transformers_passes_in_its_precision(dtype):
    """transformers on SmolLM2's GGUF (teacher-forced tensors, logits, smoke); its tokenizer is left out: its
    conversion from the GGUF differs from llama.cpp on one built-in text (measured: '١٢٣ १२३ ⅠⅡⅢ ½ ² ①')."""
    pytest.importorskip("transformers")
    from bench_compare.engines import make_engine

    def opener(options, path):
        return make_engine("hf:", path, n_threads=options.threads, n_ctx=options.n_ctx, dtype=dtype)

    result = validate(ValidateOptions(model="smollm2-135m", engine=f"hf:dtype={dtype}", threads=2,
                                      smoke_tokens=SMOKE_TOKENS), ours_opener=opener)
    assert result["precision"] == {"class": dtype, "source": "declared by the engine", "gate": "noise_floor",
                                   "variance": LLAMACPP_VARIANCE}
    assert result["mode"] == "teacher_forced"
    assert result["checks"]["tensors"] and result["checks"]["logits"] and result["checks"]["smoke"], result["checks"]



@pytest.mark.slow
def test_llamacpp_passes_against_the_numpy_reference_on_smollm2():
    """``validate --engine llamacpp --against numpy``: llama.cpp with its tensors, judged against our NumPy engine in
    ggml numerics and the variants it computes (validation.numpy_reference), passes at every tensor (it failed at
    388 of 393 when that reference had no variants). Its noisy twin's failure: test_numpy_reference, tiny models."""
    from validation.numpy_reference import VARIANCE

    result = _run("smollm2-135m", "llamacpp", against="numpy")
    assert result["passed"], (result["checks"], result["first_failure"])
    assert result["precision"]["variance"] == VARIANCE and len(result["tensors"]) == 393
