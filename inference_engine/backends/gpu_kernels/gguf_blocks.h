// The GGUF block layouts of 256 values: those MLX's affine format cannot hold (scales every 16 values: Q2_K, Q3_K,
// Q6_K; a code book of non-linear values: IQ4_XS, and IQ4_NL, whose 32-value blocks are read eight at a time as one
// of 256), and Q4_K / Q5_K (which it holds, at 6 bits a weight instead of the
// file's 4.5 / 5.5; read here in their blocks where MLXBackend.block_kernel_types asks for it), written
// once for three compilers: Metal (mx.fast.metal_kernel), CUDA through NVRTC (mx.fast.cuda_kernel) and the host's
// C++ compiler (the tests, which check every decoded value against gguf-py, i.e. ggml's dequantize_row_<type>).
//
// Only the common subset of the three languages is used: `unsigned int` (not Metal's `uint`), uint8_t, no pointer
// casts, and four macros that each dialect header defines before including this file:
//   GQ_FN          function qualifier         (Metal: inline, CUDA: __device__ __forceinline__, host: inline)
//   GQ_GLOBAL      address space of weights   (Metal: device, CUDA and host: nothing)
//   GQ_THREAD      address space of a thread's own arrays (Metal: thread, CUDA and host: nothing)
//   GQ_AS_FLOAT(u) the float32 whose bits are u (Metal: as_type<float>, CUDA: __uint_as_float, host: memcpy)
//   GQ_AS_BITS(f)  the bits of the float32 f, the other way (Metal: as_type<uint>, CUDA: __float_as_uint)
//
// A block holds 256 values (GQ_QK) in 16 sub-blocks of 16 (GQ_SUB); value i lies in sub-block i / 16. Every type
// gives value i as
//     gq_<type>_apply(gq_<type>_scale(b, s), gq_<type>_min(b, s), gq_<type>_quant(b, i)),   s = i / 16
// with float factors per sub-block and a small integer per value, in exactly ggml's float32 operations and order,
// so the value is ggml's bit for bit. The NumPy twin of the index arithmetic (which byte, which bits, which scale
// for value i) is inference_engine/backends/mlx/block_index.py; the tests hold both to gguf-py.

#ifndef GQ_GGUF_BLOCKS_H
#define GQ_GGUF_BLOCKS_H

#define GQ_QK 256
#define GQ_SUB 16

// The f16 with bits h as float32, exactly (as ggml's GGML_FP16_TO_FP32): built from its bits, so the same integer
// code runs on every compiler (no half type).
GQ_FN float gq_f16_bits(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16;
    const unsigned int e = (h >> 10) & 31u;
    const unsigned int m = h & 1023u;
    if (e == 0u) {  // zero or subnormal: m * 2^-24, exact in float32
        const float v = (float)m * 5.9604644775390625e-08f;
        return sign != 0u ? -v : v;
    }
    if (e == 31u) {  // infinity or NaN (payload kept)
        return GQ_AS_FLOAT(sign | 0x7f800000u | (m << 13));
    }
    return GQ_AS_FLOAT(sign | ((e + 112u) << 23) | (m << 13));  // rebias 15 -> 127
}

// The little-endian f16 at p as float32 (no unaligned load).
GQ_FN float gq_f16(GQ_GLOBAL const uint8_t* p) {
    return gq_f16_bits((unsigned int)p[0] | ((unsigned int)p[1] << 8));
}

// The signed byte at p (two's complement), without a pointer cast.
GQ_FN int gq_i8(GQ_GLOBAL const uint8_t* p) {
    const int v = (int)p[0];
    return v - ((v & 128) << 1);
}

// --- Q2_K: 84 bytes | scales[16] | qs[64] | d:f16 @80 | dmin:f16 @82 |
// value i = 128h + 32j + l (h = i/128, j = (i/32)%4, l = i%32): q = bits(qs[32h + l], 2j, 2);
// sub-block s: scale = d * lo(scales[s]), min = dmin * hi(scales[s]); value = scale * q - min.
enum { gq_q2_k_bytes = 84 };

GQ_FN float gq_q2_k_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b + 80) * (float)(b[s] & 15u);
}
GQ_FN float gq_q2_k_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b + 82) * (float)(b[s] >> 4);
}
GQ_FN int gq_q2_k_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    return (int)((b[16u + 32u * (i >> 7) + (i & 31u)] >> (2u * ((i >> 5) & 3u))) & 3u);
}
GQ_FN float gq_q2_k_apply(float scale, float sub_min, int q) {
    // scale * q is exact (at most 17 significant bits), so fused or not this is one rounding, as in ggml
    return scale * (float)q - sub_min;
}

