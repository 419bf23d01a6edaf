"""The merged report of a sweep directory (``bench-compare report SWEEP_DIR``, and at a sweep's end).

Every cell's result is read through :func:`bench_compare.report.load_result` (the typed records) and drawn with the
report's own helpers; what a sweep adds is the machine axis: the machines (from the labels of the nodes the cells
ran on: CPU, ISA, cores, GPU), the compare ratios per machine, a heatmap of models x machines for each test, the
validation verdicts per cell, the spread between repetitions, the failed cells with their log tails, and the
regression gate over the whole matrix (:mod:`bench_compare.gate`, against a baseline file or a baseline sweep
directory, cell by cell). A ratio with an interval (``ratio_intervals``) is shown as ``r [low-high] verdict``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_compare import gate
from bench_compare.intervals import interval_cells
from bench_compare.report import (
    KIND_BENCH,
    KIND_COMPARE,
    KIND_HTTP_COMPARE,
    KIND_VALIDATION,
    RATIO_KINDS,
    bench_rows,
    compare_rows,
    format_value,
    load_result,
    markdown_table,
    ratios_of,
    validation_metrics,
)
from bench_compare.results import utc_now
from bench_compare.sweep.store import DONE, SweepStore, is_sweep_dir
from inference_engine.errors import GGUFParityError
from inference_engine.store.atomic import atomic_write_bytes, atomic_write_text
from validation.plots import new_figure, png_bytes
from validation.provenance import machine_label

STATUS_ORDER = ("done", "failed", "unmatched", "pending")


@dataclass
class SweepData:
    root: Path
    manifest: dict[str, Any]
    records: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> cell.json ({} when pending)
    results: list[dict[str, Any]] = field(default_factory=list)  # loaded results of done cells, "_cell" added


def load_sweep(root: str | Path) -> SweepData:
    if not is_sweep_dir(root):
        raise GGUFParityError(f"{root}: not a sweep directory (no sweep.json; bench-compare sweep FILE writes one)")
    store = SweepStore(root)
    data = SweepData(Path(root), store.manifest())
    for key in data.manifest["cells"]:
        rec = store.record(key) or {"key": key, "status": "pending"}
        if rec.get("status") == DONE and not store.is_done(key):
            rec = {**rec, "status": "pending"}
        data.records[key] = rec
        if rec["status"] == DONE:
            result = load_result(store.result_path(key))
            result["_cell"] = rec
            data.results.append(result)
    return data


def machine_labels_of(rec: dict[str, Any]) -> dict[str, str]:
    return dict((rec.get("node") or {}).get("labels") or {})


def machine_name(labels: dict[str, str]) -> str:
    """``AMD-EPYC avx512, 2 cores, no GPU``: a machine as its node's labels describe it."""
    if not labels:
        return "?"
    gpu = labels.get("gpu-name") or ("GPU" if labels.get("gpu") == "true" else "no GPU")
    cores = f"{labels['cores']} cores" if labels.get("cores") else None
    head = " ".join(x for x in (labels.get("cpu"), labels.get("isa")) if x) or "?"
    return ", ".join(x for x in (head, cores, gpu) if x)


def variant_name(cell: dict[str, Any]) -> str:
    """A cell's row in the tables: model, engine (and its device), threads, numerics (the machine is the column)."""
    model = Path(cell["model"]).name if cell["model"].endswith(".gguf") else cell["model"]
    bits = [model, cell["engine"] + (f" on {cell['device']}" if cell.get("device") else "")]
    if cell.get("threads") is not None:
        bits.append(f"t{cell['threads']}")
    if cell.get("numerics"):
        bits.append(cell["numerics"])
    return " · ".join(bits)


