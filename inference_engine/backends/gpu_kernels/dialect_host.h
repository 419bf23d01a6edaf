// Host dialect of the GGUF block kernels: the shared files (gguf_blocks.h, gguf_kernels.h) and the kernel bodies
// (kernel_*.inc) compiled by the system's C++20 compiler in the tests
// (tests/inference_engine/backends/mlx/test_mlx_block_kernels.py), so the code that runs on the GPU runs here too.
//
// gq_host_launch runs a kernel body for every thread of a grid, one threadgroup at a time, each thread of the
// threadgroup on its own std::thread: GQ_BARRIER is a std::barrier over the threadgroup, GQ_SIMD_SUM one over the
// thread's SIMD group of 32 (its lanes' values summed in lane order), and GQ_SHARED_DECL makes the body's
// threadgroup arrays statics, which the threads of the one running threadgroup share. A thread that returns early
// leaves both barriers (arrive_and_drop), as a finished GPU thread no longer holds them up.
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define GQ_FN static inline
#define GQ_GLOBAL
#define GQ_THREAD
#define GQ_SHARED
#define GQ_SHARED_DECL static
#define GQ_AS_FLOAT(u) gq_host_as_float(u)
#define GQ_AS_BITS(f) gq_host_as_bits(f)
#define GQ_BARRIER() gq_host_barrier()
#define GQ_SIMD_SUM(v) gq_host_simd_sum(v)
#define GQ_EXP(x) std::exp(x)
#define GQ_SQRT(x) std::sqrt(x)

static inline float gq_host_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

static inline unsigned int gq_host_as_bits(float f) {
    unsigned int u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

struct gq_host_group {
    explicit gq_host_group(unsigned int n_threads) : all(n_threads), slots(n_threads, NAN) {
        for (unsigned int g = 0; g < (n_threads + 31u) / 32u; ++g) {
            const unsigned int lanes = n_threads - 32u * g < 32u ? n_threads - 32u * g : 32u;
            simd.emplace_back(std::make_unique<std::barrier<>>(lanes));
        }
    }
    std::barrier<> all;
    std::vector<std::unique_ptr<std::barrier<>>> simd;
    std::vector<float> slots;  // one per thread, for the SIMD sums (NaN until written: a missing lane shows)
};

static thread_local gq_host_group* gq_host_current = nullptr;
static thread_local unsigned int gq_host_tid = 0;

static inline void gq_host_barrier() {
    gq_host_current->all.arrive_and_wait();
}

static inline float gq_host_simd_sum(float v) {
    gq_host_group& g = *gq_host_current;
    const unsigned int first = gq_host_tid & ~31u;
    g.slots[gq_host_tid] = v;
    g.simd[gq_host_tid / 32u]->arrive_and_wait();
    float sum = 0.0f;
    for (unsigned int lane = first; lane < first + 32u && lane < g.slots.size(); ++lane) {
        sum += g.slots[lane];
    }
    g.simd[gq_host_tid / 32u]->arrive_and_wait();  // every lane has read before any slot is written again
    return sum;
}

// kernel(tid, group_x, group_y) for the grid groups_x x groups_y of threadgroups of n_threads.
template <class Kernel>
static void gq_host_launch(unsigned int groups_x, unsigned int groups_y, unsigned int n_threads, Kernel kernel) {
    for (unsigned int gy = 0; gy < groups_y; ++gy) {
        for (unsigned int gx = 0; gx < groups_x; ++gx) {
            gq_host_group group(n_threads);
            std::vector<std::thread> threads;
            for (unsigned int tid = 0; tid < n_threads; ++tid) {
                threads.emplace_back([&group, &kernel, tid, gx, gy] {
                    gq_host_current = &group;
                    gq_host_tid = tid;
                    kernel(tid, gx, gy);
                    group.all.arrive_and_drop();
                    group.simd[tid / 32u]->arrive_and_drop();
                });
            }
            for (std::thread& t : threads) {
                t.join();
            }
        }
    }
}
