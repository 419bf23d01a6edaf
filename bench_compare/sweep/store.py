"""A sweep's output directory: a manifest, and one folder per cell keyed by the cell.

::

    SWEEP_DIR/sweep.json                 kind gguf-parity-sweep: the sweep file's text, the cells' keys in order
    SWEEP_DIR/cells/<key>/cell.json      the cell, its status (done / failed / unmatched), node, times, error
    SWEEP_DIR/cells/<key>/result.json    the command's own result JSON (done cells only)
    SWEEP_DIR/cells/<key>/log.txt        the command's output

Every file is written atomically; a cell is finished when its ``cell.json`` says ``done`` and its ``result.json``
is there (the result is written first). A re-run skips finished cells; failed ones run again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench_compare.results import utc_now
from bench_compare.sweep.matrix import Cell
from bench_compare.sweep.spec import SweepSpec
from inference_engine.errors import GGUFParityError
from inference_engine.store.atomic import atomic_write_json, atomic_write_text

SWEEP_KIND = "gguf-parity-sweep"
MANIFEST = "sweep.json"
DONE, FAILED, UNMATCHED = "done", "failed", "unmatched"


def is_sweep_dir(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


class SweepStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cell_dir(self, key: str) -> Path:
        return self.root / "cells" / key

    def write_manifest(self, spec: SweepSpec, cells: list[Cell], executor: str) -> None:
        """The manifest; cells recorded here by an earlier run of the same sweep file stay listed (the same
        ``machines = "each"`` sweep run on several machines into one directory)."""
        keys = [c.key for c in cells]
        if (self.root / MANIFEST).is_file():
            old = self.manifest()
            if old.get("spec") == spec.text:
                keys = [k for k in old["cells"] if k not in keys and self.record(k) is not None] + keys
        atomic_write_json(self.root / MANIFEST, {
            "kind": SWEEP_KIND, "name": spec.name, "file": str(spec.path), "spec": spec.text, "executor": executor,
            "updated": utc_now(), "cells": keys})

    def manifest(self) -> dict[str, Any]:
        path = self.root / MANIFEST
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise GGUFParityError(f"{path}: not a readable sweep manifest ({exc.__class__.__name__})") from None
        if not isinstance(obj, dict) or obj.get("kind") != SWEEP_KIND or not isinstance(obj.get("cells"), list):
            raise GGUFParityError(f"{path}: not a sweep manifest (kind {SWEEP_KIND} with a list of cells)")
        return obj

    def record(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.cell_dir(key) / "cell.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return None

    def result_path(self, key: str) -> Path:
        return self.cell_dir(key) / "result.json"

    def is_done(self, key: str) -> bool:
        rec = self.record(key)
        return rec is not None and rec.get("status") == DONE and self.result_path(key).is_file()

    def write_outcome(self, cell: Cell, outcome: dict[str, Any]) -> str:
        """Store a cell's outcome (from :func:`~bench_compare.sweep.cell_run.run_cell`); its status."""
        folder = self.cell_dir(cell.key)
        atomic_write_text(folder / "log.txt", outcome.get("log") or "")
        if outcome["status"] == DONE:
            atomic_write_json(self.result_path(cell.key), outcome["result"])
        else:  # a forced re-run that failed: no earlier result stays beside the failure
            self.result_path(cell.key).unlink(missing_ok=True)
        record = {"cell": cell.to_dict(), "key": cell.key, "recorded": utc_now(),
                  **{k: v for k, v in outcome.items() if k not in ("result", "log")}}
        atomic_write_json(folder / "cell.json", record)
        return outcome["status"]

    def write_failure(self, cell: Cell, error: str, status: str = FAILED, **extra: Any) -> str:
        """A cell that ended without an outcome (its node died, nothing can run it)."""
        self.result_path(cell.key).unlink(missing_ok=True)
        atomic_write_json(self.cell_dir(cell.key) / "cell.json", {
            "cell": cell.to_dict(), "key": cell.key, "recorded": utc_now(), "status": status, "error": error,
            "log_tail": "", **extra})
        return status
