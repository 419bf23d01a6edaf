"""The local executor: this machine, cells one after another, each in its own process. Needs no Ray.

Cells whose machine labels this machine does not carry are recorded ``unmatched`` (not failed): another machine's
share of the sweep.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from bench_compare.sweep.cell_run import run_cell
from bench_compare.sweep.machine import labels_text, machine_labels, matches
from bench_compare.sweep.matrix import Cell
from bench_compare.sweep.store import UNMATCHED, SweepStore


def run_local(cells: list[Cell], store: SweepStore, echo: Callable[[str], None],
              timeout_s: float | None = None) -> dict[str, int]:
    labels = machine_labels()
    node = {"id": socket.gethostname(), "labels": labels}
    counts: dict[str, int] = {}
    for i, cell in enumerate(cells, 1):
        if not matches(cell.machine, labels):
            status = store.write_failure(cell, f"this machine ({labels_text(labels)}) does not carry "
                                               f"{labels_text(cell.machine)}", status=UNMATCHED, node=node)
        else:
            outcome = run_cell(cell.to_dict(), node, timeout_s)
            status = store.write_outcome(cell, outcome)
            if outcome.get("error"):
                echo(f"  {cell.key}: {outcome['error']}")
        counts[status] = counts.get(status, 0) + 1
        echo(f"[{i}/{len(cells)}] {status}: {cell.key}")
    return counts
