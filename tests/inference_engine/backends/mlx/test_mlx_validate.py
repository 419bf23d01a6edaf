"""``bench-compare validate --backend mlx --numerics f32`` on tiny models of every architecture: our MLX engine
against llama.cpp itself (validation.run.validate, what the command runs), tensor by tensor.

Only the checks that run the backend are asserted: tensors (every captured intermediate within the f32 NMSE
threshold), logits (KL divergence and top-1 agreement) and the greedy smoke test. The tokenizer check runs the
engine's tokenizer, which is the same code for every backend.
"""

from __future__ import annotations

import pytest
from fixtures.tiny_models import ARCHITECTURES

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed: no reference engine")

pytestmark = pytest.mark.mlx

BACKEND_CHECKS = ("tensors", "logits", "smoke")
SMOKE_TOKENS = 8  # enough greedy steps to go past gemma3 fixtures' sliding window of 4


@pytest.mark.slow  # ~10-15 s each: llama.cpp and our engine, every tensor captured
@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_validate_against_llamacpp(tiny_model, arch, device):
    from validation.run import ValidateOptions, validate

    result = validate(ValidateOptions(model=str(tiny_model(arch, "Q4_K")), backend="mlx", numerics="f32",
                                      smoke_tokens=SMOKE_TOKENS, device=device))
    assert result["backend"] == "mlx" and result["numerics"] == "f32"
    assert result["engines"]["ours"]["device"] == device
    assert (result["machine"]["gpu"] is not None) == (device == "gpu")  # the GPU's name and memory when on one
    failed = [name for name in BACKEND_CHECKS if result["checks"][name] is not True]
    assert not failed, f"{failed}; first failing tensor: {result.get('first_failure')}"
