"""Copies of a GGUF file with its weights in another precision, or with some metadata changed (through gguf-py).

Two uses in validation:

* **precision variants of the reference** (:mod:`validation.precision`): llama.cpp on the same model with every
  matrix dequantized to F32, F16 or BF16. ggml multiplies such weights by activations of the same type (its
  ``vec_dot_type`` for F32 is F32, for F16 F16, for BF16 BF16) instead of quantizing the activations to 8 bits, which
  is what an engine that dequantizes the weights and multiplies in that precision computes. How far that copy's
  output is from llama.cpp on the original file is llama.cpp's own measure of what the precision alone changes.
* **planted bugs** in tests: the same model with one hyperparameter off (a RoPE base, a norm epsilon).

Only matrices (two or more dimensions) are converted; vectors (norm weights, biases) stay as they are, as llama.cpp's
own converter keeps them in F32. The values are the original file's, dequantized exactly by gguf-py's reference
dequantizers, then rounded once to the target type. The copy is written to a temporary name and renamed, so a reader
never sees half a file; copies are kept in :func:`variants_dir`, keyed by the source's sha256 and the type.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from inference_engine.errors import GGUFParityError

# The weight types a variant can be written in, as ggml names them, and the general.file_type a copy then records.
WEIGHT_TYPES = ("F32", "F16", "BF16")
FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16"}
VARIANTS_SUBDIR = "variants"


def variants_dir() -> Path:
    """Where converted copies are kept: ``<model cache>/variants`` (``$GGUF_PARITY_CACHE`` moves it)."""
    from inference_engine.store.folders import cache_dir

    return cache_dir() / VARIANTS_SUBDIR


# Free space kept beyond a copy's own size before it is written (the file system's own reserve, other writers).
DISK_MARGIN_BYTES = 256 * 2**20


def weights_as(src: str | os.PathLike, weight_type: str, sha256: str,
               announce: Callable[[str], None] | None = None) -> Path:
    """The copy of ``src`` (whose sha256 is ``sha256``) with every matrix in ``weight_type``, written once; a copy
    about to be written is announced first (``announce``, default: one line on stderr), with its size and place."""
    weight_type = weight_type.upper()
    if weight_type not in WEIGHT_TYPES:
        raise GGUFParityError(f"unsupported weight type '{weight_type}'; supported: {', '.join(WEIGHT_TYPES)}")
    dst = variants_dir() / f"{sha256[:24]}-{weight_type}.gguf"
    if not dst.exists():
        say = announce or _to_stderr

        def before_writing(n_bytes: int) -> None:
            say(f"writing {Path(src).name} with every matrix in {weight_type} ({n_bytes / 1e9:.2f} GB, once; "
                f"the reference on it is a part of the noise floor) to {dst.parent}; `bench-compare models list` "
                "shows these copies, which may be deleted")

        rewrite(src, dst, weight_type=weight_type, before_writing=before_writing)
    return dst


def variant_files() -> list[Path]:
    """The converted copies kept in :func:`variants_dir`, largest first."""
    folder = variants_dir()
    files = [p for p in folder.glob("*.gguf") if p.is_file()] if folder.is_dir() else []
    return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def _to_stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def rewrite(src: str | os.PathLike, dst: str | os.PathLike, *, weight_type: str | None = None,
            metadata: Mapping[str, Any] | None = None, tensor_sources: Mapping[str, str] | None = None,
            before_writing: Callable[[int], None] | None = None) -> Path:
    """Copy ``src`` to ``dst`` with matrices converted to ``weight_type`` (None: unchanged), the metadata keys in
    ``metadata`` given new values (of the same GGUF type as before; the key must exist), and each tensor named in
    ``tensor_sources`` holding the data of the tensor it maps to (same type and shape: ``{"blk.1.attn_k.weight":
    "blk.1.attn_v.weight", "blk.1.attn_v.weight": "blk.1.attn_k.weight"}`` swaps K and V in layer 1).

    Refused with one line, before anything is written, where ``dst``'s file system lacks the room (the copy's
    tensor bytes plus :data:`DISK_MARGIN_BYTES`); ``before_writing(tensor bytes)`` is called just before writing."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise GGUFParityError(f"{src}: general.architecture is missing; cannot copy this file")
    changes = dict(metadata or {})
    unknown = [key for key in changes if reader.get_field(key) is None]
    if unknown:
        raise GGUFParityError(f"{src}: no metadata key {', '.join(unknown)} to change")
    by_name = {t.name: t for t in reader.tensors}
    sources = dict(tensor_sources or {})
    for name, source in sources.items():
        a, b = by_name.get(name), by_name.get(source)
        if a is None or b is None:
            raise GGUFParityError(f"{src}: no tensor {name if a is None else source} to copy")
        if a.tensor_type != b.tensor_type or tuple(a.shape) != tuple(b.shape):
            raise GGUFParityError(f"{src}: {name} and {source} differ in type or shape; cannot swap their data")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
    target = None if weight_type is None else gguf.GGMLQuantizationType[weight_type.upper()]
    try:
        writer = gguf.GGUFWriter(str(tmp), arch=arch_field.contents(), endianess=reader.endianess)
        for field in reader.fields.values():
            if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
                continue  # written by GGUFWriter itself
            if field.name == gguf.Keys.General.FILE_TYPE and target is not None:
                continue  # the copy's own, below
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            value = changes.get(field.name, field.contents())
            writer.add_key_value(field.name, value, kind, sub_type=sub)
        if target is not None:
            writer.add_file_type(gguf.LlamaFileType[FILE_TYPES[target.name]])
        plans = [_plan(t, target) for t in reader.tensors]
        needed = sum(nbytes for _, nbytes, _ in plans)
        free = shutil.disk_usage(dst.parent).free
        if free < needed + DISK_MARGIN_BYTES:
            raise GGUFParityError(f"not enough disk space for {dst.name} in {dst.parent}: it needs "
                                  f"{needed / 1e9:.2f} GB, {free / 1e9:.2f} GB free")
        if before_writing is not None:
            before_writing(needed)
        for tensor, (qtype, nbytes, shape) in zip(reader.tensors, plans):
            # a dtype other than uint8 with raw_dtype: gguf-py takes ``shape`` as the logical shape
            writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor, (qtype, _, _) in zip(reader.tensors, plans):
            data = by_name[sources.get(tensor.name, tensor.name)]
            writer.write_tensor_data(_converted(data, qtype), tensor_endianess=reader.endianess)
        writer.close()
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


def _plan(tensor, target):
    """``(type, bytes, shape as gguf-py's writer takes it)`` of ``tensor`` in the copy."""
    import gguf

    shape = tuple(int(d) for d in reversed(tensor.shape))  # numpy order (ggml's ne reversed)
    qtype = tensor.tensor_type if (target is None or len(shape) < 2) else target
    if qtype == tensor.tensor_type:
        return qtype, int(tensor.n_bytes), shape
    block, type_size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape))
    return qtype, n // block * type_size, shape


def _converted(tensor, qtype) -> np.ndarray:
    """The tensor's data as written in the copy: unchanged, or dequantized exactly and rounded once to ``qtype``."""
    import gguf

    if qtype == tensor.tensor_type:
        return tensor.data
    shape = tuple(int(d) for d in reversed(tensor.shape))
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32, copy=False)
    if qtype == gguf.GGMLQuantizationType.F32:
        return values
    if qtype == gguf.GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return gguf.quants.quantize(values, qtype)  # BF16: round to nearest even, as ggml's fp32_to_bf16
