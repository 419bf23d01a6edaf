// The per-thread work of the GGUF block kernels (mat-vec, tiled mat-mul, dequantize), written once for every
// dialect on top of gguf_blocks.h. The kernel bodies (kernel_*.inc) only add what differs between GPUs: thread
// and group indices, the SIMD-group sum and the barrier; the tests compile this file for the host, run the
// functions for every thread of a group in turn (a barrier = the end of one such pass) and compare with gguf-py.
//
// The type-independent part is included once; the per-type part is included once per type with GQ_TYPE set to
// the type's name in gguf_blocks.h (q2_k, q3_k, q6_k): GQ_FUNC(_scale) is then gq_q2_k_scale, and so on.
// Besides the macros of gguf_blocks.h it needs GQ_SHARED: the address space of threadgroup memory (Metal:
// threadgroup, CUDA and host: nothing).

#ifndef GQ_GGUF_KERNELS_COMMON
#define GQ_GGUF_KERNELS_COMMON

#define GQ_CAT_(a, b) a##b
#define GQ_CAT(a, b) GQ_CAT_(a, b)
#define GQ_FUNC(suffix) GQ_CAT(GQ_CAT(gq_, GQ_TYPE), suffix)
#define GQ_BYTES GQ_FUNC(_bytes)
// A row of n_in values is n_in * GQ_BYTES / GQ_QK bytes: whole 256-value blocks, or for IQ4_NL (whose blocks of 256
// are eight of the file's 32-value blocks) whole 32-value blocks, the last 256 possibly partial. The kernels below
// walk a row in blocks of 256 and leave out the values past n_in (always whole 8-value runs: n_in % 32 == 0).
#define GQ_ROW_BYTES(n_in) ((size_t)(n_in) * (size_t)GQ_BYTES / (size_t)GQ_QK)

// Mat-vec (decode): GQ_MATVEC_WARPS SIMD groups of 32 threads per threadgroup, SPLIT of them (a template constant:
// 1, 2 or 4) sharing an output row, each through every SPLIT-th block of it, so a long row is not one SIMD group's
// chain of dependent loads; every token of the call (at most GQ_MAX_TOK) in the same pass over the row, so each
// weight byte is read once per call.
#define GQ_MATVEC_WARPS 4
#define GQ_MAX_TOK 8

// Mat-vec, one threadgroup a row (the "group" scheme, llama.cpp's mmvq layout): GQ_GROUP_THREADS threads share each
// output row, thread t walking the row's 16-value sub-blocks t, t + GQ_GROUP_THREADS, ... (sub-block j: values
// [16 j, 16 j + 16), one scale). Consecutive threads read consecutive sub-blocks (a SIMD group two blocks' bytes at
// once), and each thread takes n_in / (16 GQ_GROUP_THREADS) steps: 4.4 for a row of 8,960 values, where a SIMD
// group a row walks its 35 blocks one after another (the SPLIT scheme above: 9 steps of 4 groups).
#define GQ_GROUP_THREADS 128

// Tiled mat-mul (prefill): a threadgroup of GQ_TILE_THREADS computes GQ_TILE_ROWS output rows x GQ_TILE_TOKS
// tokens, GQ_TILE_K input columns at a time through threadgroup memory (rows padded to GQ_TILE_STRIDE floats so
// that the 16 threads reading one column hit 16 different banks). Thread t loads 8 values of tile row t / 4 (its
// weight row and its token) and accumulates the 4 x 4 outputs rows (t % 16) + 16a, tokens (t / 16) + 16c.
#define GQ_TILE_THREADS 256
#define GQ_TILE_ROWS 64
#define GQ_TILE_TOKS 64
#define GQ_TILE_K 32
#define GQ_TILE_STRIDE 33

// Dequantize (tests, and anyone who wants W as float32): one thread per 8 consecutive values of a row.
#define GQ_DEQ_THREADS 256

