"""Model sha256s are computed once per version of a file, and recomputed when the file changes."""

from __future__ import annotations

import hashlib
import os

from inference_engine.store import digests


def no_hashing(*args, **kwargs):
    raise AssertionError("the remembered digest should have been used")


def test_remembered_while_unchanged_recomputed_when_changed(tmp_path, monkeypatch):
    path, folder = tmp_path / "m.gguf", tmp_path / "digests"
    path.write_bytes(b"GGUF one")
    assert digests.file_sha256(path, folder) == hashlib.sha256(b"GGUF one").hexdigest()
    with monkeypatch.context() as m:
        m.setattr(digests, "sha256_of_file", no_hashing)
        assert digests.file_sha256(path, folder) == hashlib.sha256(b"GGUF one").hexdigest()
    path.write_bytes(b"GGUF two")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert digests.file_sha256(path, folder) == hashlib.sha256(b"GGUF two").hexdigest()


def test_a_damaged_record_is_recomputed(tmp_path):
    path, folder = tmp_path / "m.gguf", tmp_path / "digests"
    path.write_bytes(b"GGUF")
    digests.file_sha256(path, folder)
    [record] = folder.glob("*.json")
    record.write_text("[]")
    assert digests.file_sha256(path, folder) == hashlib.sha256(b"GGUF").hexdigest()


def test_records_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(digests, "MAX_SLOTS", 3)
    folder = tmp_path / "digests"
    for i in range(5):
        (tmp_path / f"{i}.gguf").write_bytes(b"x" * i)
        digests.file_sha256(tmp_path / f"{i}.gguf", folder)
    assert len(list(folder.glob("*.json"))) == 3
