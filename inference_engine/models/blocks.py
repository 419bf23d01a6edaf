"""The attention and feed-forward blocks most architectures share, tapping under llama.cpp's names as they go.

An architecture file loads its weights into these blocks and calls them inside its own layer loop, so the file reads
top to bottom (norms, residual adds, what is tapped where) and shows only what differs from its neighbours (mlx-lm's
small blocks; transformers' "diff against llama"). Each block is the graph of llama.cpp's ``build_attn`` /
``build_ffn`` for the variants llama.cpp has:

* :class:`Attention`: Q/K/V projections (optional biases), optional per-head RMSNorm on Q and K before RoPE (qwen3,
  gemma3: tapped ``Qcur_normed`` / ``Kcur_normed``), RoPE, ``Qcur``/``Kcur``/``Vcur`` taps, an optional scale of Q
  (gemma3's ``f_attention_scale``), attention over the KV cache through :func:`~inference_engine.models.base.
  self_attention` (the cache seam: its signature and meaning stay put), ``kqv_out``, the output projection with its
  optional bias, and ``attn_out`` where llama.cpp names it. A single token that nothing taps (a decode step) first
  asks the backend's :meth:`~inference_engine.backends.base.Backend.decode_attention` to do RoPE through attention
  as one op (the same values); a backend without it runs the ops one by one.
* :class:`FeedForward`: gated feed-forward, ``ffn_up``, ``ffn_gate``, the gated activation (``ffn_swiglu`` /
  ``ffn_geglu``), ``ffn_down`` as ``ffn_out``.
* :func:`fused_layer`: a decode step nobody taps first asks the backend's
  :meth:`~inference_engine.backends.base.Backend.decode_layer` for the whole layer as one op (the same values);
  a backend without it (or a layer it does not fuse) returns None and the layer loop runs the blocks.

The mixture-of-experts feed-forward (router, top-k experts, shared expert) is :mod:`inference_engine.models.moe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.backends.base import Array, Backend
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import HParams, QKVWeights, Tap, Weights, no_tap, project_qkv, self_attention


@dataclass
class Attention:
    """One layer's self-attention weights; ``__call__`` is the block."""

    qkv: QKVWeights
    attn_output: Any
    attn_output_bias: Array | None = None
    attn_q_norm: Array | None = None  # per-head RMSNorm weights (size head_dim), qwen3 / gemma3
    attn_k_norm: Array | None = None

    @classmethod
    def load(cls, w: Weights, il: int, qk_norm: bool = False, output_bias: bool = True) -> Attention:
        return cls(
            qkv=QKVWeights.load(w, il),
            attn_output=w.matrix("attn_output", il),
            attn_output_bias=w.optional_vector("attn_output", il, "bias") if output_bias else None,
            attn_q_norm=w.vector("attn_q_norm", il) if qk_norm else None,
            attn_k_norm=w.vector("attn_k_norm", il) if qk_norm else None,
        )

    def __call__(
        self,
        b: Backend,
        hp: HParams,
        h: Array,
        il: int,
        positions: np.ndarray,
        cache: KVCache,
        tap: Tap,
        rope: dict,
        kq_scale: float,
        q_scale: float | None = None,
        sliding_window: int = 0,
        tap_attn_out: bool = True,
        softcap: float = 0.0,
    ) -> Array:
        """``h (T, n_embd)`` (the normed input) -> the attention output ``(T, n_embd)`` before any residual."""
        q, k, v = project_qkv(b, self.qkv, h, hp)  # (T, n_head, d), (T, n_head_kv, d), (T, n_head_kv, d)
        if self.attn_q_norm is not None:
            q = b.rms_norm(q, self.attn_q_norm, hp.rms_eps)  # (T, n_head, d): per head
            q = tap(f"Qcur_normed-{il}", q)
        if self.attn_k_norm is not None:
            k = b.rms_norm(k, self.attn_k_norm, hp.rms_eps)  # (T, n_head_kv, d): per head
            k = tap(f"Kcur_normed-{il}", k)
        attn = None
        if tap is no_tap and q.shape[0] == 1 and not softcap:  # a decode step nobody taps: one op where fused
            attn = b.decode_attention(cache, il, q, k, v, positions, rope, kq_scale, q_scale, sliding_window)
        if attn is None:
            attn = self._attend(b, il, q, k, v, positions, cache, tap, rope, kq_scale, q_scale, sliding_window,
                                softcap)  # (T, n_head * d_v)
        attn = tap(f"kqv_out-{il}", attn)
        attn = b.matmul(self.attn_output, attn)  # (T, n_embd)
        if self.attn_output_bias is not None:
            attn = b.add(attn, self.attn_output_bias)
        if tap_attn_out:
            attn = tap(f"attn_out-{il}", attn)
        return attn

    @staticmethod
    def _attend(b: Backend, il: int, q: Array, k: Array, v: Array, positions: np.ndarray, cache: KVCache, tap: Tap,
                rope: dict, kq_scale: float, q_scale: float | None, sliding_window: int, softcap: float) -> Array:
        """RoPE, the ``Qcur``/``Kcur``/``Vcur`` taps, the query scale, then attention over the cache."""
        q = b.rope(q, positions, **rope)  # (T, n_head, d)
        k = b.rope(k, positions, **rope)  # (T, n_head_kv, d)
        q = tap(f"Qcur-{il}", q)
        k = tap(f"Kcur-{il}", k)
        v = tap(f"Vcur-{il}", v)
        if q_scale is not None:
            q = b.scale(q, q_scale)  # (T, n_head, d)
        if softcap:  # Gemma 2's attention-score soft-capping
            return self_attention(b, cache, il, q, k, v, positions, kq_scale, sliding_window, softcap)
        return self_attention(b, cache, il, q, k, v, positions, kq_scale, sliding_window)  # (T, n_head * d_v)


