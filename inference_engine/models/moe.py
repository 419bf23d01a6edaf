"""The mixture-of-experts feed-forward (llama.cpp's ``build_moe_ffn``, src/llama-graph.cpp, softmax gating), tapping
under llama.cpp's graph names, and qwen2moe's gated shared expert.

Per token ``x`` (the normed input, ``(T, n_embd)``):

* ``ffn_moe_logits = ffn_gate_inp @ x`` ``(T, n_expert)`` (the router; llama.cpp's quantizer keeps it F32);
* ``ffn_moe_probs``: softmax over the experts (``ggml_soft_max``);
* ``ffn_moe_topk``: the ``n_expert_used`` most probable experts, best first (``ggml_argsort_top_k``: a descending
  argsort, first k); integer ids, tapped as float32 (exact) so that they are captured and teacher-forced like the
  rest;
* ``ffn_moe_weights``: their probabilities ``(T, k, 1)``. qwen3moe renormalizes them over the k (``norm_w``):
  ``ffn_moe_weights_sum`` (``ggml_sum_rows``: summed in double), clamped below at 2**-14
  (``ffn_moe_weights_sum_clamped``), then ``ffn_moe_weights_norm = weights / sum`` ``(T, k)``. qwen2moe does not:
  its k weights sum to less than 1.
* each chosen expert's SwiGLU FFN on the token: ``ffn_moe_up``, ``ffn_moe_gate``, ``ffn_moe_swiglu``,
  ``ffn_moe_down`` ``(T, k, n)``; ``ffn_moe_weighted = down * weight``; ``ffn_moe_out``: the k rows added in top-k
  order (llama.cpp's chain of ``ggml_add`` over views).

How it runs on every backend: the routing (softmax, top-k, weights) is tiny (``T x n_expert``) and decides which
matrices are read, so it runs on the host in NumPy with ggml's arithmetic
(:func:`~inference_engine.backends.numerics.soft_max_ggml` in ``ggml`` numerics). The expert products go through the
backend's own ``matmul`` on each expert's 2-D matrix (:meth:`~inference_engine.models.base.Weights.experts`: one
view per expert of the stacked 3-D tensor) with the rows of the tokens routed to it; ggml's ``mul_mat_id`` quantizes
each activation row on its own, so grouping rows by expert computes the same numbers. SwiGLU is the backend's op.
On MLX this meets the host once per MoE layer (the chosen ids decide which experts' matrices run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.backends import numerics as nx
from inference_engine.backends.base import Array, Backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile
from inference_engine.models.base import HParams, Tap, Weights, _int
from inference_engine.models.blocks import Attention, FeedForward, LayerSettings, PreNormLayer

# build_moe_ffn: "Avoid division by zero, clamp to smallest number representable by F16" (2**-14).
WEIGHTS_SUM_MIN = np.float32(6.103515625e-5)


def expert_hparams(f: GGUFFile) -> dict[str, int]:
    """The MoE hyperparameters as llama.cpp reads them for qwen2moe / qwen3moe: ``expert_count``,
    ``expert_used_count`` (both required, ``1 <= used <= count``: checked by ``gguf_validate``) and the expert FFN
    width ``expert_feed_forward_length``, else ``feed_forward_length / expert_used_count``."""
    n_expert, n_expert_used = _int(f, "expert_count"), _int(f, "expert_used_count")
    if not 1 <= n_expert_used <= n_expert:
        raise GGUFParityError(f"{f.path}: {f.raw_architecture}.expert_used_count is {n_expert_used}; expected 1.."
                              f"{f.raw_architecture}.expert_count ({n_expert})")
    n_ff_exp = _int(f, "expert_feed_forward_length", 0) or _int(f, "feed_forward_length") // n_expert_used
    return {"n_expert": n_expert, "n_expert_used": n_expert_used, "n_ff_exp": n_ff_exp}


@dataclass(frozen=True)
class MoEHParams(HParams):
    """The common hyperparameters plus the experts' (qwen2moe and qwen3moe read the same keys)."""

    n_expert: int = 0  # expert_count
    n_expert_used: int = 0  # expert_used_count: experts per token
    n_ff_exp: int = 0  # each expert's FFN width

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> MoEHParams:
        return cls(**HParams.common(f), **expert_hparams(f))


def _silu(b: Backend, x: np.ndarray) -> np.ndarray:
    return nx.silu_ggml(x) if b.numerics == "ggml" else nx.silu_f32(x)


def _soft_max(b: Backend, x: np.ndarray) -> np.ndarray:
    return nx.soft_max_ggml(x) if b.numerics == "ggml" else nx.soft_max_f32(x)


