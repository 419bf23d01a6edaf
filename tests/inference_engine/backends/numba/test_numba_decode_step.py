"""A decode step on the numba backend through its fused layer (``decode_layer``), its fused attention
(``decode_attention``) and its one-call token mat-vecs gives the logits of the ops one by one, on every architecture
that asks for them.

The ops one by one are what validation compares with llama.cpp tensor by tensor (a tap turns the fused path off),
so bit-identical logits here carry that comparison over to the untapped decode steps users run.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.backends import numba_cpu
from inference_engine.engine import OurEngine

# gemma3: query scale, sliding-window layers, NEOX RoPE; the MoE files use the same attention block; smollm3: a layer
# without RoPE (its fourth)
ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe", "smollm3")
STEPS = 6


def count_fused(monkeypatch, op: str) -> list[bool]:
    """Record, for each later call of ``NumbaBackend.<op>``, whether it fused (returned a value, not None)."""
    fused = getattr(numba_cpu.NumbaBackend, op)
    calls: list[bool] = []

    def counted(self, *args, **kwargs):
        out = fused(self, *args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(numba_cpu.NumbaBackend, op, counted)
    return calls


def decode_logits(engine) -> np.ndarray:
    engine.reset()
    engine.prefill([1, 5, 9, 2, 7])
    return np.stack([np.array(engine.decode(3 + i)) for i in range(STEPS)])


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_decode_attention_gives_the_ops_logits(tiny_model, monkeypatch, arch, kv_type):
    monkeypatch.setattr(numba_cpu.NumbaBackend, "fuse_layers", False)  # else dense layers are fused whole
    engine = OurEngine(tiny_model(arch, "Q4_K"), backend="numba", numerics="ggml", n_ctx=64, kv_type=kv_type)
    calls = count_fused(monkeypatch, "decode_attention")
    fused = decode_logits(engine)
    assert calls == [True] * (engine.model.hp.n_layer * STEPS)  # every layer of every step, none of the prefill
    monkeypatch.setattr(numba_cpu.NumbaBackend, "decode_attention", lambda *args, **kwargs: None)
    np.testing.assert_array_equal(fused.view(np.uint32), decode_logits(engine).view(np.uint32))


def decode_with_and_without_fused_layers(engine, monkeypatch) -> tuple[list[bool], np.ndarray, np.ndarray]:
    """Whether each ``decode_layer`` call of the fused run fused, then the decoded logits with fused layers and with
    the ops one by one."""
    calls = count_fused(monkeypatch, "decode_layer")
    monkeypatch.setattr(engine.model.backend, "fuse_layers", True)
    fused = decode_logits(engine)
    fused_calls = list(calls)
    monkeypatch.setattr(engine.model.backend, "fuse_layers", False)
    return fused_calls, fused, decode_logits(engine)


# (architecture, file type, per-kind type overrides): llama (NORM RoPE, no biases), qwen2 (Q/K/V biases, NEOX),
# qwen3 (per-head Q/K norms), gemma3 (post-attention and post-FFN norms, the query scale, sliding-window layers,
# GEGLU), smollm3 (its fourth layer without RoPE); V of another type than Q and K (Q/K/V in two runs, as Q4_K_M files), gate and up of different types, and
# each type with a one-token kernel.
FUSED_LAYERS = [
    ("llama", "Q4_1", {}),
    ("llama", "Q4_0", {"attn_output": "Q5_0", "ffn_down": "Q5_1"}),
    ("llama", "Q8_0", {}),
    ("qwen2", "Q4_K", {"attn_v": "Q6_K", "ffn_down": "Q6_K"}),
    ("qwen3", "Q5_K", {"ffn_up": "Q8_0"}),
    ("gemma3", "Q4_K", {"attn_v": "Q6_K"}),
    ("smollm3", "Q4_K", {"attn_v": "Q6_K", "ffn_down": "Q6_K"}),  # a NoPE layer, Q4_K_M's mix
]


@pytest.mark.parametrize("kv_type", ["f16", "f32"])
@pytest.mark.parametrize("arch,qtype,types", FUSED_LAYERS)
def test_fused_decode_layer_gives_the_ops_logits(tiny_model, monkeypatch, arch, qtype, types, kv_type):
    path = tiny_model(arch, qtype, tensor_types=types)
    engine = OurEngine(path, backend="numba", numerics="ggml", n_ctx=64, kv_type=kv_type)
    calls, fused, ops = decode_with_and_without_fused_layers(engine, monkeypatch)
    assert calls == [True] * (engine.model.hp.n_layer * STEPS)  # every layer of every decode step, never the prefill
    np.testing.assert_array_equal(fused.view(np.uint32), ops.view(np.uint32))


@pytest.mark.parametrize("arch,qtype,types,numerics", [
    ("llama", "Q4_K", {"attn_k": "Q8_0"}, "ggml"),  # Q, K, V in three runs
    ("llama", "F16", {}, "ggml"),  # no one-token integer kernel
    ("qwen2", "Q4_1", {}, "f32"),  # the float kernels' numerics
])
def test_layers_the_fused_op_does_not_compute_run_op_by_op(tiny_model, monkeypatch, arch, qtype, types, numerics):
    engine = OurEngine(tiny_model(arch, qtype, tensor_types=types), backend="numba", numerics=numerics, n_ctx=64)
    calls, fused, ops = decode_with_and_without_fused_layers(engine, monkeypatch)
    assert calls and not any(calls)
    np.testing.assert_array_equal(fused.view(np.uint32), ops.view(np.uint32))


def test_the_fused_layer_multiplies_every_type_with_a_one_token_kernel():
    """token_matvec's branches (the fused layer's) name the types that have a token_<type> kernel in the kernel
    table; a type added to one and not the other would be left out of the fused layer (or fail inside it)."""
    from inference_engine.backends.numba_kernels import KERNELS, decode_layer, entries

    with_token_kernel = {t for t in KERNELS if KERNELS.get(t).matvec_token is not None}
    assert set(decode_layer.TOKEN_TYPES) == with_token_kernel
    assert decode_layer.token_matvec is entries.token_matvec
