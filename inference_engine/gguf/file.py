"""Open a GGUF file: metadata, tensors and checks, through gguf-py's memory-mapped ``GGUFReader``.

Nothing here copies weights: each :class:`TensorInfo` holds a view into the memory map. A pure reader: any
architecture and any tensor type opens (``inspect`` shows them); what we can *run* is checked where a model is built
(:func:`inference_engine.models.check_runnable`). Every problem with the file itself (missing path, directory, empty
or non-GGUF file, truncated tensor data) raises :class:`GGUFParityError` with one line naming it.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType
from gguf.constants import GGUFValueType
from gguf.gguf_reader import ReaderField

from inference_engine.errors import GGUFParityError, one_line
from inference_engine.gguf import validate
from inference_engine.store.digests import file_sha256

GGUF_MAGIC = b"GGUF"

# The tensor types the engine computes with; everything else is refused at open time.
SUPPORTED_TENSOR_TYPES: tuple[GGMLQuantizationType, ...] = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.BF16,
    GGMLQuantizationType.Q4_0,
    GGMLQuantizationType.Q4_1,
    GGMLQuantizationType.Q5_0,
    GGMLQuantizationType.Q5_1,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q2_K,
    GGMLQuantizationType.Q3_K,
    GGMLQuantizationType.Q4_K,
    GGMLQuantizationType.Q5_K,
    GGMLQuantizationType.Q6_K,
    GGMLQuantizationType.IQ4_NL,
    GGMLQuantizationType.IQ4_XS,
)

# general.architecture values we run, and the aliases llama.cpp treats as one of them.
SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "gemma2", "qwen2moe",
                                            "qwen3moe", "smollm3")
ARCHITECTURE_ALIASES: dict[str, str] = {"mistral": "llama"}
# A file without general.architecture (or with an empty one) names no model to build: every reader refuses it.
MISSING_ARCHITECTURE = "missing required metadata key general.architecture"


def supported_type_names() -> str:
    return ", ".join(t.name for t in SUPPORTED_TENSOR_TYPES)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file.

    ``shape`` is in NumPy order (outermost first): a weight matrix with ggml ``ne = [n_in, n_out]`` has
    ``shape == (n_out, n_in)``. ``raw`` is the memory-mapped bytes, ``(rows, bytes_per_row)`` uint8 for quantized
    types and the typed array for F32/F16 (gguf-py's view; BF16 comes as raw uint8 rows).
    """

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    n_bytes: int
    raw: np.ndarray

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def type_name(self) -> str:
        return self.qtype.name


