"""Every CUDA kernel's share of GPU time from Nsight Compute's CSV, for the lent machine's `kernels` step where it
has `ncu` but no `nsys` (seen 2026-11-27 on an H200: /usr/local/cuda/bin/ncu only).

``python3 .device/ncu_kernels.py CSV [--last N] [--json OUT]`` reads ``ncu --csv --metrics gpu__time_duration.sum``
output (one row per profiled launch), keeps the last ``N`` launches (the compiled decode steps at the end of the
profiled run, after loading and warm-up), and prints each kernel name's launches, total and mean microseconds and
share, biggest first. ncu runs each launch alone (MLX_USE_CUDA_GRAPHS=0, clocks and caches left as they are), so
these are the kernels' own durations without the gaps between them: their sum against decode_profile's device
time per step says how much of a step is kernel work and how much is launching.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import defaultdict

UNITS_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def read_launches(text: str) -> list[tuple[str, float]]:
    """(kernel name, microseconds) per profiled launch, in launch order. ncu prints its own log lines (``==PROF==``)
    before the CSV: the table starts at the header row that names ``Kernel Name``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Kernel Name"' in line), None)
    if start is None:
        raise ValueError("no ncu CSV table here (no header row with \"Kernel Name\")")
    launches = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNITS_TO_US:
            raise ValueError(f"unknown time unit {unit!r} in ncu's CSV; known: {', '.join(UNITS_TO_US)}")
        value = float(row["Metric Value"].replace(",", ""))
        launches.append((short_name(row["Kernel Name"]), value * UNITS_TO_US[unit]))
    return launches


def short_name(name: str) -> str:
    """A kernel's name without its template arguments and parameter list (``void mlx::core::cu::qmv<...>(...)``
    -> ``mlx::core::cu::qmv``), so the launches of one kernel group together."""
    name = name.removeprefix("void ")
    for stop in ("<", "("):
        if stop in name:
            name = name[: name.index(stop)]
    return name.strip()


def summarize(launches: list[tuple[str, float]]) -> list[dict]:
    by_name: dict[str, list[float]] = defaultdict(list)
    for name, us in launches:
        by_name[name].append(us)
    total = sum(us for _, us in launches) or 1.0
    rows = [{"kernel": name, "launches": len(v), "total_us": sum(v), "mean_us": sum(v) / len(v),
             "share": sum(v) / total} for name, v in by_name.items()]
    return sorted(rows, key=lambda r: -r["total_us"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("--last", type=int, default=0, help="keep only the last N launches (0: all)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    try:
        with open(args.csv, encoding="utf-8", errors="replace") as f:
            launches = read_launches(f.read())
    except (OSError, ValueError) as exc:
        print(f"ncu_kernels: {exc}", file=sys.stderr)
        return 2
    if args.last > 0:
        launches = launches[-args.last:]
    rows = summarize(launches)
    total = sum(r["total_us"] for r in rows)
    print(f"{len(launches)} launches, {total:.0f} us of kernel time")
    print(f"{'kernel':70} {'launches':>8} {'total us':>10} {'mean us':>8} {'share':>6}")
    for r in rows[:40]:
        print(f"{r['kernel'][:70]:70} {r['launches']:8d} {r['total_us']:10.1f} {r['mean_us']:8.2f} {r['share']:6.1%}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"launches": len(launches), "total_us": total, "kernels": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
