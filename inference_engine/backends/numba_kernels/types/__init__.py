"""The Numba kernels sorted by tensor type: one module per type holds all of that type's code (its layout in the
docstring, the float mat-vec and dequantization, and where ggml numerics have them the integer-dot row / pair
arithmetic, the one-token mat-vec and the register-tiled kernel) and ends with its entry in the kernel table.

The kernels of a type ``<t>``: ``matvec_float_<t>(w, xv, xs, out)``, the float mat-vec (the activation in float32,
``xs`` its block sums), and ``dequant_<t>(w, row0, out)``, ggml's dequantization of rows; where ggml numerics
multiply in integers (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) also ``matvec_int_<t>(w, yq, yd, ya, out)``,
the integer-dot mat-vec (the activation quantized once per token; libggml's x86 ``vec_dot`` bit for bit),
``token_<t>(w, x, out)`` (quantize and multiply one float32 token in one call) and ``tiled_<t>`` (the register-tiled
kernel for several tokens, the mat-vec's outputs).

Helpers shared by several types live beside this package: :mod:`..float_blocks` (the float path's block
unpacking), :mod:`..intdot` (the integer-dot path's), :mod:`..inttiles` (the register tiles'), and :mod:`..isa`
(the vector vocabulary).
"""

from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.types import (
    bf16,
    f16,
    f32,
    q2_k,
    q3_k,
    q4_0,
    q4_1,
    q4_k,
    q5_0,
    q5_1,
    q5_k,
    q6_k,
    q8_0,
)
from inference_engine.registries import Registry

TYPE_MODULES = (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k)

# tensor type -> its kernels, each type's own entry (a type missing here is refused at load time, naming the ones
# that are present)
KERNELS: Registry[Kernels] = Registry(
    "tensor type",
    {module.QTYPE: module.KERNELS for module in TYPE_MODULES},
    base=Kernels,
    normalize=lambda qtype: T(int(qtype)),
    unknown="no numba kernel for",
    listing="supported",
    quote=False,
)
