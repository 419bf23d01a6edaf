"""Shared fixtures for the quants tests: random weight tensors."""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.gguf.file import TensorInfo
from inference_engine.quants import quant_for


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def make_weight():
    """``make_weight(qtype, n_out, n_in, rng)`` -> a TensorInfo of random valid blocks, as gguf-py would give it."""

    def make(qtype, n_out: int, n_in: int, rng: np.random.Generator) -> TensorInfo:
        quant = quant_for(qtype)
        rows = quant.random_rows(n_out, n_in, rng)  # uint8 (n_out, row_bytes)
        raw = rows
        if quant.qtype.name == "F32":
            raw = rows.view(np.float32)  # gguf-py hands F32/F16 over as typed arrays
        elif quant.qtype.name == "F16":
            raw = rows.view(np.float16)
        return TensorInfo(f"test.{quant.qtype.name}", quant.qtype, (n_out, n_in), rows.nbytes, raw)

    return make
