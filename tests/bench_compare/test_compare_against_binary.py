"""``bench-compare compare --against llama-bench:PATH`` on the command line: ours (the NumPy backend, real) against
a stand-in that replays what the real llama-bench printed (tests/fixtures/llama_bench); the real binary runs in
test_llama_binaries_e2e.py. Results, provenance, what is not measured, and every way the binary can fail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.child_signals import children_get_default_sigint

from bench_compare.cli import main

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fixtures" / "llama_bench" / "fake_llama_bench.py"
QUICK_TESTS = ("pp64", "tg16", "pp64 @ d64", "tg16 @ d64")  # --quick: -p 64 -n 16 -d 64 -r 2, as recorded
# A CLI run on the tiny model takes seconds; a minute means it hung.
CHILD_TIMEOUT_S = 120


@pytest.fixture
def model(tiny_model):
    return str(tiny_model("llama", "Q8_0"))


def replaying_program(path: Path) -> Path:
    """An executable at ``path`` that runs the replaying stand-in with this interpreter."""
    path.parent.mkdir()
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_bench(tmp_path) -> Path:
    """An executable named llama-bench that replays what the real one printed."""
    return replaying_program(tmp_path / "bin" / "llama-bench")


def compare(capsys, *args):
    code = main(["compare", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_against_llama_bench(capsys, model, fake_bench, tmp_path):
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "--backend", "numpy", "--quick", "-t", "1",
                             "--against", f"llama-bench:{fake_bench}", "--json", str(json_path),
                             "--report", str(report_dir))
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert (result["ours"], result["reference"]) == ("ours:numpy", "llama-bench")
    # each test: ours, then the binary; no TTFT or memory on either side
    assert [(r["test"], r["engine"]) for r in result["results"]] == [
        (t, e) for t in QUICK_TESTS for e in ("ours:numpy", "llama-bench")]
    assert set(result["ratios"]) == set(QUICK_TESTS) == set(result["ratio_intervals"])
    assert all(i["method"].startswith("unpaired") for i in result["ratio_intervals"].values())
    assert set(result["not_measured"]) == {"ttft hot", "ttft cold", "peak rss"}
    # the binary's samples are what it printed, in t/s from samples_ns
    recorded = json.loads((FAKE.parent / "tiny_llama_q8_0.json").read_text())
    bench_pp = next(r for r in result["results"] if r["engine"] == "llama-bench" and r["test"] == "pp64")
    assert bench_pp["samples_ns"] == recorded[0]["samples_ns"]
    # provenance: the binary and its build
    binary = result["reference_binary"]
    assert binary["path"] == str(fake_bench.resolve()) and len(binary["sha256"]) == 64
    assert (binary["build_commit"], binary["backends"], binary["cpu_info"]) == ("0c1e570", "CPU", "AMD EPYC")
    engine = result["settings"]["engines"]["llama-bench"]
    assert engine["n_gpu_layers"] == 99 and "-ngl" in engine["command"] and engine["has_depth"]
    # said in the output
    assert "note: yardstick: llama-bench" in out and "build 0c1e570 (1), backends CPU" in out
    assert "note: ttft hot: not measured (llama-bench times pp and tg only" in out
    assert "note: peak rss: not measured" in out and "| ours:numpy | llama-bench |" in out
    report = (report_dir / "report.md").read_text()
    assert "## Speed: ours:numpy vs llama-bench" in report and "Welch's t interval" in report
    assert "> ttft cold: not measured" in report and (report_dir / "ratios.png").is_file()


def test_depth_zero_runs_on_an_old_build(capsys, model, fake_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_NO_DEPTH", "1")
    json_path = tmp_path / "c.json"
    args = ("-m", model, "--backend", "numpy", "-p", "64", "-n", "16", "-r", "2", "-t", "1",
            "--against", f"llama-bench:{fake_bench}", "--json", str(json_path))
    code, _out, err = compare(capsys, *args, "-d", "64")
    assert code == 2 and "has no -d (--n-depth)" in err and err.count("\n") == 1 and not json_path.exists()
    code, _out, err = compare(capsys, *args, "-d", "0")
    assert code == 0, err
    assert [r["test"] for r in json.loads(json_path.read_text())["results"]] == ["pp64", "pp64", "tg16", "tg16"]


def test_a_crash_of_the_binary_ends_the_run_with_one_line(capsys, model, fake_bench, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_CRASH_ON", "tg")
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "--backend", "numpy", "--quick", "-t", "1",
                             "--against", f"llama-bench:{fake_bench}", "--json", str(json_path),
                             "--report", str(report_dir))
    assert code == 2
    last = err.splitlines()[-1]  # after the progress lines ("loading ...", the --quick note): one error line
    assert last.startswith(f"error: llama-bench ({fake_bench.resolve()}) on tg16 crashed with signal 11 (SIGSEGV)")
    assert "llama-bench failed; measured so far (nothing was written):" in out and "| pp64 |" in out
    assert not json_path.exists() and not report_dir.exists()


@pytest.mark.parametrize("against, extra, message", [
    ("llama-bench:{missing}", (), "does not exist; point it at llama.cpp's build/bin/llama-bench"),
    ("llama-bench:{model}", (), "is not executable"),
    ("llama-bench:{tmp}", (), "is a directory"),
    ("llama-bench:{fake}", ("--budget", "60"), "--budget probes both engines in this process"),
    ("llama-bench:{fake}", ("--precision", "5%"), "--precision adds paired repetitions"),
    ("llama-server:{fake}", (), "is the yardstick of an HTTP engine"),
    ("llamacpp-server", (), "--against llamacpp-server: an engine in this process is measured against llamacpp"),
    ("none", (), "--against none: an engine in this process is measured against llamacpp"),
    ("vllm", (), "--against vllm: an engine in this process is measured against llamacpp"),
    ("llama-bench:{fake}", ("--engine", "openai:http://127.0.0.1:9/v1"), "measures an in-process engine"),
    ("llama-server:{missing}", ("--engine", "openai:http://127.0.0.1:9/v1"),
     "does not exist; point it at llama.cpp's build/bin/llama-server"),
    ("llama-server:{fake}", ("--engine", "openai:http://127.0.0.1:9/v1"),
     "is not llama.cpp's llama-server (it looks like llama-bench)"),
])
def test_bad_against_exit_2_before_anything_runs(capsys, model, fake_bench, tmp_path, against, extra, message):
    json_path = tmp_path / "c.json"
    spec = against.format(missing=tmp_path / "nope", model=model, tmp=tmp_path, fake=fake_bench)
    ours = () if "--engine" in extra else ("--backend", "numpy")  # an HTTP engine refuses --backend
    code, _out, err = compare(capsys, "-m", model, *ours, "--quick", "--against", spec, "--json", str(json_path),
                              *extra)
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert "loading" not in err and not json_path.exists()


@pytest.mark.parametrize("side", ["--against", "--engine"])  # the yardstick, or the engine under test
def test_ctrl_c_stops_the_binary_and_keeps_what_was_measured(model, fake_bench, tmp_path, side):
    pidfile, json_path = tmp_path / "bench.pid", tmp_path / "c.json"
    env = {**os.environ, "FAKE_BENCH_HANG_ON": "tg", "FAKE_BENCH_PIDFILE": str(pidfile)}
    ours = ["--backend", "numpy"] if side == "--against" else []  # --engine: llama.cpp in-process the reference
    with children_get_default_sigint():  # as in a terminal, whatever this test process inherited
        process = subprocess.Popen(
            [sys.executable, "-m", "bench_compare.cli", "compare", "--no-progress", "-m", model, *ours,
             "--quick", "-t", "1", side, f"llama-bench:{fake_bench}", "--json", str(json_path)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while not pidfile.exists() or not pidfile.read_text():
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        bench_pid = int(pidfile.read_text())
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert err.endswith("interrupted\n") and "interrupted; measured so far (nothing was written):" in out
    assert "| pp64 |" in out and not json_path.exists()
    with pytest.raises(ProcessLookupError):  # the binary was stopped with the run
        os.kill(bench_pid, 0)


def test_a_build_without_a_commit_count_names_its_commit_alone():
    """llama-bench reports build_number 0 where CMake counted no commits (sources from an sdist): not printed."""
    from bench_compare.binary_compare import program_note

    counted = program_note("yardstick", {"path": "/b/llama-bench", "build": {"build_commit": "0c1e570",
                                                                             "build_number": 1}})
    uncounted = program_note("yardstick", {"path": "/b/llama-bench", "build": {"build_commit": "0c1e570",
                                                                               "build_number": 0}})
    assert "build 0c1e570 (1), backends" in counted
    assert "build 0c1e570, backends" in uncounted


# --- the engine under test as a program (--engine llama-bench:PATH): an engine in any language, its own benchmark --
@pytest.fixture
def fake_engine_bench(tmp_path) -> Path:
    """Another executable speaking llama-bench's flags: the engine under test (the same replaying stand-in)."""
    return replaying_program(tmp_path / "engine" / "my-engine-bench")


