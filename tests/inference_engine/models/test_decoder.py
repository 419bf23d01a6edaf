"""The decoder's one layer loop hands a backend's fused decode op the model's own plan of each dense layer, built once;
layers it has no plan for (experts, phi3's fused projections, gemma2's soft-capped scores) run their ops."""

from __future__ import annotations

import dataclasses

import pytest

from inference_engine.backends.base import FusedLayerPlan
from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.engine import OurEngine

DENSE = ("llama", "qwen2", "qwen3", "gemma3", "smollm3")
OTHERS = ("gemma2", "phi3", "qwen2moe", "qwen3moe")


class PlanRecordingBackend(NumpyBackend):
    """The NumPy reference, recording the plan of every ``decode_layer`` call and fusing nothing."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plans: list[tuple[int, FusedLayerPlan]] = []

    def decode_layer(self, plan, x, il, positions, cache):  # returns None: the layer's ops run
        self.plans.append((il, plan))


def _engine(tiny_model, arch: str, monkeypatch) -> OurEngine:
    monkeypatch.setattr("inference_engine.engine.get_backend", lambda *a, **k: PlanRecordingBackend())
    return OurEngine(tiny_model(arch), n_ctx=32)


@pytest.mark.parametrize("arch", DENSE + OTHERS)
def test_a_decode_step_hands_over_the_models_plans_built_once(tiny_model, monkeypatch, arch):
    engine = _engine(tiny_model, arch, monkeypatch)
    model, backend = engine.model, engine.backend
    engine.prefill([1, 5, 9])
    assert backend.plans == []  # a prefill never asks
    engine.decode(3)
    engine.decode(4)
    plans = model.fused_plan()
    assert model.fused_plan() is plans and len(plans) == model.hp.n_layer
    if arch in OTHERS:
        assert plans == [None] * model.hp.n_layer and backend.plans == []
        return
    assert [il for il, _ in backend.plans] == list(range(model.hp.n_layer)) * 2
    assert all(plan is plans[il] for il, plan in backend.plans)  # the same objects every token
    first = plans[0]
    layer, hp = model.layers[0], model.hp
    assert first.qkv == (layer.attn.qkv.attn_q, layer.attn.qkv.attn_k, layer.attn.qkv.attn_v)
    assert first.ffn_gate_up == (layer.ffn.ffn_gate, layer.ffn.ffn_up) and first.ffn_down is layer.ffn.ffn_down
    assert (first.n_head, first.n_head_kv, first.head_dim_k, first.rms_eps) == (hp.n_head, hp.n_head_kv,
                                                                                hp.head_dim_k, hp.rms_eps)
    assert first.activation == ("geglu" if arch == "gemma3" else "swiglu")
    assert (first.post_ffw_norm is not None) == (arch == "gemma3")
    assert (first.qk_norm[0] is not None) == (arch in ("qwen3", "gemma3"))


def test_replaced_hyperparameters_give_new_settings_and_plans(tiny_model, monkeypatch):
    engine = _engine(tiny_model, "gemma3", monkeypatch)
    model = engine.model
    plans = model.fused_plan()
    model.hp = dataclasses.replace(model.hp, sliding_window=model.hp.sliding_window + 1)
    assert model.fused_plan() is not plans
    windows = {plan.sliding_window for plan in model.fused_plan()} - {0}
    assert windows == {model.hp.sliding_window}
