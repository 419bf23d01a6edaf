"""``bench-compare report RESULT.json...|SWEEP_DIR [--out DIR] [--history FILE] [--baseline FILE --max-regression
PCT]``: a sweep directory (``bench-compare sweep``) is reported through :mod:`bench_compare.sweep.report`."""

from __future__ import annotations

import math
from pathlib import Path

import click

from bench_compare import gate
from bench_compare import report as report_lib
from bench_compare.options import OutputFile, ReportDir
from bench_compare.results import utc_now
from inference_engine.errors import GGUFParityError

DEFAULT_MAX_REGRESSION_PCT = 10.0
EXIT_REGRESSION = 1


class GateFailed(click.ClickException):
    """The gate found a regression: exit 1 (user errors are 2)."""

    exit_code = EXIT_REGRESSION

    def show(self, file=None) -> None:
        click.echo(f"gate: {self.format_message()}", err=True)


def parse_percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise GGUFParityError(f"--max-regression must be a number (a percentage), got '{text}'") from None
    if value < 0 or not math.isfinite(value):
        raise GGUFParityError(f"--max-regression must be a non-negative percentage, got '{text}'")
    return value


@click.command("report")
@click.argument("results", nargs=-1, required=True, metavar="RESULT.json...|SWEEP_DIR")
@click.option("--out", "out_dir", default=None, type=ReportDir(empty=False), metavar="DIR",
              help="Report directory (default reports/report-<UTC time>).")
@click.option("--history", "history", default=None, type=OutputFile(), metavar="FILE",
              help="CSV file to append one row per result to.")
@click.option("--baseline", "baseline", default=None, metavar="FILE",
              help="Baseline JSON to gate against (for a sweep: also a baseline sweep directory, cell by cell).")
@click.option("--max-regression", "max_regression", default=None, metavar="PCT",
              help=f"Allowed regression in percent (default {DEFAULT_MAX_REGRESSION_PCT:g}); needs --baseline.")
@click.option("--write-baseline", "write_baseline", default=None, type=OutputFile(), metavar="FILE",
              help="Also write a baseline JSON (ratios / validation metrics) from these results.")
def report_cmd(results: tuple[str, ...], out_dir: str | None, history: str | None, baseline: str | None,
               max_regression: str | None, write_baseline: str | None) -> None:
    """Merge compare / validation / bench RESULT JSONs (or a sweep directory's cells, with the machines side by
    side) into one Markdown report with plots; optionally append them to a history CSV and fail (exit 1) when a
    ratio to llama.cpp or a validation metric got worse than the baseline by more than --max-regression percent."""
    if max_regression is not None and baseline is None:
        raise GGUFParityError("--max-regression needs --baseline FILE")
    pct = parse_percent(max_regression) if max_regression is not None else DEFAULT_MAX_REGRESSION_PCT
    sweep = _sweep_dir(results)
    if sweep is not None:  # a sweep directory: its cells' results, the merged report in SWEEP_DIR/report
        from bench_compare.sweep import report as sweep_report

        data = sweep_report.load_sweep(sweep)
        loaded = data.results
        checks = sweep_report.gate_sweep(data, baseline, pct) if baseline is not None else None
    else:
        loaded = [report_lib.load_result(p) for p in results]
        checks = gate.check(loaded, gate.load_baseline(baseline), pct) if baseline is not None else None
    gate_section = gate.gate_markdown(checks, pct, baseline) if checks is not None else None
    if sweep is not None:
        path = sweep_report.write_sweep_report(data, Path(out_dir) if out_dir else Path(sweep) / "report",
                                               gate_section)
    else:
        out = Path(out_dir) if out_dir else Path("reports") / f"report-{utc_now().replace(':', '').replace('-', '')}"
        path = report_lib.write_report(loaded, out, gate_section)
    click.echo(f"report: {path}")
    if history:
        click.echo(f"history: {report_lib.append_history(history, loaded)}")
    if write_baseline:
        click.echo(f"baseline: {gate.write_baseline(write_baseline, loaded)}")
    if checks is not None:
        bad = [c for c in checks if c.regressed]
        for c in bad:
            direction = ">=" if c.higher_is_better else "<="
            click.echo(f"regression: {c.metric} = {c.current:.4g}, baseline {c.baseline:.4g} (needs {direction} "
                       f"{c.limit:.4g}, {pct:g}% allowed) in {c.source}", err=True)
        if bad:
            raise GateFailed(f"FAILED: {len(bad)} of {len(checks)} metrics regressed by more than {pct:g}%")
        click.echo(f"gate: passed ({len(checks)} metrics within {pct:g}% of the baseline)")


def _sweep_dir(results: tuple[str, ...]) -> str | None:
    """The sweep directory among the arguments (it must come alone), or None."""
    dirs = [p for p in results if Path(p).is_dir()]
    if not dirs:
        return None
    if len(results) != 1:
        raise GGUFParityError(f"{dirs[0]}: a sweep directory is reported on its own, not with other results")
    from bench_compare.sweep.store import is_sweep_dir

    if not is_sweep_dir(dirs[0]):
        raise GGUFParityError(f"{dirs[0]}: a directory without sweep.json; give result JSON files or a sweep "
                              "directory (bench-compare sweep writes one)")
    return dirs[0]


report = report_cmd
