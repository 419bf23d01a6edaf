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

from inference_engine.backends.base import Array, Backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import (
    HParams,
    QKVWeights,
    Tap,
    Weights,
    default_attention_scale,
    project_qkv,
    self_attention,
)
from inference_engine.models.blocks import LayerSettings, add_norm
from inference_engine.models.decoder import DecoderModel


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

    @classmethod
    def load(cls, w: Weights, il: int) -> Phi3Layer:
        fused = w.has("attn_qkv", il)
        return cls(
            attn_norm=w.vector("attn_norm", il),
            attn_qkv=w.matrix("attn_qkv", il) if fused else None,
            qkv=None if fused else QKVWeights.load(w, il),
            attn_output=w.matrix("attn_output", il),
            attn_output_bias=w.optional_vector("attn_output", il, "bias"),
            ffn_norm=w.vector("ffn_norm", il),
            ffn_up=w.matrix("ffn_up", il),
            ffn_down=w.matrix("ffn_down", il),
        )

    def project_qkv(self, b: Backend, hp: HParams, h: Array, il: int, tap: Tap):
        """Q, K, V per head from the fused matrix (split as llama.cpp's views) or the separate ones."""
        if self.attn_qkv is None:
            return project_qkv(b, self.qkv, h, hp)
        T = h.shape[0]
        q_dim, kv_dim = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
        qkv = b.matmul(self.attn_qkv, h)  # (T, q_dim + 2 * kv_dim)
        qkv = tap(f"wqkv-{il}", qkv)
        q = qkv[:, :q_dim].reshape(T, hp.n_head, hp.head_dim_k)
        k = qkv[:, q_dim:q_dim + kv_dim].reshape(T, hp.n_head_kv, hp.head_dim_k)
        v = qkv[:, q_dim + kv_dim:].reshape(T, hp.n_head_kv, hp.head_dim_v)
        return q, k, v

    def __call__(self, b: Backend, hp: HParams, x: Array, il: int, positions: np.ndarray, cache: KVCache, tap: Tap,
                 s: LayerSettings, last: bool) -> Array:
        """The residual stream ``x (T, n_embd)`` through the layer, as :class:`~inference_engine.models.blocks.
        PreNormLayer`'s call."""
        h = b.rms_norm(x, self.attn_norm, hp.rms_eps)  # (T, n_embd)
        h = tap(f"attn_norm-{il}", h)

        q, k, v = self.project_qkv(b, hp, h, il, tap)  # (T, n_head, d), (T, n_head_kv, d), (T, n_head_kv, d)
        q = b.rope(np.ascontiguousarray(q) if isinstance(q, np.ndarray) else q, positions, **s.rope)
        k = b.rope(np.ascontiguousarray(k) if isinstance(k, np.ndarray) else k, positions, **s.rope)
        v = np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v
        k = tap(f"Kcur-{il}", k)
        v = tap(f"Vcur-{il}", v)
        q = b.scale(q, s.q_scale)  # (T, n_head, d): llama.cpp names the scaled Q "Qcur" again
        q = tap(f"Qcur-{il}", q)

        attn = self_attention(b, cache, il, q, k, v, positions, s.kq_scale)  # (T, n_head * d)
        attn = tap(f"kqv_out-{il}", attn)
        attn = b.matmul(self.attn_output, attn)  # (T, n_embd)
        if self.attn_output_bias is not None:
            attn = b.add(attn, self.attn_output_bias)

        if last:
            attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
        x, h = add_norm(b, tap, attn, x, self.ffn_norm, hp.rms_eps, None, f"ffn_norm-{il}")  # (T, n_embd) each
        up = b.matmul(self.ffn_up, h)  # (T, 2 * n_ff): gate half, then up half
        up = tap(f"ffn_up-{il}", up)
        gate, up = _halves(up, hp.n_ff)
        h = b.swiglu(gate, up)  # (T, n_ff)
        h = tap(f"ffn_swiglu-{il}", h)
        h = b.matmul(self.ffn_down, h)  # (T, n_embd)
        h = tap(f"ffn_out-{il}", h)

        x = b.add(h, x)  # (T, n_embd)
        return tap(f"l_out-{il}", x)


class Phi3Model(DecoderModel):
    hparams_class = Phi3HParams

    def load_layer(self, w: Weights, il: int) -> Phi3Layer:
        return Phi3Layer.load(w, il)

    def layer_settings(self, il: int) -> LayerSettings:
        # Q scaled by 1/sqrt(head_dim) after RoPE, attention with scale 1
        return LayerSettings(rope=self.rope(), kq_scale=1.0, q_scale=default_attention_scale(self.hp.head_dim_k))


def _halves(x, n: int):
    """``(T, 2n)`` -> its two ``(T, n)`` halves, contiguous where the backend holds NumPy arrays."""
    a, c = x[:, :n], x[:, n:]
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(a), np.ascontiguousarray(c)
    return a, c