// acc[4c + a] += x[token (tid / 16) + 16c, k] * w[row (tid % 16) + 16a, k] over the tile's GQ_TILE_K columns.
GQ_FN void gq_tile_fma(GQ_SHARED const float* ws, GQ_SHARED const float* xs, unsigned int tid, GQ_THREAD float* acc) {
    const unsigned int tr = tid & 15u, tt = tid >> 4;
    for (unsigned int k = 0; k < GQ_TILE_K; ++k) {
        float wv[4];
        float xv[4];
        for (unsigned int a = 0; a < 4u; ++a) {
            wv[a] = ws[(tr + 16u * a) * GQ_TILE_STRIDE + k];
        }
        for (unsigned int c = 0; c < 4u; ++c) {
            xv[c] = xs[(tt + 16u * c) * GQ_TILE_STRIDE + k];
        }
        for (unsigned int c = 0; c < 4u; ++c) {
            for (unsigned int a = 0; a < 4u; ++a) {
                acc[4u * c + a] += xv[c] * wv[a];
            }
        }
    }
}

// y[token, row] = acc for this thread's outputs that exist (the last tiles hang over n_out and n_tok).
GQ_FN void gq_tile_store(GQ_GLOBAL float* y, GQ_THREAD const float* acc, int n_out, int n_tok, int row0, int tok0,
                         unsigned int tid) {
    const int tr = (int)(tid & 15u), tt = (int)(tid >> 4);
    for (int c = 0; c < 4; ++c) {
        const int tok = tok0 + tt + 16 * c;
        for (int a = 0; a < 4; ++a) {
            const int row = row0 + tr + 16 * a;
            if (tok < n_tok && row < n_out) {
                y[(size_t)tok * (size_t)n_out + (size_t)row] = acc[4 * c + a];
            }
        }
    }
}

#endif  // GQ_GGUF_KERNELS_COMMON

// --- per type (GQ_TYPE) ------------------------------------------------------------------------------------------

// Value i (0..255) of block b, exactly ggml's.
GQ_FN float GQ_FUNC(_value)(GQ_GLOBAL const uint8_t* b, unsigned int i) {
    const unsigned int s = i / GQ_SUB;
    return GQ_FUNC(_apply)(GQ_FUNC(_scale)(b, s), GQ_FUNC(_min)(b, s), GQ_FUNC(_quant)(b, i));
}

// Thread g of the dequantize kernel: values [8c, 8c + 8) of row g / (n_in / 8), c = g % (n_in / 8), into y.
GQ_FN void GQ_FUNC(_dequantize8)(GQ_GLOBAL const uint8_t* w, GQ_GLOBAL float* y, int n_in, size_t g) {
    const size_t chunks = (size_t)n_in / 8u;
    const size_t row = g / chunks;
    const unsigned int col = 8u * (unsigned int)(g % chunks);
    GQ_GLOBAL const uint8_t* b = w + row * GQ_ROW_BYTES(n_in) + (size_t)(col / GQ_QK) * (size_t)GQ_BYTES;
    const unsigned int first = col % GQ_QK;
    for (unsigned int k = 0; k < 8u; ++k) {
        y[row * (size_t)n_in + col + k] = GQ_FUNC(_value)(b, first + k);
    }
}

// Lane `lane` (0..31) of SIMD group `part` (0..split-1) of those computing one output row: acc[t] += the products
// of values [8 lane, 8 lane + 8) of blocks part, part + split, ... of the row (one sub-block: its scale is decoded
// once) with token t's x; none past n_in (a partial last block).
GQ_FN void GQ_FUNC(_matvec_lane)(GQ_GLOBAL const uint8_t* wrow, GQ_GLOBAL const float* x, int n_in, int n_tok,
                                 unsigned int lane, unsigned int part, unsigned int split, GQ_THREAD float* acc) {
    const unsigned int first = 8u * lane;
    const unsigned int s = first / GQ_SUB;
    const unsigned int n_blocks = ((unsigned int)n_in + GQ_QK - 1u) / GQ_QK;
    for (unsigned int blk = part; blk < n_blocks; blk += split) {
        if (blk * GQ_QK + first >= (unsigned int)n_in) {
            continue;
        }
        GQ_GLOBAL const uint8_t* b = wrow + (size_t)blk * (size_t)GQ_BYTES;
        GQ_GLOBAL const float* xb = x + (size_t)blk * GQ_QK + first;
        const float scale = GQ_FUNC(_scale)(b, s);
        const float sub_min = GQ_FUNC(_min)(b, s);
        for (unsigned int k = 0; k < 8u; ++k) {
            const float w = GQ_FUNC(_apply)(scale, sub_min, GQ_FUNC(_quant)(b, first + k));
            for (int t = 0; t < n_tok; ++t) {
                acc[t] += w * xb[(size_t)t * (size_t)n_in + k];
            }
        }
    }
}

