"""A decoded token's RoPE and its K/V rows' F16 rounding as one GPU kernel (``gpu_kernels/kernel_decode_rope.inc``).

In a compiled decode step the query's RoPE, the key's RoPE and the key's and value's F16 copies for the cache are
four element-wise kernels a layer on MLX's GPU backends (MLX fuses each chain but not across the reshapes and
transposes between them). This kernel is one: q rotated (and times the query scale, gemma3's), k rotated and both k
and v rounded to F16 (the dialects of :mod:`~inference_engine.backends.mlx.block_kernels`; ``gq_f16_from_float``
rounds to nearest even by integer code, as MLX's ``astype``). Its outputs are what the cache write and the decode
attention kernel (:mod:`~inference_engine.backends.mlx.attention_kernel`) take, so the MLX backend uses it only
beside that kernel: :meth:`~inference_engine.backends.mlx_backend.MLXBackend.decode_attention`, where
``rope_kernel`` is on.

Off by default (never run on a GPU; ``decode_profile --mlx-rope-kernel`` and ``.device/run_checks.sh``'s ``speed``
A/B it). Tested on every machine compiled for the host (every element against NumPy's float32 rotation and F16
rounding) and through NVRTC where it is installed; the step's wiring with stand-ins on MLX's CPU build.
"""

from __future__ import annotations

import mlx.core as mx

from inference_engine.backends.mlx.block_kernels import Dialect, constant, own_kernel

HEADERS = ("decode_rope.h",)
KIND = "decode_rope"  # kernel_decode_rope.inc
THREADS = constant("GQ_ROPE_THREADS", HEADERS[0])
INPUTS = ("q", "k", "v", "rope_cos", "rope_sin", "pos", "q_scale")
OUTPUTS = ("q_out", "k_bits", "v_bits")


def supports(rope: dict | None, q_shape: tuple) -> bool:
    """Whether the kernel rotates this layer's heads: one token, no RoPE (a NoPE layer) or an even number of rotated
    dimensions within the head."""
    n_tok, _, d = q_shape
    return n_tok == 1 and (rope is None or (rope["n_dims"] % 2 == 0 and 0 < rope["n_dims"] <= d))


def rope_f16(dialect: Dialect, q: mx.array, k: mx.array, v: mx.array, tables: tuple[mx.array, mx.array] | None,
             pos: mx.array, rope: dict | None, q_scale: float | None) -> tuple[mx.array, mx.array, mx.array]:
    """``q (1, n_head, d)``, ``k (1, n_head_kv, d)``, ``v (1, n_head_kv, d_v)`` float32 at position ``pos`` (``(1,)``
    int32 on the device): q and k rotated as :meth:`~inference_engine.backends.mlx_backend.MLXBackend.rope` with
    ``rope`` (its keyword arguments; None: no RoPE) and ``tables`` (cos and sin of positions ``0 ..``, ``(rows,
    n_dims/2)``), q times ``q_scale`` where given; returned as q float32 and k, v float16, same shapes."""
    _, n_head, d = q.shape
    n_kv, dv = k.shape[1], v.shape[2]
    n_dims = 0 if rope is None else int(rope["n_dims"])
    cos, sin = tables if rope is not None else (mx.zeros((1, 1)), mx.zeros((1, 1)))
    n = n_head * d + n_kv * d + n_kv * dv
    q_out, k_bits, v_bits = own_kernel(dialect, "decode_rope_f16", INPUTS, OUTPUTS, HEADERS, KIND)(
        inputs=[q.reshape(n_head, d), k.reshape(n_kv, d), v.reshape(n_kv, dv), cos, sin, pos.astype(mx.int32),
                mx.array([1.0 if q_scale is None else q_scale], dtype=mx.float32)],
        template=[("D", d), ("DV", dv), ("N_DIMS", n_dims), ("NEOX", int(bool(rope and rope.get("neox")))),
                  ("SCALE_Q", int(q_scale is not None))],
        grid=(THREADS * -(-n // THREADS), 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(n_head, d), (n_kv, d), (n_kv, dv)],
        output_dtypes=[mx.float32, mx.uint16, mx.uint16],
        stream=mx.gpu,
    )
    return (q_out.reshape(1, n_head, d), mx.view(k_bits, mx.float16).reshape(1, n_kv, d),
            mx.view(v_bits, mx.float16).reshape(1, n_kv, dv))
