// W as float32 from a Q2_K / Q3_K / Q6_K weight's GGUF blocks: the exact values of ggml's dequantize_row_<type>.
//
// Body of an mx.fast.metal_kernel. Input: w (uint8, n_out x row_bytes). Output: y (float32, N_OUT x N_IN).
// Template constants: N_IN, N_OUT; the header names the type (KQ_VALUE, KQ_BYTES). Grid: (N_OUT * N_IN / 8, 1, 1):
// thread g writes the 8 values [8c, 8c + 8) of row g / (N_IN / 8), c = g % (N_IN / 8).
const uint g = thread_position_in_grid.x;
const uint chunks = (uint)N_IN / 8;
if (g >= (uint)N_OUT * chunks) {
    return;
}
const uint row = g / chunks;
const uint c = g % chunks;
const uint blk = c / 32;
const uint first = 8 * (c % 32);
device const uint8_t* b = w + ((ulong)row * (N_IN / KQ_QK) + blk) * KQ_BYTES;
device float* out = y + (ulong)row * N_IN + 8 * c;
for (uint k = 0; k < 8; ++k) {
    out[k] = KQ_VALUE(b, first + k);
}
