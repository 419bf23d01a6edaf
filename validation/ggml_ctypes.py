"""ctypes bindings of the few ggml helpers that llama-cpp-python does not bind, and a tensor reader.

llama.cpp's ``cb_eval`` callback hands us a raw ``struct ggml_tensor *``. To turn it into a NumPy array we need
its name, type, shape (``ne``) and strides (``nb``), and its bytes. The struct layout below mirrors ``ggml.h`` of
the llama.cpp vendored in llama-cpp-python 0.3.36 (checked there: ``type`` at 0, ``ne[4]`` at 16, ``nb[4]`` at 48,
``data`` at 248, ``name[64]`` at 256, 336 bytes in all); :func:`check_layout` verifies it against the library's
own accessors (``ggml_get_name``, ``ggml_nbytes``, ``ggml_tensor_overhead``) so a layout change in a new build fails
loudly instead of reading garbage.

The functions come from ``libggml-base.so.0`` in ``llama_cpp/lib/``: the very file ``libllama.so`` links to, so
the dynamic loader hands back the already-loaded copy (one set of ggml globals, not two).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from inference_engine.errors import GGUFParityError
from validation.ggml_libs import LINKED_FIRST, load_library

GGML_MAX_DIMS = 4
GGML_MAX_SRC = 10
GGML_MAX_OP_PARAMS = 64
GGML_MAX_NAME = 64
GGML_OBJECT_SIZE = 32  # sizeof(struct ggml_object) in ggml.c: offs, size, next, type, padding[4]

# enum ggml_type values (ggml.h) for the element types we can turn into float32.
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_BF16 = 30
GGML_TYPE_I32 = 26
FLOAT_TYPES: dict[int, str] = {GGML_TYPE_F32: "F32", GGML_TYPE_F16: "F16", GGML_TYPE_BF16: "BF16"}
_STORAGE_DTYPE = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_BF16: np.uint16}


class GGMLTensor(ctypes.Structure):
    """``struct ggml_tensor`` (ggml.h), 64-bit layout."""

    _fields_ = [
        ("type", ctypes.c_int32),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * GGML_MAX_DIMS),
        ("op", ctypes.c_int32),
        ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


class GGMLInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@lru_cache(maxsize=1)
def libggml_base() -> ctypes.CDLL:
    """The ``libggml-base`` that llama-cpp-python loaded, with the prototypes we use declared."""
    import llama_cpp  # noqa: F401 - loads libllama and with it this very libggml-base copy

    try:
        lib = load_library("libggml-base", LINKED_FIRST)
    except GGUFParityError as exc:
        raise OSError(str(exc)) from None
    t = ctypes.c_void_p
    _declare(lib, "ggml_get_name", [t], ctypes.c_char_p)
    _declare(lib, "ggml_nbytes", [t], ctypes.c_size_t)
    _declare(lib, "ggml_is_contiguous", [t], ctypes.c_bool)
    _declare(lib, "ggml_n_dims", [t], ctypes.c_int)
    _declare(lib, "ggml_op_desc", [t], ctypes.c_char_p)
    _declare(lib, "ggml_type_name", [ctypes.c_int], ctypes.c_char_p)
    _declare(lib, "ggml_tensor_overhead", [], ctypes.c_size_t)
    _declare(lib, "ggml_backend_tensor_get", [t, t, ctypes.c_size_t, ctypes.c_size_t], None)
    # Used to build test tensors without a model (check_layout, unit tests of the reader).
    _declare(lib, "ggml_init", [GGMLInitParams], t)
    _declare(lib, "ggml_free", [t], None)
    _declare(
        lib,
        "ggml_new_tensor_4d",
        [t, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64],
        t,
    )
    _declare(lib, "ggml_set_name", [t, ctypes.c_char_p], t)
    _declare(lib, "ggml_transpose", [t, t], t)
    _declare(lib, "ggml_permute", [t, t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int], t)
    _declare(lib, "ggml_view_2d", [t, t, ctypes.c_int64, ctypes.c_int64, ctypes.c_size_t, ctypes.c_size_t], t)
    return lib


def _declare(lib: ctypes.CDLL, name: str, argtypes: list, restype) -> None:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = restype


# --- reading one tensor ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorHeader:
    """What the graph says about one node, read from its ``struct ggml_tensor``."""

    name: str
    op: str  # ggml_op_desc: "MUL_MAT", "RMS_NORM", "VIEW", ... (unary ops by their unary name)
    type_name: str  # ggml_type_name: "f32", "f16", "q8_0", ...
    type: int
    ne: tuple[int, int, int, int]  # ggml order: ne[0] is the fastest-varying axis
    nb: tuple[int, int, int, int]  # byte strides, same order
    contiguous: bool

    @property
    def numpy_shape(self) -> tuple[int, ...]:
        """``reversed(ne)`` with leading size-1 axes dropped (the capture convention of ``protocol.py``)."""
        return drop_leading_ones(tuple(reversed(self.ne)))

    @property
    def is_float(self) -> bool:
        return self.type in FLOAT_TYPES


def drop_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    shape = tuple(shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def read_header(ptr: int) -> TensorHeader:
    lib = libggml_base()
    t = GGMLTensor.from_address(ptr)
    return TensorHeader(
        name=(lib.ggml_get_name(ptr) or b"").decode("utf-8", "replace"),
        op=(lib.ggml_op_desc(ptr) or b"").decode(),
        type_name=(lib.ggml_type_name(t.type) or b"?").decode(),
        type=int(t.type),
        ne=tuple(int(x) for x in t.ne),
        nb=tuple(int(x) for x in t.nb),
        contiguous=bool(lib.ggml_is_contiguous(ptr)),
    )


def tensor_bytes(ptr: int) -> np.ndarray:
    """The tensor's whole byte span (``ggml_nbytes``: for a strided view, first to last element inclusive).

    Through ``ggml_backend_tensor_get`` when the tensor sits in a backend buffer (the llama.cpp graph case: it also
    works for device buffers), else straight from ``data`` (tensors of a plain ggml context, as in tests).
    """
    lib = libggml_base()
    t = GGMLTensor.from_address(ptr)
    n = int(lib.ggml_nbytes(ptr))
    out = np.empty(n, dtype=np.uint8)
    if n == 0:
        return out
    if t.buffer:
        lib.ggml_backend_tensor_get(ptr, out.ctypes.data, 0, n)
    elif t.data:
        ctypes.memmove(out.ctypes.data, t.data, n)
    else:
        raise ValueError(f"tensor '{read_header(ptr).name}' has no data")
    return out


def tensor_to_numpy(ptr: int, header: TensorHeader | None = None) -> np.ndarray | None:
    """A float32 copy of an F32 / F16 / BF16 tensor in NumPy order (``reversed(ne)``, all four axes kept).

    Strides are respected, so permuted and transposed views come out right. Returns None for other types
    (integer inputs, quantized caches): those have no float32 meaning to diff.
    """
    header = header or read_header(ptr)
    if not header.is_float:
        return None
    storage = _STORAGE_DTYPE[header.type]
    raw = tensor_bytes(ptr)
    base = raw.view(storage)
    shape = tuple(reversed(header.ne))
    strides = tuple(reversed(header.nb))
    view = np.lib.stride_tricks.as_strided(base, shape=shape, strides=strides, writeable=False)
    if header.type == GGML_TYPE_BF16:
        return (view.astype(np.uint32) << 16).view(np.float32)
    return np.array(view, dtype=np.float32, order="C")


def index_tensor_to_numpy(ptr: int, header: TensorHeader | None = None) -> np.ndarray | None:
    """An I32 tensor of indices (an MoE router's chosen experts, ``ffn_moe_topk``: a strided view of its argsort)
    as float32 in NumPy order, strides respected; indices below 2**24 are exact in float32, which is what the
    capture contract (float32 arrays) carries. None for any other type."""
    header = header or read_header(ptr)
    if header.type != GGML_TYPE_I32:
        return None
    base = tensor_bytes(ptr).view(np.int32)
    view = np.lib.stride_tricks.as_strided(base, shape=tuple(reversed(header.ne)),
                                           strides=tuple(reversed(header.nb)), writeable=False)
    return np.array(view, dtype=np.float32, order="C")


# --- layout self-check -------------------------------------------------------------------------------------------
class GGMLScratch:
    """A small plain ggml context (tensor data in its own arena), for building tensors in tests."""

    def __init__(self, mem_size: int = 1 << 20, no_alloc: bool = False):
        self.lib = libggml_base()
        self.ctx = self.lib.ggml_init(GGMLInitParams(mem_size, None, no_alloc))
        if not self.ctx:
            raise MemoryError("ggml_init failed")

    def new_tensor(self, type_: int, ne: tuple[int, ...], name: str = "") -> int:
        full = tuple(ne) + (1,) * (GGML_MAX_DIMS - len(ne))
        ptr = self.lib.ggml_new_tensor_4d(self.ctx, type_, *full)
        if name:
            self.lib.ggml_set_name(ptr, name.encode())
        return ptr

    def fill(self, ptr: int, values: np.ndarray) -> None:
        """Write ``values`` (NumPy order, contiguous) into a contiguous tensor."""
        data = np.ascontiguousarray(values)
        ctypes.memmove(GGMLTensor.from_address(ptr).data, data.ctypes.data, data.nbytes)

    def close(self) -> None:
        if self.ctx:
            self.lib.ggml_free(self.ctx)
            self.ctx = None

    def __enter__(self) -> GGMLScratch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@lru_cache(maxsize=1)
def check_layout() -> None:
    """Fail loudly if :class:`GGMLTensor` does not match this build's ``struct ggml_tensor``."""
    lib = libggml_base()
    expected_size = int(lib.ggml_tensor_overhead()) - GGML_OBJECT_SIZE
    if ctypes.sizeof(GGMLTensor) != expected_size:
        raise RuntimeError(
            f"ggml_tensor layout mismatch: ctypes struct is {ctypes.sizeof(GGMLTensor)} bytes, "
            f"this libggml's is {expected_size}"
        )
    with GGMLScratch(no_alloc=True) as scratch:
        ptr = scratch.new_tensor(GGML_TYPE_F16, (3, 5, 7, 2), name="layout-check")
        t = GGMLTensor.from_address(ptr)
        ok = (
            t.type == GGML_TYPE_F16
            and tuple(t.ne) == (3, 5, 7, 2)
            and tuple(t.nb) == (2, 6, 30, 210)
            and t.name == b"layout-check"
            and lib.ggml_get_name(ptr) == b"layout-check"
            and lib.ggml_nbytes(ptr) == 2 * 3 * 5 * 7 * 2
        )
    if not ok:
        raise RuntimeError("ggml_tensor layout mismatch: fields read through ctypes disagree with libggml")
