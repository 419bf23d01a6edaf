"""A decode step on the numba backend through its fused attention (``decode_attention``) and its one-call token
mat-vecs gives the logits of the ops one by one, on every architecture whose attention block asks for it.

The ops one by one are what validation compares with llama.cpp tensor by tensor (a tap turns the fused path off),
so bit-identical logits here carry that comparison over to the untapped decode steps users run.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.backends import numba_cpu
from inference_engine.engine import OurEngine

# gemma3: query scale, sliding-window layers, NEOX RoPE; the MoE files use the same attention block
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe")
STEPS = 6


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_decode_attention_gives_the_ops_logits(tiny_model, monkeypatch, arch, kv_type):
    engine = OurEngine(tiny_model(arch, "Q4_K"), backend="numba", numerics="ggml", n_ctx=64, kv_type=kv_type)
    fused = numba_cpu.NumbaBackend.decode_attention
    calls = []

    def counted(self, *args, **kwargs):
        out = fused(self, *args, **kwargs)
        calls.append(out is not None)
        return out

    runs = []
    for variant in (counted, lambda *args, **kwargs: None):
        monkeypatch.setattr(numba_cpu.NumbaBackend, "decode_attention", variant)
        engine.reset()
        engine.prefill([1, 5, 9, 2, 7])
        runs.append(np.stack([np.array(engine.decode(3 + i)) for i in range(STEPS)]))
    n_layer = engine.model.hp.n_layer
    assert calls == [True] * (n_layer * STEPS)  # every layer of every step, none of the prefill
    np.testing.assert_array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))
