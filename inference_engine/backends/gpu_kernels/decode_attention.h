// Decode attention on the GPU: one query token per head against an F16 K/V cache, written once for every dialect
// on top of gguf_blocks.h (gq_f16_bits) and the dialect's macros (GQ_SIMD_SUM, GQ_BARRIER, GQ_EXP, GQ_SHARED_DECL).
// The kernel bodies are kernel_decode_attention.inc (pass 1) and kernel_decode_attention_combine.inc (pass 2); the
// tests compile them for the host (dialect_host.h) and run every thread of both grids against a float64 softmax.
//
// Why a kernel: in a compiled decode step the keys are a block of cache slots larger than the position (the
// step is traced once per block), so MLX's attention gets a mask, which its CUDA build answers with its generic ops
// (F16 -> float32 copies of both cached blocks, two matmuls, the mask, the softmax: about eight kernels a layer);
// this reads the F16 cache where it lies, up to the position, in two.
//
// Pass 1 splits the key block into chunks of GQ_ATTN_CHUNK slots, a threadgroup per (chunk, query head), so a long
// context runs on many threadgroups at once (a first version, a threadgroup per head walking every slot, took 2x
// MLX's ops at depth 512 on an H200). Thread t of a threadgroup scores slot chunk * GQ_ATTN_CHUNK + t alone (its D
// products: independent loads, no reduction per slot); the chunk's max and the sum of its weights follow through
// threadgroup memory; then thread t sums dimension t (t + GQ_ATTN_THREADS, ...) of the weighted values over the
// chunk's slots (a SIMD group reads 32 consecutive halves of a row at a time). Each chunk leaves its max m, its sum
// of weights l and its unnormalized output. Pass 2, a threadgroup per head: out = sum_c exp(m_c - M) o_c /
// sum_c exp(m_c - M) l_c with M the largest m_c. Every exponential and sum in float32.
#ifndef GQ_DECODE_ATTENTION_H
#define GQ_DECODE_ATTENTION_H

#define GQ_ATTN_SIMDS 4
#define GQ_ATTN_THREADS 128  // 32 * GQ_ATTN_SIMDS
#define GQ_ATTN_CHUNK 128    // slots per pass-1 threadgroup: one a thread
#define GQ_ATTN_MAX_DIM 256  // the largest head size D (a multiple of 32) the kernel takes

// float32's -infinity, spelled the same way on every compiler
#define GQ_NEG_INF GQ_AS_FLOAT(0xff800000u)

// The first slot position p sees: 0, or within a sliding window of `window` slots (0: no window), as
// numerics.visible_keys: slot j is visible when j <= p and p - j < window.
GQ_FN int gq_attn_first_slot(int p, int window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

GQ_FN float gq_attn_max(float a, float b) {
    return a > b ? a : b;
}

#endif  // GQ_DECODE_ATTENTION_H
