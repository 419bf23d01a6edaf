"""Attention for a batch of several sequences over a paged KV pool, in one Numba call (the server's decode step).

Each query row ``t`` belongs to a sequence whose keys sit in the pool rows ``slots[slot_start[s] + j]`` for
positions ``j = 0..``; the kernel reads them there, so no sequence's K/V is gathered into a copy first and one
thread launch serves every sequence of the step. Per (row, head) it runs
:func:`~inference_engine.backends.numba_kernels.ops.attend_row`, the code
:func:`~inference_engine.backends.numba_kernels.ops.attention` runs for that row over that sequence (keys past the
row's position contribute exact zeros there), so the batched server and the one-sequence engine agree bit for bit
on attention.
"""

from __future__ import annotations

from numba import njit, prange

from inference_engine.backends.numba_kernels.ops.attention import _visible_range, attend_row


@njit(parallel=True, cache=True)
def paged_attention(q, k_pool, v_pool, slots, slot_start, row_seq, positions, scale, window, ggml, scalef, f16, out):
    """``q (T, H, dk)`` float32; ``k_pool (n_slots, Hkv * dk * esize)`` / ``v_pool`` the pool rows as bytes;
    ``row_seq[t]``: the sequence of row ``t``, whose position ``j`` is pool row ``slots[slot_start[seq] + j]``;
    ``positions[t]``: the row's position; ``out (T, H * dv)``."""
    n_tokens, n_head, dk = q.shape
    dv = out.shape[1] // n_head
    esize = 2 if f16 else 4
    group = n_head // (k_pool.shape[1] // (dk * esize))
    kflat, vflat, qflat = k_pool.reshape(k_pool.size), v_pool.reshape(v_pool.size), q.reshape(q.size)
    kb, vb = k_pool.shape[1], v_pool.shape[1]
    for th in prange(n_tokens * n_head):
        t, h = th // n_head, th % n_head
        p = positions[t]
        lo, hi = _visible_range(p, p + 1, window)  # the sequence's keys 0..p
        base = slot_start[row_seq[t]]
        if f16:  # literal storage types, as in ops.attention
            attend_row(qflat, th * dk, dk, dv, h // group, kflat, kb, vflat, vb, slots, base, True, lo, hi, p + 1,
                       scale, ggml, scalef, True, out[t], h * dv)
        else:
            attend_row(qflat, th * dk, dk, dv, h // group, kflat, kb, vflat, vb, slots, base, True, lo, hi, p + 1,
                       scale, ggml, scalef, False, out[t], h * dv)
