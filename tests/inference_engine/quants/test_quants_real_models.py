"""The real models' weights: exact dequantization and ggml-numerics matmuls against libggml, per tensor type.

SmolLM2-135M is Q4_1 (token_embd Q8_0); Gemma 3 270M Q4_K_M mixes Q8_0, Q5_0, Q4_K, Q6_K and F32. A slice of
rows of one tensor per type keeps each test to about a second.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.gguf.file import TensorInfo, open_gguf
from inference_engine.quants import GGMLMatmul, dequantize_tensor, fake_quantize, quant_for
from inference_engine.store.named_models import fetch

# Same float32 summation-order bound as the random-block tests (test_ggml_matmul.py), see GGML_MATMUL_TOL there.
GGML_MATMUL_TOL = 1e-6
N_ROWS = 64  # weight rows (outputs) checked per tensor

pytestmark = pytest.mark.slow


def row_slice(t: TensorInfo, n: int) -> TensorInfo:
    rows = np.asarray(t.raw)[:n]
    return TensorInfo(t.name, t.qtype, (rows.shape[0], t.shape[1]), rows.nbytes, rows)


def one_matrix_per_type(path) -> dict[str, TensorInfo]:
    chosen: dict[str, TensorInfo] = {}
    for t in open_gguf(path).tensors.values():
        if len(t.shape) == 2:
            chosen.setdefault(t.type_name, row_slice(t, N_ROWS))
    return chosen


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def model_matrices(request):
    return one_matrix_per_type(fetch(request.param))


def test_real_weights_dequantize_and_matmul_like_libggml(oracle, model_matrices):
    rng = np.random.default_rng(7)
    assert model_matrices  # every model has 2-D weights
    for type_name, t in model_matrices.items():
        quant = quant_for(t.qtype)
        rows = quant.as_byte_rows(t.raw)
        ours = dequantize_tensor(t)
        ref = np.stack([oracle.dequantize_row(t.qtype, r) for r in rows])
        np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32), err_msg=f"{t.name} ({type_name})")

        x = rng.standard_normal((2, t.shape[1])).astype(np.float32)
        y = GGMLMatmul(t)(x)
        y_ref = oracle.matmul(t.qtype, rows, x)
        magnitude = np.abs(fake_quantize(x, quant.vec_dot_type)) @ np.abs(ours).T
        err = np.abs(y - y_ref) / magnitude
        assert err.max() <= GGML_MATMUL_TOL, f"{t.name} ({type_name}): worst {err.max():.2e}"
