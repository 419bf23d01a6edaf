"""``bench-compare report SWEEP_DIR``: the merged report of a sweep's cells (compare ratios with and without
intervals, validation verdicts), and the regression gate over the whole matrix against a baseline sweep or file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from sweep_helpers import COMPARE_ARGS, records, run_cli, write_sweep

from bench_compare import gate
from bench_compare.report import load_result


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, sweep_model):
    folder = tmp_path_factory.mktemp("report_sweep")
    path = write_sweep(folder, f'models = ["{sweep_model}"]\nengines = ["ours:numpy"]\nthreads = [1]\n'
                               f'[commands.compare]\nargs = {COMPARE_ARGS}\n[commands.validate]\n')
    run = subprocess.run([sys.executable, "-m", "bench_compare.cli", "sweep", str(path), "--out", str(folder / "out"),
                          "--no-report"], capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr
    return folder / "out"


def _copy(src, dst, edit=None):
    shutil.copytree(src, dst)
    for key, rec in records(dst).items():
        path = dst / "cells" / key / "result.json"
        result = json.loads(path.read_text())
        if edit and rec["cell"]["command"] == "compare":
            edit(result)
            path.write_text(json.dumps(result))
    return dst


def _compare_result(folder) -> dict:
    key = next(k for k, r in records(folder).items() if r["cell"]["command"] == "compare")
    return json.loads((folder / "cells" / key / "result.json").read_text())


def test_ratios_show_their_interval_where_the_result_has_one(capsys, sweep_dir, tmp_path):
    tests = list(_compare_result(sweep_dir)["ratios"])

    def with_intervals(r):
        r["ratios"] = {t: 1.5 for t in tests}
        r["ratio_intervals"] = {t: {"ratio": 1.5, "low": 1.25, "high": 1.75, "confidence": 0.95, "verdict": "faster",
                                    "method": "test"} for t in tests}

    def without(r):
        r["ratios"] = {t: 0.75 for t in tests}
        r.pop("ratio_intervals", None)

    for name, edit, entry in (("with", with_intervals, ": 1.50 [1.25-1.75] faster |"), ("bare", without, ": 0.75 |")):
        folder = _copy(sweep_dir, tmp_path / name, edit)
        code, out, err = run_cli(capsys, "report", folder)
        assert code == 0, err
        text = (folder / "report" / "report.md").read_text()
        assert out.strip() == f"report: {folder / 'report' / 'report.md'}"
        section = text.split("## Compare ratios per machine", 1)[1].split("## Models x machines", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| ") and " vs " in line]
        assert len(rows) == len(tests) and all(row.endswith(entry) for row in rows), rows
        assert "[" not in section.split("###", 1)[1] or name == "with"


def test_a_single_repetition_ratio_has_no_interval_and_says_so():
    from bench_compare.sweep.report import ratio_text

    one = {"ratios": {"tg4": 1.4}, "ratio_intervals": {"tg4": {"ratio": 1.4, "low": None, "high": None, "n": 1,
                                                               "confidence": 0.95, "verdict": "unknown"}}}
    assert ratio_text(one, "tg4") == "1.40 [n=1] unknown"  # -r 1: no estimate of the noise, and no crash
    same = {"ratios": {"tg4": 1.02}, "ratio_intervals": {"tg4": {"ratio": 1.02, "low": 0.9, "high": 1.15, "n": 3,
                                                                "confidence": 0.95, "verdict": "same"}}}
    assert ratio_text(same, "tg4") == "1.02 [0.90-1.15] same within noise"  # compare's own words


def test_validation_verdicts_and_spread_are_in_the_report(capsys, sweep_dir, tmp_path):
    folder = _copy(sweep_dir, tmp_path / "copy")
    code, _, err = run_cli(capsys, "report", folder, "--out", tmp_path / "rep")
    assert code == 0, err
    text = (tmp_path / "rep" / "report.md").read_text()
    verdicts = text.split("## Validation verdicts", 1)[1].split("##", 1)[0]
    assert "ours:numpy · t1" in verdicts and "PASSED" in verdicts
    spread = text.split("## Spread between repetitions", 1)[1]
    assert spread.count("| ours:numpy |") == spread.count("| llamacpp |") == len(_compare_result(folder)["ratios"])


def test_the_gate_covers_the_matrix_cell_by_cell(capsys, sweep_dir, tmp_path):
    def slower(r):  # every ratio halved, with an interval that lies wholly below the 10% limit
        r["ratios"] = {t: v * 0.5 for t, v in r["ratios"].items()}
        r["ratio_intervals"] = {t: {"ratio": v, "low": v * 0.9, "high": v * 1.1, "confidence": 0.95,
                                    "verdict": "slower", "method": "test"} for t, v in r["ratios"].items()}

    same = _copy(sweep_dir, tmp_path / "same")
    code, out, err = run_cli(capsys, "report", same, "--baseline", sweep_dir, "--max-regression", "10")
    assert code == 0, err
    assert "gate: passed" in out
    worse = _copy(sweep_dir, tmp_path / "worse", slower)
    code, out, err = run_cli(capsys, "report", worse, "--baseline", sweep_dir, "--max-regression", "10")
    # the sweep's verdict is the project's gate (bench_compare.gate) applied to each cell against its baseline cell
    expected = []
    for key in records(worse):
        expected += gate.check([load_result(worse / "cells" / key / "result.json")],
                               gate.load_baseline(sweep_dir / "cells" / key / "result.json"), 10.0)
    bad = [c for c in expected if c.regressed]
    assert len(bad) == len(_compare_result(sweep_dir)["ratios"]) and code == 1 and f"FAILED: {len(bad)} of {len(expected)} metrics" in err
    assert err.count("regression: ") == len(bad)
    assert "## Regression gate" in (worse / "report" / "report.md").read_text()
    baseline_file = tmp_path / "base.json"  # a baseline file applies to every cell
    code, out, err = run_cli(capsys, "report", sweep_dir, "--write-baseline", baseline_file, "--out", tmp_path / "r")
    assert code == 0, err
    code, _, err = run_cli(capsys, "report", worse, "--baseline", baseline_file, "--out", tmp_path / "r2")
    assert code == 1 and "regression: " in err


def test_a_directory_that_is_not_a_sweep_is_one_line(capsys, tmp_path, sweep_dir):
    code, _, err = run_cli(capsys, "report", tmp_path)
    assert code == 2 and err.strip() == (f"error: {tmp_path}: a directory without sweep.json; give result JSON files "
                                         "or a sweep directory (bench-compare sweep writes one)")
    result = next((sweep_dir / "cells").glob("*/result.json"))
    code, _, err = run_cli(capsys, "report", sweep_dir, result)
    assert code == 2 and "a sweep directory is reported on its own" in err


def test_history_gets_a_row_per_finished_cell(capsys, sweep_dir, tmp_path):
    history = tmp_path / "history.csv"
    code, out, err = run_cli(capsys, "report", sweep_dir, "--out", tmp_path / "rep", "--history", history)
    assert code == 0, err
    rows = history.read_text().strip().splitlines()
    assert len(rows) == 1 + len(records(sweep_dir)) and f"history: {history}" in out


def test_an_http_engine_s_ratios_per_test_and_metric_are_reported(capsys, sweep_dir, tmp_path):
    def http(r):  # the cell's result as an HTTP engine's compare would write it (bench_compare.adapters.http_bench)
        r.clear()
        r.update({"kind": "http-compare", "schema_version": 1, "engine": "openai:http://127.0.0.1:9",
                  "reference": "llamacpp-server", "ratios": {"tg128": {"ttft": 0.8, "tpot": 1.25}}})

    folder = _copy(sweep_dir, tmp_path / "http", http)
    code, _, err = run_cli(capsys, "report", folder)
    assert code == 0, err
    text = (folder / "report" / "report.md").read_text()
    http_rows = text.split("### HTTP engines", 1)[1].split("##", 1)[0]
    assert "tg128 ttft 0.80, tg128 tpot 1.25" in http_rows
    assert "### tg128 tpot" in text and (folder / "report" / "heatmap-tg128-tpot.png").is_file()
