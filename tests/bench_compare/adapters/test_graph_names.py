"""The tensor catalogue a dump request lists is what the engines really produce: every name our engine taps (which
are llama.cpp's names) with its shape, on each architecture; and llama.cpp's own capture has every listed name."""

from __future__ import annotations

import importlib.util

import pytest
from fixtures.tiny_models import ARCHITECTURES

from bench_compare.adapters.graph_names import ModelDims, drop_leading_ones, expected_tensors
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf

IDS = [5, 9, 40, 77, 120]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_catalogue_equals_our_engines_taps(tiny_model, arch):
    from inference_engine.engine import OurEngine

    path = tiny_model(arch, "F32")
    expected = expected_tensors(ModelDims.from_gguf(open_gguf(path)), len(IDS))
    with OurEngine(str(path), backend="numpy", numerics="f32") as engine:
        captured = engine.capture(IDS)
    assert list(expected) == list(captured)  # names and production order
    assert {k: v.shape for k, v in captured.items()} == expected


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed")
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_llamacpp_produces_every_catalogued_name_with_that_shape(tiny_model, arch):
    from validation.llamacpp import LlamaCppEngine

    path = tiny_model(arch, "F32")
    expected = expected_tensors(ModelDims.from_gguf(open_gguf(path)), len(IDS))
    engine = LlamaCppEngine(str(path), n_ctx=64, n_threads=1)
    try:
        captured = engine.capture(IDS)
    finally:
        engine.close()
    assert {name: captured[name].shape for name in expected if name in captured} == expected


def test_one_token_drops_the_token_axis_and_unknown_architectures_are_one_line(tiny_model, bad_model_files):
    dims = ModelDims.from_gguf(open_gguf(tiny_model("llama", "F32")))
    assert expected_tensors(dims, 1)["attn_norm-0"] == (256,)
    assert drop_leading_ones((1, 1, 4, 64)) == (4, 64) and drop_leading_ones((1,)) == (1,)
    with pytest.raises(GGUFParityError, match="architecture 'bloom'"):
        ModelDims.from_gguf(open_gguf(bad_model_files["unknown_arch"]))
