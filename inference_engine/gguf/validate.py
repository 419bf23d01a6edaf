"""One validation pass over a GGUF file before anything (our engine or llama.cpp) uses it.

Two levels, both returning every problem found as one line each (the caller raises the first as a
:class:`GGUFParityError`, or ``inspect`` lists them all):

* **structure** (:func:`tensor_table_problems`, :func:`metadata_problems`), run by every open: tensor offsets in
  Python integers (no uint64 wrap-around), every tensor inside the data section, aligned, packed in order without
  overlap as llama.cpp's ``gguf_init_from_file`` requires (so a tensor whose declared type is smaller than its data,
  an F32 tensor declared F16, leaves a gap and is caught), 1-4 dimensions each > 0, rows a whole number of blocks
  of the type; strings that decode as UTF-8 (else the key and byte offset are named), the ``general.*`` and
  ``tokenizer.*`` keys of the types they must have.
* **model** (:func:`model_problems`), run where a model is built and before llama.cpp loads the file: the
  hyperparameters llama.cpp's ``llama_model::load_hparams`` asserts on or divides by, within sane bounds, numbers
  stored as numbers, per-layer arrays with ``block_count`` entries (per-layer flags such as
  ``sliding_window_pattern``: at most that many, as llama.cpp reads them), tensor shapes matching the hyperparameters,
  and a vocabulary consistent with the embedding (token count = embedding rows, ``token_type`` / ``scores`` as
  long as the token list, special-token ids inside it).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.constants import GGUFValueType

from inference_engine.errors import GGUFParityError


class GGUFFile(Protocol):
    """What the model checks read of an open file: :class:`inference_engine.gguf.file.GGUFFile` (the checks never
    open a file; the reader runs them, so this module does not import it)."""

    path: Path
    reader: Any
    architecture: str
    raw_architecture: str
    tensors: dict[str, Any]

    def metadata_value(self, key: str, default: Any = None) -> Any: ...

    def arch_value(self, suffix: str, default: Any = None) -> Any: ...


# ggml's GGML_MAX_DIMS: a tensor has 1 to 4 dimensions.
MAX_DIMS = 4
# ggml's int64 element counts (gguf.cpp refuses dims whose product overflows INT64_MAX).
INT64_MAX = (1 << 63) - 1
# llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h): load_hparams asserts 0 < block_count <= 512.
MAX_LAYERS = 512
# llama.cpp's LLAMA_MAX_EXPERTS (src/llama-hparams.h).
MAX_EXPERTS = 512
# No real model has more; far above them (Llama 3.1 405B: 16384 wide, 128 heads) and far below anything that
# overflows an allocation: a bound that refuses absurd values before they size an array.
MAX_EMBEDDING = 1 << 20
MAX_HEADS = 1 << 14

INTEGER_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16, GGUFValueType.UINT32,
    GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})
NUMBER_TYPES = INTEGER_TYPES | FLOAT_TYPES

# Architectures whose every layer has attention and a feed-forward block (ours and their aliases): 0 heads or a
# 0-wide feed-forward in a layer is malformed there (llama.cpp asserts on a 0 in head_count_kv).
ATTENTION_EVERY_LAYER = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe", "smollm3")
# Our mixture-of-experts architectures: expert_count and expert_used_count are required there (llama.cpp throws
# "n_expert must be > 0 for QWEN2MOE") and refused elsewhere (a Mixtral-style llama with experts is not run).
MOE_ARCHITECTURES = ("qwen2moe", "qwen3moe")

# Keys whose value, when an array, holds one entry per layer (llama.cpp's get_key_or_arr over n_layer: exactly
# block_count entries, "key ... has wrong array length" otherwise).
PER_LAYER_KEYS = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")
# Keys that are a period or one flag per layer. llama.cpp reads the array with get_arr (llama-model-loader.cpp) into
# a table of LLAMA_MAX_LAYERS slots that starts as zeros: fewer entries than layers are legal (the layers past the
# array are 0: full attention), more than 512 are refused ("array length ... exceeds max 512"), and only bool,
# int32 and uint32 items are read. More entries than layers describe layers that do not exist: refused here.
PER_LAYER_FLAG_KEYS = ("attention.sliding_window_pattern",)
PER_LAYER_FLAG_ITEM_TYPES = frozenset({GGUFValueType.BOOL, GGUFValueType.INT32, GGUFValueType.UINT32})


# --- structure: the tensor table ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorEntry:
    """One tensor-info record as the file declares it, every number a Python int."""

    index: int
    name: str
    dims: tuple[int, ...]  # ggml order (ne[0] first)
    type_id: int
    offset: int  # relative to the data section


def tensor_entry(index: int, field: Any) -> tuple[TensorEntry | None, str | None]:
    """The entry of one gguf-py tensor-info field, or a problem when its name does not decode."""
    _name_len, name_data, _n_dims, dims, raw_dtype, offset = field.parts
    try:
        name = bytes(name_data).decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, (f"tensor #{index}: name is not valid UTF-8 (byte {exc.start} of the name at offset "
                      f"{field.offset})")
    return TensorEntry(index, name, tuple(int(d) for d in dims.tolist()), int(raw_dtype[0]), int(offset[0])), None


def tensor_nbytes(entry: TensorEntry) -> int:
    qtype = GGMLQuantizationType(entry.type_id)
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(entry.dims) // block * size


def tensor_entry_problem(entry: TensorEntry) -> str | None:
    """Dimensions and type of one tensor: 1-4 dims, each > 0, no int64 overflow, rows a whole number of blocks."""
    where = f"tensor '{entry.name}'"
    if not 1 <= len(entry.dims) <= MAX_DIMS:
        return f"{where} has {len(entry.dims)} dimensions; expected 1 to {MAX_DIMS}"
    if any(d <= 0 for d in entry.dims):
        return f"{where} has a dimension of 0 ({list(entry.dims)}); every dimension must be at least 1"
    if any(d > INT64_MAX for d in entry.dims) or math.prod(entry.dims) > INT64_MAX:
        return f"{where} has {list(entry.dims)} elements, more than int64 can count"
    try:
        qtype = GGMLQuantizationType(entry.type_id)
        block, _ = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        return f"{where} has unknown tensor type id {entry.type_id}"
    if entry.dims[0] % block:
        return (f"{where} of type {qtype.name} has rows of {entry.dims[0]} elements, not a multiple of the "
                f"type's block of {block}")
    return None


def tensor_table_problems(entries: list[TensorEntry], data_start: int, alignment: int,
                          file_size: int) -> tuple[list[str], set[int]]:
    """Every problem of the tensor table and the indices of the tensors that have one (safe to skip in a listing).

    llama.cpp (``gguf_init_from_file_impl``) requires tensor ``i`` to start exactly where tensor ``i-1`` ends,
    padded to ``alignment``; we require the same, naming the more telling cause first (misaligned, overlapping,
    past the end, or a gap: the previous tensor's data larger than its declared type and shape say).
    """
    problems: list[str] = []
    bad: set[int] = set()
    if alignment <= 0 or alignment & (alignment - 1):
        return [f"general.alignment is {alignment}; expected a power of two"], {e.index for e in entries}
    expected = 0  # where the next tensor must start, relative to the data section
    prev: TensorEntry | None = None
    for entry in entries:
        problem = tensor_entry_problem(entry)
        if problem is None:
            nbytes = tensor_nbytes(entry)
            start, end = data_start + entry.offset, data_start + entry.offset + nbytes
            where = f"tensor '{entry.name}'"
            if entry.offset % alignment:
                problem = f"{where} data offset {entry.offset} is not aligned to {alignment} bytes"
            elif end > file_size:
                problem = (f"{where} needs bytes {start}..{end} but the file has {file_size} "
                           f"(truncated file or bad offset)")
            elif entry.offset < expected and prev is not None:
                problem = f"{where} data (offset {entry.offset}) overlaps tensor '{prev.name}' (ends at {expected})"
            elif entry.offset != expected:
                before = (f"; tensor '{prev.name}' before it holds more data than its type "
                          f"{GGMLQuantizationType(prev.type_id).name} and shape {list(prev.dims)} declare"
                          if prev is not None else "")
                problem = (f"{where} data starts at offset {entry.offset}, expected {expected} (tensors are packed "
                           f"in order{before})")
            expected = max(expected, entry.offset + _pad(nbytes, alignment))
            prev = entry
        if problem is not None:
            problems.append(problem)
            bad.add(entry.index)
    trailing = file_size - data_start - expected
    if prev is not None and not problems and trailing > 0:
        # gguf writers pad the last tensor too; more bytes than that means the last tensor's data is larger than
        # its type and shape declare (an F32 tensor declared F16), or something else hides after it.
        problems.append(f"tensor '{prev.name}' is followed by {trailing} bytes that no tensor declares (the last "
                        f"tensor's data is larger than its type and shape say?)")
        bad.add(prev.index)
    return problems, bad


class StructureError(Exception):
    """A structural problem found while gguf-py parses the file (the caller adds the path)."""


def checked_tensor_fields(reader: Any, data_start: int, fields: list[Any], problems: list[str] | None) -> list[Any]:
    """The tensor-info fields gguf-py may build views from: all of them when the table is valid. Otherwise raise
    :class:`StructureError` on the first problem (``problems`` None), or append every problem to ``problems`` and
    return only the tensors without one. Runs before gguf-py adds offsets (in uint64, which wraps)."""
    entries: list[TensorEntry | None] = []
    found: list[str] = []
    for i, field in enumerate(fields):
        entry, problem = tensor_entry(i, field)
        entries.append(entry)
        if problem:
            found.append(problem)
    valid = [e for e in entries if e is not None]
    table, bad = tensor_table_problems(valid, int(data_start), int(reader.alignment), len(reader.data))
    found += table
    if found and problems is None:
        raise StructureError(found[0] + (f" (and {len(found) - 1} more problem(s))" if len(found) > 1 else ""))
    if problems is not None:
        problems += found
    return [field for field, entry in zip(fields, entries) if entry is not None and entry.index not in bad]


def lossy_contents(field: Any) -> Any:
    """A string field's value with invalid UTF-8 replaced (for listing a broken file, never for running it)."""
    if field.types and field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]