def test_a_program_engine_against_llamacpp_in_this_process(capsys, model, fake_engine_bench, tmp_path):
    json_path = tmp_path / "c.json"
    engine = f"llama-bench:{fake_engine_bench}"
    code, out, err = compare(capsys, "-m", model, "--engine", engine, "--quick", "-t", "1", "--json", str(json_path))
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert (result["ours"], result["reference"]) == (engine, "llamacpp")
    # each test: the program first, then llama.cpp measured here; throughput only, unpaired intervals
    assert [(r["test"], r["engine"]) for r in result["results"]] == [
        (t, e) for t in QUICK_TESTS for e in (engine, "llamacpp")]
    recorded = json.loads((FAKE.parent / "tiny_llama_q8_0.json").read_text())
    ours = {r["test"]: r for r in result["results"] if r["engine"] == engine}
    assert ours["tg16"]["samples_ns"] == next(r for r in recorded if r["n_gen"] == 16 and not r["n_depth"])[
        "samples_ns"][:2]  # the program's own per-repetition times, read from its JSON
    assert set(result["ratios"]) == set(QUICK_TESTS) == set(result["ratio_intervals"])
    assert all(i["method"].startswith("unpaired") for i in result["ratio_intervals"].values())
    assert (result["backend"], result["numerics"]) == ("", "")  # the program's own arithmetic
    assert result["engine_binary"]["path"] == str(fake_engine_bench.resolve())
    assert result["engine_binary"]["build_commit"] == "0c1e570" and "reference_binary" not in result
    settings = result["settings"]
    assert settings["against"] == "llamacpp" and set(settings["engines"]) == {engine, "llamacpp"}
    assert settings["engines"]["llamacpp"]["type_k"] == "f16"  # llama.cpp as compare runs it: llama-bench's
    assert settings["engines"][engine]["command"][:3] == [str(fake_engine_bench.resolve()), "-m", model]
    assert "note: engine: llama-bench" in out and "note: ttft hot: not measured" in out
    assert f"model `{Path(model).name}`" in out and " numerics " not in out.splitlines()[1]


