"""Llama (and Mistral, SmolLM2, ...): llama.cpp's src/models/llama.cpp, dense (no MoE) branch.

Pre-norm blocks with RMSNorm; grouped-query attention with NORM-style RoPE (adjacent pairs: the GGUF converter
permuted Q/K rows for exactly this); SwiGLU feed-forward; tied ``output`` falls back to ``token_embd``.
Optional Q/K/V and ``attn_output`` biases and ``rope_freqs`` (Llama 3 frequency factors) are honoured as
llama.cpp does. The attention and FFN blocks are :mod:`inference_engine.models.blocks`.

Mistral-style ``llama.attention.sliding_window``: llama.cpp's llama architecture does not read it (src/models/llama.cpp
loads no ``LLM_KV_ATTENTION_SLIDING_WINDOW``; every layer attends to the whole context), and neither do we, since the
reference defines the right answer (tested past the window against llama.cpp in tests/validation/test_depth_llamacpp.py).
"""

from __future__ import annotations

from inference_engine.models.base import HParams, Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel


class LlamaModel(DecoderModel):
    hparams_class = HParams

    def load(self, w: Weights) -> None:
        self.rope_freqs = w.host_vector("rope_freqs")
        super().load(w)

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il)  # Q/K/V and attn_output biases where the file has them

    def rope(self) -> dict:
        return {**super().rope(), "neox": False, "freq_factors": self.rope_freqs}  # NORM pairs, Llama 3's factors

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur, Kcur, Vcur, kqv_out, attn_out; SwiGLU: ffn_up, ffn_gate, ffn_swiglu, ffn_out
        return LayerSettings(rope=self.rope(), kq_scale=default_attention_scale(self.hp.head_dim_k), tap_attn_out=True)
