"""Attention as Numba kernels, with the NumPy reference's numerics: per query row for a decoded token
(:func:`attention`, :func:`rope_attention`: RoPE, the query scale and the cache write fused in), blocked for prefill
(:func:`attention_blocked`: the same numbers). q.k and p.v are float32 sums in another order than BLAS (float
rounding); otherwise as :mod:`.elementwise`'s docstring says.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from inference_engine.backends.numba_kernels.isa.simd import (
    f16_bits,
    load_f16,
    load_f32,
    round_f16,
    vfma,
    vfma_nonzero,
    vload,
    vload_f16,
    vload_f32,
    vmul,
    vround_f16,
    vsplat,
    vsplat_at,
    vstore,
    vsub,
    vsum,
    vzero,
)
from inference_engine.backends.numba_kernels.ops.elementwise import rope
from inference_engine.backends.numba_kernels.ops.vexp import vexp_ggml_kj, vexp_ggml_scalef

_F32 = np.float32


# --- attention ---------------------------------------------------------------------------------------------------
@njit(parallel=True, cache=True)
def attention(q, k, v, positions, kv_len, scale, window, ggml, scalef, f16, out):
    """Causal (sliding-window) grouped-query attention, as NumpyBackend.attention: one work item per query row and
    head (:func:`attend_row`), which suits a decoded token (prefill takes :func:`attention_blocked`).

    ``q (T, H, dk)`` float32; ``k (S, Hkv * dk * esize)``, ``v (S, Hkv * dv * esize)`` the cache rows as bytes
    (``f16``: F16 storage, else F32); ``out (T, H * dv)``. ggml numerics with an F16 cache round q and the
    probabilities to F16 first (ggml's F16 mul_mat converts its F32 operand) and exponentiate with ggml_v_expf.
    """
    n_tokens, n_head, dk = q.shape
    dv = out.shape[1] // n_head
    esize = 2 if f16 else 4
    group = n_head // (k.shape[1] // (dk * esize))
    rows = np.zeros(0, np.int64)  # not paged: key j is cache row j
    kflat, vflat, qflat = k.reshape(k.size), v.reshape(v.size), q.reshape(q.size)
    for th in prange(n_tokens * n_head):
        t, h = th // n_head, th % n_head
        lo, hi = _visible_range(positions[t], kv_len, window)
        kb, vb = k.shape[1], v.shape[1]
        # literal storage types: each gets its own loops, without a branch per load
        if f16:
            attend_row(qflat, th * dk, dk, dv, h // group, kflat, kb, vflat, vb, rows, 0, False, lo, hi, kv_len,
                       scale, ggml, scalef, True, out[t], h * dv)
        else:
            attend_row(qflat, th * dk, dk, dv, h // group, kflat, kb, vflat, vb, rows, 0, False, lo, hi, kv_len,
                       scale, ggml, scalef, False, out[t], h * dv)


@njit(cache=True)
def rope_attention(q, k, v, cos, sin, n_dims, neox, q_scale, k_rows, v_rows, position, scale, window, ggml, scalef,
                   f16, out):
    """A decoded token's attention in one call, the same operations as the ops one by one: :func:`rope` on ``q`` and
    ``k``, ``q`` times ``q_scale`` in float32 (Gemma's query scale; 1 leaves it as it is), ``k`` and ``v`` written into
    cache row ``position`` (F16 rounded to nearest even as ggml's ``cpy``, or F32), then :func:`attention` over the
    rows up to ``position``. ``q (1, H, dk)``, ``k (1, Hkv, dk)``, ``v (1, Hkv, dv)`` float32; ``k_rows`` /
    ``v_rows`` the whole cache as bytes ``(n_ctx, Hkv * d * esize)``; ``out (1, H * dv)``."""
    qr, kr = np.empty_like(q), np.empty_like(k)
    rope(q, cos, sin, n_dims, neox, qr)
    rope(k, cos, sin, n_dims, neox, kr)
    if q_scale != _F32(1.0):
        qflat = qr.reshape(qr.size)
        for i in range(qflat.shape[0]):
            qflat[i] = qflat[i] * q_scale
    _store_row(kr.reshape(kr.size), k_rows[position], f16)
    _store_row(v.reshape(v.size), v_rows[position], f16)
    attention(qr, k_rows, v_rows, np.full(1, position, np.int64), position + 1, scale, window, ggml, scalef, f16, out)


@njit(inline="always", cache=True)
def _store_row(x, row, f16):
    """Float32 values ``x`` into one cache row of bytes, as F16 (nearest even) or F32."""
    if f16:
        bits = row.view(np.uint16)
        for i in range(x.shape[0]):
            bits[i] = f16_bits(x[i])
    else:
        values = row.view(np.float32)
        for i in range(x.shape[0]):
            values[i] = x[i]


@njit(inline="always", cache=True)
def _row(rows, base, paged, j):
    return rows[base + j] if paged else j


@njit(inline="always", cache=True)
def attend_row(qflat, q_off, dk, dv, g, kflat, kb, vflat, vb, rows, base, paged, lo, hi, n_keys, scale, ggml, scalef,
               f16, dst, d_off):
    """One query row of one head against keys ``lo..hi`` (``0 <= lo <= hi < n_keys``) of KV head ``g``, into
    ``dst[d_off : d_off + dv]``. Key ``j``'s K and V are row ``rows[base + j]`` (``paged``) or row ``j`` of the flat
    byte arrays ``kflat`` (``kb`` bytes a row) and ``vflat`` (``vb``), so a contiguous cache and the server's paged
    pool share the code. Callers pass ``paged`` and ``f16`` as literals, which gives each case its own loops.

    The arithmetic is :func:`attention_blocked`'s for one row, bit for bit: ``q . k`` as 16-lane FMAs then the
    horizontal sum (:func:`_dot_row`), the exponentials 16 at a time (:func:`_exp_row`), their double sum in key
    order, ``p = e * (1 / sum)`` (rounded to F16 with an F16 cache in ggml numerics), then ``p . v`` per 16
    outputs as FMAs in key order skipping zero ``p`` (four output vectors per pass over the keys), and a
    ``dv % 16`` tail as scalar sums over all ``n_keys`` keys, invisible ones adding exact zeros.
    """
    esize = 2 if f16 else 4
    to_f16 = ggml and f16
    qv = np.empty(dk, np.float32)
    i = 0
    while i + 16 <= dk:
        x = vload(qflat, q_off + i)
        vstore(qv, i, vround_f16(x) if to_f16 else x)
        i += 16
    for e in range(i, dk):
        qv[e] = round_f16(qflat[q_off + e]) if to_f16 else qflat[q_off + e]
    m = hi - lo + 1
    scores = np.empty(max(m, 0), np.float32)  # key lo + i at scores[i]
    top = -np.inf
    k_off = g * dk * esize
    for i in range(m):
        s = _dot_row(qv, 0, kflat, _row(rows, base, paged, lo + i) * kb + k_off, dk, f16) * scale
        scores[i] = s
        top = max(top, s)
    if m > 0:
        _exp_row(scores, 0, m, top, ggml, scalef, np.empty(16, np.float32))
        _normalize_row(scores, 0, m, _sum_row(scores, 0, m), to_f16)
    v_off = g * dv * esize
    e0 = 0
    while e0 + 64 <= dv:
        a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
        for i in range(m):
            pj = scores[i]
            if pj != _F32(0.0):
                o = _row(rows, base, paged, lo + i) * vb + v_off + e0 * esize
                p = vsplat(pj)
                a0 = vfma(p, vload_f16(vflat, o) if f16 else vload_f32(vflat, o), a0)
                a1 = vfma(p, vload_f16(vflat, o + 16 * esize) if f16 else vload_f32(vflat, o + 64), a1)
                a2 = vfma(p, vload_f16(vflat, o + 32 * esize) if f16 else vload_f32(vflat, o + 128), a2)
                a3 = vfma(p, vload_f16(vflat, o + 48 * esize) if f16 else vload_f32(vflat, o + 192), a3)
        vstore(dst, d_off + e0, a0)
        vstore(dst, d_off + e0 + 16, a1)
        vstore(dst, d_off + e0 + 32, a2)
        vstore(dst, d_off + e0 + 48, a3)
        e0 += 64
    while e0 + 16 <= dv:
        acc = vzero()
        for i in range(m):
            o = _row(rows, base, paged, lo + i) * vb + v_off + e0 * esize
            acc = vfma_nonzero(scores[i], vload_f16(vflat, o) if f16 else vload_f32(vflat, o), acc)
        vstore(dst, d_off + e0, acc)
        e0 += 16
    for e in range(e0, dv):
        total32 = _F32(0.0)
        for j in range(n_keys):
            pj = scores[j - lo] if lo <= j <= hi else _F32(0.0)
            o = _row(rows, base, paged, j) * vb + v_off + e * esize
            total32 += pj * (load_f16(vflat, o) if f16 else load_f32(vflat, o))
        dst[d_off + e] = total32


# --- attention for many query tokens (prefill), blocked: the same numbers as :func:`attention` -------------------
# Query tokens per work item of :func:`attention_blocked`; an item is these tokens times the query heads of one KV
# head, so each key / value row loaded serves ``ATTENTION_BLOCK_TOKENS * group`` query rows. 8 keeps an item's
# scores (rows x keys: 48 x 512 floats for Qwen2.5 1.5B at 512 tokens) in L2 and gives two threads 128 items there;
# other sizes were not measured.
ATTENTION_BLOCK_TOKENS = 8


@njit(inline="always", cache=True)
def _visible_range(p, kv_len, window):
    """The keys ``lo..hi`` that the query at position ``p`` sees (``j <= p``, ``p - j < window``); empty if lo > hi."""
    lo = max(0, p - window + 1) if window > 0 else 0
    return lo, min(p, kv_len - 1)


@njit(inline="always", cache=True)
def _dot_row(qbuf, q_off, kv, j_off, d, f16):
    """``q . k_j`` for one head: the query float32 at ``qbuf[q_off : q_off + d]``, the key at byte ``j_off`` of
    ``kv`` (f32 or f16 bytes); 16-lane FMAs, then the horizontal sum, then a scalar tail."""
    acc = vzero()
    e = 0
    while e + 16 <= d:
        k = vload_f16(kv, j_off + 2 * e) if f16 else vload_f32(kv, j_off + 4 * e)
        acc = vfma(vload(qbuf, q_off + e), k, acc)
        e += 16
    total = vsum(acc)
    for i in range(e, d):
        kf = load_f16(kv, j_off + 2 * i) if f16 else load_f32(kv, j_off + 4 * i)
        total += qbuf[q_off + i] * kf
    return total


@njit(inline="always", cache=True)
def _dot_4rows(qbuf, q_off, kv, j_off, d, f16):
    """:func:`_dot_row` for the four query rows at ``q_off``, ``q_off + d``, ... against one key row, loaded once
    (four independent FMA chains instead of one: the same sums, several times the throughput)."""
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
    e = 0
    while e + 16 <= d:
        k = vload_f16(kv, j_off + 2 * e) if f16 else vload_f32(kv, j_off + 4 * e)
        a0 = vfma(vload(qbuf, q_off + e), k, a0)
        a1 = vfma(vload(qbuf, q_off + d + e), k, a1)
        a2 = vfma(vload(qbuf, q_off + 2 * d + e), k, a2)
        a3 = vfma(vload(qbuf, q_off + 3 * d + e), k, a3)
        e += 16
    t0, t1, t2, t3 = vsum(a0), vsum(a1), vsum(a2), vsum(a3)
    for i in range(e, d):
        kf = load_f16(kv, j_off + 2 * i) if f16 else load_f32(kv, j_off + 4 * i)
        t0 += qbuf[q_off + i] * kf
        t1 += qbuf[q_off + d + i] * kf
        t2 += qbuf[q_off + 2 * d + i] * kf
        t3 += qbuf[q_off + 3 * d + i] * kf
    return t0, t1, t2, t3


@njit(inline="always", cache=True)
def _pv_row(scores, s0, vflat, vb, j0, j1, off, f16, acc):
    """Adds ``p_j v_j[off:off+16]`` for keys ``j0 <= j < j1`` in order to ``acc``, zero ``p_j`` skipped as in
    :func:`attention` (``p_j = scores[s0 + j]``; value row j at byte ``j * vb`` of ``vflat``)."""
    for j in range(j0, j1):
        o = j * vb + off
        vj = vload_f16(vflat, o) if f16 else vload_f32(vflat, o)
        acc = vfma_nonzero(scores[s0 + j], vj, acc)
    return acc


@njit(inline="always", cache=True)
def _pv_4rows(scores, s0, span, vflat, vb, j0, j1, off, f16, a0, a1, a2, a3):
    """:func:`_pv_row` for four query rows (scores ``span`` apart), each value vector loaded once."""
    for j in range(j0, j1):
        o = j * vb + off
        vj = vload_f16(vflat, o) if f16 else vload_f32(vflat, o)
        s = s0 + j
        a0 = vfma_nonzero(scores[s], vj, a0)
        a1 = vfma_nonzero(scores[s + span], vj, a1)
        a2 = vfma_nonzero(scores[s + 2 * span], vj, a2)
        a3 = vfma_nonzero(scores[s + 3 * span], vj, a3)
    return a0, a1, a2, a3


@njit(inline="always", cache=True)
def _pv_4rows_nonzero(scores, s0, span, vflat, vb, j0, j1, off, f16, a0, a1, a2, a3):
    """:func:`_pv_4rows` over keys whose four probabilities are known to be non-zero: plain FMAs (the skip
    never applies, so the result is the same)."""
    for j in range(j0, j1):
        o = j * vb + off
        vj = vload_f16(vflat, o) if f16 else vload_f32(vflat, o)
        s = s0 + j
        a0 = vfma(vsplat_at(scores, s), vj, a0)
        a1 = vfma(vsplat_at(scores, s + span), vj, a1)
        a2 = vfma(vsplat_at(scores, s + 2 * span), vj, a2)
        a3 = vfma(vsplat_at(scores, s + 3 * span), vj, a3)
    return a0, a1, a2, a3


@njit(inline="always", cache=True)
def _keep_score(scores, top, lo, hi, span, j_min, r, j, s):
    """Store row ``r``'s scaled score of key ``j`` if the row sees it, and track the row's maximum (in key order)."""
    if lo[r] <= j <= hi[r]:
        scores[r * span + j - j_min] = s
        top[r] = max(top[r], s)


@njit(inline="always", cache=True)
def _exp_row(scores, start, m, top, ggml, scalef, pad):
    """The softmax's exponentials ``exp(s - top)`` in place on the ``m`` visible scores at ``scores[start:]``: in
    ggml numerics 16 lanes at a time (:mod:`.vexp`, ggml_v_expf's bits), the last ``m % 16`` through ``pad``."""
    top32 = _F32(top)
    if not ggml:
        for i in range(m):
            scores[start + i] = _F32(math.exp(np.float64(scores[start + i] - top32)))
        return
    vtop = vsplat(top32)
    i = 0
    while i < m:
        whole = i + 16 <= m
        if whole:
            x = vload(scores, start + i)
        else:
            for lane in range(16):
                pad[lane] = scores[start + i + lane] if i + lane < m else top32
            x = vload(pad, 0)
        e = vexp_ggml_scalef(vsub(x, vtop)) if scalef else vexp_ggml_kj(vsub(x, vtop))
        if whole:
            vstore(scores, start + i, e)
        else:
            vstore(pad, 0, e)
            for lane in range(m - i):
                scores[start + i + lane] = pad[lane]
        i += 16


@njit(inline="always", cache=True)
def _sum_row(scores, start, m):
    total = 0.0  # double, in key order
    for i in range(m):
        total += np.float64(scores[start + i])
    return total


@njit(inline="always", cache=True)
def _sum_4rows(scores, start, span, m):
    """:func:`_sum_row` of four rows ``span`` apart with the same ``m``: four independent sums in one loop."""
    t0, t1, t2, t3 = 0.0, 0.0, 0.0, 0.0
    for i in range(m):
        t0 += np.float64(scores[start + i])
        t1 += np.float64(scores[start + span + i])
        t2 += np.float64(scores[start + 2 * span + i])
        t3 += np.float64(scores[start + 3 * span + i])
    return t0, t1, t2, t3


@njit(inline="always", cache=True)
def _normalize_row(scores, start, m, total, to_f16):
    """``p = e * (float)(1 / total)`` [rounded to F16: ggml's F16 mul_mat converts its F32 operand]; returns how
    many p are 0."""
    inv = _F32(1.0 / total)
    vinv = vsplat(inv)
    i = 0
    while i + 16 <= m:
        p = vmul(vload(scores, start + i), vinv)
        vstore(scores, start + i, vround_f16(p) if to_f16 else p)
        i += 16
    for e in range(i, m):
        pj = scores[start + e] * inv
        scores[start + e] = round_f16(pj) if to_f16 else pj
    zeros = 0
    for i in range(m):
        zeros += scores[start + i] == _F32(0.0)
    return zeros


@njit(parallel=True, cache=True)
def attention_blocked(q, k, v, positions, kv_len, scale, window, ggml, scalef, f16, out):
    """:func:`attention` for many query tokens (prefill), bit for bit the same result, arranged for the cache.

    Work items are ``ATTENTION_BLOCK_TOKENS`` query tokens times the query heads of one KV head (threads take
    them from both ends of the causal triangle, so that each gets as many keys); in an item every key and value
    row is loaded once per four query rows, which keeps four FMA chains in flight. Each output is the sum
    :func:`attention` computes, over the same terms in the same order: the same ``q . k`` (16-lane FMAs then the
    horizontal sum), the same softmax (:func:`_exp_row`'s exponentials and their double sum in key order), the
    same ``p . v`` per 16 outputs (FMAs in key order, zero probabilities skipped; a tail of ``dv % 16`` outputs as
    scalar sums over every key).
    """
    n_tokens, n_head, dk = q.shape
    dv = out.shape[1] // n_head
    esize = 2 if f16 else 4
    n_head_kv = k.shape[1] // (dk * esize)
    group = n_head // n_head_kv
    tb = ATTENTION_BLOCK_TOKENS
    n_blocks = (n_tokens + tb - 1) // tb
    qflat = q.reshape(q.size)
    for item in prange(n_blocks * n_head_kv):
        g = item % n_head_kv
        zig = item // n_head_kv
        blk = zig // 2 if zig % 2 == 0 else n_blocks - 1 - zig // 2  # 0, n-1, 1, n-2, ...: equal shares of keys
        t0 = blk * tb
        n_rows = min(tb, n_tokens - t0) * group  # row r: token t0 + r // group, head g * group + r % group
        qbuf = np.empty(n_rows * dk, np.float32)
        lo = np.empty(n_rows, np.int64)
        hi = np.empty(n_rows, np.int64)
        j_min, j_max = kv_len, -1
        for r in range(n_rows):
            t, h = t0 + r // group, g * group + r % group
            src = (t * n_head + h) * dk
            i = 0
            while i + 16 <= dk:
                x = vload(qflat, src + i)
                vstore(qbuf, r * dk + i, vround_f16(x) if (ggml and f16) else x)
                i += 16
            for e in range(i, dk):
                qbuf[r * dk + e] = round_f16(qflat[src + e]) if (ggml and f16) else qflat[src + e]
            lo[r], hi[r] = _visible_range(positions[t], kv_len, window)
            if lo[r] <= hi[r]:
                j_min, j_max = min(j_min, lo[r]), max(j_max, hi[r])
        span = max(0, j_max - j_min + 1)
        scores = np.zeros(n_rows * span, np.float32)
        top = np.full(n_rows, -np.inf)
        kflat, vflat = k.reshape(k.size), v.reshape(v.size)
        kb, vb = k.shape[1], v.shape[1]
        k_off = g * dk * esize
        # q . k
        r = 0
        while r < n_rows:
            quad = r + 4 <= n_rows
            last = r + 3 if quad else r
            jl, jh = lo[r], hi[r]
            for i in range(r + 1, last + 1):
                jl, jh = min(jl, lo[i]), max(jh, hi[i])
            for j in range(jl, jh + 1):
                if quad:
                    s0, s1, s2, s3 = _dot_4rows(qbuf, r * dk, kflat, j * kb + k_off, dk, f16)
                    _keep_score(scores, top, lo, hi, span, j_min, r, j, s0 * scale)
                    _keep_score(scores, top, lo, hi, span, j_min, r + 1, j, s1 * scale)
                    _keep_score(scores, top, lo, hi, span, j_min, r + 2, j, s2 * scale)
                    _keep_score(scores, top, lo, hi, span, j_min, r + 3, j, s3 * scale)
                else:
                    s0 = _dot_row(qbuf, r * dk, kflat, j * kb + k_off, dk, f16) * scale
                    _keep_score(scores, top, lo, hi, span, j_min, r, j, s0)
            r = last + 1
        # softmax
        zeros = np.zeros(n_rows, np.int64)
        pad = np.empty(16, np.float32)
        r = 0
        while r < n_rows:
            start, m = r * span + lo[r] - j_min, hi[r] - lo[r] + 1
            same = r + 4 <= n_rows and m > 0
            for i in range(r + 1, r + 4 if same else r):
                same = same and lo[i] == lo[r] and hi[i] == hi[r]
            n_same = 4 if same else 1  # four rows seeing the same keys (query heads of one token): sums interleaved
            for i in range(n_same):
                if m > 0:
                    _exp_row(scores, start + i * span, m, top[r + i], ggml, scalef, pad)
            if same:
                sum0, sum1, sum2, sum3 = _sum_4rows(scores, start, span, m)
                zeros[r] = _normalize_row(scores, start, m, sum0, ggml and f16)
                zeros[r + 1] = _normalize_row(scores, start + span, m, sum1, ggml and f16)
                zeros[r + 2] = _normalize_row(scores, start + 2 * span, m, sum2, ggml and f16)
                zeros[r + 3] = _normalize_row(scores, start + 3 * span, m, sum3, ggml and f16)
            elif m > 0:
                zeros[r] = _normalize_row(scores, start, m, _sum_row(scores, start, m), ggml and f16)
            r += n_same
        # p . v
        v_off = g * dv * esize
        r = 0
        while r < n_rows:
            n_quad = min(4, n_rows - r)
            jl, jh, ji, jx = lo[r], hi[r], lo[r], hi[r]  # union jl..jh; ji..jx: keys every row sees
            nz = zeros[r]
            for i in range(r + 1, r + n_quad):
                jl, jh = min(jl, lo[i]), max(jh, hi[i])
                ji, jx = max(ji, lo[i]), min(jx, hi[i])
                nz += zeros[i]
            s0 = r * span - j_min  # row r's probability of key j: scores[s0 + j]
            e0 = 0
            while e0 + 16 <= dv:
                off = v_off + e0 * esize
                if n_quad == 4:
                    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
                    if nz == 0 and ji <= jx:  # keys in ji..jx have four non-zero probabilities
                        a0, a1, a2, a3 = _pv_4rows(scores, s0, span, vflat, vb, jl, ji, off, f16, a0, a1, a2, a3)
                        a0, a1, a2, a3 = _pv_4rows_nonzero(
                            scores, s0, span, vflat, vb, ji, jx + 1, off, f16, a0, a1, a2, a3
                        )
                        a0, a1, a2, a3 = _pv_4rows(
                            scores, s0, span, vflat, vb, jx + 1, jh + 1, off, f16, a0, a1, a2, a3
                        )
                    else:
                        a0, a1, a2, a3 = _pv_4rows(scores, s0, span, vflat, vb, jl, jh + 1, off, f16, a0, a1, a2, a3)
                for i in range(n_quad):
                    rr = r + i
                    t, h = t0 + rr // group, g * group + rr % group
                    if n_quad == 4:
                        acc = a0 if i == 0 else (a1 if i == 1 else (a2 if i == 2 else a3))
                    else:
                        acc = _pv_row(scores, s0 + i * span, vflat, vb, jl, jh + 1, off, f16, vzero())
                    vstore(out[t], h * dv + e0, acc)
                e0 += 16
            for i in range(n_quad):  # the dv % 16 tail: scalar sums over every key, zeros included, as attention
                rr = r + i
                t, h = t0 + rr // group, g * group + rr % group
                for e in range(e0, dv):
                    total32 = _F32(0.0)
                    for j in range(kv_len):
                        pj = scores[rr * span + j - j_min] if j_min <= j <= j_max else _F32(0.0)
                        total32 += pj * (
                            load_f16(vflat, j * vb + v_off + 2 * e)
                            if f16
                            else load_f32(vflat, j * vb + v_off + 4 * e)
                        )
                    out[t, h * dv + e] = total32
            r += n_quad