def _pad(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


# --- structure: metadata ------------------------------------------------------------------------------------------
# Keys whose GGUF type is fixed (llama.cpp reads them with that type, or its loader throws / asserts).
STRING_KEYS = ("general.architecture", "general.name", "tokenizer.ggml.model", "tokenizer.ggml.pre")
STRING_ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
INTEGER_ARRAY_KEYS = ("tokenizer.ggml.token_type",)
NUMBER_ARRAY_KEYS = ("tokenizer.ggml.scores",)


# The vocabulary's string arrays: decoded (and their UTF-8 checked, the bad item named) by the tokenizer when it is
# built, so a plain open does not decode Gemma 3's 262,144 tokens twice. inspect and the llama.cpp gate check them.
VOCAB_STRING_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")


def metadata_problems(reader: Any, skip_strings: tuple[str, ...] = ()) -> list[str]:
    """Strings that do not decode (key and byte offset named; not checked for ``skip_strings``), and fixed-type keys
    of the wrong type."""
    problems: list[str] = []
    base = _base_address(reader)
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        types = list(field.types)
        if not types:
            continue
        is_string = types[0] == GGUFValueType.STRING or types[:2] == [GGUFValueType.ARRAY, GGUFValueType.STRING]
        if is_string and key not in skip_strings:
            problem = first_bad_string(key, field, types[0] == GGUFValueType.ARRAY, base)
            if problem:
                problems.append(problem)
        expected = _expected_type(key)
        if expected is not None and not _has_type(types, expected):
            problems.append(f"metadata {key} must be {expected}, got {_type_text(types)}")
    return problems


def first_bad_string(key: str, field: Any, is_array: bool, base: int) -> str | None:
    """The first string of ``field`` that is not UTF-8, named with its index and file offset; else None.

    One decode of all strings joined by NUL (an ASCII byte ends any multi-byte sequence, so no invalid string can
    hide by completing at its neighbour's start): 0.2 s for Gemma 3's 262,144 tokens; per item only on failure."""
    parts = [field.parts[idx] for idx in field.data]
    try:
        b"\0".join([p.tobytes() for p in parts]).decode("utf-8")
        return None
    except UnicodeDecodeError:
        pass
    for i, part in enumerate(parts):
        try:
            part.tobytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            item = f" item {i}" if is_array else ""
            return (f"metadata {key}{item} is not valid UTF-8 (at byte offset {_address(part) - base + exc.start} "
                    f"of the file)")
    return None


def _expected_type(key: str) -> str | None:
    if key in STRING_KEYS:
        return "a string"
    if key in STRING_ARRAY_KEYS:
        return "an array of strings"
    if key in INTEGER_ARRAY_KEYS:
        return "an array of integers"
    if key in NUMBER_ARRAY_KEYS:
        return "an array of numbers"
    return None


def _has_type(types: list[GGUFValueType], expected: str) -> bool:
    if expected == "a string":
        return types == [GGUFValueType.STRING]
    if types[0] != GGUFValueType.ARRAY or len(types) < 2:
        return False
    item = types[1]
    return {"an array of strings": item == GGUFValueType.STRING, "an array of integers": item in INTEGER_TYPES,
            "an array of numbers": item in NUMBER_TYPES}[expected]


def _type_text(types: list[GGUFValueType]) -> str:
    if types and types[0] == GGUFValueType.ARRAY:
        return f"an array of {types[1].name.lower()}" if len(types) > 1 else "an empty array"
    return types[0].name.lower() if types else "nothing"


def string_array_problem(reader: Any, key: str) -> str | None:
    """The first item of the string array ``key`` that is not UTF-8, named with its index and offset; else None."""
    field = reader.fields.get(key)
    return None if field is None else first_bad_string(key, field, True, _base_address(reader))


def _address(part: np.ndarray) -> int:
    return int(part.__array_interface__["data"][0])


def _base_address(reader: Any) -> int:
    return _address(reader.data.view(np.ndarray))


# --- model: hyperparameters, shapes, vocabulary -------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    """What the hyperparameters say, after validation: enough to size the KV cache before loading weights."""

    n_layer: int
    n_embd: int
    n_head: list[int]
    n_head_kv: list[int]
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int

    def kv_cache_bytes(self, n_ctx: int, bytes_per_value: int) -> int:
        return sum(n_ctx * h * (self.head_dim_k + self.head_dim_v) * bytes_per_value for h in self.n_head_kv)


class _Checker:
    """Collects problems while reading one architecture's keys (prefix ``<arch>.``)."""

    def __init__(self, f: GGUFFile):
        self.f = f
        self.arch = f.raw_architecture
        self.problems: list[str] = []

    def arch_key(self, suffix: str, required: bool = False) -> tuple[str, list[GGUFValueType] | None]:
        """The key ``<arch>.<suffix>`` and its value types; None for an absent key (a problem when required)."""
        key = f"{self.arch}.{suffix}"
        field = self.f.reader.fields.get(key)
        if field is None and required:
            self.problems.append(f"missing required metadata key {key}")
        return key, None if field is None else list(field.types)

    def number(self, suffix: str, kind: str, required: bool = False, lo: float | None = None,
               hi: float | None = None) -> Any:
        """A scalar ``int`` or ``float`` key within ``[lo, hi]``; None (and a problem when required) otherwise."""
        key, types = self.arch_key(suffix, required)
        if types is None:
            return None
        allowed = INTEGER_TYPES if kind == "int" else NUMBER_TYPES
        if len(types) != 1 or types[0] not in allowed:
            self.problems.append(f"metadata {key} must be {'an integer' if kind == 'int' else 'a number'}, "
                                 f"got {_type_text(types)}")
            return None
        value = self.f.metadata_value(key)
        return self._bounded(key, value, lo, hi)

    def per_layer(self, suffix: str, n_layer: int | None, required: bool = False, lo: int = 1,
                  hi: int | None = None) -> list[int] | None:
        """An integer key given once or per layer (an array of ``block_count`` entries), as a per-layer list."""
        key, types = self.arch_key(suffix, required)
        if types is None:
            return None
        if types[0] == GGUFValueType.ARRAY:
            if len(types) < 2 or types[1] not in INTEGER_TYPES:
                self.problems.append(f"metadata {key} must be an integer or an array of integers, "
                                     f"got {_type_text(types)}")
                return None
            values = [int(v) for v in self.f.metadata_value(key)]
            if n_layer is not None and len(values) != n_layer:
                self.problems.append(f"metadata {key} has {len(values)} entries; expected one per layer "
                                     f"(block_count = {n_layer})")
                return None
        elif len(types) == 1 and types[0] in INTEGER_TYPES:
            values = [int(self.f.metadata_value(key))] * (n_layer or 1)
        else:
            self.problems.append(f"metadata {key} must be an integer or an array of integers, "
                                 f"got {_type_text(types)}")
            return None
        for i, v in enumerate(values):
            if self._bounded(key if len(set(values)) == 1 else f"{key}[{i}]", v, lo, hi) is None:
                return None
        return values

    def layer_flags(self, suffix: str, n_layer: int | None) -> None:
        """A key that is a period (an integer >= 0) or one flag per layer (``PER_LAYER_FLAG_KEYS``): an array of
        bool / int32 / uint32 with at most ``block_count`` entries (llama.cpp's ``get_arr``: the rest are 0)."""
        key, types = self.arch_key(suffix)
        if types is None:
            return
        if types[0] != GGUFValueType.ARRAY:
            self.number(suffix, "int", lo=0, hi=INT64_MAX)
            return
        if len(types) < 2 or types[1] not in PER_LAYER_FLAG_ITEM_TYPES:
            self.problems.append(f"metadata {key} must be an integer or an array of bool, int32 or uint32, "
                                 f"got {_type_text(types)}")
            return
        n = _array_length(self.f.reader.fields[key])
        if n_layer is not None and n > n_layer:
            self.problems.append(f"metadata {key} has {n} entries; expected at most one per layer (block_count = "
                                 f"{n_layer}; layers past the array use full attention)")

    def _bounded(self, key: str, value: Any, lo: float | None, hi: float | None) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            self.problems.append(f"metadata {key} is {value}; expected a finite number")
            return None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bounds = f"{_num(lo)}..{_num(hi)}" if lo is not None and hi is not None else (
                f"at least {_num(lo)}" if lo is not None else f"at most {_num(hi)}")
            self.problems.append(f"metadata {key} is {_num(value)}; expected {bounds}")
            return None
        return value


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, (int, np.integer)) else f"{value:g}"


