"""Qwen3 (dense): llama.cpp's src/models/qwen3.cpp.

What differs from Llama: a per-head RMSNorm on Q and K (``attn_q_norm`` / ``attn_k_norm``, weights of size
head_dim) before NEOX-style RoPE; the head size comes from ``attention.key_length`` (128 in Qwen3, not
n_embd / n_head); no ``attn_output`` bias and no ``attn_out`` name. No Q/K/V bias in the released models (llama.cpp
loads them when present, so do we); SwiGLU feed-forward.
"""

from __future__ import annotations

from inference_engine.models.base import HParams, Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel


class Qwen3Model(DecoderModel):
    hparams_class = HParams

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il, qk_norm=True, output_bias=False)

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur_normed, Kcur_normed, Qcur, Kcur, Vcur, kqv_out (no attn_out name); SwiGLU
        return LayerSettings(rope=self.rope(), kq_scale=default_attention_scale(self.hp.head_dim_k))