// --- Q3_K: 110 bytes | hmask[32] | qs[64] | scales[12] | d:f16 @108 |
// value i = 128h + 32j + l: q = bits(qs[32h + l], 2j, 2) - (bits(hmask[l], 4h + j, 1) ? 0 : 4);
// sub-block s has a six-bit scale: low 4 bits = nibble s/8 of scales[s % 8], high 2 bits =
// bits(scales[8 + s%4], 2(s/4), 2); scale = d * (six_bit - 32), no min; value = scale * q.
enum { gq_q3_k_bytes = 110 };

GQ_FN float gq_q3_k_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    const unsigned int low = (b[96u + (s & 7u)] >> (4u * (s >> 3))) & 15u;
    const unsigned int high = (b[104u + (s & 3u)] >> (2u * (s >> 2))) & 3u;
    return gq_f16(b + 108) * (float)((int)(low | (high << 4)) - 32);
}
GQ_FN float gq_q3_k_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return 0.0f;
}
GQ_FN int gq_q3_k_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const unsigned int h = i >> 7, j = (i >> 5) & 3u, l = i & 31u;
    const int q = (int)((b[32u + 32u * h + l] >> (2u * j)) & 3u);
    const unsigned int hbit = (b[l] >> (4u * h + j)) & 1u;
    return hbit != 0u ? q : q - 4;
}
GQ_FN float gq_q3_k_apply(float scale, float sub_min, int q) {
    return scale * (float)q;
}

// --- Q4_K: 144 bytes | d:f16 | dmin:f16 @2 | scales[12] @4 | qs[128] @16 |
// value i = 64h + 32k + l (h = i/64, k = (i/32)%2, l = i%32): q = nibble k of qs[32h + l]; ggml's sub-block
// j = i/32 (32 values; our 16-value sub-block s takes j = s/2) has six-bit codes (get_scale_min_k4): for j < 4
// sc = bits(scales[j], 0, 6), m = bits(scales[j + 4], 0, 6); for j >= 4 sc = lo(scales[j + 4]) | bits(scales[j - 4],
// 6, 2) << 4, m = hi(scales[j + 4]) | bits(scales[j], 6, 2) << 4. scale = d * sc, min = dmin * m (both exact: 11 x 6
// bits); value = scale * q - min (scale * q exact: one rounding, as ggml's d1 * q - m1).
enum { gq_q4_k_bytes = 144 };

GQ_FN unsigned int gq_k4_code(GQ_GLOBAL const uint8_t* b, unsigned int j, unsigned int is_min) {
    GQ_GLOBAL const uint8_t* sc = b + 4;
    if (j < 4u) {
        return sc[j + 4u * is_min] & 63u;
    }
    const unsigned int low = is_min != 0u ? sc[j + 4u] >> 4 : sc[j + 4u] & 15u;
    return low | ((sc[j - 4u * (1u - is_min)] >> 6) << 4);
}
GQ_FN float gq_q4_k_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b) * (float)gq_k4_code(b, s >> 1, 0u);
}
GQ_FN float gq_q4_k_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b + 2) * (float)gq_k4_code(b, s >> 1, 1u);
}
GQ_FN int gq_q4_k_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    return (int)((b[16u + 32u * (i >> 6) + (i & 31u)] >> (4u * ((i >> 5) & 1u))) & 15u);
}
GQ_FN float gq_q4_k_apply(float scale, float sub_min, int q) {
    return scale * (float)q - sub_min;
}

// --- Q5_K: 176 bytes | d:f16 | dmin:f16 @2 | scales[12] @4 | qh[32] @16 | qs[128] @48 |
// value i = 64h + 32k + l: q = nibble k of qs[32h + l] | bits(qh[l], i/32, 1) << 4; scales and mins as Q4_K's;
// value = scale * q - min (scale * q exact: 17 x 5 bits).
enum { gq_q5_k_bytes = 176 };

