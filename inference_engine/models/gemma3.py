"""Gemma 3 (text): llama.cpp's src/models/gemma3.cpp, with the hyperparameters of llama_model_gemma3.

What differs from Llama, each as llama.cpp does it:

* Embeddings scaled by ``sqrtf(n_embd)`` (a float32 ``ggml_scale``; tapped as ``inp_scaled``).
* Per-head RMSNorm on Q and K before NEOX-style RoPE; the head size is ``attention.key_length`` (256 in 270M).
* Q is multiplied by ``f_attention_scale`` before attention, which then runs with scale 1: ``1/sqrt(head_dim)``,
  or ``1/sqrt(n_embd / n_head)`` for the 62-layer 27B (llama.cpp decides by layer count; it does not read
  ``query_pre_attn_scalar``).
* Sandwich norms: ``attn_post_norm`` on the attention output and ``ffn_post_norm`` on the FFN output, each before
  its residual add. The GGUF norm weights already hold ``1 + w``.
* GELU-tanh gated FFN (GEGLU).
* Interleaved sliding-window attention when ``attention.sliding_window`` is set: layer ``il`` is local iff
  ``il % n < n - 1`` with ``n = attention.sliding_window_pattern`` (default 6), or per layer when the file stores
  that key as an array. Local layers use ``rope.freq_base_swa`` (default 10000) and no RoPE scaling; global
  layers use ``rope.freq_base`` and ``rope.scaling.factor``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile
from inference_engine.models.base import HParams, Weights, default_attention_scale, sliding_window_layers
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel

DEFAULT_SWA_PATTERN = 6  # load_swa_pattern(ml, 6) in llama_model_gemma3::load_arch_hparams
DEFAULT_ROPE_FREQ_BASE_SWA = 10000.0  # llama_hparams::rope_freq_base_train_swa default
LAYERS_OF_27B = 62  # LLM_TYPE_27B: the one size whose attention scale uses n_embd / n_head


def attention_scale(n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """``f_attention_scale`` as llama_model_gemma3::load_arch_hparams sets it (a C float)."""
    if n_layer == LAYERS_OF_27B:
        return float(np.float32(1.0) / np.sqrt(np.float32(n_embd // n_head)))
    return default_attention_scale(head_dim)


@dataclass(frozen=True)
class Gemma3HParams(HParams):
    sliding_window: int  # n_swa; 0 = no sliding-window layers
    swa_layers: tuple[bool, ...]  # per layer: sliding-window attention?
    rope_freq_base_swa: float
    attention_scale: float  # f_attention_scale, applied to Q
    embedding_scale: float  # sqrtf(n_embd)

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Gemma3HParams:
        common = HParams.common(f)
        n_layer = common["n_layer"]
        n_swa = int(f.arch_value("attention.sliding_window", 0) or 0)
        swa = sliding_window_layers(f, n_layer, DEFAULT_SWA_PATTERN) if n_swa > 0 else (False,) * n_layer
        if f.arch_value("final_logit_softcapping", 0.0):
            raise GGUFParityError(f"{f.path}: gemma3 final_logit_softcapping is not supported")
        return cls(
            **common,
            sliding_window=n_swa,
            swa_layers=swa,
            rope_freq_base_swa=float(np.float32(f.arch_value("rope.freq_base_swa", DEFAULT_ROPE_FREQ_BASE_SWA))),
            attention_scale=attention_scale(n_layer, common["n_embd"], common["n_head"], common["head_dim_k"]),
            embedding_scale=float(np.sqrt(np.float32(common["n_embd"]))),
        )


class Gemma3Model(DecoderModel):
    hparams_class = Gemma3HParams
    scale_embeddings = True  # inp_scaled

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il, qk_norm=True, output_bias=False, sandwich=True)

    def rope_for_layer(self, il: int) -> dict:
        """RoPE settings of layer ``il`` (``llama_model::get_rope_freq_base / _scale``)."""
        hp = self.hp
        if hp.swa_layers[il]:
            return {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base_swa, "neox": True, "freq_scale": 1.0}
        return self.rope()

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur_normed, Kcur_normed, Qcur, Kcur, Vcur, Q scaled by f_attention_scale, kqv_out (no attn_out name),
        # attn_post_norm, sa_out; GEGLU: ffn_up..ffn_geglu..ffn_out, ffn_post_norm
        hp = self.hp
        return LayerSettings(rope=self.rope_for_layer(il), kq_scale=1.0, q_scale=hp.attention_scale,
                             sliding_window=hp.sliding_window if hp.swa_layers[il] else 0, activation="geglu")