def _host_tap(b: Backend, tap: Tap, name: str, x: np.ndarray) -> np.ndarray:
    """A host (NumPy) tensor through the tap, as a backend array; what flows on (ours, or the forced value) comes
    back to the host as float32."""
    out = tap(name, b.from_numpy(np.ascontiguousarray(x, dtype=np.float32)))
    return np.asarray(b.to_numpy(out), dtype=np.float32)


def expert_products(b: Backend, matrices: list[Any], x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``ggml_mul_mat_id``: ``out[t, j] = matrices[ids[t, j]] @ x[t]`` (``x (T, n_in)``, the same row for every
    chosen expert) or ``@ x[t, j]`` (``x (T, k, n_in)``). One backend ``matmul`` per expert in use, on the rows
    routed to it. Returns ``(T, k, n_out)`` float32 on the host."""
    T, k = ids.shape
    out: np.ndarray | None = None
    for e in np.unique(ids):
        t_idx, j_idx = np.nonzero(ids == e)
        rows = x[t_idx] if x.ndim == 2 else x[t_idx, j_idx]  # (n_routed, n_in)
        y = np.asarray(b.to_numpy(b.matmul(matrices[int(e)], b.from_numpy(np.ascontiguousarray(rows)))),
                       dtype=np.float32)  # (n_routed, n_out)
        if out is None:
            out = np.empty((T, k, y.shape[-1]), dtype=np.float32)
        out[t_idx, j_idx] = y
    assert out is not None  # T >= 1 and k >= 1: some expert is in use
    return out


@dataclass
class MoEFeedForward:
    """One layer's router and stacked experts; ``__call__`` is llama.cpp's ``build_moe_ffn`` (softmax gating,
    SwiGLU experts)."""

    ffn_gate_inp: Any  # the router, (n_expert, n_embd)
    ffn_gate_exps: list[Any]  # per expert (n_ff_exp, n_embd)
    ffn_up_exps: list[Any]  # per expert (n_ff_exp, n_embd)
    ffn_down_exps: list[Any]  # per expert (n_embd, n_ff_exp)
    n_expert_used: int
    normalize_weights: bool  # llama.cpp's norm_w: qwen3moe True, qwen2moe False

    @classmethod
    def load(cls, w: Weights, il: int, n_expert_used: int, normalize_weights: bool) -> MoEFeedForward:
        return cls(
            ffn_gate_inp=w.matrix("ffn_gate_inp", il),
            ffn_gate_exps=w.experts("ffn_gate_exps", il),
            ffn_up_exps=w.experts("ffn_up_exps", il),
            ffn_down_exps=w.experts("ffn_down_exps", il),
            n_expert_used=n_expert_used,
            normalize_weights=normalize_weights,
        )

    @property
    def n_expert(self) -> int:
        return len(self.ffn_up_exps)

    def route(self, b: Backend, h: Array, il: int, tap: Tap) -> tuple[np.ndarray, np.ndarray]:
        """The router: ``(ids (T, k) int64, weights (T, k, 1) float32)``, every step tapped."""
        k = self.n_expert_used
        logits = b.matmul(self.ffn_gate_inp, h)  # (T, n_expert)
        logits = np.asarray(b.to_numpy(tap(f"ffn_moe_logits-{il}", logits)), dtype=np.float32)
        probs = _host_tap(b, tap, f"ffn_moe_probs-{il}", _soft_max(b, logits))  # (T, n_expert)
        order = np.argsort(-probs, axis=-1, kind="stable")[:, :k]  # (T, k): best first
        ids = np.rint(_host_tap(b, tap, f"ffn_moe_topk-{il}", order.astype(np.float32))).astype(np.int64)
        if ids.shape != order.shape or ids.min() < 0 or ids.max() >= self.n_expert:
            raise GGUFParityError(f"layer {il}: expert ids {ids.tolist()} are not {k} ids in 0..{self.n_expert - 1}")
        weights = np.take_along_axis(probs, ids, axis=-1)[..., None]  # (T, k, 1)
        weights = _host_tap(b, tap, f"ffn_moe_weights-{il}", weights)
        if self.normalize_weights:
            T = weights.shape[0]
            total = weights.reshape(T, k).sum(axis=-1, dtype=np.float64, keepdims=True).astype(np.float32)  # (T, 1)
            total = _host_tap(b, tap, f"ffn_moe_weights_sum-{il}", total)
            total = _host_tap(b, tap, f"ffn_moe_weights_sum_clamped-{il}", np.maximum(total, WEIGHTS_SUM_MIN))
            normed = (weights.reshape(T, k) / total).astype(np.float32)  # (T, k)
            weights = _host_tap(b, tap, f"ffn_moe_weights_norm-{il}", normed).reshape(T, k, 1)
        return ids, weights

    def __call__(self, b: Backend, h: Array, il: int, tap: Tap) -> Array:
        """``h (T, n_embd)`` (the normed input) -> ``ffn_moe_out (T, n_embd)``."""
        ids, weights = self.route(b, h, il, tap)  # (T, k), (T, k, 1)
        x = np.asarray(b.to_numpy(h), dtype=np.float32)  # (T, n_embd)
        up = _host_tap(b, tap, f"ffn_moe_up-{il}", expert_products(b, self.ffn_up_exps, x, ids))  # (T, k, n_ff)
        gate = _host_tap(b, tap, f"ffn_moe_gate-{il}", expert_products(b, self.ffn_gate_exps, x, ids))
        act = b.swiglu(b.from_numpy(gate), b.from_numpy(up))  # (T, k, n_ff)
        act = np.asarray(b.to_numpy(tap(f"ffn_moe_swiglu-{il}", act)), dtype=np.float32)
        down = _host_tap(b, tap, f"ffn_moe_down-{il}", expert_products(b, self.ffn_down_exps, act, ids))
        weighted = _host_tap(b, tap, f"ffn_moe_weighted-{il}", down * weights)  # (T, k, n_embd)
        out = weighted[:, 0]
        for j in range(1, weighted.shape[1]):  # ggml_add chain, in top-k order
            out = out + weighted[:, j]
        return tap(f"ffn_moe_out-{il}", b.from_numpy(np.ascontiguousarray(out, dtype=np.float32)))


@dataclass
class SharedExpert:
    """qwen2moe's shared expert: a dense SwiGLU FFN every token goes through, scaled per token by
    ``sigmoid(ffn_gate_inp_shexp . x)``. llama.cpp computes that sigmoid as ``silu(g) / g``."""

    ffn: FeedForward  # ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp
    ffn_gate_inp_shexp: Any  # (1, n_embd): the gate's one-row projection

    @classmethod
    def load(cls, w: Weights, il: int) -> SharedExpert:
        return cls(ffn=FeedForward.load(w, il, "_shexp"), ffn_gate_inp_shexp=w.row_matrix("ffn_gate_inp_shexp", il))

    def __call__(self, b: Backend, h: Array, il: int, tap: Tap) -> Array:
        """``h (T, n_embd)`` -> ``ffn_shexp_out (T, n_embd)``: tapped ``ffn_up``/``ffn_gate``/``ffn_swiglu`` (the
        dense names, as llama.cpp's ``build_ffn``), ``ffn_shexp``, ``ffn_shexp_gate_inp``, ``ffn_shexp_gate``."""
        y = self.ffn(b, h, il, tap, "swiglu", out_name="ffn_shexp")  # (T, n_embd)
        g = b.matmul(self.ffn_gate_inp_shexp, h)  # (T, 1)
        g = np.asarray(b.to_numpy(tap(f"ffn_shexp_gate_inp-{il}", g)), dtype=np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):  # g == 0 gives NaN, as in llama.cpp
            sigmoid = (_silu(b, g) / g).astype(np.float32)  # (T, 1)
        gate = _host_tap(b, tap, f"ffn_shexp_gate-{il}", sigmoid)
        out = (np.asarray(b.to_numpy(y), dtype=np.float32) * gate).astype(np.float32)  # (T, n_embd)
        return tap(f"ffn_shexp_out-{il}", b.from_numpy(out))


@dataclass
class MoELayer(PreNormLayer):
    """A pre-norm layer whose feed-forward is the experts (``moe``) and, in qwen2moe, a shared expert (``shexp``):
    ``ffn_out`` is their sum there; qwen3moe's ``ffn_moe_out`` goes straight into the residual."""

    moe: MoEFeedForward | None = None
    shexp: SharedExpert | None = None

    @classmethod
    def load_moe(cls, w: Weights, il: int, n_expert_used: int, normalize_weights: bool, qk_norm: bool = False,
                 shared: bool = False) -> MoELayer:
        return cls(
            attn_norm=w.vector("attn_norm", il),
            attn=Attention.load(w, il, qk_norm=qk_norm, output_bias=False),
            ffn_norm=w.vector("ffn_norm", il),
            ffn=None,
            moe=MoEFeedForward.load(w, il, n_expert_used, normalize_weights=normalize_weights),
            shexp=SharedExpert.load(w, il) if shared else None,
        )

    def feed_forward(self, b: Backend, h: Array, il: int, tap: Tap, s: LayerSettings) -> Array:
        moe = self.moe(b, h, il, tap)  # (T, n_embd): ffn_moe_logits..ffn_moe_out
        if self.shexp is None:
            return moe
        shared = self.shexp(b, h, il, tap)  # (T, n_embd): ffn_up..ffn_shexp_out
        h = b.add(moe, shared)  # (T, n_embd)
        return tap(f"ffn_out-{il}", h)
