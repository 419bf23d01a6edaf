"""The real models (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M) against llama.cpp. Slow: marked ``slow``.

Why three kinds of comparison (measured on this machine; see the constants):

* **Op by op** on llama.cpp's own graph tensors: each op reproduces llama.cpp's output from llama.cpp's input,
  bit for bit for element-wise ops and to float32 summation order for products. The sharpest test there is.
* **f32 numerics against llama.cpp on a dequantized copy.** llama.cpp quantizes every matmul's input activations
  (to Q8_0 / Q8_1 / Q8_K), so on a quantized file no float engine can match it to rounding. On a copy of the file
  with every tensor dequantized to F32 llama.cpp multiplies in float32, which is exactly what our f32 numerics does
  on the original: KL divergence 7e-11 (SmolLM2) and 4e-6 (Gemma 3, whose GELU llama.cpp reads from an F16 table).
  Subtle bugs (a RoPE base off by 2x, a wrong norm epsilon) show up here as 5e-3 and more.
* **ggml numerics against llama.cpp on the quantized file.** Every op matches, but a 1e-7 rounding difference that
  flips one 8-bit activation grows layer after layer (chaotic amplification through re-quantization), so the end
  result is only statistically close. llama.cpp is no more consistent with itself: its prefill+decode path and its
  one-pass batch over the same tokens differ by KL divergence up to 4.8e-3 mean / 2e-2 max on these prompts, and
  disagree on a greedy token where one of them sees a 0.3-logit margin. The bounds here are set from that.
"""

from __future__ import annotations

import pytest
from llamacpp_parity import (
    SMOKE_PROMPTS,
    compare_greedy,
    compare_logits,
    teacher_forced_ops,
)

from inference_engine.engine import OurEngine

pytestmark = pytest.mark.slow

MODELS = ("smollm2-135m", "gemma3-270m")
KLD_PROMPT = (
    "The quick brown fox jumps over the lazy dog. In 1969, Neil Armstrong became the first person to walk on the "
    "Moon, and"
)
GREEDY_TOKENS = 32
# llama.cpp's threads on the real models: its results do not depend on them (measured: every one of its graph
# tensors equal bit for bit at 1 and 2 threads on both models, quantized and dequantized; ggml gives each thread whole
# output rows), and two nearly halve its share of the time (Gemma 3 dequantized, 32 greedy tokens: 3.8 s at 1 thread,
# 2.1 s at 2). Our engine keeps one: its NumPy reference's BLAS splits sums by thread count.
LLAMACPP_THREADS = 2

# Op by op on the real graphs: measured at most 4e-13 (matmul) / 1e-13 (attention); see test_fixture_parity.
OP_NMSE_MAX = 1e-11
EXACT_OPS = ("embed", "rms_norm", "rope", "glu")
# f32 numerics vs llama.cpp on the dequantized copy, per position: measured max 7.3e-11 (SmolLM2), 3.6e-6
# (Gemma 3: llama.cpp's F16 GELU table). A RoPE base off by 2x or a norm epsilon off by 10x gives >= 5e-3 mean.
DEQUANTIZED_KLD_MAX = 1e-4
# The near tie: a greedy divergence (or argmax mismatch) is allowed only where llama.cpp's top-2 gap is
# smaller. Applied where the numerics match llama.cpp's to rounding (the dequantized copy).
NEAR_TIE_MARGIN = 0.05
# ggml numerics vs llama.cpp on the quantized file. llama.cpp's own two paths (prefill+decode vs one batch) differ
# by up to 4.8e-3 mean / 1.95e-2 max KLD here; ours measured 4.5e-3 / 1.7e-2 (SmolLM2) and 6.1e-3 / 4.1e-2
# (Gemma 3). These bounds catch gross errors (Gemma's local-layer RoPE base: mean 0.10; a 10x norm epsilon on
# Gemma: max 1.1), not subtle ones: those are the dequantized-copy and op-by-op tests' job.
GGML_QUANTIZED_KLD_MEAN_MAX = 1e-2
GGML_QUANTIZED_KLD_MAX = 1e-1
# Greedy against llama.cpp on the quantized file: a near tie here is what llama.cpp's own two paths can flip.
# They disagree on the top-2 gap by up to 0.28 logits at one position (0.315 vs 0.035, SmolLM2, "Q: Why is the
# sky blue?"); ours diverged at gaps up to 0.45 (measured over 5 prompts x 2 models on an Intel Xeon). The 0.05 near
# tie is not reachable on quantized files by any engine that is not bit-identical to llama.cpp's kernels.
QUANTIZED_NEAR_TIE_MARGIN = 0.5
# A wider divergence also passes when llama.cpp's own variance explains it on the same prefix, by validate's greedy
# smoke rule (validation.smoke: its flash-attention variant picks our token, or moves the gap by at least
# gap / GAP_SHIFT_FACTOR). Seen on an AMD EPYC (AVX-512): SmolLM2, "def fibonacci(n):", step 20, llama.cpp's gap
# 0.959, which its flash-attention variant moves by 0.657 (within sqrt(3) x 0.657 = 1.14).


