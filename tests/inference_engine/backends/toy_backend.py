"""A toy backend in one file: the NumPy reference ops, with its own matmul (weights dequantized once at load time,
products in float64). Registered by one line (see test_toy_backend.py), it runs every architecture."""

from __future__ import annotations

import numpy as np

from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import dequantize_tensor


class ToyBackend(NumpyBackend):
    name = "toy"

    def __init__(self, numerics: str = "f32", n_threads: int | None = None):
        super().__init__(numerics, n_threads)
        self.description = "toy: dequantized float64 matmul"
        self.matmuls = 0

    def load_matrix(self, t: TensorInfo) -> np.ndarray:
        return dequantize_tensor(t).astype(np.float64)  # (n_out, n_in)

    def matmul(self, w: np.ndarray, x: np.ndarray) -> np.ndarray:
        self.matmuls += 1
        return (np.asarray(x, dtype=np.float64) @ w.T).astype(np.float32)
