"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): llama.cpp's src/models/qwen3moe.cpp.

What differs from Qwen3: the feed-forward is a mixture of experts (:class:`~inference_engine.models.moe.
MoEFeedForward`: router ``ffn_gate_inp``, softmax, the ``expert_used_count`` best experts, their probabilities
renormalized to sum to 1, ``norm_w = true``: tapped ``ffn_moe_weights_sum``, ``_sum_clamped``, ``_norm``), no shared
expert, and ``ffn_moe_out`` goes straight into the residual (no ``ffn_out`` name). As Qwen3: per-head q/k RMSNorm
before NEOX RoPE, head size from ``attention.key_length``, no ``attn_out`` name; a missing ``output.weight`` falls
back to ``token_embd``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference_engine.kv_cache import KVCache
from inference_engine.models.base import Model, Tap, Weights, default_attention_scale, no_tap
from inference_engine.models.blocks import Attention
from inference_engine.models.moe import MoEFeedForward, MoEHParams


@dataclass
class Qwen3MoeLayer:
    attn_norm: Any
    attn: Attention
    ffn_norm: Any
    moe: MoEFeedForward


class Qwen3MoeModel(Model):
    hparams_class = MoEHParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            Qwen3MoeLayer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il, qk_norm=True, output_bias=False),
                ffn_norm=w.vector("ffn_norm", il),
                moe=MoEFeedForward.load(w, il, self.hp.n_expert_used, normalize_weights=True),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.output()

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
                              tap_attn_out=False)  # (T, n_embd): Qcur_normed, Kcur_normed, Qcur..kqv_out

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"ffn_inp-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            h = layer.moe(b, h, il, tap)  # (T, n_embd): ffn_moe_logits..ffn_moe_out

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        logits = tap("result_output", logits)
        return logits