def model_problems(f: GGUFFile, reference: bool = False) -> tuple[list[str], ModelShape | None]:
    """Every hyperparameter, shape and vocabulary problem of ``f`` (an open file whose structure is valid).

    ``reference``: for llama.cpp's load, only what llama.cpp itself requires (no refusal of what our engine does
    not run, such as experts, and no shape checks of our architectures' tensor names).
    """
    c = _Checker(f)
    ours = not reference  # keys llama.cpp reads only for some architectures are required for ours, checked if present
    # 0 heads in a layer is legal only where llama.cpp builds layers without attention (hybrid recurrent models).
    min_heads = 1 if ours or f.raw_architecture in ATTENTION_EVERY_LAYER else 0
    n_layer = c.number("block_count", "int", required=True, lo=1, hi=MAX_LAYERS)
    n_embd = c.number("embedding_length", "int", required=True, lo=1, hi=MAX_EMBEDDING)
    n_layer_or_none = int(n_layer) if n_layer is not None else None
    n_head = c.per_layer("attention.head_count", n_layer_or_none, required=ours, lo=min_heads, hi=MAX_HEADS)
    n_head_kv = c.per_layer("attention.head_count_kv", n_layer_or_none, lo=min_heads, hi=MAX_HEADS)
    n_ff = c.per_layer("feed_forward_length", n_layer_or_none, required=ours, lo=min_heads, hi=MAX_EMBEDDING * 64)
    for suffix in PER_LAYER_FLAG_KEYS:
        c.layer_flags(suffix, n_layer_or_none)
    key_length = c.number("attention.key_length", "int", lo=1, hi=MAX_EMBEDDING)
    value_length = c.number("attention.value_length", "int", lo=1, hi=MAX_EMBEDDING)
    n_rot = c.number("rope.dimension_count", "int", lo=1, hi=MAX_EMBEDDING)
    n_ctx_train = c.number("context_length", "int", lo=0, hi=INT64_MAX)
    c.number("attention.layer_norm_rms_epsilon", "float", required=ours, lo=0, hi=1)
    c.number("rope.freq_base", "float", lo=1e-6)
    c.number("rope.freq_base_swa", "float", lo=1e-6)
    c.number("rope.scaling.factor", "float", lo=0)
    c.number("attention.sliding_window", "int", lo=0, hi=INT64_MAX)
    c.number("final_logit_softcapping", "float", lo=0)
    c.number("attn_logit_softcapping", "float", lo=0)
    n_expert = c.number("expert_count", "int", lo=0, hi=MAX_EXPERTS)
    n_expert_used = c.number("expert_used_count", "int", lo=0, hi=MAX_EXPERTS)
    if n_expert_used and not n_expert:
        c.problems.append(f"metadata {c.arch}.expert_used_count is {n_expert_used} but the file has no "
                          f"{c.arch}.expert_count (llama.cpp asserts expert_used_count <= expert_count)")
    elif n_expert_used and n_expert and n_expert_used > n_expert:
        c.problems.append(f"metadata {c.arch}.expert_used_count is {n_expert_used}, above "
                          f"{c.arch}.expert_count {n_expert}")
    elif n_expert and not n_expert_used:
        c.problems.append(f"metadata {c.arch}.expert_used_count is {'missing' if n_expert_used is None else 0} but "
                          f"{c.arch}.expert_count is {n_expert}; expected 1..{n_expert} (llama.cpp asserts "
                          f"expert_used_count > 0 when there are experts)")
    groups = c.number("expert_group_count", "int", lo=0, hi=MAX_EXPERTS)
    if n_expert and groups and groups >= n_expert:
        c.problems.append(f"metadata {c.arch}.expert_group_count is {groups}; llama.cpp asserts fewer groups than "
                          f"{c.arch}.expert_count {n_expert}")
    moe = f.architecture in MOE_ARCHITECTURES
    if n_expert and not reference and not moe:
        c.problems.append(f"mixture-of-experts {c.arch} models are not supported ({c.arch}.expert_count = "
                          f"{n_expert}); supported mixture-of-experts architectures: {', '.join(MOE_ARCHITECTURES)}")
    if moe and not reference:
        if not n_expert:
            c.problems.append(f"metadata {c.arch}.expert_count is {'missing' if n_expert is None else 0}; {c.arch} "
                              f"needs at least 1 expert (llama.cpp: n_expert must be > 0)")
        if groups and groups > 1:
            c.problems.append(f"metadata {c.arch}.expert_group_count is {groups}: grouped expert selection is not "
                              f"supported; supported: 0 or 1 group")
    n_ff_exp = c.number("expert_feed_forward_length", "int", lo=1, hi=MAX_EMBEDDING * 64)
    n_ff_shexp = c.number("expert_shared_feed_forward_length", "int", lo=1, hi=MAX_EMBEDDING * 64)
    if None in (n_layer, n_embd, n_head, n_ff) or (n_head_kv is None and f.arch_value("attention.head_count_kv")
                                                   is not None):
        return c.problems, None
    n_head_kv = n_head_kv or list(n_head)
    for il, (h, hkv) in enumerate(zip(n_head, n_head_kv)):
        if (h == 0) != (hkv == 0) or (hkv and h % hkv):
            c.problems.append(f"layer {il}: {h} attention heads cannot share {hkv} KV heads evenly "
                              f"({c.arch}.attention.head_count / head_count_kv)")
            break
    if not n_head[0]:  # a hybrid model's first layer without attention (reference only): nothing more to derive
        return c.problems, None
    if (key_length is None or value_length is None) and n_embd % n_head[0]:
        c.problems.append(f"{c.arch}.embedding_length {n_embd} is not divisible by {c.arch}.attention.head_count "
                          f"{n_head[0]} (and the file gives no attention.key_length/value_length)")
        return c.problems, None
    head_dim_k = int(key_length) if key_length is not None else n_embd // n_head[0]
    head_dim_v = int(value_length) if value_length is not None else n_embd // n_head[0]
    if n_rot is not None and (n_rot > head_dim_k or n_rot % 2):
        c.problems.append(f"metadata {c.arch}.rope.dimension_count is {n_rot}; expected an even number of at most "
                          f"the head size {head_dim_k}")
    shape = ModelShape(int(n_layer), int(n_embd), n_head, n_head_kv, head_dim_k, head_dim_v,
                       int(n_ctx_train or 0))
    n_vocab = _vocab_problems(f, c.problems, required=not reference)
    if not reference:
        _shape_problems(f, shape, n_ff, n_vocab, c.problems)
        if moe and n_expert and n_expert_used:
            experts = (int(n_expert), int(n_ff_exp or n_ff[0] // n_expert_used), int(n_ff_shexp or n_ff[0]))
            _expert_shape_problems(f, shape, experts, c.problems)
    return c.problems, shape


def _vocab_problems(f: GGUFFile, problems: list[str], required: bool = True) -> int | None:
    """Token list vs embedding rows, the parallel arrays' lengths, special ids; returns the token count.
    ``required``: a file without a vocabulary is a problem (llama.cpp names what it misses itself)."""
    fields = f.reader.fields
    tokens = fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        if required:
            problems.append("missing required metadata key tokenizer.ggml.tokens (the file has no tokenizer)")
        return None
    n_tokens = len(tokens.data)
    if n_tokens == 0:
        problems.append("metadata tokenizer.ggml.tokens is empty")
        return None
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        field = fields.get(key)
        if field is not None and field.types and field.types[0] == GGUFValueType.ARRAY:
            n = _array_length(field)
            if n != n_tokens:
                problems.append(f"metadata {key} has {n} entries; expected one per token ({n_tokens})")
    for kind in ("bos", "eos", "unk", "pad", "sep", "cls", "mask", "eot", "eom"):
        key = f"tokenizer.ggml.{kind}_token_id"
        field = fields.get(key)
        if field is None:
            continue
        if list(field.types) != [GGUFValueType.UINT32] and (len(field.types) != 1
                                                            or field.types[0] not in INTEGER_TYPES):
            problems.append(f"metadata {key} must be an integer, got {_type_text(list(field.types))}")
            continue
        value = int(f.metadata_value(key))
        if not 0 <= value < n_tokens and value != 0xFFFFFFFF and value != -1:  # -1 / 2^32-1: "no such token"
            problems.append(f"metadata {key} is {value}, outside the vocabulary of {n_tokens} tokens")
    embd = f.tensors.get("token_embd.weight")
    if embd is not None and embd.shape[0] != n_tokens:
        problems.append(f"tokenizer.ggml.tokens has {n_tokens} tokens but token_embd.weight has {embd.shape[0]} "
                        f"rows; they must be equal")
    return n_tokens


def check_vocab(f: GGUFFile) -> None:
    """Raise the first vocabulary problem (token arrays' lengths, special ids, embedding rows) as one line."""
    problems: list[str] = []
    _vocab_problems(f, problems, required=False)  # no vocabulary at all: the tokenizer's own message says so
    if problems:
        raise_first(f.path, problems)


def _array_length(field: Any) -> int:
    if len(field.types) > 1 and field.types[1] == GGUFValueType.STRING:
        return len(field.data)
    return int(field.parts[field.data[0]].shape[0]) if field.data else 0


def _shape_problems(f: GGUFFile, s: ModelShape, n_ff: list[int], n_vocab: int | None, problems: list[str]) -> None:
    """Every present tensor whose shape disagrees with the hyperparameters (missing tensors: the model says)."""
    expected: dict[str, tuple[int, ...]] = {}
    if n_vocab is not None:
        expected["token_embd.weight"] = (n_vocab, s.n_embd)
        expected["output.weight"] = (n_vocab, s.n_embd)
    expected["output_norm.weight"] = (s.n_embd,)
    for il in range(s.n_layer):
        q, kv_k, kv_v = s.n_head[il] * s.head_dim_k, s.n_head_kv[il] * s.head_dim_k, s.n_head_kv[il] * s.head_dim_v
        blk = f"blk.{il}"
        expected.update({
            f"{blk}.attn_norm.weight": (s.n_embd,), f"{blk}.ffn_norm.weight": (s.n_embd,),
            f"{blk}.post_attention_norm.weight": (s.n_embd,), f"{blk}.post_ffw_norm.weight": (s.n_embd,),
            f"{blk}.attn_q.weight": (q, s.n_embd), f"{blk}.attn_k.weight": (kv_k, s.n_embd),
            f"{blk}.attn_v.weight": (kv_v, s.n_embd),
            f"{blk}.attn_output.weight": (s.n_embd, s.n_head[il] * s.head_dim_v),
            f"{blk}.attn_q.bias": (q,), f"{blk}.attn_k.bias": (kv_k,), f"{blk}.attn_v.bias": (kv_v,),
            f"{blk}.attn_q_norm.weight": (s.head_dim_k,), f"{blk}.attn_k_norm.weight": (s.head_dim_k,),
            f"{blk}.ffn_gate.weight": (n_ff[il], s.n_embd), f"{blk}.ffn_up.weight": (n_ff[il], s.n_embd),
            f"{blk}.ffn_down.weight": (s.n_embd, n_ff[il]),
            f"{blk}.attn_qkv.weight": (q + kv_k + kv_v, s.n_embd),  # fused Q/K/V (phi3)
        })
        if f"{blk}.ffn_gate.weight" not in f.tensors and f"{blk}.ffn_up.weight" in f.tensors:
            # no separate gate: a fused gate+up (phi3, llama.cpp's LLM_FFN_SWIGLU on one tensor) holds both halves
            n_up = f.tensors[f"{blk}.ffn_up.weight"].shape[0]
            expected[f"{blk}.ffn_up.weight"] = (n_up if n_up == 2 * n_ff[il] else n_ff[il], s.n_embd)
    for name, shape in expected.items():
        t = f.tensors.get(name)
        if t is not None and tuple(t.shape) != shape:
            problems.append(f"tensor '{name}' has shape {list(t.shape)}; the hyperparameters say {list(shape)}")
            if len(problems) > 32:  # one broken key makes every layer disagree: enough to see the pattern
                return


def _expert_shape_problems(f: GGUFFile, s: ModelShape, experts: tuple[int, int, int], problems: list[str]) -> None:
    """The MoE tensors' shapes (llama.cpp's qwen2moe / qwen3moe ``load_arch_tensors``): the router
    ``(n_expert, n_embd)``, stacked experts ``(n_expert, n_ff_exp, n_embd)`` / ``(n_expert, n_embd, n_ff_exp)``
    with ``n_ff_exp`` = expert_feed_forward_length (else feed_forward_length / expert_used_count), and the shared
    expert's with ``n_ff_shexp`` = expert_shared_feed_forward_length (else feed_forward_length)."""
    n_expert, n_ff_exp, n_ff_shexp = experts
    for il in range(s.n_layer):
        blk = f"blk.{il}"
        expected = {
            f"{blk}.ffn_gate_inp.weight": (n_expert, s.n_embd),
            f"{blk}.ffn_gate_exps.weight": (n_expert, n_ff_exp, s.n_embd),
            f"{blk}.ffn_up_exps.weight": (n_expert, n_ff_exp, s.n_embd),
            f"{blk}.ffn_down_exps.weight": (n_expert, s.n_embd, n_ff_exp),
            f"{blk}.ffn_gate_inp_shexp.weight": (s.n_embd,),
            f"{blk}.ffn_gate_shexp.weight": (n_ff_shexp, s.n_embd),
            f"{blk}.ffn_up_shexp.weight": (n_ff_shexp, s.n_embd),
            f"{blk}.ffn_down_shexp.weight": (s.n_embd, n_ff_shexp),
        }
        for name, shape in expected.items():
            t = f.tensors.get(name)
            if t is not None and tuple(t.shape) != shape:
                problems.append(f"tensor '{name}' has shape {list(t.shape)}; the hyperparameters say {list(shape)}")
                if len(problems) > 32:
                    return


def check_model(f: GGUFFile, reference: bool = False) -> ModelShape | None:
    """Raise the first model-level problem of ``f`` as one line (with a count of the rest); else its shape (always
    there for our architectures; ``reference`` on another architecture may not derive one)."""
    problems, shape = model_problems(f, reference)
    if problems:
        raise_first(f.path, problems)
    if shape is None and not reference:
        raise GGUFParityError(f"{f.path}: the hyperparameters do not describe an attention model")
    return shape


def raise_first(path: str | os.PathLike, problems: list[str]) -> None:
    more = (f" (and {len(problems) - 1} more problem(s); `bench-compare inspect` lists them)"
            if len(problems) > 1 else "")
    raise GGUFParityError(f"{path}: {problems[0]}{more}")


# --- context size ---------------------------------------------------------------------------------------------------
def available_memory_bytes() -> int | None:
    """Memory available to a new allocation now (MemAvailable), or None where the platform does not say."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_context(path: str | os.PathLike, shape: ModelShape, n_ctx: int, bytes_per_value: int,
                  flag: str = "--ctx") -> None:
    """Refuse a context whose KV cache cannot fit in the memory available now (saying how much it needs)."""
    need = shape.kv_cache_bytes(n_ctx, bytes_per_value)
    have = available_memory_bytes()
    if have is not None and need > have:
        raise GGUFParityError(
            f"{flag} {n_ctx} needs a KV cache of {need / 2**30:.1f} GiB ({shape.n_layer} layers) but only "
            f"{have / 2**30:.1f} GiB of memory is available; use a smaller {flag}"
            + (f" (the model was trained with {shape.n_ctx_train})" if shape.n_ctx_train else "")
        )


def check_training_context(path: str | os.PathLike, shape: ModelShape, n_ctx: int, flag: str = "--ctx") -> None:
    if shape.n_ctx_train and n_ctx > shape.n_ctx_train:
        raise GGUFParityError(f"{flag} {n_ctx} is above the model's training context of {shape.n_ctx_train} "
                              f"tokens ({path}); use at most {shape.n_ctx_train}")