@pytest.fixture(scope="module", params=MODELS)
def model_path(request):
    from inference_engine.store.named_models import fetch

    return fetch(request.param, progress=False)


@pytest.fixture(scope="module")
def dequantized_path(model_path):
    """The model with every matrix dequantized to F32: the copy validate's f32 class keeps for its noise floor
    (``validation.gguf_rewrite.weights_as``; written once, shared with validate's tests: 0.5-1 GB and ~30 s each)."""
    from inference_engine.store.digests import file_sha256
    from validation.gguf_rewrite import weights_as

    return weights_as(model_path, "F32", file_sha256(model_path), announce=lambda line: None)


@pytest.fixture(scope="module")
def ref_quantized(model_path):
    from validation.llamacpp import LlamaCppEngine

    with LlamaCppEngine(model_path, n_ctx=256, n_threads=LLAMACPP_THREADS) as engine:
        yield engine


@pytest.fixture(scope="module")
def ref_dequantized(dequantized_path):
    from validation.llamacpp import LlamaCppEngine

    with LlamaCppEngine(dequantized_path, n_ctx=256, n_threads=LLAMACPP_THREADS) as engine:
        yield engine


@pytest.fixture(scope="module")
def ours_f32(model_path):
    return OurEngine(model_path, numerics="f32", n_ctx=256, n_threads=1)


@pytest.fixture(scope="module")
def ours_ggml(model_path):
    return OurEngine(model_path, numerics="ggml", n_ctx=256, n_threads=1)


def test_each_op_reproduces_llamacpp_given_its_inputs(ours_ggml, ref_quantized):
    ids = ref_quantized.tokenize(KLD_PROMPT, add_bos=True)
    checks = teacher_forced_ops(ours_ggml, ref_quantized.capture(ids), ids)
    not_exact = [(c.name, c.nmse) for c in checks if c.op in EXACT_OPS and not c.exact]
    assert not not_exact, f"ops that should equal llama.cpp bit for bit differ: {not_exact[:5]}"
    too_far = [(c.name, c.nmse) for c in checks if c.nmse > OP_NMSE_MAX]
    assert not too_far, f"ops off llama.cpp by more than NMSE {OP_NMSE_MAX}: {too_far[:5]}"


def test_f32_numerics_equal_llamacpp_on_dequantized_weights(ours_f32, ref_dequantized):
    ids = ref_dequantized.tokenize(KLD_PROMPT, add_bos=True)
    ref = ref_dequantized.capture(ids, names=["result_output"])["result_output"]
    c = compare_logits(ours_f32.capture(ids, names=["result_output"])["result_output"], ref)
    print(f"f32 numerics vs llama.cpp on dequantized weights: {c.summary()}")
    assert c.kld_max <= DEQUANTIZED_KLD_MAX, c.summary()
    assert not c.argmax_mismatches(NEAR_TIE_MARGIN), c.summary()


@pytest.mark.parametrize("prompt", SMOKE_PROMPTS)
def test_greedy_equals_llamacpp_on_dequantized_weights(ours_f32, ref_dequantized, prompt):
    g = compare_greedy(ours_f32, ref_dequantized, ref_dequantized.tokenize(prompt, add_bos=True), GREEDY_TOKENS)
    print(f"{prompt!r}: {g.describe()}")
    assert g.acceptable(NEAR_TIE_MARGIN), g.describe()


def test_ggml_numerics_close_to_llamacpp_on_the_quantized_file(ours_ggml, ref_quantized):
    ids = ref_quantized.tokenize(KLD_PROMPT, add_bos=True)
    ref = ref_quantized.capture(ids, names=["result_output"])["result_output"]
    c = compare_logits(ours_ggml.capture(ids, names=["result_output"])["result_output"], ref)
    print(
        f"ggml numerics vs llama.cpp on the quantized file: {c.summary()}, "
        f"argmax mismatches (position, llama.cpp margin): {c.argmax_mismatches(0.0)}"
    )
    assert c.kld_mean <= GGML_QUANTIZED_KLD_MEAN_MAX, c.summary()
    assert c.kld_max <= GGML_QUANTIZED_KLD_MAX, c.summary()
    assert not c.argmax_mismatches(QUANTIZED_NEAR_TIE_MARGIN), c.summary()


@pytest.mark.parametrize("prompt", SMOKE_PROMPTS)
def test_greedy_close_to_llamacpp_on_the_quantized_file(ours_ggml, ref_quantized, prompt):
    from validation.smoke import greedy_smoke

    variants = ref_quantized.rounding_variants()
    try:
        smoke = greedy_smoke(ours_ggml, ref_quantized, ref_quantized.tokenize(prompt, add_bos=True), GREEDY_TOKENS,
                             variants)
    finally:
        for variant in variants.values():
            variant.close()
    print(f"{prompt!r}: {smoke.matched}/{GREEDY_TOKENS} identical; divergence {smoke.first_divergence}")
    divergence = smoke.first_divergence
    assert smoke.passed or divergence["margin"] < QUANTIZED_NEAR_TIE_MARGIN, divergence
