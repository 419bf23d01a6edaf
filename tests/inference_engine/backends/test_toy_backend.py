"""Adding a backend is one file (toy_backend.py) plus one registration: then our engine, ``engines list`` and the
bench command all know it by name."""

from __future__ import annotations

import numpy as np
import pytest

from bench_compare.cli import main
from inference_engine.backends import BACKENDS
from inference_engine.engine import OurEngine

# Products in float64 instead of float32 (same dequantized weights): logits agree with the NumPy backend in f32
# numerics to float32 rounding accumulated over a few tiny layers, far below any real difference.
TOY_LOGITS_ATOL = 1e-3


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setattr(BACKENDS, "entries", dict(BACKENDS.entries))  # copies, so the registration ends with the test
    monkeypatch.setattr(BACKENDS, "meta", dict(BACKENDS.meta))
    # the one registration:
    BACKENDS.register("toy", "toy_backend:ToyBackend", needs="numpy", help="a toy in one file")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_toy_backend_runs_a_tiny_model(toy_registered, tiny_model, arch):
    path = tiny_model(arch)
    with OurEngine(path, backend="toy", n_ctx=64) as toy, OurEngine(path, backend="numpy", n_ctx=64) as ref:
        ids = toy.tokenize("hello world", add_bos=True)
        got, want = toy.prefill(ids), ref.prefill(ids)
        assert toy.name == "ours:toy" and toy.backend.matmuls > 0
        np.testing.assert_allclose(got, want, atol=TOY_LOGITS_ATOL)
        assert int(np.argmax(toy.decode(int(np.argmax(got))))) == int(np.argmax(ref.decode(int(np.argmax(want)))))


def test_toy_backend_is_listed_and_benched(toy_registered, tiny_model, capsys):
    assert main(["engines", "list"]) == 0
    assert any(line.startswith("ours:toy") for line in capsys.readouterr().out.splitlines())
    assert main(["bench", "--engine", "ours:toy", "-m", str(tiny_model("llama")), "-p", "4", "-n", "2", "-r", "1",
                 "-t", "1", "-o", "jsonl"]) == 0
    assert '"engine": "ours:toy"' in capsys.readouterr().out
