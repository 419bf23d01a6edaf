"""Tensor dumps: validate an engine written in any language from the files it writes (``--engine dump:DIR``).

The contract (also in ``docs/PLUGGING_IN.md``), version :data:`CONTRACT_VERSION`:

1. The harness writes ``DIR/request.json`` (:func:`build_request`): the model (path, sha256, architecture and sizes),
   the ``token_ids`` to run as one prefill, and ``tensors``: the llama.cpp graph names wanted with their shapes.
2. The engine runs one prefill of exactly those ids on a fresh cache and writes into the same directory
   ``tensors.safetensors`` (F32, F16 or BF16 tensors, any subset of the names, under its own names if a name map
   translates them) and ``manifest.json``::

       {"format": "gguf-parity.dump", "version": 1, "model_sha256": "<hex>", "token_ids": [1, 2, 3],
        "engine": {"name": "my-engine", "version": "0.3.1"}, "tensors": {"l_out-0": {"dtype": "F32"}, ...}}

3. ``validate --engine dump:DIR`` reads them (:func:`read_dump`). A dump for another model (sha256) or other token
   ids is rejected in one line (exit 2): comparing it would measure nothing. Per tensor, problems are reported, not
   raised: a tensor not provided is listed as such; a mis-shaped one fails with both shapes; NaN or inf values fail
   it (the metrics turn them into an infinite NMSE).

What a dump cannot give: speed (nothing is timed), tokenizer parity (it holds ids, not a tokenizer), decoding beyond
the one prefill (greedy smoke stops at its first decode), and teacher forcing (the engine ran on its own values).
Those checks say "not checked" with the reason. Logits (KLD, top-1) come from ``result_output`` where the dump has it.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from bench_compare.adapters.graph_names import ModelDims, drop_leading_ones, expected_tensors
from bench_compare.adapters.name_map import NameMap, load_name_map
from inference_engine.errors import GGUFParityError, read_user_text
from inference_engine.protocol import EngineCapabilityError

CONTRACT_VERSION = 1
REQUEST_FORMAT = "gguf-parity.dump-request"
MANIFEST_FORMAT = "gguf-parity.dump"
REQUEST_FILE = "request.json"
TENSORS_FILE = "tensors.safetensors"
MANIFEST_FILE = "manifest.json"
SUPPORTED_DTYPES = ("F32", "F16", "BF16")
CONVENTIONS = (
    "Run token_ids as one prefill on a fresh KV cache. Each tensor is row-major with llama.cpp's NumPy-order shape "
    "(reversed ggml ne, token axis first, leading size-1 axes dropped), as listed under 'tensors'; Qcur/Kcur/Vcur "
    "may also be written as (n_tokens, n_head * head_dim). l_out of the last layer and result_output hold every "
    "token's row. Write any subset; names llama.cpp does not produce are listed, not compared."
)


# --- the request ------------------------------------------------------------------------------------------------


def build_request(model_path: str | Path, gguf, ids: list[int], names: Iterable[str] | None = None) -> dict:
    """The request for one prefill of ``ids`` on ``model_path``; ``names`` narrows the tensors wanted."""
    dims = ModelDims.from_gguf(gguf)
    wanted = expected_tensors(dims, len(ids))
    if names is not None:
        chosen = set(names)
        wanted = {k: v for k, v in wanted.items() if k in chosen}
    return {
        "format": REQUEST_FORMAT,
        "version": CONTRACT_VERSION,
        "model": {"path": str(Path(model_path).resolve()), "sha256": gguf.sha256, **dims.to_dict()},
        "token_ids": [int(i) for i in ids],
        "tensors": [{"name": name, "shape": list(shape)} for name, shape in wanted.items()],
        "outputs": {"tensors": TENSORS_FILE, "manifest": MANIFEST_FILE},
        "conventions": CONVENTIONS,
    }


def write_request(directory: str | Path, request: dict) -> Path:
    from inference_engine.store.atomic import atomic_write_json

    return atomic_write_json(Path(directory) / REQUEST_FILE, request)


# --- writing a dump from Python (our own engine, tests; other languages write the same two files) ---------------


def write_dump(directory: str | Path, tensors: dict[str, np.ndarray], *, model_sha256: str, token_ids: list[int],
               engine_name: str, engine_version: str = "", dtype: str = "F32") -> Path:
    """Write ``tensors.safetensors`` (``dtype``: F32 or F16) and ``manifest.json`` as the contract says."""
    from safetensors.numpy import save

    from inference_engine.store.atomic import atomic_write_bytes, atomic_write_json

    np_dtype = {"F32": np.float32, "F16": np.float16}[dtype]
    arrays = {name: np.ascontiguousarray(np.asarray(a, dtype=np_dtype)) for name, a in tensors.items()}
    directory = Path(directory)
    atomic_write_bytes(directory / TENSORS_FILE, save(arrays))
    atomic_write_json(directory / MANIFEST_FILE, {
        "format": MANIFEST_FORMAT, "version": CONTRACT_VERSION, "model_sha256": model_sha256,
        "token_ids": [int(i) for i in token_ids], "engine": {"name": engine_name, "version": engine_version},
        "tensors": {name: {"dtype": dtype} for name in arrays},
    })
    return directory


# --- reading a dump ---------------------------------------------------------------------------------------------


@dataclass
class Dump:
    """A dump read and checked: tensors under llama.cpp's names, and what was wrong with individual tensors."""

    directory: Path
    engine: dict
    tensors: dict[str, np.ndarray]
    not_provided: list[str]  # requested names the dump lacks
    problems: dict[str, str] = field(default_factory=dict)  # llama.cpp name -> what is wrong (the diff fails it)
    unknown_names: list[str] = field(default_factory=list)  # names (after the map) llama.cpp does not produce
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"directory": str(self.directory), "engine": self.engine, "provided": sorted(self.tensors),
                "not_provided": self.not_provided, "problems": self.problems, "unknown_names": self.unknown_names,
                "warnings": self.warnings}

    def notes(self) -> list[str]:
        """Lines for the validation report."""
        n = len(self.tensors) - len(self.unknown_names)
        lines = [f"dump {self.directory} by {self.engine.get('name') or '?'} {self.engine.get('version') or ''}: "
                 f"{n} of {n + len(self.not_provided)} requested tensors provided".replace("  ", " ")]
        if self.not_provided:
            lines.append(f"not provided ({len(self.not_provided)}): {_short_list(self.not_provided)}")
        for name, problem in self.problems.items():
            lines.append(f"dump tensor {name}: {problem}")
        if self.unknown_names:
            lines.append(f"names llama.cpp does not produce (not compared; a --name-map translates them): "
                         f"{_short_list(self.unknown_names)}")
        return lines + self.warnings


