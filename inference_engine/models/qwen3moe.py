"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): llama.cpp's src/models/qwen3moe.cpp.

What differs from Qwen3: the feed-forward is a mixture of experts (:class:`~inference_engine.models.moe.
MoEFeedForward`: router ``ffn_gate_inp``, softmax, the ``expert_used_count`` best experts, their probabilities
renormalized to sum to 1, ``norm_w = true``: tapped ``ffn_moe_weights_sum``, ``_sum_clamped``, ``_norm``), no shared
expert, and ``ffn_moe_out`` goes straight into the residual (no ``ffn_out`` name). As Qwen3: per-head q/k RMSNorm
before NEOX RoPE, head size from ``attention.key_length``, no ``attn_out`` name; a missing ``output.weight`` falls
back to ``token_embd``.
"""

from __future__ import annotations

from inference_engine.models.base import Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings
from inference_engine.models.decoder import DecoderModel
from inference_engine.models.moe import MoEHParams, MoELayer


class Qwen3MoeModel(DecoderModel):
    hparams_class = MoEHParams

    def load_layer(self, w: Weights, il: int) -> MoELayer:
        return MoELayer.load_moe(w, il, self.hp.n_expert_used, normalize_weights=True, qk_norm=True)

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur_normed, Kcur_normed, Qcur, Kcur, Vcur, kqv_out (no attn_out name); ffn_moe_logits..ffn_moe_out
        return LayerSettings(rope=self.rope(), kq_scale=default_attention_scale(self.hp.head_dim_k))
