"""Gemma 2's own hyperparameters, and that its soft-capping is what makes it match llama.cpp."""

from __future__ import annotations

import dataclasses

import pytest
from llamacpp_parity import llamacpp_capture

from inference_engine.engine import OurEngine
from validation.diff import diff_captures

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")

IDS = [3, 17, 40, 99, 7, 12, 5, 9, 30, 44]  # 10 positions: past the window of 4


def test_hparams_from_the_file(tiny_model):
    hp = OurEngine(tiny_model("gemma2"), n_ctx=32).model.hp
    assert hp.swa_layers == (True, False, True, False) and hp.sliding_window == 4
    assert (hp.attn_softcap, hp.final_softcap) == (2.0, 3.0)


@pytest.mark.parametrize("field, first", [("attn_softcap", "kqv_out-0"), ("final_softcap", "result_output"),
                                          ("sliding_window", "kqv_out-0")])
def test_each_gemma2_feature_is_needed_to_match_llamacpp(tiny_model, field, first):
    path = tiny_model("gemma2")
    theirs = llamacpp_capture(path, IDS, n_ctx=32)
    ours = OurEngine(path, numerics="ggml", n_ctx=32)
    assert diff_captures(ours.capture(IDS, force=theirs), theirs, 1e-6).passed
    wrong = {"attn_softcap": 0.0, "final_softcap": 1000.0, "sliding_window": 0}[field]
    ours.model.hp = dataclasses.replace(ours.model.hp, **{field: wrong})
    assert diff_captures(ours.capture(IDS, force=theirs), theirs, 1e-6).first_failure == first
