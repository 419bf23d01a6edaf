"""What the dispatcher needs to know about one tensor type: :class:`Kernels`, one entry per type.

Each ``types/<type>.py`` ends with its entry (``KERNELS = Kernels(...)``); :data:`.types.KERNELS` assembles them into
the kernel table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Kernels:
    """Everything the dispatcher needs to know about one tensor type."""

    matvec: Callable  # (w uint8 (N, row_bytes), xv f32 (K,), xs f32 (K/sub,), out f32 (N,)) -> None
    dequant: Callable  # (w, row0, out f32 (rows, K)) -> None: ggml's dequantize_row for rows row0..
    vec_dot_type: str  # the activation type ggml quantizes to for this weight (activations.prepare)
    sub: int  # sub-block length of the constant terms (xs), 0 if none
    # ggml numerics, few tokens: the integer-dot mat-vec ((w, yq, yd, ya, out)) and the quantized activation it
    # reads (activations.quantize_int); None where only the float kernels exist.
    matvec_int: Callable | None = None
    int_activation: str = ""
    matmul_tiled: Callable | None = None  # the register-tiled T-token kernel (tiled_<type>, same arguments)
    matvec_token: Callable | None = None  # one float32 token: quantize + matvec_int in one call ((w, x, out))
