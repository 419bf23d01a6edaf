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
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import (HParams, Model, Tap, Weights, default_attention_scale, no_tap,
                                          sliding_window_layers)
from inference_engine.models.blocks import Attention, FeedForward, fused_layer

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


@dataclass
class Gemma3Layer:
    attn_norm: Any
    attn: Attention  # with per-head Q/K norms
    post_attention_norm: Any
    ffn_norm: Any
    ffn: FeedForward
    post_ffw_norm: Any


class Gemma3Model(Model):
    hparams_class = Gemma3HParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            Gemma3Layer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il, qk_norm=True, output_bias=False),
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
        """RoPE settings of layer ``il`` (``llama_model::get_rope_freq_base / _scale``)."""
        hp = self.hp
        if hp.swa_layers[il]:
            return {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base_swa, "neox": True, "freq_scale": 1.0}
        return {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)
        x = b.scale(x, hp.embedding_scale)  # (T, n_embd)
        x = tap("inp_scaled", x)

        for il, layer in enumerate(self.layers):
            rope = self.rope_for_layer(il)
            window = hp.sliding_window if hp.swa_layers[il] else 0
            fused = fused_layer(b, layer, hp, x, il, positions, cache, tap, rope, 1.0, q_scale=hp.attention_scale,
                                sliding_window=window, activation="geglu")
            if fused is not None:  # a decode step nobody taps, the whole layer as one backend op
                x = fused  # (1, n_embd): l_out
                continue

            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)

            # Qcur_normed, Kcur_normed, Qcur, Kcur, Vcur, Q scaled by f_attention_scale, kqv_out; no attn_out name
            attn = layer.attn(b, hp, h, il, positions, cache, tap, rope, 1.0, q_scale=hp.attention_scale,
                              sliding_window=window, tap_attn_out=False)  # (T, n_embd)

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            attn = b.rms_norm(attn, layer.post_attention_norm, hp.rms_eps)  # (T, n_embd)
            attn = tap(f"attn_post_norm-{il}", attn)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"sa_out-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            h = layer.ffn(b, h, il, tap, "geglu")  # (T, n_embd): ffn_up..ffn_geglu..ffn_out
            h = b.rms_norm(h, layer.post_ffw_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_post_norm-{il}", h)

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        logits = tap("result_output", logits)
        return logits
