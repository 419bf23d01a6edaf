"""``--against llama-bench:PATH`` / ``llama-server:PATH``: the PATH checks, llama-bench's command and JSON (from a
record of the real binary, tests/fixtures/llama_bench), and the unpaired interval its ratios use."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from bench_compare import llama_bench_bin, yardstick
from bench_compare.intervals import METHOD_UNPAIRED, unpaired_interval_of
from bench_compare.measure import pp_test, tg_test
from bench_compare.yardstick import ChildOutput, Yardstick
from inference_engine.errors import GGUFParityError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "llama_bench"
RECORDS = json.loads((FIXTURES / "tiny_llama_q8_0.json").read_text())
HELP = (FIXTURES / "llama_bench_help.txt").read_text()
# llama-bench prints samples_ts with 6 significant digits (std::to_string-like "%g"): our t/s from samples_ns agree
# to that precision
PRINTED_TS_RTOL = 1e-5


def script(tmp_path: Path, body: str, name: str = "llama-bench") -> Path:
    """An executable shell script standing in for a binary (only what PATH checks look at: runs, prints, exits)."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def help_printer(tmp_path: Path, text: str, name: str = "llama-bench") -> Path:
    (tmp_path / f"{name}.help").write_text(text)
    return script(tmp_path, f'cat "{tmp_path / (name + ".help")}"', name)


# --- --against parsing and the PATH checks --------------------------------------------------------------------
def test_parse_against():
    assert yardstick.parse_against("llama-bench:/x/llama-bench") == Yardstick("llama-bench", Path("/x/llama-bench"))
    assert yardstick.parse_against("llama-server:~/b/llama-server").path == Path("~/b/llama-server").expanduser()
    for named in ("llamacpp", "llamacpp-server", "none", None, ""):
        assert yardstick.parse_against(named) is None
    with pytest.raises(GGUFParityError, match="needs the binary's path"):
        yardstick.parse_against("llama-bench:")


def test_recorded_help_passes(tmp_path):
    info = yardstick.check_binary(Yardstick("llama-bench", help_printer(tmp_path, HELP)))
    assert info.has_depth and len(info.sha256) == 64


@pytest.mark.parametrize("case, pattern", [
    ("missing", "does not exist"),
    ("directory", "is a directory"),
    ("not_executable", "is not executable"),
    ("not_llama_bench", "is not llama.cpp's llama-bench: its --help has no --n-prompt"),
    ("server", r"is not llama.cpp's llama-bench \(it looks like llama-server\)"),
    ("crashes", r"crashed on --help \(signal 11 \(SIGSEGV\)\); this build is broken"),
    ("not_a_program", "cannot be run"),
])
def test_bad_path_is_one_line(tmp_path, case, pattern):
    path = {
        "missing": lambda: tmp_path / "nothing",
        "directory": lambda: tmp_path,
        "not_executable": lambda: (tmp_path / "plain").write_text(HELP) and tmp_path / "plain",
        "not_llama_bench": lambda: script(tmp_path, "echo usage: something else"),
        "server": lambda: help_printer(tmp_path, "--port --host --ctx-size --n-gpu-layers --alias"),
        "crashes": lambda: script(tmp_path, "kill -SEGV $$"),
        "not_a_program": lambda: _garbage_executable(tmp_path),
    }[case]()
    with pytest.raises(GGUFParityError, match=pattern) as info:
        yardstick.check_binary(Yardstick("llama-bench", path))
    assert "\n" not in str(info.value)


def _garbage_executable(tmp_path: Path) -> Path:
    path = tmp_path / "garbage"
    path.write_bytes(b"\x7fELF garbage, not a program")
    os.chmod(path, 0o755)
    return path


def test_old_build_without_depth(tmp_path):
    old = "".join(line for line in HELP.splitlines(True) if "--n-depth" not in line)
    info = yardstick.check_binary(Yardstick("llama-bench", help_printer(tmp_path, old)))
    assert not info.has_depth
    yardstick.check_depth(info, [0, 0])  # depth-0 tests still run
    with pytest.raises(GGUFParityError, match=r"has no -d \(--n-depth\).*pass -d 0"):
        yardstick.check_depth(info, [0, 512])


# --- the command and the JSON -----------------------------------------------------------------------------------
def test_bench_command_has_llama_benchs_flags():
    assert llama_bench_bin.bench_command("/b/llama-bench", "/m.gguf", pp_test(512), 5, 8) == [
        "/b/llama-bench", "-m", "/m.gguf", "-p", "512", "-n", "0", "-r", "5", "-t", "8", "-ngl", "99", "-o", "json"]
    command = llama_bench_bin.bench_command("llama-bench", "m.gguf", tg_test(128, 4096), 3, 2)
    assert command[command.index("-n") + 1] == "128" and command[command.index("-p") + 1] == "0"
    assert command[-2:] == ["-d", "4096"]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: f"p{r['n_prompt']}n{r['n_gen']}d{r['n_depth']}")
