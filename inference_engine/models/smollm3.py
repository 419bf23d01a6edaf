"""SmolLM3: llama.cpp's src/models/smollm3.cpp.

What differs from Llama: every fourth layer has no RoPE at all (NoPE: ``use_rope = (il + 1) % 4 != 0``, the step
fixed at 4 in ``llama_model_smollm3::load_arch_hparams`` whatever the file says), so layers 3, 7, 11, ... attend
over Q and K exactly as projected; no ``rope_freqs`` (llama.cpp passes no frequency factors) and no
``attn_output`` bias (it loads none: a file with one fails llama.cpp's tensor count). The rest is Llama's: RMSNorm
pre-norm blocks, NORM-style RoPE pairs (the converter subclasses Llama's and permutes Q/K rows), grouped-query
attention, optional Q/K/V biases, SwiGLU, ``attn_out`` tapped, ``output`` tied to ``token_embd`` when absent
(SmolLM3-3B ties them).
"""

from __future__ import annotations

from inference_engine.models.base import HParams, Weights, default_attention_scale
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel

# llama_model_smollm3::load_arch_hparams: hparams.n_no_rope_layer_step = 4 (not read from the file)
NO_ROPE_LAYER_STEP = 4


def uses_rope(il: int) -> bool:
    """Whether layer ``il`` rotates Q and K (llama.cpp: ``(il + 1) % n_no_rope_layer_step != 0``)."""
    return (il + 1) % NO_ROPE_LAYER_STEP != 0


class SmolLM3Model(DecoderModel):
    hparams_class = HParams

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il, output_bias=False)  # Q/K/V biases where the file has them

    def rope(self) -> dict:
        return {**super().rope(), "neox": False}  # NORM pairs (LLAMA_ROPE_TYPE_NORM)

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur, Kcur, Vcur, kqv_out, attn_out; SwiGLU: ffn_up, ffn_gate, ffn_swiglu, ffn_out
        return LayerSettings(rope=self.rope() if uses_rope(il) else None,
                             kq_scale=default_attention_scale(self.hp.head_dim_k), tap_attn_out=True)
