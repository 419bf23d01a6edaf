"""``bench-compare sweep FILE [--dry-run] [--out DIR] [--ray-address auto|ray://HOST:PORT] [--force]``: run a sweep
file's matrix (:mod:`bench_compare.sweep`) on this machine or a Ray cluster, then write its merged report."""

from __future__ import annotations

from pathlib import Path

import click

from bench_compare.options import Number
from bench_compare.sweep import matrix
from bench_compare.sweep import spec as spec_lib
from bench_compare.sweep.report import load_sweep, write_sweep_report
from bench_compare.sweep.store import DONE, FAILED, SweepStore
from inference_engine.errors import CheckFailed, GGUFParityError

DEFAULT_OUT_ROOT = Path("reports") / "sweeps"


def _out_dir(out: str | None, spec: spec_lib.SweepSpec) -> Path:
    path = Path(out) if out else DEFAULT_OUT_ROOT / spec.name
    if path.exists() and not path.is_dir():
        raise GGUFParityError(f"--out {path} is a file; give a directory for the sweep's results")
    return path


def _machines(spec: spec_lib.SweepSpec, ray_address: str | None) -> list[dict[str, str]] | None:
    """For ``machines = "each"``: the cluster's machines (Ray) or this one."""
    if not spec.each_machine:
        return None
    if ray_address:
        from bench_compare.sweep.ray_executor import cluster_machines

        return cluster_machines(ray_address)
    from bench_compare.sweep.machine import machine_labels

    return [machine_labels()]


def _entry_text(entry: dict) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in entry.items())


def dry_run_table(cells: list[matrix.Cell], store: SweepStore, force: bool) -> list[str]:
    lines = []
    for c in cells:
        state = "done" if store.is_done(c.key) and not force else "to-run"
        machine = ",".join(f"{k}={v}" for k, v in c.machine.items()) or "any machine"
        lines.append(f"{state:6} {c.key}\n        bench-compare {' '.join(c.argv('RESULT.json'))}   [{machine}]")
    return lines


@click.command("sweep")
@click.argument("file", metavar="FILE.toml")
@click.option("--out", "out", default=None, metavar="DIR",
              help="Sweep directory: results per cell and the report (default reports/sweeps/<name>).")
@click.option("--dry-run", is_flag=True, help="List the cells (and which are done) without running anything.")
@click.option("--ray-address", "ray_address", default=None, metavar="ADDRESS",
              help="Run on a Ray cluster: auto (the cluster this machine belongs to) | ray://HOST:PORT. "
                   "Default: the local executor, one cell after another on this machine.")
@click.option("--force", is_flag=True, help="Re-run cells that already finished.")
@click.option("--cell-timeout", "cell_timeout", default=None, type=Number(0.0, lo_open=True), metavar="SECONDS",
              help="Stop a cell that runs longer and record it failed.")
@click.option("--no-report", "no_report", is_flag=True, help="Skip the merged report at the end.")
def sweep(file: str, out: str | None, dry_run: bool, ray_address: str | None, force: bool,
          cell_timeout: float | None, no_report: bool) -> int:
    """Run the matrix of a sweep file (models x engines x backends x threads x numerics x commands x machines),
    one fresh process per cell, on this machine or a Ray cluster; results land in the sweep directory, a re-run
    skips finished cells, and the merged report is written at the end. Exit 1 if a cell failed."""
    spec = spec_lib.load_spec(file)
    store = SweepStore(_out_dir(out, spec))
    executor = "ray" if ray_address else "local"
    if ray_address is not None and not ray_address.strip():
        raise GGUFParityError("--ray-address must be auto or ray://HOST:PORT")
    if ray_address:
        from bench_compare.sweep.ray_executor import connect_cluster, import_ray

        import_ray()  # Ray missing, or no cluster at the address: one line now, before anything is written
        if not dry_run:
            connect_cluster(ray_address)
    machines = _machines(spec, ray_address)
    cells, dropped = matrix.cells(spec, machines)
    for i in matrix.unmatched_excludes(spec, machines):
        click.echo(f"sweep: exclude[{i}] ({_entry_text(spec.exclude[i])}) matches no combination of the axes: it "
                   "leaves nothing out", err=True)
    if dry_run:
        for line in dry_run_table(cells, store, force):
            click.echo(line)
        click.echo(f"{len(cells)} cells ({dropped} excluded), {executor} executor, results in {store.root}")
        return 0
    todo = [c for c in cells if force or not store.is_done(c.key)]
    store.write_manifest(spec, cells, executor)
    click.echo(f"sweep {spec.name}: {len(cells)} cells, {len(cells) - len(todo)} already done, {len(todo)} to run "
               f"({executor} executor) -> {store.root}", err=True)

    def echo(text: str) -> None:
        click.echo(text, err=True)

    try:
        if ray_address:
            from bench_compare.sweep.ray_executor import run_ray

            counts = run_ray(todo, store, echo, ray_address, cell_timeout)
        else:
            from bench_compare.sweep.local import run_local

            counts = run_local(todo, store, echo, cell_timeout)
    except KeyboardInterrupt:
        kept = sum(store.is_done(c.key) for c in cells)
        click.echo(f"interrupted: {kept} of {len(cells)} cells finished and kept in {store.root}; run the same "
                   "command again to resume", err=True)
        raise
    click.echo("sweep: " + ", ".join(f"{n} {s}" for s, n in counts.items()) if counts else "sweep: nothing to run")
    if not no_report:
        click.echo(f"report: {write_sweep_report(load_sweep(store.root), store.root / 'report')}")
    failed = counts.get(FAILED, 0)
    if failed:
        where = store.root / "cells" if no_report else store.root / "report" / "report.md"
        raise CheckFailed(f"{failed} of {len(todo)} cells failed (see {where}); the rest ({counts.get(DONE, 0)} done) "
                          "are kept, a re-run retries the failed ones")
    return 0