class FastGGUFReader(GGUFReader):
    """gguf-py's reader with metadata arrays parsed in one pass instead of one NumPy call per element.

    Stock ``GGUFReader`` builds a memory-mapped view per array element: Gemma 3's 262,144-token vocabulary (tokens,
    scores, types) took 8-25 s to open here, which would dominate cold start. Scalar arrays become one typed view;
    string arrays are walked with ``struct`` over a plain ndarray view and kept as :class:`StringArrayParts` (one
    offset per string, each string's view made when it is read): a view object per string held SmolLM2's 98,000
    vocabulary strings in 15 MB of resident memory and Gemma 3's 262,144 in 45 MB, for arrays that only the
    tokenizer's first build reads. The fields' ``contents()`` are identical to the stock reader's (tested); tensors
    are parsed by gguf-py unchanged.
    """

    _U64 = struct.Struct("<Q")

    def __init__(self, path, mode="r", problems: list[str] | None = None):
        # None: the first structural problem of the tensor table raises; a list: problems are collected there and
        # only the valid tensors are built (``inspect`` shows what it can of a broken file).
        self.problems = problems
        identity = os.stat(path)  # before mapping: a file replaced in between then reads as changed, never as same
        super().__init__(path, mode)
        from inference_engine.platform.mapped_pages import remember_file_identity  # here: backends import us

        remember_file_identity(self.data, identity)  # lets the numba backend read weights by name, safely

    def _build_tensors(self, start_offs, fields):
        fields = validate.checked_tensor_fields(self, start_offs, fields, self.problems)
        super()._build_tensors(start_offs, fields)

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs
        raw_itype = self._get(offs, np.uint32)
        alen = self._get(offs + 4, np.uint64)
        offs += 12
        item_type, count = GGUFValueType(int(raw_itype[0])), int(alen[0])
        types = [GGUFValueType.ARRAY, item_type]
        nptype = self.gguf_scalar_to_np.get(item_type)
        if nptype is not None:
            values = self._get(offs, nptype, count)
            if values.shape[0] != count:  # gguf-py's _get returns what is left when the file ends early
                raise ValueError(f"array of {count} values at offset {orig_offs} runs past the end of the file")
            return 12 + int(values.nbytes), [raw_itype, alen, values], [2], types
        if item_type != GGUFValueType.STRING:  # nested arrays: rare, leave them to gguf-py
            return super()._get_field_parts(orig_offs, raw_type)
        buf = self.data.view(np.ndarray)
        if count > (len(buf) - offs) // 8:  # each string takes at least its 8-byte length
            raise ValueError(f"array of {count} strings at offset {orig_offs} cannot fit in the file")
        starts = self._string_starts(buf, offs, count)
        offs = starts[count]
        parts = StringArrayParts([raw_itype, alen], buf, starts)
        return offs - orig_offs, parts, range(2, count + 2), types

    def _string_starts(self, buf: np.ndarray, offs: int, count: int) -> array:
        """The file offset of each of ``count`` strings from ``offs`` on, then the offset just past the last one.

        A walk without checks first (over a memoryview: twice as fast as checking each length, 20 ms for Qwen2.5's
        151,936 tokens); only when it ends past the file does the checked walk run, to name the string at fault."""
        unpack, size = self._U64.unpack_from, len(buf)
        view = memoryview(buf)
        starts = [0] * (count + 1)
        try:
            for i in range(count):
                starts[i] = offs
                offs += 8 + unpack(view, offs)[0]
        except struct.error:
            offs = size + 1
        if offs <= size:
            starts[count] = offs
            return array("q", starts)
        offs = starts[0]
        for _ in range(count):
            (length,) = unpack(buf, offs)
            if length > size - offs - 8:
                raise ValueError(f"string of {length} bytes at offset {offs} runs past the end of the file")
            offs += 8 + length
        raise ValueError(f"array of {count} strings at offset {starts[0]} runs past the end of the file")

    def _build_fields(self, offs: int, count: int) -> int:
        """gguf-py's ``_build_fields``, keeping a string array's parts lazy (gguf-py concatenates them into a list)."""
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            head: list[np.ndarray] = [kv_klen, kv_kdata, raw_kv_type]
            field_size, field_parts, field_idxs, field_types = self._get_field_parts(offs, raw_kv_type[0])
            if isinstance(field_parts, StringArrayParts):
                parts: Sequence[np.ndarray] = field_parts.with_head(head)
                idxs: Sequence[int] = range(field_idxs.start + len(head), field_idxs.stop + len(head))
            else:
                parts = head + field_parts
                idxs = [idx + len(head) for idx in field_idxs]
            name = str(bytes(kv_kdata), encoding="utf-8")
            self._push_field(ReaderField(orig_offs, name, parts, idxs, field_types), skip_sum=True)
            offs += field_size
        return offs


class LazySequence(Sequence):
    """A read-only sequence whose items are made when indexed: a subclass gives ``__len__`` and ``_item(i)`` for
    ``0 <= i < len(self)``; this resolves negative indices and slices (a list) and raises IndexError naming
    ``_INDEX_NAME`` for the rest."""

    __slots__ = ()
    _INDEX_NAME = "index"

    def _item(self, i: int) -> Any:
        raise NotImplementedError

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._item(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"{self._INDEX_NAME} out of range")
        return self._item(i)


