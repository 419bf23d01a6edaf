"""Attention for a batch of several sequences over a paged KV pool, in one Numba call (the server's decode step).

Each query row ``t`` belongs to a sequence whose keys sit in the pool rows ``slots[slot_start[s] + j]`` for
positions ``j = 0..``; the kernel reads them there, so no sequence's K/V is gathered into a copy first and one
thread launch serves every sequence of the step. Per (row, head) it computes exactly what
:func:`~inference_engine.backends.numba_kernels.ops.attention` computes for that row over that sequence (same
operations in the same order: keys past the row's position contribute exact zeros there), so the batched server
and the one-sequence engine agree bit for bit on attention.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.ops import _dot_head, softmax_visible
from inference_engine.backends.numba_kernels.simd import (
    load_f16,
    load_f32,
    round_f16,
    vfma,
    vload_f16,
    vload_f32,
    vsplat,
    vstore,
    vzero,
)

_F32 = np.float32


@njit(parallel=True, cache=True)
def paged_attention(q, k_pool, v_pool, slots, slot_start, row_seq, positions, scale, window, ggml, scalef, f16, out):
    """``q (T, H, dk)`` float32; ``k_pool (n_slots, Hkv * dk * esize)`` / ``v_pool`` the pool rows as bytes;
    ``row_seq[t]``: the sequence of row ``t``, whose position ``j`` is pool row ``slots[slot_start[seq] + j]``;
    ``positions[t]``: the row's position; ``out (T, H * dv)``."""
    n_tokens, n_head, dk = q.shape
    dv = out.shape[1] // n_head
    esize = 2 if f16 else 4
    n_head_kv = k_pool.shape[1] // (dk * esize)
    group = n_head // n_head_kv
    for th in prange(n_tokens * n_head):
        t, h = th // n_head, th % n_head
        g = h // group
        p = positions[t]
        base = slot_start[row_seq[t]]
        kv_len = p + 1
        qv = np.empty(dk, np.float32)
        for i in range(dk):
            qv[i] = round_f16(q[t, h, i]) if (ggml and f16) else q[t, h, i]
        scores = np.empty(kv_len, np.float32)
        visible = np.zeros(kv_len, np.bool_)
        top = -np.inf
        for j in range(kv_len):
            if window <= 0 or p - j < window:
                visible[j] = True
                s = _dot_head(qv, k_pool[slots[base + j]], g * dk * esize, dk, f16) * scale
                scores[j] = s
                top = max(top, s)
        softmax_visible(scores, visible, top, ggml, scalef, f16)
        dst = out[t]
        out_base = h * dv
        e0 = 0
        while e0 + 16 <= dv:
            acc = vzero()
            for j in range(kv_len):
                if scores[j] != _F32(0.0):
                    off = (g * dv + e0) * esize
                    row = v_pool[slots[base + j]]
                    vj = vload_f16(row, off) if f16 else vload_f32(row, off)
                    acc = vfma(vsplat(scores[j]), vj, acc)
            vstore(dst, out_base + e0, acc)
            e0 += 16
        for i in range(e0, dv):
            total32 = _F32(0.0)
            for j in range(kv_len):
                off = (g * dv + i) * esize
                row = v_pool[slots[base + j]]
                total32 += scores[j] * (load_f16(row, off) if f16 else load_f32(row, off))
            dst[out_base + i] = total32
