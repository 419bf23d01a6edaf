"""Sweep test helpers: cells are real ``bench-compare`` processes on a tiny GGUF with the NumPy backend (about a
second each); :func:`write_sweep` writes a sweep file, :func:`run_cli` runs ``bench-compare`` in this process."""

from __future__ import annotations

import json
from pathlib import Path

from bench_compare.cli import main

# fast cells: a second or two each on the tiny model
COMPARE_ARGS = '["-p", "8", "-n", "4", "-d", "0", "-r", "2", "--no-cold", "--no-progress"]'
BENCH_ARGS = '["-p", "8", "-n", "4", "-r", "2"]'


def write_sweep(folder: Path, body: str, name: str = "sweep.toml") -> Path:
    path = folder / name
    path.write_text(body, encoding="utf-8")
    return path


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def records(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sorted((sweep_dir / "cells").glob("*/cell.json"))}
