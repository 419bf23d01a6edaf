"""Decode attention as GPU kernels over the F16 K/V cache (``gpu_kernels/kernel_decode_attention*.inc``).

A compiled decode step (:mod:`~inference_engine.backends.mlx.steps`) reads a block of cache slots larger than the
position, so it hands MLX's attention a mask, and MLX's CUDA build answers a masked single-query attention with its
generic ops (the F16 blocks copied to float32, two matmuls, the mask, the softmax). These kernels instead read the F16
cache where it lies, up to the position (and within a sliding window), in float32: two kernels a layer, the first
over chunks of ``CHUNK`` slots in parallel, the second combining the chunks (``decode_attention.h``). Same dialects
as the GGUF block kernels (:mod:`~inference_engine.backends.mlx.block_kernels`: Metal through
``mx.fast.metal_kernel``, CUDA through ``mx.fast.cuda_kernel``).

On by default on CUDA (:data:`~inference_engine.backends.mlx_backend.ATTENTION_KERNEL_DEFAULTS`): on an H200
(2026-11-27) a compiled decode step of a Qwen2.5-1.5B-shaped model ran 188 tokens a second with it against 167 with
MLX's ops at depth 0 and 165 against 127 at depth 512 (launched steps; forced ones faster in four of six such
A/Bs, slower in one: docs/PERFORMANCE.md), and its GPU tests passed there. Its first version (a
threadgroup per head walking every slot) had taken 16.5 ms of device time a token at depth 512 against 7.4 for
MLX's ops. Off on Metal, where it has never run. Tested on every machine compiled for the host
(tests/inference_engine/backends/mlx/test_mlx_attention_kernel.py, every thread of both grids against a float64
softmax) and through NVRTC where it is installed.
"""

from __future__ import annotations

import mlx.core as mx

from inference_engine.backends.mlx.block_kernels import Dialect, constant, own_kernel

HEADERS = ("gguf_blocks.h", "decode_attention.h")
THREADS, CHUNK, MAX_DIM = (constant(f"GQ_ATTN_{n}", HEADERS[1]) for n in ("THREADS", "CHUNK", "MAX_DIM"))
PASSES = ("decode_attention", "decode_attention_combine")  # kernel_<pass>.inc


def supports(q_shape: tuple, k_buffer: mx.array, v_buffer: mx.array) -> bool:
    """Whether the kernel computes this attention: one query token, F16 K and V of one head size (a multiple of 32,
    at most :data:`MAX_DIM`), query heads a whole multiple of the K/V heads."""
    n_tok, n_head, d = q_shape
    n_kv = k_buffer.shape[0]
    return (n_tok == 1 and k_buffer.dtype == v_buffer.dtype == mx.float16 and k_buffer.shape == v_buffer.shape
            and k_buffer.shape[2] == d and d % 32 == 0 and d <= MAX_DIM and n_head % n_kv == 0)


def _kernel(dialect: Dialect, kernel_pass: str):
    first = kernel_pass == PASSES[0]
    return own_kernel(dialect, f"{kernel_pass}_f16",
                      ("q", "k", "v", "pos", "scale") if first else ("part_o", "part_m", "part_l"),
                      ("part_o", "part_m", "part_l") if first else ("o",), HEADERS, kernel_pass)


def decode_attention(dialect: Dialect, q: mx.array, k_buffer: mx.array, v_buffer: mx.array, pos: mx.array,
                     scale: float, sliding_window: int = 0, n_keys: int | None = None) -> mx.array:
    """``q (1, n_head, d)`` float32 against the cache buffers ``(n_head_kv, n_ctx, d)`` float16 (this step's row
    already written) at position ``pos`` (``(1,)`` int32 on the device, below ``n_keys``: the step's block of key
    slots, default all of them): ``(1, n_head * d)`` float32, as
    :meth:`~inference_engine.backends.mlx_backend.MLXBackend.masked_attention` over the visible slots."""
    _, n_head, d = q.shape
    n_chunks = -(-(k_buffer.shape[1] if n_keys is None else n_keys) // CHUNK)
    part_o, part_m, part_l = _kernel(dialect, PASSES[0])(
        inputs=[q.reshape(n_head, d), mx.view(k_buffer, mx.uint16), mx.view(v_buffer, mx.uint16),
                pos.astype(mx.int32), mx.array([scale], dtype=mx.float32)],
        template=[("D", d), ("GROUP", n_head // k_buffer.shape[0]), ("WINDOW", int(sliding_window)),
                  ("N_CHUNKS", n_chunks)],
        grid=(THREADS * n_chunks, n_head, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_head * n_chunks, d), (n_head * n_chunks,), (n_head * n_chunks,)],
        output_dtypes=[mx.float32] * 3,
        stream=mx.gpu,
    )
    return _kernel(dialect, PASSES[1])(
        inputs=[part_o, part_m, part_l],
        template=[("D", d), ("N_CHUNKS", n_chunks)],
        grid=(THREADS * n_head, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_head, d)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )[0].reshape(1, n_head * d)
