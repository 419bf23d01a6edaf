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

from validation.metrics import NMSE_MAX_F32  # noqa: E402
from validation.run import ValidateOptions, validate  # noqa: E402


def _validate(model: str, smoke_tokens: int = 16):
    return validate(ValidateOptions(model=model, engine="hf:", numerics="f32", threads=2, smoke_tokens=smoke_tokens))


def test_hf_smollm2_is_teacher_forced_and_every_hooked_tensor_lines_up():
    result = _validate("smollm2-135m")
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


def test_hf_gemma3_maps_gemmas_own_tensors():
    result = _validate("gemma3-270m", smoke_tokens=0)
    names = {t["name"] for t in result["tensors"]}
    assert {"inp_scaled", "Qcur_normed-0", "attn_post_norm-0", "sa_out-0", "ffn_geglu-0", "ffn_post_norm-17",
            "l_out-17", "result_output"} <= names
    assert result["mode"] == "teacher_forced" and result["checks"]["tensors"] is True
    assert result["engines"]["ours"]["class"] == "Gemma3ForCausalLM"
