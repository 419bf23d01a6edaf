"""Custom Metal kernels (``mx.fast.metal_kernel``) for the GGUF types MLX's affine format cannot hold exactly.

Q2_K, Q3_K and Q6_K scale every 16 values; MLX's affine groups are 32, 64 or 128 values. On Apple silicon these
weights stay in their GGUF blocks on the GPU and two kernels read them directly (sources in
``inference_engine/backends/metal_kernels/``):

* ``kquant16_matvec``: ``x @ W.T`` for a few tokens (decode): one SIMD group per output row and token.
* ``kquant16_dequantize``: ``W`` as float32, exactly ggml's values (prefill multiplies with it; tests compare it
  with gguf-py bit for bit).

Only built where ``mx.metal.is_available()``; elsewhere the backend uses dequantized float32 weights.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import mlx.core as mx
from gguf import GGMLQuantizationType as T

KERNEL_DIR = Path(__file__).resolve().parent.parent / "metal_kernels"
ROWS_PER_GROUP = 4  # SIMD groups (output rows) per threadgroup of the matvec kernel: 128 threads
MATVEC_MAX_TOKENS = 8  # above this many tokens the weight is dequantized once and multiplied as float32

# type -> name prefix of its functions in kquant16_decode.metal
KERNEL_TYPES: dict[T, str] = {T.Q2_K: "q2_k", T.Q3_K: "q3_k", T.Q6_K: "q6_k"}


def metal_available() -> bool:
    metal = getattr(mx, "metal", None)  # absent from some non-Apple builds
    return bool(metal is not None and metal.is_available())


def kernel_source(name: str) -> str:
    return (KERNEL_DIR / f"{name}.metal").read_text()


def kernel_header(qtype: T) -> str:
    """The decode helpers plus the #defines that pick ``qtype``'s functions."""
    prefix = KERNEL_TYPES[qtype]
    return (
        kernel_source("kquant16_decode")
        + f"\n#define KQ_DOT8 {prefix}_dot8\n#define KQ_VALUE {prefix}_value\n#define KQ_BYTES {prefix.upper()}_BYTES\n"
    )


@cache
def _kernel(kind: str, qtype: T):
    outputs = ["y"]
    inputs = ["w", "x"] if kind == "matvec" else ["w"]
    return mx.fast.metal_kernel(
        name=f"gguf_{KERNEL_TYPES[qtype]}_{kind}",
        input_names=inputs,
        output_names=outputs,
        source=kernel_source(f"kquant16_{kind}"),
        header=kernel_header(qtype),
        ensure_row_contiguous=True,
    )


def matvec(qtype: T, w: mx.array, x: mx.array, n_out: int, n_in: int) -> mx.array:
    """``x (T, n_in) float32 @ W.T`` with ``w`` the GGUF rows (uint8 ``(n_out, row_bytes)``): ``(T, n_out)``."""
    n_tokens = x.shape[0]
    groups = -(-n_out // ROWS_PER_GROUP)
    return _kernel("matvec", qtype)(
        inputs=[w, x],
        template=[("N_IN", n_in), ("N_OUT", n_out)],
        grid=(32 * ROWS_PER_GROUP * groups, n_tokens, 1),
        threadgroup=(32 * ROWS_PER_GROUP, 1, 1),
        output_shapes=[(n_tokens, n_out)],
        output_dtypes=[mx.float32],
    )[0]


def dequantize(qtype: T, w: mx.array, n_out: int, n_in: int) -> mx.array:
    """The GGUF rows ``w`` as float32 ``(n_out, n_in)``, value for value as ggml's dequantize_row."""
    n_threads = n_out * n_in // 8
    return _kernel("dequantize", qtype)(
        inputs=[w],
        template=[("N_IN", n_in), ("N_OUT", n_out)],
        grid=(n_threads, 1, 1),
        threadgroup=(min(256, n_threads), 1, 1),
        output_shapes=[(n_out, n_in)],
        output_dtypes=[mx.float32],
    )[0]
