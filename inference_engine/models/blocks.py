"""The attention and feed-forward blocks most architectures share, tapping under llama.cpp's names as they go.

An architecture file loads its weights into these blocks and says what differs (:class:`LayerSettings`); the layer
loop is :mod:`inference_engine.models.decoder`'s, once, so the file reads top to bottom and shows only what differs
from its neighbours (mlx-lm's small blocks; transformers' "diff against llama"). Each block is the graph of llama.cpp's ``build_attn`` /
``build_ffn`` for the variants llama.cpp has:

* :class:`Attention`: Q/K/V projections (optional biases), optional per-head RMSNorm on Q and K before RoPE (qwen3,
  gemma3: tapped ``Qcur_normed`` / ``Kcur_normed``), RoPE (none in a NoPE layer: SmolLM3's every fourth),
  ``Qcur``/``Kcur``/``Vcur`` taps, an optional scale of Q
  (gemma3's ``f_attention_scale``), attention over the KV cache through :func:`~inference_engine.models.base.
  self_attention` (the cache seam: its signature and meaning stay put), ``kqv_out``, the output projection with its
  optional bias, and ``attn_out`` where llama.cpp names it. A single token that nothing taps (a decode step) first
  asks the backend's :meth:`~inference_engine.backends.base.Backend.decode_attention` to do RoPE through attention
  as one op (the same values); a backend without it runs the ops one by one.
* :class:`FeedForward`: gated feed-forward, ``ffn_up``, ``ffn_gate``, the gated activation (``ffn_swiglu`` /
  ``ffn_geglu``), ``ffn_down`` as ``ffn_out``.
* :class:`PreNormLayer`: the pre-norm decoder layer around them (norms, residual adds, gemma's sandwich norms), the
  one layer loop body of every architecture but phi3, with its :class:`LayerSettings`; and, for a backend's fused
  decode op, the layer as a :class:`~inference_engine.backends.base.FusedLayerPlan` (:meth:`PreNormLayer.
  fused_plan`).

The mixture-of-experts feed-forward (router, top-k experts, shared expert) is :mod:`inference_engine.models.moe`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.backends.base import Array, Backend, FusedLayerPlan
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
        rope: dict | None,
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
                rope: dict | None, kq_scale: float, q_scale: float | None, sliding_window: int,
                softcap: float) -> Array:
        """RoPE (``rope`` None: none, a NoPE layer), the ``Qcur``/``Kcur``/``Vcur`` taps, the query scale, then
        attention over the cache."""
        if rope is not None:
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


@dataclass(frozen=True)
class LayerSettings:
    """What one layer's call takes besides its weights, fixed per layer (the model computes them once): RoPE's
    keyword arguments (None: the layer has no RoPE, as SmolLM3's NoPE layers), the attention's scale, the query's
    scale (gemma), the sliding window (0: none), the attention-score soft cap (gemma2; 0: none), the gated
    activation, and the graph names that differ by architecture (``attn_out`` tapped: llama;
    ``ffn_post_norm-<il>`` tapped: gemma3, not gemma2's unlayered one)."""

    rope: dict | None
    kq_scale: float
    q_scale: float | None = None
    sliding_window: int = 0
    softcap: float = 0.0
    activation: str = "swiglu"
    tap_attn_out: bool = False
    tap_ffn_post_norm: bool = True


def add_norm(b: Backend, tap: Tap, delta: Array, x: Array, weight: Array, eps: float, sum_name: str | None,
             norm_name: str) -> tuple[Array, Array]:
    """The residual add ``delta + x`` (tapped as ``sum_name``; None: not tapped) and its RMSNorm with ``weight``
    (tapped as ``norm_name``): both ``(T, n_embd)``. Where nothing taps, one backend op (:meth:`~inference_engine.
    backends.base.Backend.add_rms_norm`: a GPU kernel on the MLX backend where it has one); a tap may replace the sum,
    and the norm must then see what it put there, so tapped it is the two ops."""
    if tap is no_tap:
        return b.add_rms_norm(delta, x, weight, eps)
    x = b.add(delta, x)
    if sum_name is not None:
        x = tap(sum_name, x)
    return x, tap(norm_name, b.rms_norm(x, weight, eps))


@dataclass
class PreNormLayer:
    """A pre-norm decoder layer (llama, qwen2, qwen3, gemma2/3, the MoE files): ``attn_norm``, attention, the residual
    add, ``ffn_norm``, the feed-forward, the residual add; gemma's sandwich norms (``post_attention_norm``,
    ``post_ffw_norm``) where the file has them. ``__call__`` is the layer, tapping under llama.cpp's names."""

    attn_norm: Array
    attn: Attention
    ffn_norm: Array
    ffn: Any  # FeedForward; None in an MoE layer (moe.MoELayer), whose feed_forward is the experts
    post_attention_norm: Array | None = None
    post_ffw_norm: Array | None = None

    @classmethod
    def load(cls, w: Weights, il: int, qk_norm: bool = False, output_bias: bool = True,
             sandwich: bool = False) -> PreNormLayer:
        """Layer ``il``: ``qk_norm`` (per-head Q/K norms) and ``output_bias`` as :meth:`Attention.load`;
        ``sandwich``: gemma's ``post_attention_norm`` and ``post_ffw_norm``."""
        attn_norm = w.vector("attn_norm", il)
        attn = Attention.load(w, il, qk_norm=qk_norm, output_bias=output_bias)
        post_attention_norm = w.vector("post_attention_norm", il) if sandwich else None
        ffn_norm = w.vector("ffn_norm", il)
        ffn = FeedForward.load(w, il)
        post_ffw_norm = w.vector("post_ffw_norm", il) if sandwich else None
        return cls(attn_norm, attn, ffn_norm, ffn, post_attention_norm, post_ffw_norm)

    def __call__(self, b: Backend, hp: HParams, x: Array, il: int, positions: np.ndarray, cache: KVCache, tap: Tap,
                 s: LayerSettings, last: bool, normed: Array | None = None,
                 next_norm: Array | None = None) -> Array | tuple[Array, Array]:
        """The residual stream ``x (T, n_embd)`` through the layer; ``last``: keep only the last row from the
        attention's residual add on (llama.cpp's ``inp_out_ids`` in the last layer when only one row's logits are
        wanted). Where nothing taps, the decoder may chain the layers' norms (:meth:`~inference_engine.models.
        decoder.DecoderModel.forward`): ``normed`` is ``x`` already normed by ``attn_norm`` (the previous layer's
        last op), and with ``next_norm`` (the next layer's ``attn_norm``, or the output norm) the layer ends with its
        residual add and that norm as one backend op (:meth:`~inference_engine.backends.base.Backend.
        add_rms_norm`) and returns both: ``(l_out, l_out normed)``."""
        h = normed if normed is not None else b.rms_norm(x, self.attn_norm, hp.rms_eps)  # (T, n_embd)
        h = tap(f"attn_norm-{il}", h)
        attn = self.attn(b, hp, h, il, positions, cache, tap, s.rope, s.kq_scale, q_scale=s.q_scale,
                         sliding_window=s.sliding_window, tap_attn_out=s.tap_attn_out,
                         softcap=s.softcap)  # (T, n_embd): [Qcur_normed, Kcur_normed,] Qcur..kqv_out[, attn_out]
        if last:
            attn, x = attn[-1:], x[-1:]  # only the output row goes on: (1, n_embd)
        sum_name = f"ffn_inp-{il}"
        if self.post_attention_norm is not None:  # gemma: the attention output normed before its residual add
            attn = b.rms_norm(attn, self.post_attention_norm, hp.rms_eps)  # (T, n_embd)
            attn = tap(f"attn_post_norm-{il}", attn)
            sum_name = f"sa_out-{il}"  # what llama.cpp calls that sum
        x, h = add_norm(b, tap, attn, x, self.ffn_norm, hp.rms_eps, sum_name, f"ffn_norm-{il}")  # (T, n_embd) each
        h = self.feed_forward(b, h, il, tap, s)  # (T, n_embd): ffn_up..ffn_out (or the experts')
        if self.post_ffw_norm is not None:
            h = b.rms_norm(h, self.post_ffw_norm, hp.rms_eps)  # (T, n_embd)
            if s.tap_ffn_post_norm:
                h = tap(f"ffn_post_norm-{il}", h)

        if next_norm is not None:
            return b.add_rms_norm(h, x, next_norm, hp.rms_eps)  # (T, n_embd) each: l_out, and it normed
        x = b.add(h, x)  # (T, n_embd)
        return tap(f"l_out-{il}", x)

    def feed_forward(self, b: Backend, h: Array, il: int, tap: Tap, s: LayerSettings) -> Array:
        """The normed ``h (T, n_embd)`` through the feed-forward: ``(T, n_embd)``."""
        return self.ffn(b, h, il, tap, s.activation)

    def fused_plan(self, hp: HParams, s: LayerSettings) -> FusedLayerPlan | None:
        """This layer as a backend's fused decode op takes it (:meth:`~inference_engine.backends.base.Backend.
        decode_layer`), or None where the layer is not one (a feed-forward other than a dense gated one; a soft-capped
        attention)."""
        if not isinstance(self.ffn, FeedForward) or s.softcap:
            return None
        a, f = self.attn, self.ffn
        return FusedLayerPlan(
            attn_norm=self.attn_norm, qkv=(a.qkv.attn_q, a.qkv.attn_k, a.qkv.attn_v),
            qkv_bias=(a.qkv.attn_q_bias, a.qkv.attn_k_bias, a.qkv.attn_v_bias), qk_norm=(a.attn_q_norm, a.attn_k_norm),
            attn_output=a.attn_output, attn_output_bias=a.attn_output_bias,
            post_attention_norm=self.post_attention_norm, ffn_norm=self.ffn_norm, ffn_gate_up=(f.ffn_gate, f.ffn_up),
            ffn_down=f.ffn_down, post_ffw_norm=self.post_ffw_norm, activation=s.activation, rope=s.rope,
            kq_scale=s.kq_scale, q_scale=s.q_scale, sliding_window=s.sliding_window, rms_eps=hp.rms_eps,
            n_head=hp.n_head, n_head_kv=hp.n_head_kv, head_dim_k=hp.head_dim_k, head_dim_v=hp.head_dim_v,
        )