class StringArrayParts(LazySequence):
    """A string-array field's ``parts`` as gguf-py indexes them: the ``head`` arrays (key, type, length), then one
    uint8 view per string, made when indexed from ``starts`` (the file offset of each string's 8-byte length, plus
    the offset just past the last string)."""

    __slots__ = ("buf", "head", "starts")
    _INDEX_NAME = "string array part index"

    def __init__(self, head: list[np.ndarray], buf: np.ndarray, starts: array):
        self.head = head
        self.buf = buf
        self.starts = starts

    def with_head(self, head: list[np.ndarray]) -> StringArrayParts:
        return StringArrayParts(head + self.head, self.buf, self.starts)

    def __len__(self) -> int:
        return len(self.head) + len(self.starts) - 1

    def _item(self, i: int) -> np.ndarray:
        if i < len(self.head):
            return self.head[i]
        j = i - len(self.head)
        return self.buf[self.starts[j] + 8 : self.starts[j + 1]]


def _field_value(field) -> Any:
    """Decode one metadata field to plain Python (str, int, float, bool or list)."""
    try:
        return field.contents()
    except UnicodeDecodeError:  # only a file opened with strict=False gets here: validation refuses it otherwise
        return validate.lossy_contents(field)


class GGUFFile:
    """A validated, memory-mapped GGUF model file.

    ``strict=False`` (``inspect``): structural problems are listed in ``problems`` instead of raised, and only the
    tensors without one are kept, so a broken file still shows what it can.
    """

    def __init__(self, path: str | os.PathLike, strict: bool = True):
        self.path = Path(path)
        self.problems: list[str] = []
        self.unsupported: list[str] = []  # strict=False only: the problems that are our engine's limits
        self.structure_problems: list[str] = []  # strict=False only: tensor table and metadata problems
        _check_path(self.path)
        try:
            self.reader = FastGGUFReader(self.path, "r", problems=None if strict else self.problems)
        except validate.StructureError as exc:
            raise GGUFParityError(f"{self.path}: {exc}") from None
        except (ValueError, IndexError, OSError, KeyError, OverflowError, struct.error) as exc:  # truncation
            raise GGUFParityError(f"{self.path}: truncated or corrupt GGUF file ({one_line(exc, 160)})") from None
        skip = validate.VOCAB_STRING_KEYS if strict else ()  # the tokenizer checks those as it decodes them
        self.problems += validate.metadata_problems(self.reader, skip_strings=skip)
        if strict and self.problems:
            validate.raise_first(self.path, self.problems)
        if not strict:
            self._open_lenient()
            return
        self.raw_architecture = str(self.metadata_value("general.architecture", ""))
        if not self.raw_architecture:
            raise GGUFParityError(f"{self.path}: {MISSING_ARCHITECTURE}")
        # Any architecture and tensor type opens (for inspect); what we can run is checked where a model is built
        # (inference_engine.models.check_runnable).
        self.architecture = ARCHITECTURE_ALIASES.get(self.raw_architecture, self.raw_architecture)
        self.tensors: dict[str, TensorInfo] = {}
        file_size = self.path.stat().st_size
        for t in self.reader.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            if int(t.data_offset) + int(t.n_bytes) > file_size:
                raise GGUFParityError(
                    f"{self.path}: file is truncated: tensor '{t.name}' needs bytes up to "
                    f"{int(t.data_offset) + int(t.n_bytes)} but the file has {file_size}"
                )
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors[t.name] = TensorInfo(t.name, qtype, shape, int(t.n_bytes), t.data)

    def _open_lenient(self) -> None:
        """What ``__init__`` does after the structure checks, each refusal recorded in ``problems`` instead."""
        self.raw_architecture = str(self.metadata_value("general.architecture", "") or "")
        self.architecture = ARCHITECTURE_ALIASES.get(self.raw_architecture, self.raw_architecture)
        if not self.raw_architecture:  # a broken file (llama.cpp refuses it too), not an architecture we lack
            self.problems.append(MISSING_ARCHITECTURE)
        elif self.architecture not in SUPPORTED_ARCHITECTURES:
            self.unsupported.append(f"unsupported architecture '{self.raw_architecture}'; supported: "
                                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        self.tensors = {}
        for t in self.reader.tensors:
            qtype = GGMLQuantizationType(int(t.tensor_type))
            if qtype not in SUPPORTED_TENSOR_TYPES:
                self.unsupported.append(f"tensor '{t.name}' has unsupported type {qtype.name}; supported: "
                                        f"{supported_type_names()}")
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors[t.name] = TensorInfo(t.name, qtype, shape, int(t.n_bytes), t.data)
        self.structure_problems = list(self.problems)  # what every reader of the file must refuse
        if self.architecture in SUPPORTED_ARCHITECTURES:
            self.problems += validate.model_problems(self)[0]
        # ``unsupported`` stays apart: a valid file our engine cannot run is not a broken file (llama.cpp may run it)

    # --- metadata -------------------------------------------------------------------------------------------
    @cached_property
    def metadata(self) -> dict[str, Any]:
        """Every key-value pair, decoded (large arrays such as the vocabulary included)."""
        return {k: _field_value(f) for k, f in self.reader.fields.items() if not k.startswith("GGUF.")}

    def metadata_value(self, key: str, default: Any = None) -> Any:
        field = self.reader.fields.get(key)
        if field is None:
            return default
        return _field_value(field)

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        """A per-architecture key such as ``llama.block_count``, looked up under the file's own prefix."""
        return self.metadata_value(f"{self.raw_architecture}.{suffix}", default)

    def require_arch_value(self, suffix: str) -> Any:
        value = self.arch_value(suffix)
        if value is None:
            raise GGUFParityError(f"{self.path}: missing required metadata key {self.raw_architecture}.{suffix}")
        return value

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFParityError(f"{self.path}: missing tensor '{name}'") from None

    # --- identity -------------------------------------------------------------------------------------------
    @property
    def file_size(self) -> int:
        return self.path.stat().st_size

    @cached_property
    def sha256(self) -> str:
        return file_sha256(self.path)  # remembered per file version: no 1 GB re-hash

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def file_type_name(self) -> str:
        """The file's quantization as llama.cpp names it in model_type (``Q4_1``, ``Q4_K_M``)."""
        file_type = self.metadata_value("general.file_type")
        if file_type is not None:
            try:
                return LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                pass
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            if len(t.shape) >= 2:
                counts[t.type_name] = counts.get(t.type_name, 0) + t.n_bytes
        return max(counts, key=counts.get) if counts else "F32"

    def describe(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "architecture": self.architecture,
            "name": self.metadata_value("general.name", self.path.stem),
            "size_bytes": self.file_size,
            "n_params": self.n_params,
            "quant": self.file_type_name,
        }


def _check_path(path: Path) -> None:
    if not path.exists():
        raise GGUFParityError(f"{path}: no such file")
    if path.is_dir():
        raise GGUFParityError(f"{path}: is a directory, expected a .gguf file")
    size = path.stat().st_size
    if size == 0:
        raise GGUFParityError(f"{path}: file is empty, expected a .gguf file")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFParityError(f"{path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")


def open_gguf(path: str | os.PathLike, strict: bool = True) -> GGUFFile:
    return GGUFFile(path, strict)


def check_reference_file(path: str | os.PathLike) -> None:
    """What a file must pass before llama.cpp loads it: every structural, metadata and hyperparameter problem
    refused in one line; an architecture or tensor type only our engine does not run is llama.cpp's to load."""
    f = open_gguf(path, strict=False)
    if f.structure_problems:
        validate.raise_first(path, f.structure_problems)
    validate.check_model(f, reference=True)
