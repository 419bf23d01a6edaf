// Decode attention on the GPU: one query token per head against an F16 K/V cache, written once for every dialect
// on top of gguf_blocks.h (gq_f16_bits) and the dialect's macros (GQ_SIMD_SUM, GQ_BARRIER, GQ_EXP, GQ_SHARED_DECL).
// The kernel body is kernel_decode_attention.inc; the tests compile both for the host (dialect_host.h) and run
// every thread of the grid against a float64 softmax.
//
// Why a kernel: in a compiled decode step the keys are a block of cache slots larger than the position (the
// step is traced once per block), so MLX's attention gets a mask, which its CUDA build answers with its generic ops
// (F16 -> float32 copies of both cached blocks, two matmuls, the mask, the softmax: about eight kernels a layer);
// this reads the F16 cache where it lies, up to the position, in one.
//
// A threadgroup per query head, GQ_ATTN_SIMDS SIMD groups of 32 threads: SIMD group g takes the visible slots
// lo + g, lo + g + GQ_ATTN_SIMDS, ..., each lane D / 32 of the head's values (lane + 32 e: a SIMD group reads 32
// consecutive halves at a time), and keeps a running softmax (max, sum, weighted values) in float32; the groups'
// partial results are then merged through threadgroup memory, every exponential in float32.
#ifndef GQ_DECODE_ATTENTION_H
#define GQ_DECODE_ATTENTION_H

#define GQ_ATTN_SIMDS 4
#define GQ_ATTN_THREADS 128  // 32 * GQ_ATTN_SIMDS
#define GQ_ATTN_MAX_DIM 256  // the largest head size D (a multiple of 32) the kernel takes

// float32's -infinity, spelled the same way on every compiler
#define GQ_NEG_INF GQ_AS_FLOAT(0xff800000u)

// The first slot position p sees: 0, or within a sliding window of `window` slots (0: no window), as
// numerics.visible_keys: slot j is visible when j <= p and p - j < window.
GQ_FN int gq_attn_first_slot(int p, int window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

#endif  // GQ_DECODE_ATTENTION_H
