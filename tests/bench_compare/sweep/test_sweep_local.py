"""The local executor end to end: real cells (fresh ``bench-compare`` processes on a tiny model), a failing cell
that does not stop the sweep, cells for another machine, resume, --force, Ctrl-C, and no Ray needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fixtures.child_signals import children_get_default_sigint
from sweep_helpers import BENCH_ARGS, COMPARE_ARGS, records, run_cli, write_sweep

from bench_compare.report import load_result
from bench_compare.sweep.machine import machine_labels

SWEEP = """
name = "local"
models = ["{model}", "missing-model.gguf"]
backends = ["numpy"]
threads = [1]
machines = [{{}}, {{ cpu = "no-such-cpu" }}]
[commands.compare]
args = {compare}
[commands.bench]
args = {bench}
"""


def sweep_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "bench_compare.cli", "sweep", *map(str, args)]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory, sweep_model):
    folder = tmp_path_factory.mktemp("local_sweep")
    path = write_sweep(folder, SWEEP.format(model=sweep_model, compare=COMPARE_ARGS, bench=BENCH_ARGS))
    out = folder / "out"
    run = subprocess.run(sweep_cmd(path, "--out", out), capture_output=True, text=True, check=False, timeout=300)
    return path, out, run


def test_every_cell_ends_done_failed_or_unmatched_and_the_sweep_goes_on(local_sweep):
    _, out, run = local_sweep
    assert run.returncode == 1, run.stderr  # a failed cell: exit 1, after every other cell ran
    assert "2 of 8 cells failed" in run.stderr and "(2 done) are kept" in run.stderr
    recs = records(out)
    assert len(recs) == 8
    by_status = {s: [r for r in recs.values() if r["status"] == s] for s in ("done", "failed", "unmatched")}
    assert [len(by_status[s]) for s in ("done", "failed", "unmatched")] == [2, 2, 4]
    here = machine_labels()
    for r in by_status["done"]:
        assert r["cell"]["model"].endswith(".gguf") and "missing" not in r["cell"]["model"]
        assert r["node"]["labels"] == here and r["returncode"] == 0 and r["ended"] > r["started"]
        result = load_result(out / "cells" / r["key"] / "result.json")  # the command's own typed JSON
        assert result["kind"] == {"compare": "gguf-parity-compare", "bench": "gguf-parity-bench"}[r["cell"]["command"]]
        threads = result["settings"].get("n_threads") or result["settings"].get("threads")  # compare | bench
        assert threads in (1, [1])  # the threads axis reached the command
    for r in by_status["failed"]:
        assert "missing-model.gguf" in r["cell"]["model"] and r["returncode"] == 2
        assert r["error"].startswith("exit code 2: error:") and "missing-model.gguf" in r["log_tail"]
        assert not (out / "cells" / r["key"] / "result.json").exists()
    for r in by_status["unmatched"]:
        assert r["cell"]["machine"] == {"cpu": "no-such-cpu"} and "does not carry cpu=no-such-cpu" in r["error"]


def test_the_merged_report_is_written_at_the_end(local_sweep):
    _, out, run = local_sweep
    text = (out / "report" / "report.md").read_text()
    assert f"report: {out / 'report' / 'report.md'}" in run.stdout
    assert "4 done" not in text and "2 done, 2 failed, 4 unmatched" in text
    assert "## Compare ratios per machine" in text and "## Spread between repetitions" in text
    assert "## Failed cells" in text and "missing-model.gguf" in text
    assert (out / "report" / "heatmap-pp8.png").stat().st_size > 1000


def test_a_rerun_skips_finished_cells_and_force_reruns_them(local_sweep):
    path, out, _ = local_sweep
    before = records(out)
    done = sorted(k for k, r in before.items() if r["status"] == "done")
    run = subprocess.run(sweep_cmd(path, "--out", out, "--no-report"), capture_output=True, text=True, check=False, timeout=300)
    assert "8 cells, 2 already done, 6 to run" in run.stderr
    after = records(out)
    assert all(after[k] == before[k] for k in done)  # not run again
    assert all(after[k]["recorded"] >= before[k]["recorded"] for k in after)
    dry = subprocess.run(sweep_cmd(path, "--out", out, "--dry-run"), capture_output=True, text=True, check=False, timeout=60)
    listed = [line.split()[:2] for line in dry.stdout.splitlines() if line and not line.startswith(" ")][:-1]
    assert sorted(k for state, k in listed if state == "done") == done
    assert dry.stdout.strip().endswith(f"8 cells (0 excluded), local executor, results in {out}")
    forced = subprocess.run(sweep_cmd(path, "--out", out, "--no-report", "--force"), capture_output=True,
                            text=True, check=False, timeout=300)
    assert "0 already done, 8 to run" in forced.stderr
    assert all(records(out)[k]["started"] > after[k]["started"] for k in done)


def test_ctrl_c_keeps_finished_cells_and_a_rerun_resumes(tmp_path, sweep_model):
    body = f"""
