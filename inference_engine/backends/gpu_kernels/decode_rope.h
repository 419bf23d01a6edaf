// A decoded token's RoPE and its K/V rows' F16 rounding as one GPU kernel (kernel_decode_rope.inc), written once for
// every dialect on top of the dialect's macros (GQ_AS_BITS). Why: in a compiled decode step the query's RoPE, the
// key's RoPE, and the key's and value's F16 copies for the cache are four element-wise kernels a layer (MLX fuses
// each chain, not across the reshapes between them); this is one, its outputs what the cache write and the decode
// attention kernel (decode_attention.h) take.
#ifndef GQ_DECODE_ROPE_H
#define GQ_DECODE_ROPE_H

#define GQ_ROPE_THREADS 256  // threads a threadgroup: one an element of q, k and v

// The F16 bits nearest to the float32 f, ties to even (IEEE's round-to-nearest-even, as MLX's astype(float16) and
// ggml's fp32 -> fp16): integer code only (no half type), NumPy's npy_floatbits_to_halfbits step for step. Overflow
// gives infinity; NaN stays NaN (its payload's top bits kept).
GQ_FN unsigned int gq_f16_from_float(float value) {
    const unsigned int f = GQ_AS_BITS(value);
    const unsigned int sign = (f & 0x80000000u) >> 16;
    unsigned int f_exp = f & 0x7f800000u;
    unsigned int f_sig = f & 0x007fffffu;
    if (f_exp >= 0x47800000u) {  // |f| >= 65536, infinity or NaN
        if (f_exp == 0x7f800000u && f_sig != 0u) {
            const unsigned int nan = 0x7c00u + (f_sig >> 13);
            return sign + (nan == 0x7c00u ? nan + 1u : nan);  // a payload in the dropped bits only: still NaN
        }
        return sign + 0x7c00u;
    }
    if (f_exp <= 0x38000000u) {  // below F16's smallest normal: a subnormal half or a signed zero
        if (f_exp < 0x33000000u) {
            return sign;
        }
        f_exp >>= 23;
        f_sig = (0x00800000u + f_sig) >> (113u - f_exp);
        // add half an ulp unless the result is even and exactly halfway (bits the shift dropped count)
        if ((f_sig & 0x00003fffu) != 0x00001000u || (f & 0x000007ffu) != 0u) {
            f_sig += 0x00001000u;
        }
        return sign + (f_sig >> 13);  // a carry into the exponent is the right answer (the smallest normal)
    }
    const unsigned int h_exp = (f_exp - 0x38000000u) >> 13;
    if ((f_sig & 0x00003fffu) != 0x00001000u) {
        f_sig += 0x00001000u;
    }
    return sign + h_exp + (f_sig >> 13);  // a carry rounds up into the exponent, past 65504 to infinity
}

// Element i (0 <= i < N_DIMS) of a head rotated by RoPE at angle index `pair`, given its value x, its partner's
// value xp (the other of its pair) and whether it is the pair's second: x cos - xp sin for the first, x cos + xp sin
// for the second, as the MLX backend's rope (x*C + partner*S with S = (-sin, sin)).
GQ_FN float gq_rope_value(float x, float xp, float c, float s, bool second) {
    return second ? x * c + xp * s : x * c + xp * (-s);
}

#endif  // GQ_DECODE_ROPE_H