def ratio_text(result: dict[str, Any], test: str) -> str:
    """``1.23`` or, with an interval, ``1.23 [1.10-1.31] faster``."""
    ratio = (result.get("ratios") or {}).get(test)
    interval = (result.get("ratio_intervals") or {}).get(test)
    if isinstance(interval, dict) and interval.get("ratio", ratio) is not None:
        bounds, verdict = interval_cells(interval)  # compare's own cells: the same ends and words in both reports
        return f"{interval.get('ratio', ratio):.2f} [{bounds}] {verdict}"
    return "-" if ratio is None or not math.isfinite(ratio) else f"{ratio:.2f}"


def _short(value: float | None) -> str:
    """``433``, ``90.3``, ``1.25``: three significant digits, whole numbers from 100 on (the README's tables)."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _by_machine(data: SweepData) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in data.results:
        out.setdefault(machine_name(machine_labels_of(r["_cell"])), []).append(r)
    return out


def machines_section(data: SweepData) -> list[str]:
    rows = {}
    for rec in data.records.values():
        labels = machine_labels_of(rec)
        if not labels:
            continue
        name = machine_name(labels)
        row = rows.setdefault(name, {"labels": labels, "done": 0, "failed": 0, "measured": set()})
        if rec["status"] in ("done", "failed"):
            row[rec["status"]] += 1
    for r in data.results:
        machine = r.get("machine") or {}
        if machine.get("cpu_isa"):
            rows[machine_name(machine_labels_of(r["_cell"]))]["measured"].add(machine_label(machine))
    table = [[name, row["labels"].get("cpu", "?"), row["labels"].get("isa-full") or row["labels"].get("isa", "?"),
              row["labels"].get("cores", "?"), row["labels"].get("gpu-name") or row["labels"].get("gpu", "?"),
              str(row["done"]), str(row["failed"]), "; ".join(sorted(row["measured"])) or "-"]
             for name, row in rows.items()]
    return ["## Machines", "", ("As the nodes' labels advertise them; the last column is what the cells' own "
                                "results recorded about the CPU they measured."), "",
            markdown_table(["machine", "CPU", "ISA", "cores", "GPU", "done", "failed", "measured on"], table,
                           "lllrlrrl"), ""]


def ratio_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The results with ratios to llama.cpp: compare results, in-process and over HTTP."""
    return [r for r in results if r["_kind"] in RATIO_KINDS]


def compare_tests(results: list[dict[str, Any]]) -> list[str]:
    """Every ratio's name, in order (an HTTP compare's as ``test metric``, :func:`bench_compare.report.ratios_of`)."""
    tests: list[str] = []
    for r in ratio_results(results):
        for t in ratios_of(r):
            if t not in tests:
                tests.append(t)
    return tests


def ratios_section(data: SweepData) -> list[str]:
    """Per machine, the README's layout: a row per test, a column per cell, ``ours vs llama.cpp: ratio``."""
    lines = ["## Compare ratios per machine", "",
             ("Each entry: ours vs llama.cpp (medians): the ratio, oriented so that higher is better for ours "
              "(throughput ours / llama.cpp, time and memory llama.cpp / ours), measured in the same run on that "
              "machine; with an interval, its confidence interval and the verdict."), ""]
    for machine, results in _by_machine(data).items():
        compares = [r for r in results if r["_kind"] == KIND_COMPARE]
        if not compares:
            continue
        entries: dict[str, dict[int, str]] = {}  # "test unit" -> column -> entry
        for col, r in enumerate(compares):
            for row in compare_rows(r):
                values = " vs ".join(_short(v) for v in (row["ours"], row["reference"]))
                entries.setdefault(f"{row['test']} {row['unit']}", {})[col] = f"{values}: {ratio_text(r, row['test'])}"
        table = [[test] + [by_col.get(col, "-") for col in range(len(compares))] for test, by_col in entries.items()]
        lines += [f"### {machine}", "", markdown_table(["test"] + [variant_name(r["_cell"]["cell"]) for r in compares],
                                                      table), ""]
    return lines + http_ratios_section(data)