GQ_FN float gq_q5_k_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_q4_k_scale(b, s);  // the same header: d, dmin, scales[12]
}
GQ_FN float gq_q5_k_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_q4_k_min(b, s);
}
GQ_FN int gq_q5_k_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const unsigned int lo = (b[48u + 32u * (i >> 6) + (i & 31u)] >> (4u * ((i >> 5) & 1u))) & 15u;
    const unsigned int hi = (b[16u + (i & 31u)] >> (i >> 5)) & 1u;
    return (int)(lo | (hi << 4));
}
GQ_FN float gq_q5_k_apply(float scale, float sub_min, int q) {
    return scale * (float)q - sub_min;
}

// --- Q6_K: 210 bytes | ql[128] | qh[64] | scales[16]: int8 | d:f16 @208 |
// value i = 128h + 32k + l (k = (i/32)%4): q = (nibble k/2 of ql[64h + 32(k%2) + l]) | bits(qh[32h + l], 2k, 2) << 4,
// minus 32; sub-block s: scale = d * scales[s], no min; value = scale * q (ggml's d * sc * q, left to right).
enum { gq_q6_k_bytes = 210 };

GQ_FN float gq_q6_k_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b + 208) * (float)gq_i8(b + 192u + s);
}
GQ_FN float gq_q6_k_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return 0.0f;
}
GQ_FN int gq_q6_k_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const unsigned int h = i >> 7, k = (i >> 5) & 3u, l = i & 31u;
    const unsigned int lo = (b[64u * h + 32u * (k & 1u) + l] >> (4u * (k >> 1))) & 15u;
    const unsigned int hi = (b[128u + 32u * h + l] >> (2u * k)) & 3u;
    return (int)(lo | (hi << 4)) - 32;
}
GQ_FN float gq_q6_k_apply(float scale, float sub_min, int q) {
    return scale * (float)q;
}

// --- IQ4_XS: 136 bytes | d:f16 | scales_h: u16 LE @2 | scales_l[4] @4 | qs[128] @8 |
// value i = 32t + 16k + j (t = i/32, k = (i/16)%2, j = i%16): code = nibble k of qs[16t + j], looked up in ggml's
// kvalues_iq4nl; ggml's sub-block t (32 values) has ls = nibble t%2 of scales_l[t/2] | bits(scales_h, 2t, 2) << 4,
// scale = d * (ls - 32), no min; value = scale * kvalue (ggml's dl * kvalues_iq4nl[code]; exact). Our 16-value
// sub-block s takes ggml's sub-block s/2.
enum { gq_iq4_xs_bytes = 136 };

GQ_FN float gq_iq4_xs_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    const unsigned int t = s >> 1;
    const unsigned int low = (b[4u + (t >> 1)] >> (4u * (t & 1u))) & 15u;
    const unsigned int high = (b[2u + (t >> 2)] >> (2u * (t & 3u))) & 3u;
    return gq_f16(b) * (float)((int)(low | (high << 4)) - 32);
}
GQ_FN float gq_iq4_xs_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return 0.0f;
}
GQ_FN int gq_iq4_xs_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const int kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return kvalues[(b[8u + 16u * (i >> 5) + (i & 15u)] >> (4u * ((i >> 4) & 1u))) & 15u];
}
GQ_FN float gq_iq4_xs_apply(float scale, float sub_min, int q) {
    return scale * (float)q;
}

// --- IQ4_NL: blocks of 32 values, 18 bytes | d:f16 | qs[16] |, read as a block of 256 = eight of them (144 bytes;
// a row's last may be partial: gguf_kernels.h's GQ_ROW_BYTES). Value i = 32t + 16k + j (t = i/32: file block t at
// byte 18t, k = (i/16)%2, j = i%16): code = nibble k of its qs[j], looked up in kvalues_iq4nl; value = d * kvalue
// (ggml's dequantize_row_iq4_nl, exact). Our 16-value sub-block s lies in file block s/2: its d.
enum { gq_iq4_nl_bytes = 144 };

GQ_FN float gq_iq4_nl_scale(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return gq_f16(b + 18u * (s >> 1));
}
GQ_FN float gq_iq4_nl_min(GQ_GLOBAL const uint8_t* b, unsigned int s) {
    return 0.0f;
}
GQ_FN int gq_iq4_nl_quant(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const int kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    return kvalues[(b[18u * (i >> 5) + 2u + (i & 15u)] >> (4u * ((i >> 4) & 1u))) & 15u];
}
GQ_FN float gq_iq4_nl_apply(float scale, float sub_min, int q) {
    return scale * (float)q;
}

#endif  // GQ_GGUF_BLOCKS_H
