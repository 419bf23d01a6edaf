"""``--engine hf:``: Hugging Face transformers on the same GGUF, validated against llama.cpp end to end.

Slow (transformers converts the GGUF and its vocabulary: tens of seconds to minutes) and skipped without the ``hf``
extra (``pip install -e ".[hf]"``) or llama-cpp-python.
"""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[hf]')")
pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[hf]')")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                                   reason="llama-cpp-python is not installed")]

from validation.metrics import NMSE_MAX_F32  # noqa: E402  (after the importorskip)


def test_hf_smollm2_is_teacher_forced_and_every_hooked_tensor_lines_up(validate_engine):
    result = validate_engine("hf:", model="smollm2-135m", numerics="f32", threads=2)
    assert result["mode"] == "teacher_forced"  # the hooks take force=
    names = {t["name"] for t in result["tensors"]}
    # 11 hooked tensors per layer x 30 layers, embd, result_norm, result_output
    assert len(names) == 11 * 30 + 3 and {"embd", "attn_out-29", "l_out-29", "result_output"} <= names
    assert not any(n.startswith(("Qcur-", "Kcur-")) for n in names)  # RoPE happens where no hook sees it
    assert result["checks"]["tensors"] is True and result["first_failure"] is None
    assert max(t["nmse"] for t in result["tensors"]) <= NMSE_MAX_F32
    assert result["checks"]["logits"] is True and result["checks"]["smoke"] is True
    assert result["tokenizer"]["cases"] > 100  # transformers' own tokenizer, converted from the GGUF, was compared
    assert result["engines"]["ours"]["class"] == "LlamaForCausalLM"


def test_hf_gemma3_maps_gemmas_own_tensors(validate_engine):
    result = validate_engine("hf:", model="gemma3-270m", numerics="f32", threads=2, smoke_tokens=0)
    names = {t["name"] for t in result["tensors"]}
    assert {"inp_scaled", "Qcur_normed-0", "attn_post_norm-0", "sa_out-0", "ffn_geglu-0", "ffn_post_norm-17",
            "l_out-17", "result_output"} <= names
    assert result["mode"] == "teacher_forced" and result["checks"]["tensors"] is True
    assert result["engines"]["ours"]["class"] == "Gemma3ForCausalLM"


@pytest.mark.heavy
def test_hf_qwen_1_5b_validates_against_llamacpp(validate_engine):
    """The 1.5B (qwen2: QKV biases, GPT-2 BPE): transformers dequantizes it to 6 GB of float32; minutes."""
    result = validate_engine("hf:", model="qwen2.5-coder-1.5b", numerics="f32", threads=2, smoke_tokens=4)
    assert result["mode"] == "teacher_forced" and result["engines"]["ours"]["class"] == "Qwen2ForCausalLM"
    assert result["checks"]["tensors"] is True, result["first_failure"]
    assert max(t["nmse"] for t in result["tensors"]) <= NMSE_MAX_F32
    assert result["checks"]["logits"] is True


# Both engines run float32 on the same F32 weights; only the order of float sums differs (seen: NMSE ~1e-12).
TINY_NMSE_MAX = 1e-9


# Gemma: transformers 5's GGUF loader leaves query_pre_attn_scalar at its default, 256, where llama.cpp scales by
# 1/sqrt(attention.key_length), and Gemma 2's soft caps at theirs (50, 30): the tiny models take those values, so
# that both engines compute the same model (a file with others is refused: test below)
TINY_OVERRIDES = {"gemma3": {"head_dim": 256}, "gemma2": {"head_dim": 256, "attn_softcap": 50.0, "final_softcap": 30.0}}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3", "gemma2", "phi3"])
def test_hf_hooks_give_llamacpp_names_and_values_on_tiny_models(tiny_model, arch):
    """On tiny F32 models every hooked tensor equals our engine's tap of the same name (our taps are llama.cpp's
    names, checked against llama.cpp elsewhere), and forcing a tensor changes what follows it."""
    import numpy as np

    from bench_compare.adapters.hf_transformers import open_engine
    from inference_engine.engine import OurEngine
    from validation.diff import diff_captures

    path = tiny_model(arch, "F32", **TINY_OVERRIDES.get(arch, {}))
    ids = [40, 75, 84, 90, 3, 120]
    with OurEngine(str(path), backend="numpy", numerics="f32") as ours:
        reference = ours.capture(ids)
    hf = open_engine("", str(path))
    captured = hf.capture(ids)
    diff = diff_captures(captured, reference, TINY_NMSE_MAX)
    assert diff.passed and not diff.ours_only, (diff.first_failure, diff.ours_only)
    assert len(diff.tensors) >= 2 + (8 if arch == "phi3" else 9) * 2  # every layer's hooks, by name and shape
    # what no hook sees: Q and K after RoPE (inside transformers' attention function); phi3's V, a slice of wqkv;
    # Gemma's embedding before its scale (transformers scales inside the embedding module)
    uncapturable = {"Qcur", "Kcur"} | ({"Vcur"} if arch == "phi3" else set()) | ({"embd"} if "gemma" in arch else set())
    assert {name.rpartition("-")[0] or name for name in diff.reference_only} <= uncapturable, diff.reference_only
    forced = hf.capture(ids, force={"attn_norm-0": np.zeros_like(reference["attn_norm-0"])})
    v_name = "wqkv-0" if arch == "phi3" else "Vcur-0"  # phi3: Q, K and V in one product
    assert not np.any(forced[v_name]) or arch == "qwen2"  # V of a zero input is zero (qwen2: its bias)
    np.testing.assert_allclose(hf.prefill(ids), captured["result_output"][-1], rtol=1e-5, atol=1e-5)


def test_hf_refuses_a_gemma2_whose_settings_transformers_would_not_load(tiny_model):
    """The tiny Gemma 2's soft caps (2, 3) and head size (64) are not transformers' defaults: one line naming each."""
    from bench_compare.adapters.hf_transformers import open_engine
    from inference_engine.errors import GGUFParityError

    with pytest.raises(GGUFParityError) as info:
        open_engine("", str(tiny_model("gemma2", "F32")))
    message = str(info.value)
    assert "transformers loaded" in message and "with Gemma 2 settings of its own, not the file's" in message
    assert "attn_logit_softcapping 50.0 (the file's model: 2)" in message and "\n" not in message
    assert "final_logit_softcapping 30.0 (the file's model: 3)" in message
    assert "query_pre_attn_scalar 256 (the file's model: 64)" in message