models = ["{sweep_model}"]
engines = ["ours:numpy"]
threads = [1]
[commands.bench]
args = ["-p", "8", "-n", "4", "-r", "1"]
[commands.compare]
args = ["-p", "16", "-n", "256", "-d", "0", "-r", "60", "--no-cold", "--no-progress"]
"""
    path, out = write_sweep(tmp_path, body), tmp_path / "out"
    with children_get_default_sigint():  # a suite run as a background job would start it with SIGINT ignored
        proc = subprocess.Popen(sweep_cmd(path, "--out", out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    deadline = time.time() + 120
    while not list((out / "cells").glob("bench-*/result.json")) and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # the compare cell is running now
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: 1 of 2 cells finished and kept" in err
    recs = records(out)
    assert [r["cell"]["command"] for r in recs.values()] == ["bench"]  # the cut cell left nothing behind
    dry = subprocess.run(sweep_cmd(path, "--out", out, "--dry-run"), capture_output=True, text=True, check=False, timeout=60)
    states = {line.split()[1].split("-")[0]: line.split()[0] for line in dry.stdout.splitlines()
              if line.split()[0] in ("done", "to-run")}
    assert states == {"bench": "done", "compare": "to-run"}


def test_the_local_executor_needs_no_ray(capsys, monkeypatch, tmp_path, sweep_model):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails, as where Ray is not installed
    path = write_sweep(tmp_path, f'models = ["{sweep_model}"]\nengines = ["ours:numpy"]\n'
                                 f'[commands.bench]\nargs = {BENCH_ARGS}\n')
    code, out, err = run_cli(capsys, "sweep", path, "--out", tmp_path / "out")
    assert code == 0, err
    assert "sweep: 1 done" in out and [r["status"] for r in records(tmp_path / "out").values()] == ["done"]
    code, _, err = run_cli(capsys, "sweep", path, "--out", tmp_path / "out", "--ray-address", "auto", "--force")
    assert code == 2 and err.strip() == ("error: the ray executor needs Ray: pip install -e \".[ray]\" (or run "
                                         "without --ray-address for the local executor)")


def test_bad_sweep_input_is_one_line_exit_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "sweep", tmp_path / "none.toml")
    assert code == 2 and err.strip() == f"error: {tmp_path / 'none.toml'}: no such sweep file (TOML: docs/SWEEPS.md)"
    (tmp_path / "binary.toml").write_bytes(b"\x91\x00\xff")
    code, _, err = run_cli(capsys, "sweep", tmp_path / "binary.toml")
    assert code == 2 and err.startswith(f"error: {tmp_path / 'binary.toml'}: not UTF-8 text") and err.count("\n") == 1
    path = write_sweep(tmp_path, "models = ['m']\n[commands.generate]\n")
    code, _, err = run_cli(capsys, "sweep", path, "--dry-run")
    assert code == 2 and "commands.generate is not a command a sweep runs (supported: compare, bench, validate)" in err
    (tmp_path / "file").write_text("x")
    path = write_sweep(tmp_path, "models = ['m']\n[commands.bench]\n", "ok.toml")
    code, _, err = run_cli(capsys, "sweep", path, "--out", tmp_path / "file")
    assert code == 2 and "is a file" in err and len(err.strip().splitlines()) == 1


def test_a_cell_past_its_timeout_is_stopped_and_recorded_failed(capsys, tmp_path, sweep_model):
    path = write_sweep(tmp_path, f'models = ["{sweep_model}"]\nengines = ["ours:numpy"]\n[commands.bench]\n'
                                 'args = ["-p", "16", "-n", "256", "-r", "200"]\n')
    code, _, err = run_cli(capsys, "sweep", path, "--out", tmp_path / "out", "--cell-timeout", "1", "--no-report")
    assert code == 1 and "1 of 1 cells failed" in err
    (rec,) = records(tmp_path / "out").values()
    assert rec["status"] == "failed" and rec["error"] == "timed out after 1 s" and rec["ended"] - rec["started"] < 30


def test_no_cluster_at_the_address_is_one_line_before_anything_is_written(tmp_path, sweep_model):
    pytest.importorskip("ray")
    path = write_sweep(tmp_path, f'models = ["{sweep_model}"]\n[commands.bench]\n')
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(sweep_cmd(path, "--out", tmp_path / "out", "--ray-address", "auto"), capture_output=True,
                         text=True, check=False, timeout=120, env=env,
                         cwd=tmp_path)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith("error: --ray-address auto: cannot connect to a Ray cluster")
    assert not (tmp_path / "out").exists()
