// Host dialect of the GGUF block kernels: the shared files (gguf_blocks.h, gguf_kernels.h) and the kernel bodies
// (kernel_*.inc) compiled by the system's C++ compiler in the tests
// (tests/inference_engine/backends/mlx/test_mlx_block_kernels.py), so the code that runs on the GPU runs here too.
//
// gq_host_launch runs a kernel body for every thread of a grid, one threadgroup at a time, each thread of the
// threadgroup as a fiber (its own stack, ucontext) on the calling thread: a fiber runs until it reaches a barrier
// or returns, then the next one runs. GQ_BARRIER waits for every live thread of the threadgroup, GQ_SIMD_SUM for
// those of the thread's SIMD group of 32 (its lanes' values summed in lane order), and GQ_SHARED_DECL makes the
// body's threadgroup arrays statics, which the fibers of the one running threadgroup share. A thread that returns
// early leaves both barriers, as a finished GPU thread no longer holds them up. Each round over the waiting fibers
// takes them in a new shuffled order (a fixed seed: runs repeat), so that a read of shared memory that lacks its
// barrier meets a writer that has not run yet, as it can on a GPU. Fibers rather than an OS thread per GPU thread:
// the same semantics without creating 128 threads per threadgroup and waking them at every barrier (the four host
// kernel test files: 114 s that way, 23 s as fibers, on 2 cores).
#if defined(__APPLE__) && !defined(_XOPEN_SOURCE)
#define _XOPEN_SOURCE 600  // macOS declares the ucontext functions only then
#endif
#include <ucontext.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
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

// One barrier's count, as std::barrier keeps it: `expected` live threads, `arrived` of them waiting in `phase`.
struct gq_host_barrier_state {
    unsigned int expected = 0;
    unsigned int arrived = 0;
    unsigned int phase = 0;
};

struct gq_host_group {
    explicit gq_host_group(unsigned int n_threads) : slots(n_threads, NAN) {
        all.expected = n_threads;
        for (unsigned int g = 0; g < (n_threads + 31u) / 32u; ++g) {
            simd.emplace_back();
            simd.back().expected = n_threads - 32u * g < 32u ? n_threads - 32u * g : 32u;
        }
    }
    gq_host_barrier_state all;
    std::vector<gq_host_barrier_state> simd;
    std::vector<float> slots;  // one per thread, for the SIMD sums (NaN until written: a missing lane shows)
};

struct gq_host_fiber {
    ucontext_t context;
    std::unique_ptr<char[]> stack;
    bool done = false;
};

// 256 KiB of stack per GPU thread: the bodies keep a few small arrays (at most GQ_MAX_TOK accumulators) on it
static constexpr std::size_t GQ_HOST_STACK = 256u * 1024u;

static thread_local gq_host_group* gq_host_current = nullptr;
static thread_local unsigned int gq_host_tid = 0;
static thread_local ucontext_t gq_host_scheduler;
static thread_local gq_host_fiber* gq_host_running = nullptr;
static thread_local void (*gq_host_body)(void*, unsigned int) = nullptr;
static thread_local void* gq_host_body_arg = nullptr;
static thread_local unsigned long gq_host_progress = 0;  // arrivals at barriers (a finished thread's included)

static inline void gq_host_yield() {
    swapcontext(&gq_host_running->context, &gq_host_scheduler);
}

static inline void gq_host_arrive_and_wait(gq_host_barrier_state& b) {
    const unsigned int phase = b.phase;
    ++gq_host_progress;
    if (++b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
        return;
    }
    while (b.phase == phase) {
        gq_host_yield();
    }
}

// A returning thread: one fewer to wait for, in this phase and the next ones (std::barrier::arrive_and_drop).
static inline void gq_host_arrive_and_drop(gq_host_barrier_state& b) {
    ++gq_host_progress;
    --b.expected;
    if (b.arrived != 0 && b.arrived == b.expected) {
        b.arrived = 0;
        ++b.phase;
    }
}

static inline void gq_host_barrier() {
    gq_host_arrive_and_wait(gq_host_current->all);
}

static inline float gq_host_simd_sum(float v) {
    gq_host_group& g = *gq_host_current;
    const unsigned int tid = gq_host_tid;
    const unsigned int first = tid & ~31u;
    g.slots[tid] = v;
    gq_host_arrive_and_wait(g.simd[tid / 32u]);
    float sum = 0.0f;
    for (unsigned int lane = first; lane < first + 32u && lane < g.slots.size(); ++lane) {
        sum += g.slots[lane];
    }
    gq_host_arrive_and_wait(g.simd[tid / 32u]);  // every lane has read before any slot is written again
    return sum;
}

static void gq_host_fiber_entry(unsigned int tid) {
    gq_host_tid = tid;
    gq_host_body(gq_host_body_arg, tid);
    gq_host_arrive_and_drop(gq_host_current->all);
    gq_host_arrive_and_drop(gq_host_current->simd[tid / 32u]);
    gq_host_running->done = true;
}  // returns to uc_link: the scheduler

// kernel(tid, group_x, group_y) for the grid groups_x x groups_y of threadgroups of n_threads.
template <class Kernel>
static void gq_host_launch(unsigned int groups_x, unsigned int groups_y, unsigned int n_threads, Kernel kernel) {
    std::vector<gq_host_fiber> fibers(n_threads);
    for (gq_host_fiber& f : fibers) {
        f.stack.reset(new char[GQ_HOST_STACK]);
    }
    std::vector<unsigned int> order(n_threads);
    std::uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (unsigned int gy = 0; gy < groups_y; ++gy) {
        for (unsigned int gx = 0; gx < groups_x; ++gx) {
            gq_host_group group(n_threads);
            struct Call {
                Kernel* kernel;
                unsigned int gx, gy;
            } call{&kernel, gx, gy};
            gq_host_body = [](void* arg, unsigned int tid) {
                Call* c = static_cast<Call*>(arg);
                (*c->kernel)(tid, c->gx, c->gy);
            };
            gq_host_body_arg = &call;
            gq_host_current = &group;
            for (unsigned int tid = 0; tid < n_threads; ++tid) {
                gq_host_fiber& f = fibers[tid];
                f.done = false;
                getcontext(&f.context);
                f.context.uc_stack.ss_sp = f.stack.get();
                f.context.uc_stack.ss_size = GQ_HOST_STACK;
                f.context.uc_link = &gq_host_scheduler;
                makecontext(&f.context, reinterpret_cast<void (*)()>(gq_host_fiber_entry), 1, tid);
                order[tid] = tid;
            }
            for (unsigned int live = n_threads; live > 0;) {
                for (unsigned int i = n_threads; i > 1; --i) {  // Fisher-Yates with a xorshift generator
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    const unsigned int j = static_cast<unsigned int>(seed % i);
                    const unsigned int t = order[i - 1];
                    order[i - 1] = order[j];
                    order[j] = t;
                }
                const unsigned long before = gq_host_progress;
                live = 0;
                for (unsigned int tid : order) {
                    gq_host_fiber& f = fibers[tid];
                    if (f.done) {
                        continue;
                    }
                    gq_host_running = &f;
                    gq_host_tid = tid;
                    swapcontext(&gq_host_scheduler, &f.context);
                    live += f.done ? 0u : 1u;
                }
                if (live > 0 && gq_host_progress == before) {  // a GPU would hang: say so rather than spin
                    std::fprintf(stderr, "gq_host_launch: threadgroup (%u, %u) deadlocked: %u of its %u threads "
                                 "wait at a barrier the others never reach\n", gx, gy, live, n_threads);
                    std::abort();
                }
            }
        }
    }
}