// Thread work of the one-threadgroup-a-row mat-vec: acc[t] += the products of the row's 16-value sub-block j (values
// [16 j, 16 j + 16): block j / 16's sub-block j % 16, one scale and min, decoded once) with token t's x. A row of
// n_in values has n_in / 16 sub-blocks (n_in % 32 == 0): an IQ4_NL row's partial last block of 256 is whole ones.
GQ_FN void GQ_FUNC(_matvec_sub)(GQ_GLOBAL const uint8_t* wrow, GQ_GLOBAL const float* x, int n_in, int n_tok,
                                unsigned int j, GQ_THREAD float* acc) {
    GQ_GLOBAL const uint8_t* b = wrow + (size_t)(j / 16u) * (size_t)GQ_BYTES;
    const unsigned int s = j % 16u;
    const float scale = GQ_FUNC(_scale)(b, s);
    const float sub_min = GQ_FUNC(_min)(b, s);
    float w[16];
    for (unsigned int k = 0; k < 16u; ++k) {
        w[k] = GQ_FUNC(_apply)(scale, sub_min, GQ_FUNC(_quant)(b, 16u * s + k));
    }
    GQ_GLOBAL const float* xj = x + 16u * (size_t)j;
    for (int t = 0; t < n_tok; ++t) {
        for (unsigned int k = 0; k < 16u; ++k) {
            acc[t] += w[k] * xj[(size_t)t * (size_t)n_in + k];
        }
    }
}

// Thread tid's share of loading one tile step: values [k0 + c, k0 + c + 8) (c = 8 (tid % 4)) of weight row
// row0 + tid / 4 (decoded, one sub-block) and of token tok0 + tid / 4's x, zeros past n_out / n_tok.
GQ_FN void GQ_FUNC(_tile_load)(GQ_GLOBAL const uint8_t* w, GQ_GLOBAL const float* x, int n_out, int n_in, int n_tok,
                               int row0, int tok0, int k0, unsigned int tid, GQ_SHARED float* ws,
                               GQ_SHARED float* xs) {
    const unsigned int r = tid >> 2, c = 8u * (tid & 3u);
    const unsigned int col = (unsigned int)k0 + c;
    GQ_SHARED float* wdst = ws + r * GQ_TILE_STRIDE + c;
    GQ_SHARED float* xdst = xs + r * GQ_TILE_STRIDE + c;
    const int row = row0 + (int)r;
    if (row < n_out) {
        GQ_GLOBAL const uint8_t* b = w + (size_t)row * GQ_ROW_BYTES(n_in) + (size_t)(col / GQ_QK) * (size_t)GQ_BYTES;
        const unsigned int first = col % GQ_QK;
        const float scale = GQ_FUNC(_scale)(b, first / GQ_SUB);
        const float sub_min = GQ_FUNC(_min)(b, first / GQ_SUB);
        for (unsigned int k = 0; k < 8u; ++k) {
            wdst[k] = GQ_FUNC(_apply)(scale, sub_min, GQ_FUNC(_quant)(b, first + k));
        }
    } else {
        for (unsigned int k = 0; k < 8u; ++k) {
            wdst[k] = 0.0f;
        }
    }
    const int tok = tok0 + (int)r;
    if (tok < n_tok) {
        GQ_GLOBAL const float* src = x + (size_t)tok * (size_t)n_in + col;
        for (unsigned int k = 0; k < 8u; ++k) {
            xdst[k] = src[k];
        }
    } else {
        for (unsigned int k = 0; k < 8u; ++k) {
            xdst[k] = 0.0f;
        }
    }
}
