"""A decoded token through a whole pre-norm decoder layer in one compiled call (llama, qwen2, qwen3, gemma3).

A small model's decode step is mostly calls, not arithmetic: SmolLM2's layer is ten backend ops (two RMSNorms, four
one-token mat-vecs, the fused attention, SwiGLU, two residual adds) plus the Python between them, ~50 us a layer
of a ~230 us layer. :func:`prenorm_layer` runs the same kernels in the same order from compiled code, so it gives
the ops' values bit for bit and leaves only the kernels' own time (and one thread-pool launch per parallel
kernel); what it saved: docs/PERFORMANCE.md.

The mat-vecs are the one-token kernels (``token_<type>``: quantize the activation, then the integer-dot mat-vec),
chosen inside compiled code by GGML type id (:func:`.entries.token_matvec`): Numba's cache keeps nothing compiled
for a function that takes other compiled functions as arguments (checked with Numba 0.68: every process compiled
it again), so the choice is a branch over :data:`.entries.TOKEN_TYPES`, generated with the kernel table from the
same type specs (:mod:`.make_entries`), so the two cannot disagree. Projections that multiply the same input
arrive as at most two runs (``a`` then ``b``: Q and K fused with V apart when V has another type, as Q4_K_M
files do), each one fused matrix or one weight; a run with no rows is skipped.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from inference_engine.backends.numba_kernels import ops
from inference_engine.backends.numba_kernels.entries import TOKEN_TYPES, token_matvec

__all__ = ["TOKEN_TYPES", "prenorm_layer", "token_matvec"]


@njit(cache=True)
def _two_runs(type_a, rows_a, type_b, rows_b, x):
    """The outputs of two runs of weights on the same input, one after the other: ``(rows_a + rows_b,)``."""
    out = np.empty(rows_a.shape[0] + rows_b.shape[0], np.float32)
    token_matvec(type_a, rows_a, x, out[: rows_a.shape[0]])
    token_matvec(type_b, rows_b, x, out[rows_a.shape[0]:])
    return out


@njit(cache=True)
def _norm_rows(x, weight, eps):
    """:func:`ops.rms_norm` of each row of ``x (rows, n)``, a new array (a token, or one token's heads)."""
    out = np.empty_like(x)
    ops.rms_norm(x, weight, eps, out)
    return out


@njit(cache=True)
def prenorm_layer(x, eps, attn_norm, qkv_types, qkv_a, qkv_b, qkv_bias, q_norm, k_norm, n_head, n_head_kv, dk, dv,
                  cos, sin, n_dims, neox, k_rows, v_rows, position, scale, q_scale, window, ggml, scalef, f16, o_type,
                  o_rows, o_bias, post_attn_norm, ffn_norm, gu_types, gu_a, gu_b, geglu, gelu_table, vec_width,
                  down_type, down_rows, post_ffn_norm):
    """One token ``x (1, n_embd)`` float32 through a pre-norm layer, as the model's ops one by one compute it:

    ``h = rms_norm(x) * attn_norm``; ``q, k, v`` from the runs ``qkv_a``, ``qkv_b`` (``qkv_types``: their GGML
    type ids), plus ``qkv_bias`` (all three biases one after another, or empty: none); per-head RMSNorm of q and k
    where ``q_norm`` / ``k_norm`` are not empty (qwen3, gemma3); :func:`ops.rope_attention` (RoPE from ``cos`` /
    ``sin``, q times ``q_scale``, the cache write at ``position``, attention within ``window`` (0: all); ``ggml``,
    ``scalef``, ``f16`` as the backend's attention flags); the output projection (``o_bias`` or empty), RMSNorm by
    ``post_attn_norm`` where not empty (gemma3); ``x1 = attn + x``; ``h = rms_norm(x1) * ffn_norm``; gate and up
    from the runs ``gu_a``, ``gu_b``; :func:`ops.geglu` (``geglu``: ggml's, through ``gelu_table``) or
    :func:`ops.swiglu` (``vec_width``: ggml's SIMD width); the down projection, RMSNorm by ``post_ffn_norm`` where
    not empty; returns ``ffn + x1``.
    """
    n_embd = x.shape[1]
    n_q, n_k = n_head * dk, n_head_kv * dk
    h = _norm_rows(x, attn_norm, eps)
    qkv = _two_runs(qkv_types[0], qkv_a, qkv_types[1], qkv_b, h.reshape(n_embd))
    if qkv_bias.shape[0]:
        qkv = qkv + qkv_bias
    if q_norm.shape[0]:
        q = _norm_rows(qkv[:n_q].reshape(n_head, dk), q_norm, eps).reshape(1, n_head, dk)
        k = _norm_rows(qkv[n_q : n_q + n_k].reshape(n_head_kv, dk), k_norm, eps).reshape(1, n_head_kv, dk)
    else:
        q = qkv[:n_q].copy().reshape(1, n_head, dk)
        k = qkv[n_q : n_q + n_k].copy().reshape(1, n_head_kv, dk)
    v = qkv[n_q + n_k :].copy().reshape(1, n_head_kv, dv)
    attn = np.empty((1, n_head * dv), np.float32)
    ops.rope_attention(q, k, v, cos, sin, n_dims, neox, q_scale, k_rows, v_rows, position, scale, window, ggml,
                       scalef, f16, attn)
    out = np.empty(n_embd, np.float32)
    token_matvec(o_type, o_rows, attn.reshape(n_head * dv), out)
    if o_bias.shape[0]:
        out = out + o_bias
    a = out.reshape(1, n_embd)
    if post_attn_norm.shape[0]:
        a = _norm_rows(a, post_attn_norm, eps)
    x1 = a + x
    h = _norm_rows(x1, ffn_norm, eps)
    gate_up = _two_runs(gu_types[0], gu_a, gu_types[1], gu_b, h.reshape(n_embd))
    n_ff = gate_up.shape[0] // 2
    act = np.empty((1, n_ff), np.float32)
    if geglu:
        ops.geglu(gate_up[:n_ff].reshape(1, n_ff), gate_up[n_ff:].reshape(1, n_ff), ggml, gelu_table, act)
    else:
        ops.swiglu(gate_up[:n_ff].reshape(1, n_ff), gate_up[n_ff:].reshape(1, n_ff), vec_width, scalef, act)
    down = np.empty(n_embd, np.float32)
    token_matvec(down_type, down_rows, act.reshape(n_ff), down)
    f = down.reshape(1, n_embd)
    if post_ffn_norm.shape[0]:
        f = _norm_rows(f, post_ffn_norm, eps)
    return f + x1
