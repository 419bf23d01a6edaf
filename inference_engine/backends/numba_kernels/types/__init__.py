"""The Numba kernels sorted by tensor type: one module per type holds all of that type's code (its layout in the
docstring, the float mat-vec and dequantization, and where ggml numerics have them the integer-dot row / pair
arithmetic, the one-token mat-vec and the register-tiled kernel) and ends with its entry in the kernel table.

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
    "tensor type", {module.QTYPE: module.KERNELS for module in TYPE_MODULES}, base=Kernels,
    normalize=lambda qtype: T(int(qtype)), unknown="no numba kernel for", listing="supported", quote=False)
