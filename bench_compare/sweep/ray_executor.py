"""The Ray executor: cells dispatched over a Ray cluster, one benchmark per node at a time.

We write no scheduler: each cell is a Ray task that needs one ``bench_slot`` (a custom resource every node offers
exactly one of, :data:`~bench_compare.sweep.machine.BENCH_SLOT`) and no CPU from Ray's pool, so no two cells ever
share a machine; a cell with machine labels carries them as Ray's ``label_selector`` and runs only on nodes that
carry them (nodes advertise their CPU, ISA, cores and GPU as labels: :mod:`bench_compare.sweep.machine`). The task
starts the cell's process on its node and returns the outcome; the driver writes it into the sweep directory.

A node that dies mid-cell: Ray retries the task once (``max_retries=1``) on another node that matches; if none is
alive the driver cancels it and records it failed, and if the retry dies too Ray's error is recorded. Ctrl-C
cancels the cells in flight; finished cells stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench_compare.sweep.cell_run import run_cell
from bench_compare.sweep.machine import BENCH_SLOT, labels_text, matches
from bench_compare.sweep.matrix import Cell
from bench_compare.sweep.store import FAILED, UNMATCHED, SweepStore
from inference_engine.errors import GGUFParityError

MAX_RETRIES = 1  # a node that dies mid-cell: once more on another matching node, then failed
POLL_S = 1.0  # how often the driver looks for cells no live node can run any more
RAY_LABEL_PREFIX = "ray.io/"  # Ray's own labels (node id, ...), not the machine's


def import_ray():
    try:
        import ray
    except ImportError:
        raise GGUFParityError("the ray executor needs Ray: pip install -e \".[ray]\" (or run without --ray-address "
                              "for the local executor)") from None
    return ray


def run_cell_on_node(cell_dict: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
    """The Ray task: run the cell here, recording this node's id and labels."""
    import ray

    ctx = ray.get_runtime_context()
    labels = {k: v for k, v in dict(ctx.get_node_labels()).items() if not k.startswith(RAY_LABEL_PREFIX)}
    return run_cell(cell_dict, {"id": ctx.get_node_id(), "labels": labels}, timeout_s)


def bench_nodes(ray) -> list[dict[str, str]]:
    """The labels of the live nodes that offer a bench slot."""
    return [{k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith(RAY_LABEL_PREFIX)}
            for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(BENCH_SLOT, 0) >= 1]


def connect(ray, address: str) -> bool:
    """Connect to the cluster at ``address`` unless this process already is; True if we connected here."""
    if ray.is_initialized():
        return False
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise GGUFParityError(f"--ray-address {address}: cannot connect to a Ray cluster ({str(exc).splitlines()[0]}"
                              "); start one with `ray start --head` (docs/SWEEPS.md)") from None
    return True


def connect_cluster(address: str) -> None:
    """Connect to the cluster now (a wrong address is one line before anything is written); :func:`run_ray` then
    uses this connection."""
    connect(import_ray(), address)


def cluster_machines(address: str) -> list[dict[str, str]]:
    """The machine labels of the cluster's bench nodes (connecting, and staying connected for :func:`run_ray`)."""
    connect_cluster(address)
    return bench_nodes(import_ray())


def run_ray(cells: list[Cell], store: SweepStore, echo: Callable[[str], None], address: str = "auto",
            timeout_s: float | None = None, poll_s: float = POLL_S) -> dict[str, int]:
    ray = import_ray()
    connected_here = connect(ray, address)
    try:
        return _dispatch(ray, cells, store, echo, timeout_s, poll_s)
    finally:
        if connected_here:
            ray.shutdown()


def _dispatch(ray, cells, store, echo, timeout_s, poll_s) -> dict[str, int]:
    nodes = bench_nodes(ray)
    if not nodes:
        raise GGUFParityError(f"the Ray cluster has no node with a {BENCH_SLOT} resource; start each node with "
                              "`ray start ... $(python -m bench_compare.sweep.machine)` (docs/SWEEPS.md)")
    task = ray.remote(num_cpus=0, resources={BENCH_SLOT: 1}, max_retries=MAX_RETRIES)(run_cell_on_node)
    counts: dict[str, int] = {}
    done = 0

    def finished(cell: Cell, status: str, note: str = "") -> None:
        nonlocal done
        done += 1
        counts[status] = counts.get(status, 0) + 1
        echo(f"[{done}/{len(cells)}] {status}: {cell.key}{note}")

    pending: dict[Any, Cell] = {}
    for cell in cells:
        if not any(matches(cell.machine, labels) for labels in nodes):
            finished(cell, store.write_failure(cell, f"no node of the cluster carries {labels_text(cell.machine)}",
                                               status=UNMATCHED))
            continue
        options = {"label_selector": dict(cell.machine)} if cell.machine else {}
        pending[task.options(**options).remote(cell.to_dict(), timeout_s)] = cell
    checked = time.monotonic()
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=poll_s)
            for ref in ready:
                cell = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the node died again, the worker crashed, ...
                    error = f"{type(exc).__name__}: {_first_line(exc)} (after {MAX_RETRIES} retry)"
                    finished(cell, store.write_failure(cell, error), f" ({error})")
                    continue
                status = store.write_outcome(cell, outcome)
                finished(cell, status, f" ({outcome['error']})" if outcome.get("error") else "")
            if time.monotonic() - checked >= poll_s:  # every poll_s, however busy the cluster is
                _fail_orphans(ray, pending, store, finished)
                checked = time.monotonic()
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return counts


def _fail_orphans(ray, pending: dict[Any, Cell], store: SweepStore, finished) -> None:
    """Cells waiting for a node that no longer exists (their only matching node died): cancelled, failed."""
    live = bench_nodes(ray)
    for ref, cell in list(pending.items()):
        if not any(matches(cell.machine, labels) for labels in live):
            ray.cancel(ref, force=True)
            del pending[ref]
            error = (f"no live node carries {labels_text(cell.machine)} any more (the node that ran it left the cluster "
                     "and no other matching node is left to retry on)")
            finished(cell, store.write_failure(cell, error, status=FAILED), f" ({error})")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
