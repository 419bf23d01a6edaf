"""Qwen2 (and Qwen2.5): llama.cpp's src/models/qwen2.cpp.

What differs from Llama: Q/K/V biases (loaded when present, as for llama), NEOX-style RoPE (pairs ``(i, i + d/2)``),
no ``attn_output`` bias and no ``attn_out`` name (llama.cpp's qwen2 graph names none), and an optional
``output.bias`` added to the logits. SwiGLU feed-forward; tied ``output`` falls back to ``token_embd``.
"""

from __future__ import annotations

from inference_engine.models.base import HParams, Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel


class Qwen2Model(DecoderModel):
    hparams_class = HParams

    def load(self, w: Weights) -> None:
        super().load(w)
        self.output_bias = w.optional_vector("output", suffix="bias")

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il, output_bias=False)  # Q/K/V biases where the file has them

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur, Kcur, Vcur, kqv_out (no attn_out name); SwiGLU
        return LayerSettings(rope=self.rope(), kq_scale=default_attention_scale(self.hp.head_dim_k))

    def logits(self, x):
        logits = super().logits(x)  # (rows, n_vocab)
        return logits if self.output_bias is None else self.backend.add(logits, self.output_bias)