def http_ratios_section(data: SweepData) -> list[str]:
    """HTTP engines' ratios to llama.cpp's server per test and metric (TTFT, TPOT, ...), a row per cell."""
    rows = []
    for r in data.results:
        if r["_kind"] == KIND_HTTP_COMPARE:
            ratios = ratios_of(r)
            rows.append([variant_name(r["_cell"]["cell"]), machine_name(machine_labels_of(r["_cell"])),
                         ", ".join(f"{name} {value:.2f}" for name, value in ratios.items()) or "-"])
    if not rows:
        return []
    return ["### HTTP engines", "", markdown_table(["cell", "machine", "ratios (higher is better for the engine)"],
                                                  rows, "lll"), ""]


def heatmap_grid(data: SweepData, test: str) -> tuple[list[str], list[str], list[list[float]]]:
    """Rows (cell variants) x columns (machines) of the ratio for ``test``; NaN where no cell measured it."""
    values: dict[tuple[str, str], float] = {}
    rows: list[str] = []
    cols: list[str] = []
    for r in data.results:
        ratio = ratios_of(r).get(test) if r["_kind"] in RATIO_KINDS else None
        if ratio is None:
            continue
        row, col = variant_name(r["_cell"]["cell"]), machine_name(machine_labels_of(r["_cell"]))
        rows += [row] if row not in rows else []
        cols += [col] if col not in cols else []
        values[(row, col)] = float(ratio)
    return rows, cols, [[values.get((row, col), math.nan) for col in cols] for row in rows]


