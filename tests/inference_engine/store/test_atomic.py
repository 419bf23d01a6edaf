"""Atomic writes: the target holds the old content or the whole new one; a failure leaves no temporary file."""

from __future__ import annotations

import json
import os

import pytest

from inference_engine.store.atomic import atomic_open, atomic_write_bytes, atomic_write_json, atomic_write_text


def test_writes_and_replaces(tmp_path):
    p = tmp_path / "sub" / "out.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    atomic_write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert os.listdir(p.parent) == ["out.txt"]


def test_failure_keeps_old_content_and_leaves_no_temp(tmp_path):
    p = tmp_path / "report.md"
    p.write_text("old report")
    with pytest.raises(RuntimeError), atomic_open(p) as fh:
        fh.write("half of a new rep")
        raise RuntimeError("disk full, say")
    assert p.read_text() == "old report"
    assert os.listdir(tmp_path) == ["report.md"]


def test_ctrl_c_while_writing_creates_nothing(tmp_path):
    p = tmp_path / "new.json"
    with pytest.raises(KeyboardInterrupt), atomic_open(p) as fh:
        fh.write("{")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_unserialisable_json_never_touches_the_file(tmp_path):
    p = tmp_path / "r.json"
    with pytest.raises(TypeError):
        atomic_write_json(p, {"x": object()})
    assert not p.exists() and os.listdir(tmp_path) == []


def test_json_handles_numpy_values(tmp_path):
    import numpy as np

    p = atomic_write_json(tmp_path / "r.json", {"a": np.float32(1.5), "b": np.arange(3), "c": tmp_path})
    assert json.loads(p.read_text()) == {"a": 1.5, "b": [0, 1, 2], "c": str(tmp_path)}


def test_bad_mode():
    with pytest.raises(ValueError), atomic_open("x", "a"):
        pass
