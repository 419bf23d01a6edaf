// Decoding of the GGUF K-quant types whose scales cover 16 values (Q2_K, Q3_K, Q6_K), for mx.fast.metal_kernel.
//
// Shared by the matvec and dequantize kernels (passed as their `header`). Written in the subset of the Metal
// Shading Language that is also C++: the tests compile this very file with a C++ compiler and a few typedefs
// (tests/inference_engine/backends/mlx/test_mlx_metal_kernels.py) and check every decoded value against
// gguf-py's dequantization, so the bit unpacking is verified on machines without Metal too.
//
// Each <type>_value(block, i) returns value i (0..255) of one 256-value block exactly as ggml's
// dequantize_row_<type> computes it (ggml/src/ggml-quants.c): float32 products in ggml's order.
// Each <type>_dot8(block, lane, x) returns sum_{k<8} value(8*lane + k) * x[k]: lane 0..31 of a SIMD group covers
// values [8*lane, 8*lane + 8) of the block, which lie in one 16-value sub-block (one scale).

#define KQ_QK 256

inline float kq_f16(device const uint8_t* p) {
    return (float)(*((device const half*)p));
}

// --- Q2_K: 84 bytes | scales[16] | qs[64] | d:f16 | dmin:f16 |
// w[128h + 32j + l] = dl * bits(qs[32h + l], 2j, 2) - ml (l = 0..31), sub-block s = i / 16,
// dl = d * (scales[s] & 15), ml = dmin * (scales[s] >> 4).
#define Q2_K_BYTES 84

inline float q2_k_value(device const uint8_t* b, uint i) {
    const uint h = i >> 7, j = (i >> 5) & 3, l = i & 31;
    const uint8_t sc = b[i >> 4];
    const float dl = kq_f16(b + 80) * (float)(sc & 15);
    const float ml = kq_f16(b + 82) * (float)(sc >> 4);
    const int q = (b[16 + 32 * h + l] >> (2 * j)) & 3;
    return dl * (float)q - ml;
}

inline float q2_k_dot8(device const uint8_t* b, uint lane, device const float* x) {
    float acc = 0.0f;
    for (uint k = 0; k < 8; ++k) {
        acc += q2_k_value(b, 8 * lane + k) * x[k];
    }
    return acc;
}

// --- Q3_K: 110 bytes | hmask[32] | qs[64] | scales[12] | d:f16 |
// w[128h + 32j + l] = dl * (bits(qs[32h + l], 2j, 2) - (bits(hmask[l], 4h + j, 1) ? 0 : 4)),
// dl = d * (scale_s - 32); scale_s six bits: low 4 = lo(scales[s]) (s < 8) or hi(scales[s - 8]),
// high 2 = bits(scales[8 + s % 4], 2 * (s / 4), 2).
#define Q3_K_BYTES 110

inline float q3_k_value(device const uint8_t* b, uint i) {
    const uint h = i >> 7, j = (i >> 5) & 3, l = i & 31, s = i >> 4;
    device const uint8_t* scales = b + 96;
    const int low = s < 8 ? (scales[s] & 15) : (scales[s - 8] >> 4);
    const int high = (scales[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    const float dl = kq_f16(b + 108) * (float)((low | (high << 4)) - 32);
    const int q = (b[32 + 32 * h + l] >> (2 * j)) & 3;
    const int hbit = (b[l] >> (4 * h + j)) & 1;
    return dl * (float)(q - (hbit ? 0 : 4));
}

inline float q3_k_dot8(device const uint8_t* b, uint lane, device const float* x) {
    float acc = 0.0f;
    for (uint k = 0; k < 8; ++k) {
        acc += q3_k_value(b, 8 * lane + k) * x[k];
    }
    return acc;
}

// --- Q6_K: 210 bytes | ql[128] | qh[64] | scales[16]: int8 | d:f16 |
// half h, quarter k = 0..3, l = 0..31: w[128h + 32k + l] = (d * sc_s) * (q - 32),
// q = nibble k/2 of ql[64h + 32(k%2) + l] | bits(qh[32h + l], 2k, 2) << 4, s = i / 16.
#define Q6_K_BYTES 210

inline float q6_k_value(device const uint8_t* b, uint i) {
    const uint h = i >> 7, k = (i >> 5) & 3, l = i & 31;
    const int lo = (b[64 * h + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
    const int hi = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    const int sc = (int)((device const int8_t*)(b + 192))[i >> 4];
    const float d = kq_f16(b + 208);
    return (d * (float)sc) * (float)((lo | (hi << 4)) - 32);
}

inline float q6_k_dot8(device const uint8_t* b, uint lane, device const float* x) {
    float acc = 0.0f;
    for (uint k = 0; k < 8; ++k) {
        acc += q6_k_value(b, 8 * lane + k) * x[k];
    }
    return acc;
}
