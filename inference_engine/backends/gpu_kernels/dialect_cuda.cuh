// CUDA dialect of the GGUF block kernels: the header of mx.fast.cuda_kernel (compiled by NVRTC after MLX's
// device/utils.cuh, outside MLX's namespace). Followed by gguf_blocks.h, `#define GQ_TYPE <type>` and
// gguf_kernels.h. Not compiled here (no CUDA): the tests compile the shared files with dialect_host.h instead.
#define GQ_FN __device__ __forceinline__
#define GQ_GLOBAL
#define GQ_THREAD
#define GQ_SHARED
#define GQ_SHARED_DECL __shared__
#define GQ_AS_FLOAT(u) __uint_as_float(u)
#define GQ_AS_BITS(f) __float_as_uint(f)
#define GQ_BARRIER() __syncthreads()
#define GQ_SIMD_SUM(v) gq_warp_sum(v)
#define GQ_EXP(x) expf(x)
#define GQ_SQRT(x) sqrtf(x)

// The sum of v over the 32 lanes of a warp, in every lane (a butterfly of shuffles).
__device__ __forceinline__ float gq_warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}
