"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): llama.cpp's src/models/qwen2moe.cpp.

What differs from Qwen2: the feed-forward is a mixture of experts (:class:`~inference_engine.models.moe.
MoEFeedForward`: router ``ffn_gate_inp``, softmax, the ``expert_used_count`` best experts, weighted by their
probabilities *without* renormalization, ``norm_w = false``) plus a shared expert every token goes through, scaled by
``sigmoid(ffn_gate_inp_shexp . x)`` (:class:`~inference_engine.models.moe.SharedExpert`); ``ffn_out`` is their sum.
Q/K/V biases when present, NEOX RoPE, no ``attn_out`` name; ``output.weight`` is required (llama.cpp's loader has no
tied fallback for qwen2moe). The shared expert's width is ``expert_shared_feed_forward_length``, else
``feed_forward_length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference_engine.kv_cache import KVCache
from inference_engine.models.base import Model, Tap, Weights, default_attention_scale, no_tap
from inference_engine.models.blocks import Attention
from inference_engine.models.moe import MoEFeedForward, MoEHParams, SharedExpert


@dataclass
class Qwen2MoeLayer:
    attn_norm: Any
    attn: Attention
    ffn_norm: Any
    moe: MoEFeedForward
    shexp: SharedExpert


class Qwen2MoeModel(Model):
    hparams_class = MoEHParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            Qwen2MoeLayer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il, output_bias=False),
                ffn_norm=w.vector("ffn_norm", il),
                moe=MoEFeedForward.load(w, il, self.hp.n_expert_used, normalize_weights=False),
                shexp=SharedExpert.load(w, il),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.matrix("output")  # required: no tied fallback in llama.cpp's qwen2moe

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp
        kq_scale = default_attention_scale(hp.head_dim_k)
        rope = {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)

        for il, layer in enumerate(self.layers):
            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)
            attn = layer.attn(b, hp, h, il, positions, cache, tap, rope, kq_scale,
                              tap_attn_out=False)  # (T, n_embd): Qcur..kqv_out, then attn_output

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"ffn_inp-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            moe = layer.moe(b, h, il, tap)  # (T, n_embd): ffn_moe_logits..ffn_moe_out
            shared = layer.shexp(b, h, il, tap)  # (T, n_embd): ffn_up..ffn_shexp_out
            h = b.add(moe, shared)  # (T, n_embd)
            h = tap(f"ffn_out-{il}", h)

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        logits = tap("result_output", logits)
        return logits