def test_recorded_json_parses_into_results(record):
    test = pp_test(record["n_prompt"], record["n_depth"]) if record["n_prompt"] else tg_test(record["n_gen"],
                                                                                             record["n_depth"])
    output = ChildOutput(0, json.dumps([record]), "")
    parsed = llama_bench_bin.record_for(output, test, reps=len(record["samples_ns"]))
    result = llama_bench_bin.to_result(parsed, test)
    assert result.test == test.name and result.engine == "llama-bench" and result.unit == "t/s"
    assert result.samples_ns == record["samples_ns"]
    np.testing.assert_allclose(result.samples, record["samples_ts"], rtol=PRINTED_TS_RTOL)
    assert llama_bench_bin.build_info(parsed) == {"build_commit": "0c1e570", "build_number": 1, "backends": "CPU",
                                                  "cpu_info": "AMD EPYC", "gpu_info": ""}
    assert llama_bench_bin.settings_of(parsed)["n_gpu_layers"] == 99


def test_whole_recorded_file_parses():
    assert len(llama_bench_bin.parse_json((FIXTURES / "tiny_llama_q8_0.json").read_text())) == 4


@pytest.mark.parametrize("output, pattern", [
    (ChildOutput(-11, "[\n", "load_tensors: ...\n"), r"on pp64 crashed with signal 11 \(SIGSEGV\): load_tensors"),
    (ChildOutput(1, "[\n", "llama_bench: error: failed to load model 'm.gguf'\n"),
     "exited with code 1: llama_bench: error: failed to load model"),
    (ChildOutput(0, "| model | size |\n", ""), "printed no JSON"),
    (ChildOutput(0, '{"a": 1}', ""), "not an array"),
    (ChildOutput(0, json.dumps([{**RECORDS[1]}]), ""), "expected one result for -p 64 -n 0 -d 0, got -p 0 -n 16"),
    (ChildOutput(0, json.dumps([{k: v for k, v in RECORDS[0].items() if k != "samples_ns"}]), ""),
     "no samples_ns"),
    (ChildOutput(0, json.dumps([RECORDS[0]]), ""), "2 samples for -r 3"),
])
def test_binary_failures_are_one_line(output, pattern):
    with pytest.raises(llama_bench_bin.BinaryFailed, match=pattern) as info:
        llama_bench_bin.record_for(output, pp_test(64), reps=3 if "-r 3" in pattern else 2)
    assert "\n" not in str(info.value) and isinstance(info.value, GGUFParityError)


# --- the unpaired interval ----------------------------------------------------------------------------------------
def test_unpaired_interval_is_welchs_on_the_logs():
    """Against SciPy's own Welch interval for the difference of the mean log-samples."""
    ours = [101.0, 97.0, 104.0, 99.5, 102.0]
    ref = [120.0, 126.0, 118.0]
    interval = unpaired_interval_of(ours, ref, higher_is_better=True)
    from scipy import stats  # here, not at the top: over a second to import, paid by every collection

    welch = stats.ttest_ind(np.log(ours), np.log(ref), equal_var=False).confidence_interval(0.95)
    assert interval.ratio == pytest.approx(math.exp(np.mean(np.log(ours)) - np.mean(np.log(ref))))
    assert (interval.low, interval.high) == pytest.approx((math.exp(welch.low), math.exp(welch.high)))
    assert interval.verdict == "slower" and interval.n == 3 and interval.method == METHOD_UNPAIRED
    times = unpaired_interval_of(ours, ref, higher_is_better=False)  # a time: the ratio turns over
    assert times.ratio == pytest.approx(1 / interval.ratio) and times.verdict == "faster"


def test_unpaired_interval_edge_cases():
    same = unpaired_interval_of([100.0, 100.0], [50.0, 50.0], True)
    assert (same.ratio, same.low, same.high) == pytest.approx((2.0, 2.0, 2.0))  # no spread: a point
    assert same.verdict == "faster"
    one = unpaired_interval_of([100.0], [50.0, 60.0], True)
    assert one.low is None and one.verdict == "unknown" and one.n == 1
    assert unpaired_interval_of([], [1.0], True) is None
    overlap = unpaired_interval_of([100.0, 110.0, 90.0], [105.0, 95.0, 100.0], True)
    assert overlap.low < 1 < overlap.high and overlap.verdict == "same"