def test_two_programs_the_engine_and_llama_bench(capsys, model, fake_bench, fake_engine_bench, tmp_path):
    """Nothing runs in this process: the same replayed records on both sides give ratios of exactly 1."""
    json_path = tmp_path / "c.json"
    engine = f"llama-bench:{fake_engine_bench}"
    code, out, err = compare(capsys, "-m", model, "--engine", engine, "--quick", "-t", "1",
                             "--against", f"llama-bench:{fake_bench}", "--json", str(json_path))
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert (result["ours"], result["reference"]) == (engine, "llama-bench")
    assert [(r["test"], r["engine"]) for r in result["results"]] == [
        (t, e) for t in QUICK_TESTS for e in (engine, "llama-bench")]
    assert result["settings"]["load_s_in_process"] == {} and result["settings"]["warmup_runs"] == {}
    assert all(ratio == pytest.approx(1.0) for ratio in result["ratios"].values())
    assert {i["verdict"] for i in result["ratio_intervals"].values()} == {"same"}
    assert result["engine_binary"]["path"] == str(fake_engine_bench.resolve())
    assert result["reference_binary"]["path"] == str(fake_bench.resolve())
    assert "note: engine: llama-bench" in out and "note: yardstick: llama-bench" in out


def test_a_crash_of_the_program_engine_ends_the_run_with_one_line(capsys, model, fake_engine_bench, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("FAKE_BENCH_CRASH_ON", "tg")
    json_path = tmp_path / "c.json"
    engine = f"llama-bench:{fake_engine_bench}"
    code, out, err = compare(capsys, "-m", model, "--engine", engine, "--quick", "-t", "1", "--json", str(json_path))
    assert code == 2 and not json_path.exists()
    last = err.splitlines()[-1]  # after the progress lines ("... against llamacpp ...", the --quick note)
    assert last.startswith(f"error: {engine} ({fake_engine_bench.resolve()}) on tg16 crashed with signal 11 (SIGSEGV)")
    assert f"{engine} failed; measured so far (nothing was written):" in out and "| pp64 |" in out


@pytest.mark.parametrize("engine, extra, message", [
    ("llama-bench:", (), "--engine llama-bench: needs your benchmark program's path"),
    ("llama-bench:{missing}", (), "--engine llama-bench: {missing} does not exist; point it at your benchmark program"),
    ("llama-bench:{model}", (), "is not executable"),
    ("llama-bench:/bin/true", (), "--engine llama-bench: /bin/true does not take llama-bench's flags: its --help has "
                                  "no --n-prompt"),
    ("llama-bench:{fake}", ("--precision", "5%"), "--precision adds paired repetitions"),
    ("llama-bench:{fake}", ("--budget", "60"), "--budget probes both engines in this process"),
    ("llama-bench:{fake}", ("--backend", "numba", "--numerics", "f32"), "--backend, --numerics not used with --engine "
                                                                        "llama-bench:"),
])
def test_a_bad_program_engine_is_one_line_before_anything_runs(capsys, model, fake_engine_bench, tmp_path, engine,
                                                               extra, message):
    if "/bin/true" in engine and not Path("/bin/true").exists():
        pytest.skip("no /bin/true here")
    names = {"missing": tmp_path / "nope", "model": model, "fake": fake_engine_bench}
    json_path = tmp_path / "c.json"
    code, _out, err = compare(capsys, "-m", model, "--engine", engine.format(**names), "--quick", "-t", "1",
                              "--json", str(json_path), *extra)
    assert code == 2 and err.count("\n") == 1 and not json_path.exists(), err
    assert message.format(**names) in err


@pytest.mark.parametrize("command", [["validate", "--model"], ["bench", "-p", "16", "-n", "4", "-m"]])
def test_a_program_engine_is_compare_only(capsys, model, fake_engine_bench, command):
    code = main([*command, model, "--engine", f"llama-bench:{fake_engine_bench}"])
    _out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "is a benchmark program: bench-compare compare runs it once per test" in err


def test_the_example_bench_program_is_an_engine(capsys, model, tmp_path):
    """examples/bench_program.py, the contract written out (our engine timed by its own program, not replayed):
    compare runs it per test and reads its own timings."""
    program = tmp_path / "bin" / "bench_program"
    program.parent.mkdir()
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "examples" / "bench_program.py"}" '
                       '--engine-spec ours:numpy "$@"\n')
    program.chmod(0o755)
    json_path = tmp_path / "c.json"
    engine = f"llama-bench:{program}"
    code, _out, err = compare(capsys, "-m", model, "--engine", engine, "--quick", "-t", "1", "--json", str(json_path))
    assert code == 0, err
    result = json.loads(json_path.read_text())
    timed = [r for r in result["results"] if r["engine"] == engine]
    assert [r["test"] for r in timed] == list(QUICK_TESTS)
    assert all(len(r["samples_ns"]) == 2 and min(r["samples_ns"]) > 0 for r in timed)  # --quick: -r 2
    assert result["settings"]["engines"][engine]["type_k"] == "f16"


