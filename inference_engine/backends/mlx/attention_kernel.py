"""Decode attention as one GPU kernel over the F16 K/V cache (``gpu_kernels/kernel_decode_attention.inc``).

A compiled decode step (:mod:`~inference_engine.backends.mlx.steps`) reads a block of cache slots larger than the
position, so it hands MLX's attention a mask, and MLX's CUDA build answers a masked single-query attention with its
generic ops (the F16 blocks copied to float32, two matmuls, the mask, the softmax). This kernel instead reads the F16
cache where it lies, up to the position (and within a sliding window), in float32: one kernel a layer. Same
dialects as the GGUF block kernels (:mod:`~inference_engine.backends.mlx.block_kernels`: Metal through
``mx.fast.metal_kernel``, CUDA through ``mx.fast.cuda_kernel``).

Off by default (:attr:`~inference_engine.backends.mlx_backend.MLXBackend.attention_kernel`): its code runs here
only compiled for the host (tests/inference_engine/backends/mlx/test_mlx_attention_kernel.py, every thread of the
grid against a float64 softmax) and through NVRTC where NVRTC is installed; it has not yet run on a GPU. The
GPU-marked tests and ``decode_profile --mlx-attention-kernel`` are what a GPU session runs to decide.
"""

from __future__ import annotations

import re
from functools import cache

import mlx.core as mx

from inference_engine.backends.mlx.block_kernels import Dialect, read

THREADS = int(re.search(r"^#define GQ_ATTN_THREADS (\d+)", read("decode_attention.h"), re.MULTILINE).group(1))
MAX_DIM = int(re.search(r"^#define GQ_ATTN_MAX_DIM (\d+)", read("decode_attention.h"), re.MULTILINE).group(1))


def supports(q_shape: tuple, k_buffer: mx.array, v_buffer: mx.array) -> bool:
    """Whether the kernel computes this attention: one query token, F16 K and V of one head size (a multiple of 32,
    at most :data:`MAX_DIM`), query heads a whole multiple of the K/V heads."""
    n_tok, n_head, d = q_shape
    n_kv = k_buffer.shape[0]
    return (n_tok == 1 and k_buffer.dtype == v_buffer.dtype == mx.float16 and k_buffer.shape == v_buffer.shape
            and k_buffer.shape[2] == d and d % 32 == 0 and d <= MAX_DIM and n_head % n_kv == 0)


def header(dialect: Dialect) -> str:
    return f"{read(dialect.header_file)}\n{read('gguf_blocks.h')}\n{read('decode_attention.h')}\n"


def source(dialect: Dialect) -> str:
    return f"{read(dialect.ids_file)}\n{read('kernel_decode_attention.inc')}"


@cache
def _kernel(dialect: Dialect):
    return dialect.factory()(
        name="decode_attention_f16",
        input_names=["q", "k", "v", "pos", "scale"],
        output_names=["o"],
        source=source(dialect),
        header=header(dialect),
        ensure_row_contiguous=True,
    )


def decode_attention(dialect: Dialect, q: mx.array, k_buffer: mx.array, v_buffer: mx.array, pos: mx.array,
                     scale: float, sliding_window: int = 0) -> mx.array:
    """``q (1, n_head, d)`` float32 against the cache buffers ``(n_head_kv, n_ctx, d)`` float16 (this step's row
    already written) at position ``pos`` (``(1,)`` int32 on the device): ``(1, n_head * d)`` float32, as
    :meth:`~inference_engine.backends.mlx_backend.MLXBackend.masked_attention` over the visible slots."""
    _, n_head, d = q.shape
    return _kernel(dialect)(
        inputs=[q.reshape(n_head, d), mx.view(k_buffer, mx.uint16), mx.view(v_buffer, mx.uint16),
                pos.astype(mx.int32), mx.array([scale], dtype=mx.float32)],
        template=[("D", d), ("GROUP", n_head // k_buffer.shape[0]), ("WINDOW", int(sliding_window))],
        grid=(THREADS * n_head, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_head, d)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )[0].reshape(1, n_head * d)
