"""What the dispatcher needs to know about one tensor type (:class:`Kernels`), and how a type's kernels are described
(:class:`KernelSpec`) for the generated entry points (:mod:`.entries`, made by :mod:`.make_entries`).

``types/<type>.py`` holds a type's arithmetic; its :class:`KernelSpec` in the table :data:`.kernel_specs.SPECS` says,
for each kernel, the shared loop it is made of and the type's functions (and constants) handed to that loop.
:mod:`.entries` turns every spec into compiled, cached functions (``matvec_float_<type>``, ``dequant_<type>``,
``matvec_int_<type>``, ``token_<type>``, ``tiled_<type>``, ``ktiled_<type>``) and the kernel table's :class:`Kernels` entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gguf import GGMLQuantizationType as T


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
    # llama.cpp's tiled K-quant mat-mul (ktiles: AVX-512 VNNI, 8 tokens or more; same arguments as matvec_int)
    matmul_ktiled: Callable | None = None


# Placeholders in a :class:`Call`'s arguments: the type's generated layout, one-row-pair or tile function (see
# KernelSpec).
LAYOUT = "layout"
PAIR = "pair"
TILE = "tile"
LANES = "lanes"
# ... and one for a number: the spec's block bytes (``layout[0]``), written as a literal.
BLOCK_BYTES = "block_bytes"


@dataclass(frozen=True)
class Call:
    """``fn(*args, <the kernel's own arguments>)``: a loop (shared, or the type's own) and what the type hands it:
    its functions, integer constants, :data:`BLOCK_BYTES` (its layout's block bytes), or :data:`LAYOUT` /
    :data:`PAIR` / :data:`TILE` / :data:`LANES` (the type's generated helper)."""

    fn: Callable
    args: tuple[Any, ...] = ()

    def __init__(self, fn: Callable, *args: Any):
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)


@dataclass(frozen=True)
class KernelSpec:
    """A tensor type's kernels, as :mod:`.make_entries` writes them into :mod:`.entries`.

    ``layout`` is ``(block bytes, constant-term factor)`` (F32 / F16 / BF16: bytes a value, 0), generated as the
    inlined ``layout_<type>()`` the shared loops call inside their parallel loop, so that both stay compile-time
    constants there (passed as arguments they became the loop's runtime parameters). ``pair`` (inlined, ``(w0, w1, p0, p1, yq, yd, ya) -> (out0, out1)``) and ``tile`` (compiled on its own, as the
    parfor pass's array analysis rejects its tuple states inlined: ``(w0, w1, yq, yd, ya, t0, t1, t2, t3) -> 8
    values``) are helpers that ``matvec_int`` / ``tiled`` name as :data:`PAIR` / :data:`TILE`.
    """

    qtype: T
    vec_dot_type: str  # as Kernels
    sub: int
    layout: tuple[int, float]
    matvec_float: Call  # -> matvec_float_<type>(w, xv, xs, out), parallel, fastmath
    dequant: Call  # -> dequant_<type>(w, row0, out), parallel
    int_activation: str = ""  # the activations.row_<int_activation> quantizer of token_<type>
    matvec_int: Call | None = None  # -> matvec_int_<type>(w, yq, yd, ya, out), parallel; token_<type>(w, x, out)
    tiled: Call | None = None  # -> tiled_<type>(w, yq, yd, ya, out), parallel
    ktiled: Call | None = None  # -> ktiled_<type>(w, yq, yd, ya, out), parallel (ktiles: llama.cpp's tiled mat-mul)
    pair: Call | None = None
    tile: Call | None = None
    lanes: Call | None = None  # -> lanes_<type>(codes, dd, mm, yg, og, dg, sg): ktiles.ktiled_lanes' 2-row pass