def test_an_error_before_any_work_prints_no_progress_bar(capsys, model, tmp_path):
    """With the progress bar on (the default), a mistake found before anything is measured is the one error line:
    no bar drawn before it (in a log, the bar's text would run into the error)."""
    code = main(["compare", "-m", model, "--engine", f"llama-bench:{tmp_path / 'nope'}", "--quick"])
    _out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: --engine llama-bench:") and err.count("\n") == 1, err


@pytest.mark.parametrize("command", [["compare", "--no-progress", "--quick", "--against", "none"],
                                     ["validate", "--no-progress"]])
@pytest.mark.parametrize("engine, message", [
    ("llama-server:", "--engine llama-server: needs the binary's path"),
    ("llama-server:{missing}", "--engine llama-server: {missing} does not exist; point it at llama.cpp's "
                               "build/bin/llama-server"),
    ("llama-server:{model}", "is not executable"),
    ("llama-server:{fake}", "--engine llama-server: {fake} is not llama.cpp's llama-server (it looks like "
                            "llama-bench)"),
])
def test_a_bad_llama_server_engine_is_one_line_before_anything_runs(capsys, model, fake_bench, tmp_path, command,
                                                                      engine, message):
    """``--engine llama-server:PATH``: llama.cpp's own server as the engine under test, its binary checked as
    ``--against llama-server:PATH`` checks it."""
    names = {"missing": tmp_path / "nope", "model": model, "fake": fake_bench}
    json_path = tmp_path / "out.json"
    code = main([*command, "-m", model, "--engine", engine.format(**names), "--json", str(json_path)])
    _out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and not json_path.exists(), err
    assert message.format(**names) in err


def test_a_llama_server_engine_with_a_bad_slot_count_is_one_line(capsys, model, fake_bench):
    code = main(["validate", "--no-progress", "-m", model, "--engine", f"llama-server:{fake_bench}",
                 "--engine-opt", "n_parallel=two"])
    _out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "n_parallel must be an integer >= 1, got 'two'" in err, err
