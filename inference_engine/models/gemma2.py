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
from typing import Any

import numpy as np

from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import (HParams, Model, Tap, Weights, default_attention_scale, no_tap,
                                          sliding_window_layers)
from inference_engine.models.blocks import Attention, FeedForward

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


@dataclass
class Gemma2Layer:
    attn_norm: Any
    attn: Attention
    post_attention_norm: Any
    ffn_norm: Any
    ffn: FeedForward
    post_ffw_norm: Any


class Gemma2Model(Model):
    hparams_class = Gemma2HParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            Gemma2Layer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il, output_bias=False),
                post_attention_norm=w.vector("post_attention_norm", il),
                ffn_norm=w.vector("ffn_norm", il),
                ffn=FeedForward.load(w, il),
                post_ffw_norm=w.vector("post_ffw_norm", il),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.output()

    def rope_for_layer(self, il: int) -> dict:
        hp = self.hp
        base = hp.rope_freq_base_swa if hp.swa_layers[il] else hp.rope_freq_base
        return {"n_dims": hp.n_rot, "freq_base": base, "neox": True, "freq_scale": hp.rope_freq_scale}

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)
        x = b.scale(x, hp.embedding_scale)  # (T, n_embd)
        x = tap("inp_scaled", x)

        for il, layer in enumerate(self.layers):
            window = hp.sliding_window if hp.swa_layers[il] else 0

            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)
            # Qcur, Kcur, Vcur, Q scaled by f_attention_scale, soft-capped scores, kqv_out; no attn_out name
            attn = layer.attn(b, hp, h, il, positions, cache, tap, self.rope_for_layer(il), 1.0,
                              q_scale=hp.attention_scale, sliding_window=window, tap_attn_out=False,
                              softcap=hp.attn_softcap)  # (T, n_embd)

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            attn = b.rms_norm(attn, layer.post_attention_norm, hp.rms_eps)  # (T, n_embd)
            attn = tap(f"attn_post_norm-{il}", attn)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"sa_out-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            h = layer.ffn(b, h, il, tap, "geglu")  # (T, n_embd): ffn_up..ffn_geglu..ffn_out
            h = b.rms_norm(h, layer.post_ffw_norm, hp.rms_eps)  # (T, n_embd): llama.cpp's unlayered ffn_post_norm

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        logits = b.softcap(logits, hp.final_softcap)  # (rows, n_vocab)
        logits = tap("result_output", logits)
        return logits