@dataclass
class FeedForward:
    """One layer's gated feed-forward weights; ``__call__`` is the block."""

    ffn_gate: Any
    ffn_up: Any
    ffn_down: Any

    @classmethod
    def load(cls, w: Weights, il: int, suffix: str = "") -> FeedForward:
        """``suffix``: ``"_shexp"`` loads an MoE's shared expert (``ffn_gate_shexp``...), same block."""
        ffn_gate, ffn_up = w.matrices((f"ffn_gate{suffix}", f"ffn_up{suffix}"), il)
        return cls(ffn_gate=ffn_gate, ffn_up=ffn_up, ffn_down=w.matrix(f"ffn_down{suffix}", il))

    def __call__(self, b: Backend, h: Array, il: int, tap: Tap, activation: str = "swiglu",
                 out_name: str = "ffn_out") -> Array:
        """``h (T, n_embd)`` (the normed input) -> ``(T, n_embd)``; ``activation``: ``swiglu`` or ``geglu``;
        ``out_name``: what llama.cpp calls the down projection's output (``ffn_shexp`` for a shared expert)."""
        gate, up = b.matmul_many((self.ffn_gate, self.ffn_up), h)  # (T, n_ff) each
        up = tap(f"ffn_up-{il}", up)
        gate = tap(f"ffn_gate-{il}", gate)
        h = getattr(b, activation)(gate, up)  # (T, n_ff)
        h = tap(f"ffn_{activation}-{il}", h)
        h = b.matmul(self.ffn_down, h)  # (T, n_embd)
        return tap(f"{out_name}-{il}", h)


@dataclass
class PreNormLayer:
    """A pre-norm decoder layer's weights (llama, qwen2, qwen3, ...): ``attn_norm``, attention, ``ffn_norm``, FFN."""

    attn_norm: Array
    attn: Attention
    ffn_norm: Array
    ffn: FeedForward


def fused_layer(b: Backend, layer: Any, hp: HParams, x: Array, il: int, positions: np.ndarray, cache: KVCache,
                tap: Tap, rope: dict, kq_scale: float, q_scale: float | None = None, sliding_window: int = 0,
                activation: str = "swiglu") -> Array | None:
    """A layer (attention and gated feed-forward weights as :class:`Attention` and :class:`FeedForward`) for one token
    nobody taps (a decode step) as the backend's one op (:meth:`~inference_engine.backends.base.Backend.
    decode_layer`): the residual stream after the layer, or None where the backend has no such op for it (the caller
    then runs the layer's ops one by one). The arguments are those the layer's attention block gets."""
    if tap is not no_tap or x.shape[0] != 1:
        return None
    return b.decode_layer(layer, hp, x, il, positions, cache, rope, kq_scale, q_scale, sliding_window, activation)
