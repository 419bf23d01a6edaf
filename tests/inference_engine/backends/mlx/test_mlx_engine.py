"""``OurEngine(..., backend="mlx", numerics="f32")`` gives the NumPy backend's f32 logits, on tiny models of every
architecture and tensor type and on both real models.

Both backends compute with exactly ggml's weight values (the MLX ones transcoded exactly, see
test_mlx_transcode.py) and the same float32 formulas; what may differ is float32 summation order (BLAS against
MLX's quantized matmul, float32 against double sums in RMSNorm, MLX's attention kernel) and one FMA in RoPE.
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import ARCHITECTURES, TENSOR_TYPES

from inference_engine.engine import OurEngine

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")

pytestmark = pytest.mark.mlx

# max |logit difference| / max |reference logit| on the tiny models: measured 0.5e-6 .. 2.5e-6 (2-6 layers, float32
# summation order only). 1e-4 keeps a 40x margin; a wrong weight layout, mask or RoPE pairing moves logits by O(1).
LOGITS_REL_TOL = 1e-4
# The same on the real models: measured 3.2e-5 (SmolLM2-135M, prefill row) and 5.7e-6 (Gemma 3 270M). SmolLM2's
# residual stream reaches |x| ~ 25000 and some layers cancel it to ~100 (l_out-9: ffn_out ~ -594 plus ffn_inp ~ 657
# gives 78), so per-op differences of ~1e-6 of the operands show as ~1e-5 .. 1e-4 of the result. 3e-4: 10x margin.
REAL_LOGITS_REL_TOL = 3e-4
# Intermediates of a capture, relative to each tensor's largest value: the same errors, seen layer by layer.
CAPTURE_REL_TOL = 1e-4

PROMPT = list(range(3, 15))  # 12 tokens: past gemma3 fixtures' sliding window of 4, so decode masks matter
DECODE = [20, 7, 33, 101]


def run(path_or_file, backend: str, kv_type: str = "f32", device: str | None = None) -> np.ndarray:
    """Logits of a prefill and of each following decode step, (1 + len(DECODE), n_vocab)."""
    engine = OurEngine(path_or_file, backend=backend, numerics="f32", n_ctx=64, kv_type=kv_type, device=device)
    rows = [engine.prefill(PROMPT)]
    rows += [engine.decode(t) for t in DECODE]
    return np.stack(rows)


def assert_logits_close(got: np.ndarray, expected: np.ndarray, tol: float = LOGITS_REL_TOL) -> float:
    assert got.shape == expected.shape and np.all(np.isfinite(got))
    rel = float(np.abs(got - expected).max() / np.abs(expected).max())
    assert rel <= tol, f"max |diff| / max |logit| = {rel:.3g}"
    # Greedy choice agrees wherever the reference is not a near tie (top-2 gap above the tolerance).
    top2 = np.sort(expected, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tol * np.abs(expected).max()
    np.testing.assert_array_equal(got.argmax(-1)[clear], expected.argmax(-1)[clear])
    return rel


# Every tensor type on llama (each weight path: float, MLX affine at 4/5/8 bits, the 16-value K-quants); on the
# other architectures the types that exercise each path once (their own code is the graph, not the weights).
TYPES_PER_ARCH = {"llama": TENSOR_TYPES}
PATH_TYPES = ("F16", "Q5_0", "Q8_0", "Q4_K", "Q6_K")
CASES = [(arch, qtype) for arch in ARCHITECTURES for qtype in TYPES_PER_ARCH.get(arch, PATH_TYPES)]


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]  # the GPU: Metal, or CUDA with MLX's CUDA build


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch,qtype", CASES)
def test_logits_match_numpy_backend(tiny_model, arch, qtype, device):
    path = tiny_model(arch, qtype)
    assert_logits_close(run(path, "mlx", device=device), run(path, "numpy"))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_f16_kv_cache(tiny_model, arch):
    path = tiny_model(arch, "Q8_0")
    assert_logits_close(run(path, "mlx", kv_type="f16"), run(path, "numpy", kv_type="f16"))


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_capture_matches_numpy_backend(tiny_model, arch):
    """Every intermediate tapped under llama.cpp's names, with the same shapes and values."""
    path = tiny_model(arch, "Q4_K")
    ours = OurEngine(path, backend="mlx", numerics="f32", n_ctx=64).capture(PROMPT)
    ref = OurEngine(path, backend="numpy", numerics="f32", n_ctx=64).capture(PROMPT)
    assert ours.keys() == ref.keys()
    for name, expected in ref.items():
        got = ours[name]
        assert got.shape == expected.shape and got.dtype == np.float32, name
        rel = np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30)
        assert rel <= CAPTURE_REL_TOL, f"{name}: {rel:.3g}"


@pytest.mark.parametrize("device", DEVICES)
def test_model_info_records_backend_and_fallback(tiny_model, device):
    engine = OurEngine(tiny_model("llama", "Q6_K"), backend="mlx", numerics="f32", n_ctx=32, device=device)
    info = engine.model_info
    assert info["backend"] == "mlx" and info["numerics"] == "f32"
    assert info["device"] == device == info["device_info"]["device"]
    assert info["device_info"]["float32_matmul_error"] <= 1.0  # within float32's bound on either device
    assert "f32 numerics only" in info["backend_description"]
    kernels = engine.backend.kernels  # Q6_K: GGUF blocks read by our Metal / CUDA kernels on a GPU
    form = f"{kernels.name}-kernel" if kernels else "float32"
    assert f"Q6_K->{form}" in info["backend_description"]
    assert info["versions"]["mlx"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_real_model_logits_match_numpy_backend(real_gguf, model):
    f = real_gguf(model)
    rel = assert_logits_close(run(f, "mlx"), run(f, "numpy"), REAL_LOGITS_REL_TOL)
    print(f"{model}: max |diff| / max |logit| = {rel:.3g}")
