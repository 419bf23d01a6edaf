"""A cell's private directory: named after the process running the cell, so a directory left by a process killed
mid-cell (a node that went away, a forced cancel) is removed by the next cell on that machine, and nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from bench_compare.sweep.cell_run import SCRATCH_PREFIX, remove_stale_scratch, run_cell
from bench_compare.sweep.matrix import Cell


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_directories_of_processes_that_are_gone_are_removed(tmp_path):
    gone = tmp_path / f"{SCRATCH_PREFIX}{dead_pid()}-abc"
    (gone / "report").mkdir(parents=True)
    (gone / "report" / "partial.json").write_text("{")  # what a killed cell may have left half-written
    kept = [tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-live",  # a cell running now
            tmp_path / f"{SCRATCH_PREFIX}x1y2z3",  # no pid in the name: not one of ours to judge
            tmp_path / f"{SCRATCH_PREFIX}{dead_pid()}",  # no "-" after the pid
            tmp_path / "other-dir"]
    for path in kept:
        path.mkdir()
    a_file = tmp_path / f"{SCRATCH_PREFIX}{dead_pid()}-file"
    a_file.write_text("not a directory")

    assert remove_stale_scratch(str(tmp_path)) == [str(gone)]
    assert not gone.exists()
    assert all(path.is_dir() for path in kept) and a_file.is_file()


def test_a_missing_temporary_directory_is_not_an_error(tmp_path):
    assert remove_stale_scratch(str(tmp_path / "absent")) == []


def test_a_cell_removes_what_killed_cells_left_and_its_own_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left = tmp_path / f"{SCRATCH_PREFIX}{dead_pid()}-left"
    left.mkdir()
    cell = Cell(command="bench", model=str(tmp_path / "missing.gguf"), engine="ours", backend="numpy", threads=1,
                numerics=None)
    outcome = run_cell(cell.to_dict(), {"id": "here", "labels": {}}, timeout_s=120)
    assert outcome["status"] == "failed" and "missing.gguf" in outcome["error"]  # a fast, real cell
    assert list(tmp_path.iterdir()) == []
