"""Phi-3 (dense): llama.cpp's src/models/phi3.cpp.

What differs from Llama:

* Fused projections: one ``attn_qkv`` matrix gives Q, K and V stacked along its rows (tapped as ``wqkv``, then
  split: Q the first ``n_head * d`` rows, K the next ``n_head_kv * d``, V the rest; llama.cpp's ``build_qkv``
  views). Files with separate ``attn_q/k/v`` are read as llama.cpp reads them (``create_tensor_qkv``).
* One ``ffn_up`` of ``2 * n_ff`` rows holds gate and up: ``ggml_swiglu`` on it is ``silu(first half) * second
  half`` (no ``ffn_gate`` tensor, no ``ffn_gate`` name).
* NEOX RoPE; Q is multiplied by ``1/sqrtf(head_dim)`` after RoPE and *renamed* ``Qcur`` (the last value of the name
  is the scaled one), attention then runs with scale 1.
* Optional ``attn_output`` bias; no ``attn_out`` name; tied ``output`` falls back to ``token_embd``.
* llama.cpp disables Phi-3's sliding window ("Phi SWA is currently disabled"), so do we. The long-context RoPE factor
  tensors (``rope_factors_long/short``, Phi-3 128k) are refused, not silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import (
    HParams,
    Model,
    QKVWeights,
    Tap,
    Weights,
    default_attention_scale,
    no_tap,
    project_qkv,
    self_attention,
)


@dataclass(frozen=True)
class Phi3HParams(HParams):
    @classmethod
    def from_gguf(cls, f: GGUFFile) -> Phi3HParams:
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            if name in f.tensors:
                raise GGUFParityError(f"{f.path}: phi3 long-context RoPE factors ({name}) are not supported; "
                                      "supported: phi3 without rope_factors_long/short")
        return cls(**HParams.common(f))


@dataclass
class Phi3Layer:
    attn_norm: Any
    attn_qkv: Any | None  # fused (n_head*d + 2*n_head_kv*d, n_embd), or None with separate projections
    qkv: QKVWeights | None
    attn_output: Any
    attn_output_bias: Any | None
    ffn_norm: Any
    ffn_up: Any  # (2 * n_ff, n_embd): gate rows, then up rows
    ffn_down: Any


class Phi3Model(Model):
    hparams_class = Phi3HParams

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = []
        for il in range(self.hp.n_layer):
            fused = w.has("attn_qkv", il)
            self.layers.append(Phi3Layer(
                attn_norm=w.vector("attn_norm", il),
                attn_qkv=w.matrix("attn_qkv", il) if fused else None,
                qkv=None if fused else QKVWeights.load(w, il),
                attn_output=w.matrix("attn_output", il),
                attn_output_bias=w.optional_vector("attn_output", il, "bias"),
                ffn_norm=w.vector("ffn_norm", il),
                ffn_up=w.matrix("ffn_up", il),
                ffn_down=w.matrix("ffn_down", il),
            ))
        self.output_norm = w.vector("output_norm")
        self.output = w.output()

    def qkv(self, layer: Phi3Layer, h, il: int, tap: Tap):
        """Q, K, V per head from the fused matrix (split as llama.cpp's views) or the separate ones."""
        b, hp = self.backend, self.hp
        if layer.attn_qkv is None:
            return project_qkv(b, layer.qkv, h, hp)
        T = h.shape[0]
        q_dim, kv_dim = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
        qkv = b.matmul(layer.attn_qkv, h)  # (T, q_dim + 2 * kv_dim)
        qkv = tap(f"wqkv-{il}", qkv)
        q = qkv[:, :q_dim].reshape(T, hp.n_head, hp.head_dim_k)
        k = qkv[:, q_dim:q_dim + kv_dim].reshape(T, hp.n_head_kv, hp.head_dim_k)
        v = qkv[:, q_dim + kv_dim:].reshape(T, hp.n_head_kv, hp.head_dim_v)
        return q, k, v

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp = self.backend, self.hp
        q_scale = default_attention_scale(hp.head_dim_k)
        rope = {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}
        n_ff = hp.n_ff

        x = b.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)

        for il, layer in enumerate(self.layers):
            h = b.rms_norm(x, layer.attn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"attn_norm-{il}", h)

            q, k, v = self.qkv(layer, h, il, tap)  # (T, n_head, d), (T, n_head_kv, d), (T, n_head_kv, d)
            q = b.rope(np.ascontiguousarray(q) if isinstance(q, np.ndarray) else q, positions, **rope)
            k = b.rope(np.ascontiguousarray(k) if isinstance(k, np.ndarray) else k, positions, **rope)
            v = np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v
            k = tap(f"Kcur-{il}", k)
            v = tap(f"Vcur-{il}", v)
            q = b.scale(q, q_scale)  # (T, n_head, d): llama.cpp names the scaled Q "Qcur" again
            q = tap(f"Qcur-{il}", q)

            attn = self_attention(b, cache, il, q, k, v, positions, 1.0)  # (T, n_head * d)
            attn = tap(f"kqv_out-{il}", attn)
            attn = b.matmul(layer.attn_output, attn)  # (T, n_embd)
            if layer.attn_output_bias is not None:
                attn = b.add(attn, layer.attn_output_bias)

            if il == hp.n_layer - 1 and not all_logits:
                attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
            x = b.add(attn, x)  # (T, n_embd)

            h = b.rms_norm(x, layer.ffn_norm, hp.rms_eps)  # (T, n_embd)
            h = tap(f"ffn_norm-{il}", h)
            up = b.matmul(layer.ffn_up, h)  # (T, 2 * n_ff): gate half, then up half
            up = tap(f"ffn_up-{il}", up)
            gate, up = _halves(up, n_ff)
            h = b.swiglu(gate, up)  # (T, n_ff)
            h = tap(f"ffn_swiglu-{il}", h)
            h = b.matmul(layer.ffn_down, h)  # (T, n_embd)
            h = tap(f"ffn_out-{il}", h)

            x = b.add(h, x)  # (T, n_embd)
            x = tap(f"l_out-{il}", x)

        x = b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = b.matmul(self.output, x)  # (rows, n_vocab)
        logits = tap("result_output", logits)
        return logits


def _halves(x, n: int):
    """``(T, 2n)`` -> its two ``(T, n)`` halves, contiguous where the backend holds NumPy arrays."""
    a, c = x[:, :n], x[:, n:]
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(a), np.ascontiguousarray(c)
    return a, c
