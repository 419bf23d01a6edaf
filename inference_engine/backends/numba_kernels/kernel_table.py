"""The kernel table: tensor type -> its compiled kernels (:class:`~.kernel_entry.Kernels`), the entries
:mod:`.make_entries` generated from :data:`.kernel_specs.SPECS` into :mod:`.entries`."""

from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels.entries import ENTRIES
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.registries import Registry

# tensor type -> its kernels (a type missing here is refused at load time, naming the ones that are present)
KERNELS: Registry[Kernels] = Registry(
    "tensor type",
    dict(ENTRIES),
    base=Kernels,
    normalize=lambda qtype: T(int(qtype)),
    unknown="no numba kernel for",
    listing="supported",
    quote=False,
)
