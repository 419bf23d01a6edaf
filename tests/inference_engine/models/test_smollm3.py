"""SmolLM3's NoPE layers: which layers skip RoPE, and that skipping it is what makes the model match llama.cpp."""

from __future__ import annotations

import pytest
from llamacpp_parity import llamacpp_capture

from inference_engine.engine import OurEngine
from inference_engine.models import smollm3
from validation.diff import diff_captures

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")

IDS = [3, 17, 40, 99, 7, 12, 5, 9, 30, 44]  # 10 positions: RoPE moves every position but the first


def test_every_fourth_layer_has_no_rope(tiny_model):
    model = OurEngine(tiny_model("smollm3", n_layer=8), n_ctx=32).model
    assert [s.rope is None for s in model.settings] == [False, False, False, True] * 2
    assert all(s.rope["neox"] is False for s in model.settings if s.rope is not None)  # NORM pairs, as llama


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_rotating_the_nope_layer_is_caught_against_llamacpp(tiny_model, monkeypatch, backend):
    path = tiny_model("smollm3")
    theirs = llamacpp_capture(path, IDS, n_ctx=32)
    assert diff_captures(OurEngine(path, backend=backend, numerics="ggml", n_ctx=32).capture(IDS, force=theirs),
                         theirs, 1e-6).passed
    monkeypatch.setattr(smollm3, "uses_rope", lambda il: True)  # a Llama that forgot the NoPE layers
    wrong = OurEngine(path, backend=backend, numerics="ggml", n_ctx=32)
    assert diff_captures(wrong.capture(IDS, force=theirs), theirs, 1e-6).first_failure == "Qcur-3"
