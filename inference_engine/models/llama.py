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

from dataclasses import dataclass

from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import HParams, Model, Tap, Weights, default_attention_scale, no_tap
from inference_engine.models.blocks import Attention, FeedForward, PreNormLayer, fused_layer


@dataclass(frozen=True)
class LlamaHParams(HParams):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> LlamaHParams:
        return cls(**HParams.common(f))


class LlamaModel(Model):
    hparams_class = LlamaHParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.rope_freqs = w.host_vector("rope_freqs")
        self.layers = [
            PreNormLayer(
                attn_norm=w.vector("attn_norm", il),
                attn=Attention.load(w, il),
                ffn_norm=w.vector("ffn_norm", il),
                ffn=FeedForward.load(w, il),
            )
            for il in range(self.hp.n_layer)
        ]
        self.output_norm = w.vector("output_norm")
        self.output = w.output()

    def rope(self) -> dict:
        hp = self.hp
        return {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": False, "freq_scale": hp.rope_freq_scale,
                "freq_factors": self.rope_freqs}

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp
        kq_scale = default_attention_scale(hp.head_dim_k)
        rope = self.rope()

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)

        for il, layer in enumerate(self.layers):
            fused = fused_layer(b, layer, hp, x, il, positions, cache, tap, rope, kq_scale)
            if fused is not None:  # a decode step nobody taps, the whole layer as one backend op
                x = fused  # (1, n_embd): l_out
                continue
            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)
            attn = layer.attn(b, hp, h, il, positions, cache, tap, rope, kq_scale)  # (T, n_embd): Qcur..attn_out

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
        logits = tap("result_output", logits)
        return logits
