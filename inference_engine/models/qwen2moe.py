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

from inference_engine.models.base import Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings
from inference_engine.models.decoder import DecoderModel
from inference_engine.models.moe import MoEHParams, MoELayer


class Qwen2MoeModel(DecoderModel):
    hparams_class = MoEHParams
    output_tied = False  # output.weight required: no tied fallback in llama.cpp's qwen2moe

    def load_layer(self, w: Weights, il: int) -> MoELayer:
        return MoELayer.load_moe(w, il, self.hp.n_expert_used, normalize_weights=False, shared=True)

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur, Kcur, Vcur, kqv_out (no attn_out name); ffn_moe_logits..ffn_moe_out, ffn_up..ffn_shexp_out, ffn_out
        return LayerSettings(rope=self.rope(), kq_scale=default_attention_scale(self.hp.head_dim_k))
