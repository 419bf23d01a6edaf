"""Qwen2 (and Qwen2.5): llama.cpp's src/models/qwen2.cpp.

What differs from Llama: Q/K/V biases (loaded when present, as for llama), NEOX-style RoPE (pairs ``(i, i + d/2)``),
no ``attn_output`` bias and no ``attn_out`` name (llama.cpp's qwen2 graph names none), and an optional
``output.bias`` added to the logits. SwiGLU feed-forward; tied ``output`` falls back to ``token_embd``.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import HParams, Model, Tap, Weights, default_attention_scale, no_tap
from inference_engine.models.blocks import Attention, FeedForward, PreNormLayer, fused_layer


@dataclass(frozen=True)
class Qwen2HParams(HParams):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Qwen2HParams:
        return cls(**HParams.common(f))


class Qwen2Model(Model):
    hparams_class = Qwen2HParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [
            PreNormLayer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il, output_bias=False),
                ffn_norm=w.vector("ffn_norm", il),
                ffn=FeedForward.load(w, il),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.output()
        self.output_bias = w.optional_vector("output", suffix="bias")

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp
        kq_scale = default_attention_scale(hp.head_dim_k)
        rope = {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)

        for il, layer in enumerate(self.layers):
            fused = fused_layer(b, layer, hp, x, il, positions, cache, tap, rope, kq_scale)
            if fused is not None:  # a decode step nobody taps, the whole layer as one backend op
                x = fused  # (1, n_embd): l_out
                continue
            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)
            attn = layer.attn(b, hp, h, il, positions, cache, tap, rope, kq_scale,
                              tap_attn_out=False)  # (T, n_embd): Qcur..kqv_out, then attn_output

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            x = b.add(attn, x)  # (T, n_embd)
            x = tap(f"ffn_inp-{il}", x)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            h = layer.ffn(b, h, il, tap, "swiglu")  # (T, n_embd): ffn_up..ffn_out

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        if self.output_bias is not None:
            logits = b.add(logits, self.output_bias)
        logits = tap("result_output", logits)
        return logits