def heatmap_png(test: str, rows: list[str], cols: list[str], grid: list[list[float]]) -> bytes:
    """Models x machines, coloured by log2 of the ratio (green: ours faster, red: slower), values written in."""
    import numpy as np
    from matplotlib import colormaps

    fig = new_figure(3.0 + 1.9 * len(cols), 1.5 + 0.45 * len(rows), layout=None)
    ax = fig.add_subplot(1, 1, 1)
    arr = np.array(grid, dtype=float)
    logs = np.log2(np.where(arr > 0, arr, np.nan))
    span = max(float(np.nanmax(np.abs(logs))) if np.isfinite(logs).any() else 1.0, 0.25)
    cmap = colormaps["RdYlGn"].with_extremes(bad="#dddddd")  # grey: no cell measured it there
    image = ax.imshow(np.ma.masked_invalid(logs), cmap=cmap, vmin=-span, vmax=span, aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if math.isfinite(arr[i, j]):
                dark = abs(logs[i, j]) > 0.6 * span  # the ends of the colour map: white text
                ax.text(j, i, f"{arr[i, j]:.2f}", ha="center", va="center", fontsize=9, gid=f"ratio:{i}:{j}",
                        color="white" if dark else "black")
    ax.set_xticks(range(len(cols)), [c.replace(", ", "\n") for c in cols], fontsize=8)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_title(f"{test}: ours / llama.cpp per machine")
    fig.colorbar(image, ax=ax, label="log2 ratio (above 0: ours faster)")
    return png_bytes(fig)


def heatmaps_section(data: SweepData, out: Path) -> list[str]:
    lines = ["## Models x machines", ""]
    for test in compare_tests(data.results):
        rows, cols, grid = heatmap_grid(data, test)
        name = "heatmap-" + re.sub(r"[^A-Za-z0-9.+-]+", "-", test) + ".png"
        atomic_write_bytes(out / name, heatmap_png(test, rows, cols, grid))
        table = [[row] + ["-" if math.isnan(v) else f"{v:.2f}" for v in values] for row, values in zip(rows, grid)]
        lines += [f"### {test}", "", markdown_table(["cell"] + cols, table), "", f"![{test} heatmap]({name})", ""]
    return lines


def validation_section(data: SweepData) -> list[str]:
    rows = []
    for r in data.results:
        if r["_kind"] != KIND_VALIDATION:
            continue
        m = validation_metrics(r)
        rows.append([variant_name(r["_cell"]["cell"]), machine_name(machine_labels_of(r["_cell"])),
                     "PASSED" if m["passed"] else "**FAILED**"]
                    + [f"{m[k]:.3g}" if k in m else "-" for k in ("kld_mean", "top1_agreement", "worst_nmse")])
    if not rows:
        return []
    return ["## Validation verdicts", "", markdown_table(["cell", "machine", "verdict", "kld_mean", "top1",
                                                          "worst nmse"], rows, "llllrr"), ""]


def spread_section(data: SweepData) -> list[str]:
    """Per cell and test: the median and the coefficient of variation of the repetitions, for each engine."""
    rows = []
    for r in data.results:
        where = f"{variant_name(r['_cell']['cell'])} @ {machine_name(machine_labels_of(r['_cell']))}"
        if r["_kind"] == KIND_COMPARE:
            stats = {(x["test"], x["engine"]): x for x in r.get("results", [])}
            for row in compare_rows(r):
                for engine in (r.get("ours"), r.get("reference")):
                    x = stats.get((row["test"], engine))
                    if x is not None:
                        rows.append([where, row["test"], engine, format_value(x["median"], x["unit"]),
                                     _cv(x.get("stddev"), x.get("mean")), str(x.get("n", "?"))])
        elif r["_kind"] == KIND_BENCH:
            for b in bench_rows(r):
                rows.append([where, b["test"], r.get("engine") or "?", f"{b['avg_ts']:.2f} t/s",
                             _cv(b["stddev_ts"], b["avg_ts"]), str(b["n"])])
    if not rows:
        return []
    return ["## Spread between repetitions", "", ("Coefficient of variation (stddev / mean) of each measurement's "
                                                  "repetitions: a ratio is only as steady as the runs behind it."), "",
            markdown_table(["cell", "test", "engine", "median", "cv", "reps"], rows, "llllrr"), ""]


def _cv(stddev: Any, mean: Any) -> str:
    try:
        return f"{100.0 * float(stddev) / float(mean):.1f}%"
    except (TypeError, ValueError, ZeroDivisionError):
        return "-"


def failures_section(data: SweepData) -> list[str]:
    lines = []
    for key, rec in data.records.items():
        if rec["status"] != "failed":
            continue
        lines += [f"### `{key}`", "", f"on {machine_name(machine_labels_of(rec))}: {rec.get('error', '?')}", ""]
        if rec.get("log_tail"):
            lines += ["```", rec["log_tail"], "```", ""]
    return ["## Failed cells", ""] + lines if lines else []


def gate_sweep(data: SweepData, baseline: str, pct: float) -> list[gate.Check]:
    """The gate over every cell: against a baseline file (each result), or a baseline sweep cell by cell."""
    gated = [r for r in data.results if r["_kind"] in gate.GATED_KINDS]
    if not is_sweep_dir(baseline):
        return gate.check(gated, gate.load_baseline(baseline), pct)
    base = SweepStore(baseline)
    checks: list[gate.Check] = []
    for r in gated:
        key = r["_cell"]["key"]
        if base.is_done(key):
            checks += gate.check([r], gate.load_baseline(base.result_path(key)), pct)
    if not checks:
        raise GGUFParityError(f"{baseline}: the baseline sweep has no finished cell in common with {data.root}")
    return checks


def render(data: SweepData, out: Path, gate_section: str | None = None) -> str:
    counts = {s: sum(rec["status"] == s for rec in data.records.values()) for s in STATUS_ORDER}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines = [f"# Sweep report: {data.manifest.get('name', '?')}", "",
             (f"Generated {utc_now()} from `{data.root}` (sweep file `{data.manifest.get('file', '?')}`, executor "
              f"{data.manifest.get('executor', '?')}): {len(data.records)} cells, {summary}."), ""]
    for section in (machines_section(data), ratios_section(data), heatmaps_section(data, out),
                    validation_section(data), spread_section(data), failures_section(data)):
        lines += section
    if gate_section:
        lines += [gate_section, ""]
    return "\n".join(lines)


def write_sweep_report(data: SweepData, out_dir: str | Path, gate_section: str | None = None) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.md"
    atomic_write_text(path, render(data, out, gate_section))
    return path
