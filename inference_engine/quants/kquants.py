"""The 256-element super-block types ("K-quants"): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Layouts from ggml/src/ggml-common.h and ``dequantize_row_*`` in ggml/src/ggml-quants.c. ``d`` / ``dmin`` are f16
super-block scales; the per-sub-block scales and mins are small integers. ``lo(b)`` / ``hi(b)`` are the low / high
nibble of byte ``b``, ``bits(b, s, n)`` the ``n`` bits of ``b`` from bit ``s``.

ggml pairs every K-quant with Q8_K activations (float32 ``d`` per 256 values, int8 quants, int16 sums per 16),
and applies the mins through those sums: ``y -= d_a * dmin * sum(m_sub * bsum_sub)``.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as T

from inference_engine.quants.base import QuantType


class Q2_K(QuantType, qtype=T.Q2_K, vec_dot_type=T.Q8_K):
    # 84 bytes -> 256 weights in 16 sub-blocks of 16, w = d * sc * q - dmin * m, q in 0..3
    # byte  0                 16                       80      82        84
    #       | scales[16]: u8   | qs[64]: 2-bit q        | d:f16 | dmin:f16 |
    # scales[s]: lo = sc (4 bits), hi = m (4 bits) of sub-block s
    # half h = 0,1 uses q = qs[32h : 32h+32]; for shift j = 0..3:
    #   w[128h + 32j + l]      = bits(q[l],    2j, 2) with sub-block 8h + 2j      (l = 0..15)
    #   w[128h + 32j + 16 + l] = bits(q[l+16], 2j, 2) with sub-block 8h + 2j + 1
    f16_scale_offsets = (80, 82)


class Q3_K(QuantType, qtype=T.Q3_K, vec_dot_type=T.Q8_K):
    # 110 bytes -> 256 weights in 16 sub-blocks of 16, w = d * (sc - 32) * (q - 4*(1 - hbit)), q in 0..3
    # byte  0              32                 96                108     110
    #       | hmask[32]     | qs[64]: 2-bit q  | scales[12]     | d:f16 |
    # scales: 16 six-bit values; low 4 bits: lo(scales[s]) for s < 8, hi(scales[s-8]) for s >= 8;
    #         high 2 bits: bits(scales[8 + s%4], 2*(s//4), 2)
    # q and sub-blocks as in Q2_K; the high bit of w[128h + 32j + l] is bits(hmask[l], 4h + j, 1),
    # of w[128h + 32j + 16 + l] is bits(hmask[l+16], 4h + j, 1); a clear bit subtracts 4.
    f16_scale_offsets = (108,)


class Q4_K(QuantType, qtype=T.Q4_K, vec_dot_type=T.Q8_K):
    # 144 bytes -> 256 weights in 8 sub-blocks of 32, w = d * sc * q - dmin * m, q in 0..15
    # byte  0      2         4            16                    144
    #       | d:f16 | dmin:f16 | scales[12] | qs[128]: 4-bit q   |
    # scales: 8 six-bit (sc, m) pairs (get_scale_min_k4): for s < 4 sc = bits(scales[s], 0, 6),
    #         m = bits(scales[s+4], 0, 6); for s >= 4 sc = lo(scales[s+4]) | bits(scales[s-4], 6, 2) << 4,
    #         m = hi(scales[s+4]) | bits(scales[s], 6, 2) << 4
    # chunk c = 0..3: w[64c + l] = lo(qs[32c + l]) (sub-block 2c), w[64c + 32 + l] = hi(qs[32c + l]) (2c+1)
    f16_scale_offsets = (0, 2)


class Q5_K(QuantType, qtype=T.Q5_K, vec_dot_type=T.Q8_K):
    # 176 bytes -> 256 weights in 8 sub-blocks of 32, w = d * sc * q - dmin * m, q in 0..31
    # byte  0      2         4            16         48                     176
    #       | d:f16 | dmin:f16 | scales[12] | qh[32]   | qs[128]: low 4 bits  |
    # scales as Q4_K; chunk c = 0..3, l = 0..31:
    #   w[64c + l]      = lo(qs[32c + l]) | bits(qh[l], 2c,     1) << 4   (sub-block 2c)
    #   w[64c + 32 + l] = hi(qs[32c + l]) | bits(qh[l], 2c + 1, 1) << 4   (sub-block 2c + 1)
    f16_scale_offsets = (0, 2)


class Q6_K(QuantType, qtype=T.Q6_K, vec_dot_type=T.Q8_K):
    # 210 bytes -> 256 weights in 16 sub-blocks of 16, w = d * sc * (q - 32), q in 0..63, sc int8
    # byte  0                  128              192               208     210
    #       | ql[128]: low 4   | qh[64]: high 2 | scales[16]: i8   | d:f16 |
    # half h = 0,1 uses L = ql[64h:], H = qh[32h:], l = 0..31, sub-block of w[i] is i // 16:
    #   w[128h + l]      = lo(L[l])      | bits(H[l], 0, 2) << 4
    #   w[128h + 32 + l] = lo(L[l + 32]) | bits(H[l], 2, 2) << 4
    #   w[128h + 64 + l] = hi(L[l])      | bits(H[l], 4, 2) << 4
    #   w[128h + 96 + l] = hi(L[l + 32]) | bits(H[l], 6, 2) << 4
    f16_scale_offsets = (208,)