def _short_list(names: list[str], n: int = 12) -> str:
    return ", ".join(names[:n]) + (f", ... ({len(names) - n} more)" if len(names) > n else "")


def _load_json(path: Path, what: str) -> dict:
    text = read_user_text(path, what)  # missing, a directory, unreadable, not UTF-8: one line each
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GGUFParityError(f"{path}: {what} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict):
        raise GGUFParityError(f"{path}: the {what} must be a JSON object")
    return obj


def read_manifest(directory: Path) -> dict:
    path = directory / MANIFEST_FILE
    manifest = _load_json(path, "dump manifest")
    if manifest.get("format") != MANIFEST_FORMAT:
        raise GGUFParityError(f"{path}: \"format\" is {manifest.get('format')!r}, expected {MANIFEST_FORMAT!r}")
    if manifest.get("version") != CONTRACT_VERSION:
        raise GGUFParityError(f"{path}: dump contract version {manifest.get('version')!r}; supported: "
                              f"{CONTRACT_VERSION}")
    for key, kind in (("model_sha256", str), ("token_ids", list)):
        if not isinstance(manifest.get(key), kind):
            raise GGUFParityError(f"{path}: \"{key}\" is missing or not a {kind.__name__}")
    if not isinstance(manifest.get("engine", {}), dict):
        raise GGUFParityError(f"{path}: \"engine\" must be an object with \"name\" and \"version\"")
    return manifest


def check_identity(manifest: dict, directory: Path, model_sha256: str, model_name: str, ids: list[int]) -> None:
    """The dump must be of this model and these ids, else comparing it measures nothing (one line, exit 2)."""
    if manifest["model_sha256"].lower() != model_sha256.lower():
        raise GGUFParityError(f"dump {directory} was written for a model with sha256 {manifest['model_sha256'][:16]}"
                              f"..., not {model_name} (sha256 {model_sha256[:16]}...): a dump of the wrong model")
    try:
        theirs = [int(i) for i in manifest["token_ids"]]
    except (TypeError, ValueError):
        raise GGUFParityError(f"{directory / MANIFEST_FILE}: \"token_ids\" must be a list of integers") from None
    if theirs != list(ids):
        first = next((k for k, (a, b) in enumerate(zip(theirs, ids)) if a != b), min(len(theirs), len(ids)))
        raise GGUFParityError(f"dump {directory} holds {len(theirs)} token ids, the harness asked for {len(ids)}; "
                              f"they differ from position {first} (dump {theirs[first:first + 4]}, asked "
                              f"{list(ids)[first:first + 4]}): rerun the engine on {REQUEST_FILE}")


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor as float32. F32/F16 through the safetensors library; BF16 (which NumPy lacks) from the raw
    bytes at the offsets in the file's header (8-byte little-endian length, then JSON)."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise GGUFParityError(f"{path}: no such file (the engine writes its tensors there)")
    out: dict[str, np.ndarray] = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
            dtypes = {name: f.get_slice(name).get_dtype() for name in names}
            bad = {n: d for n, d in dtypes.items() if d not in SUPPORTED_DTYPES}
            if bad:
                name, dtype = next(iter(bad.items()))
                raise GGUFParityError(f"{path}: tensor {name!r} is {dtype}; supported: {', '.join(SUPPORTED_DTYPES)}")
            for name in names:
                if dtypes[name] != "BF16":
                    out[name] = np.asarray(f.get_tensor(name), dtype=np.float32)
    except SafetensorError as exc:
        raise GGUFParityError(f"{path}: not a readable safetensors file ({exc})") from None
    bf16 = [n for n, d in dtypes.items() if d == "BF16"]
    if bf16:
        out.update(_read_bf16(path, bf16))
    return out


def _read_bf16(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    with open(path, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out = {}
    for name in names:
        start, end = header[name]["data_offsets"]
        bits = np.frombuffer(data[start:end].tobytes(), dtype="<u2").astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(header[name]["shape"])
    return out


def conform(array: np.ndarray, expected: tuple[int, ...] | None) -> tuple[np.ndarray, str | None]:
    """The protocol's shape for a dumped tensor, or the array as written and what is wrong with its shape.

    Leading size-1 axes are dropped; a tensor whose trailing axes are merged (``Qcur`` as ``(T, n_head*head_dim)``)
    is reshaped, since that is the same row-major data. Anything else is left as written: the diff fails it with
    both shapes.
    """
    shape = drop_leading_ones(array.shape)
    array = array.reshape(shape)
    if expected is None or shape == expected:
        return array, None
    same_rows = len(shape) >= 1 and len(expected) >= 1 and shape[0] == expected[0]
    if same_rows and array.size == int(np.prod(expected)) and (len(shape) == 2 or len(expected) == 2):
        return array.reshape(expected), None
    return array, f"shape {list(shape)}, expected {list(expected)}"


def read_dump(directory: str | Path, *, model_sha256: str, model_name: str, ids: list[int],
              expected: dict[str, tuple[int, ...]], name_map: NameMap | None = None) -> Dump:
    """Read and check a dump (module doc); ``expected`` is :func:`graph_names.expected_tensors` for ``ids``."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    check_identity(manifest, directory, model_sha256, model_name, ids)
    raw = read_safetensors(directory / TENSORS_FILE)
    listed = manifest.get("tensors") or {}
    warnings = []
    tensors: dict[str, np.ndarray] = {}
    problems: dict[str, str] = {}
    origin: dict[str, str] = {}
    for theirs, array in raw.items():
        ours = name_map.resolve(theirs) if name_map else theirs
        if ours in origin:
            raise GGUFParityError(f"{directory / TENSORS_FILE}: tensors {origin[ours]!r} and {theirs!r} both map to "
                                  f"{ours!r}; give each llama.cpp name one tensor")
        origin[ours] = theirs
        array, shape_problem = conform(array, expected.get(ours))
        tensors[ours] = array
        if shape_problem:
            problems[ours] = shape_problem
        bad = int(np.count_nonzero(~np.isfinite(array)))
        if bad:
            problems[ours] = "; ".join(filter(None, [problems.get(ours), f"{bad} of {array.size} values NaN or inf"]))
        if isinstance(listed, dict) and theirs in listed:
            said = str((listed[theirs] or {}).get("dtype", "")).upper()
            if said and said not in SUPPORTED_DTYPES:
                warnings.append(f"manifest lists {theirs!r} as {said}; the file holds a supported float type")
        elif isinstance(listed, dict):
            warnings.append(f"manifest does not list tensor {theirs!r}")
    not_provided = [name for name in expected if name not in tensors]
    unknown = [name for name in tensors if name not in expected]
    engine = {k: str(v) for k, v in (manifest.get("engine") or {}).items() if k in ("name", "version")}
    return Dump(directory, engine, tensors, not_provided, problems, unknown, warnings[:5])


# --- the engine ---------------------------------------------------------------------------------------------------


class DumpEngine:
    """The Engine protocol over a dump directory: ``capture`` (and the last row of ``result_output`` as
    ``prefill``'s logits) for the dump's ids; everything else raises :class:`EngineCapabilityError`."""

    partial_capture = True  # an engine dumps what it can; validation lists the rest as not provided

    def __init__(self, directory: str | Path, model: str | Path, *, n_ctx: int = 2048,
                 name_map: str | Path | None = None, label: str | None = None):
        from inference_engine.gguf.file import open_gguf

        self.directory = Path(directory)
        self.model_path = Path(model)
        self.gguf = open_gguf(self.model_path)
        self.dims = ModelDims.from_gguf(self.gguf)
        self.name_map = load_name_map(name_map, expected_tensors(self.dims, 2)) if name_map else None
        self.name = label or f"dump:{self.directory}"
        self._n_ctx = int(n_ctx)
        self._dumps: dict[tuple[int, ...], tuple[Dump, frozenset | None]] = {}
        self._last: Dump | None = None

    # -- how a dump for some ids is obtained (CommandEngine runs a program instead) --
    def _obtain(self, ids: list[int], names: list[str] | None) -> Path:
        if not (self.directory / MANIFEST_FILE).is_file():
            self.directory.mkdir(parents=True, exist_ok=True)
            path = write_request(self.directory, build_request(self.model_path, self.gguf, ids))
            raise GGUFParityError(f"no dump in {self.directory} yet: wrote {path} ({len(ids)} token ids); run your "
                                  f"engine on it to write {TENSORS_FILE} and {MANIFEST_FILE} there, then run this "
                                  "command again")
        return self.directory

    def dump_for(self, ids: list[int], names: list[str] | None = None) -> Dump:
        """The dump for ``ids`` holding at least ``names`` (None: everything); obtained once, then reused."""
        key = tuple(int(i) for i in ids)
        cached = self._dumps.get(key)
        asked = None if names is None else frozenset(names)
        if cached is None or (cached[1] is not None and (asked is None or not asked <= cached[1])):
            directory = self._obtain(list(key), names)
            dump = read_dump(directory, model_sha256=self.gguf.sha256, model_name=str(self.model_path),
                             ids=list(key), expected=expected_tensors(self.dims, len(key)), name_map=self.name_map)
            self._dumps = {key: (dump, asked)}  # one prompt at a time: a capture's tensors can be large
            cached = self._dumps[key]
        if asked is None or self._last is None:
            self._last = cached[0]  # the report describes the full capture, not a logits-only rerun
        return cached[0]

    # -- the Engine protocol --
    @property
    def model_info(self) -> dict[str, Any]:
        info = {"engine": self.name, "file": str(self.model_path), "sha256": self.gguf.sha256,
                "architecture": self.dims.architecture, "n_ctx": self._n_ctx, "backend": "external",
                "numerics": "as the engine computed them",
                "unavailable": "speed (nothing is timed), tokenizer (a dump holds ids), decode beyond the prefill, "
                               "teacher forcing"}
        if self._last is not None:
            info["writer"] = self._last.engine
            info["dump"] = self._last.summary()
            info["notes"] = self._last.notes()
        return info

    @property
    def n_vocab(self) -> int:
        return self.dims.n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        raise EngineCapabilityError(f"{self.name} holds token ids, not a tokenizer: tokenizer parity is not checked")

    def detokenize(self, ids: Iterable[int]) -> str:
        raise EngineCapabilityError(f"{self.name} holds token ids, not a tokenizer")

    def reset(self) -> None:
        pass

    def capture(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        wanted = None if names is None else list(names)
        tensors = self.dump_for(list(ids), wanted).tensors
        return dict(tensors) if wanted is None else {k: v for k, v in tensors.items() if k in set(wanted)}

    def prefill(self, ids: list[int]) -> np.ndarray:
        self._check_prefill_ids(list(ids))
        logits = self.dump_for(list(ids), ["result_output"]).tensors.get("result_output")
        if logits is None:
            raise EngineCapabilityError(f"{self.name} has no result_output, so it gives no logits")
        return np.asarray(logits).reshape(-1, self.dims.n_vocab)[-1]

    def _check_prefill_ids(self, ids: list[int]) -> None:
        """Logits exist only for the dump's own ids: any other prompt (a benchmark's) is a capability gap."""
        manifest = self.directory / MANIFEST_FILE
        try:
            dumped = json.loads(manifest.read_text(encoding="utf-8")).get("token_ids")
        except (OSError, ValueError):
            dumped = None
        if dumped != ids:
            raise EngineCapabilityError(f"{self.name} holds one prefill of its request's token ids and nothing else: "
                                        "it cannot run other prompts, and nothing in a dump can be timed")

    def decode(self, token_id: int) -> np.ndarray:
        raise EngineCapabilityError(f"{self.name} holds one prefill of the requested ids; it cannot decode further "
                                    "tokens (use --engine 'cmd:...' to have the harness rerun the engine)")

    def close(self) -> None:
        self._dumps.clear()


def open_engine(target: str, model: str, **options) -> DumpEngine:
    """A tensor dump from an engine in any language: DIR/request.json -> tensors.safetensors + manifest.json.

    Factory for ``--engine dump:DIR`` (options: ``n_ctx``, ``name_map``; others are ignored)."""
    if not target:
        raise GGUFParityError("--engine dump: needs a directory (dump:DIR), where request.json is written and the "
                              "engine's tensors.safetensors and manifest.json are read")
    return DumpEngine(target, model, n_ctx=options.get("n_ctx") or 2048, name_map=options.get("name_map"))
