"""A residual add and the RMSNorm after it as one GPU kernel (``gpu_kernels/kernel_add_rms_norm.inc``).

A pre-norm layer adds its attention's output to the residual stream (``ffn_inp``) and norms the sum for the
feed-forward (``ffn_norm``), then adds the feed-forward's output and the next layer norms that (``attn_norm``): each
an add and ``mx.fast.rms_norm`` on MLX's GPU backends, two kernels (MLX's compile fuses element-wise chains, not an
element-wise op into a ``mx.fast`` primitive). This kernel is one, for every row: the sum (what the residual stream
goes on with) and its norm times the weight, in the dialects of :mod:`~inference_engine.backends.mlx.block_kernels`
(one threadgroup a row; the squares summed per SIMD group, then across them in order).

The MLX backend uses it for :meth:`~inference_engine.backends.base.Backend.add_rms_norm` where ``norm_kernel`` is on
and it has GPU kernels (and the decoder then chains its layers' norms: ``fuses_add_rms_norm``); off by default (never
run on a GPU: ``decode_profile --mlx-norm-kernel`` and ``.device/run_checks.sh``'s ``speed`` A/B it). Tested on every
machine compiled for the host against float64 references, through NVRTC where it is installed, and its wiring with a
stand-in on MLX's CPU build.
"""

from __future__ import annotations

import mlx.core as mx

from inference_engine.backends.mlx.block_kernels import Dialect, constant, own_kernel

HEADERS = ("add_rms_norm.h",)
KIND = "add_rms_norm"  # kernel_add_rms_norm.inc
THREADS = constant("GQ_NORM_THREADS", HEADERS[0])
INPUTS = ("a", "b", "w", "eps")
OUTPUTS = ("residual", "normed")  # the sum, what the residual stream goes on with


def supports(a: mx.array, b: mx.array, weight: mx.array | None) -> bool:
    """Whether the kernel computes this add and norm: two float32 arrays of rows of one shape and a weight as long
    as a row (a norm without a weight, or a broadcast add, runs as MLX's ops)."""
    return (weight is not None and a.ndim == 2 and a.shape == b.shape and weight.shape == (a.shape[1],)
            and a.dtype == b.dtype == weight.dtype == mx.float32)


def add_rms_norm(dialect: Dialect, a: mx.array, b: mx.array, weight: mx.array,
                 eps: float) -> tuple[mx.array, mx.array]:
    """``a + b`` and its RMSNorm times ``weight`` (``(rows, n)``, ``(rows, n)``, ``(n,)``, float32): the sum and the
    normed sum, as :meth:`~inference_engine.backends.mlx_backend.MLXBackend.add` then ``rms_norm`` compute them
    (float32; the squares summed in another order)."""
    rows, n = a.shape
    total, normed = own_kernel(dialect, "add_rms_norm", INPUTS, OUTPUTS, HEADERS, KIND)(
        inputs=[a, b, weight, mx.array([eps], dtype=mx.float32)],
        grid=(THREADS * rows, 1, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(rows, n), (rows, n)],
        output_dtypes=[mx.float32, mx.float32],
        stream=mx.gpu,
    )
    return total, normed
