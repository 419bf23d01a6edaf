"""Gemma 2: llama.cpp's src/models/gemma2.cpp, with the hyperparameters of llama_model_gemma2.

What differs from Gemma 3 (whose file this one mirrors):

* Soft-capping: attention scores become ``c * tanh(scores / c)`` before the mask and softmax
  (``attn_logit_softcapping``, default 50), and the logits ``c * tanh(logits / c)`` (``final_logit_softcapping``,
  default 30), each as llama.cpp's scale, tanh, scale.
* No per-head Q/K norms. Sliding-window layers alternate: layer ``il`` is local iff ``il % 2 == 0``
  (``load_swa_pattern(ml, 2)``), window ``attention.sliding_window`` (default 4096); local and global layers share
  one RoPE base unless the file sets ``rope.freq_base_swa``.
* llama.cpp names the FFN post-norm ``ffn_post_norm`` without a layer suffix (``cb(..., -1)``), so it is not
  tapped: one name for every layer cannot be compared or forced per layer. ``l_out`` follows it.

Shared with Gemma 3: embeddings scaled by ``sqrtf(n_embd)`` (``inp_scaled``), Q scaled by ``f_attention_scale``
before attention with scale 1 (``1/sqrt(head_dim)``; the 46-layer 27B uses ``n_embd / n_head``), sandwich norms
(``attn_post_norm``, the FFN post-norm), GELU-tanh gated FFN, tied output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference_engine.gguf.file import GGUFFile
from inference_engine.models.base import HParams, Weights, default_attention_scale, sliding_window_layers
from inference_engine.models.blocks import LayerSettings, PreNormLayer
from inference_engine.models.decoder import DecoderModel

SWA_PATTERN = 2  # load_swa_pattern(ml, 2)
DEFAULT_SLIDING_WINDOW = 4096  # hparams.n_swa = 4096, "default value of gemma 2"
DEFAULT_ATTN_SOFTCAP = 50.0  # llama_hparams::f_attn_logit_softcapping
DEFAULT_FINAL_SOFTCAP = 30.0  # llama_hparams::f_final_logit_softcapping
LAYERS_OF_27B = 46


@dataclass(frozen=True)
class Gemma2HParams(HParams):
    sliding_window: int
    swa_layers: tuple[bool, ...]
    rope_freq_base_swa: float
    attention_scale: float
    embedding_scale: float
    attn_softcap: float
    final_softcap: float

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Gemma2HParams:
        common = HParams.common(f)
        n_layer = common["n_layer"]
        if n_layer == LAYERS_OF_27B:
            scale = float(np.float32(1.0) / np.sqrt(np.float32(common["n_embd"] // common["n_head"])))
        else:
            scale = default_attention_scale(common["head_dim_k"])
        return cls(
            **common,
            sliding_window=int(f.arch_value("attention.sliding_window", DEFAULT_SLIDING_WINDOW)),
            swa_layers=sliding_window_layers(f, n_layer, SWA_PATTERN),
            rope_freq_base_swa=float(np.float32(f.arch_value("rope.freq_base_swa", common["rope_freq_base"]))),
            attention_scale=scale,
            embedding_scale=float(np.sqrt(np.float32(common["n_embd"]))),
            attn_softcap=float(np.float32(f.arch_value("attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP))),
            final_softcap=float(np.float32(f.arch_value("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP))),
        )


class Gemma2Model(DecoderModel):
    hparams_class = Gemma2HParams
    scale_embeddings = True  # inp_scaled

    def load_layer(self, w: Weights, il: int) -> PreNormLayer:
        return PreNormLayer.load(w, il, output_bias=False, sandwich=True)

    def rope_for_layer(self, il: int) -> dict:
        hp = self.hp
        return {**self.rope(), "freq_base": hp.rope_freq_base_swa if hp.swa_layers[il] else hp.rope_freq_base}

    def layer_settings(self, il: int) -> LayerSettings:
        # Qcur, Kcur, Vcur, Q scaled by f_attention_scale, soft-capped scores, kqv_out (no attn_out name),
        # attn_post_norm, sa_out; GEGLU: ffn_up..ffn_geglu..ffn_out; llama.cpp's unlayered ffn_post_norm untapped
        hp = self.hp
        return LayerSettings(rope=self.rope_for_layer(il), kq_scale=1.0, q_scale=hp.attention_scale,
                             sliding_window=hp.sliding_window if hp.swa_layers[il] else 0, softcap=hp.attn_softcap,
                             activation="geglu", tap_ffn_post_norm=False)

    def logits(self, x):
        return self.backend.softcap(super().logits(x), self.hp.final_softcap)  # (rows, n_vocab)
