// Metal dialect of the GGUF block kernels: the header of mx.fast.metal_kernel (MLX puts metal_stdlib and
// `using namespace metal` before it). Followed by gguf_blocks.h, `#define GQ_TYPE <type>` and gguf_kernels.h.
// Not compiled here (no Metal on Linux): the tests compile the shared files with dialect_host.h instead.
#define GQ_FN inline
#define GQ_GLOBAL device
#define GQ_THREAD thread
#define GQ_SHARED threadgroup
#define GQ_SHARED_DECL threadgroup
#define GQ_AS_FLOAT(u) as_type<float>(u)
#define GQ_AS_BITS(f) as_type<uint>(f)
#define GQ_BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)
#define GQ_SIMD_SUM(v) simd_sum(v)
#define GQ_EXP(x) exp(x)
#define GQ_SQRT(x) precise::sqrt(x)
