"""Qwen2 (and Qwen2.5): llama.cpp's src/models/qwen2.cpp.

Llama's block with Q/K/V biases and NEOX-style RoPE (pairs ``(i, i + d/2)``); SwiGLU feed-forward; tied
``output`` falls back to ``token_embd``; an optional ``output.bias`` is added to the logits. llama.cpp's qwen2
graph names no ``attn_out`` tensor, so neither do we.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference_engine.gguf_file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import (
    HParams,
    Model,
    QKVWeights,
    Tap,
    Weights,
    default_attention_scale,
    no_tap,
    project_qkv,
    self_attention,
)


@dataclass(frozen=True)
class Qwen2HParams(HParams):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Qwen2HParams:
        return cls(**HParams.common(f))


@dataclass
class Qwen2Layer:
    attn_norm: Any
    qkv: QKVWeights
    attn_output: Any
    ffn_norm: Any
    ffn_gate: Any
    ffn_up: Any
    ffn_down: Any


class Qwen2Model(Model):
    hparams_class = Qwen2HParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            Qwen2Layer(
                attn_norm=w.vector("attn_norm", il),
                qkv=QKVWeights.load(w, il),
                attn_output=w.matrix("attn_output", il),
                ffn_norm=w.vector("ffn_norm", il),
                ffn_gate=w.matrix("ffn_gate", il),
                ffn_up=w.matrix("ffn_up", il),
                ffn_down=w.matrix("ffn_down", il),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.output()
        self.output_bias = w.optional_vector("output", suffix="bias")

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp
        kq_scale = default_attention_scale(hp.head_dim_k)
        rope = {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)

        for il, layer in enumerate(self.layers):
            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)

            q, k, v = project_qkv(b, layer.qkv, h, hp)  # (T, n_head, d), (T, n_head_kv, d), (T, n_head_kv, d)
            q = b.rope(q, positions, **rope)  # (T, n_head, d)
            k = b.rope(k, positions, **rope)  # (T, n_head_kv, d)
            q = tap(f"Qcur-{il}", q)
            k = tap(f"Kcur-{il}", k)
            v = tap(f"Vcur-{il}", v)

            attn = self_attention(b, cache, il, q, k, v, positions, kq_scale)  # (T, n_head * d)
            attn = tap(f"kqv_out-{il}", attn)
            attn = b.matmul(layer.attn_output, attn)  # (T, n_embd)

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"ffn_inp-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            up = b.matmul(layer.ffn_up, h)  # (T, n_ff)
            up = tap(f"ffn_up-{il}", up)
            gate = b.matmul(layer.ffn_gate, h)  # (T, n_ff)
            gate = tap(f"ffn_gate-{il}", gate)
            h = b.swiglu(gate, up)  # (T, n_ff)
            h = tap(f"ffn_swiglu-{il}", h)
            h = b.matmul(layer.ffn_down, h)  # (T, n_embd)
            h = tap(f"ffn_out-{il}", h)

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        if self.output_bias is not None:
            logits = b.add(logits, self.output_bias)
        logits = tap("result_output", logits)
        return logits
