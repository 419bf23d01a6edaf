"""``bench-compare bench`` end to end on fake engines and a fake clock: llama-bench's flags, output formats that
parse, exact numbers, and one-line errors with exit code 2 for bad input."""

from __future__ import annotations

import csv
import io
import json

import pytest
from bench_fakes import DECODE_CTX_NS, DECODE_NS, PREFILL_CALL_NS, PREFILL_TOKEN_NS

from bench_compare.cli import main
from bench_compare.cmd_bench import parse_int_list
from inference_engine.errors import GGUFParityError


@pytest.fixture
def model(tiny_model):
    return str(tiny_model("llama"))


def run(capsys, *args):
    code = main(["bench", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_exact_numbers(capsys, fake_engines, model):
    code, out, err = run(capsys, "-m", model, "-p", "16", "-n", "4", "-r", "3", "-o", "json", "--engine",
                         "ours:numpy")
    assert code == 0, err
    records = json.loads(out)
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 4)]
    pp, tg = records
    pp_ns = PREFILL_CALL_NS + 16 * PREFILL_TOKEN_NS
    tg_ns = 4 * DECODE_NS + DECODE_CTX_NS * (0 + 1 + 2 + 3)
    assert pp["samples_ns"] == [pp_ns] * 3 and pp["avg_ns"] == pp_ns
    assert pp["avg_ts"] == pytest.approx(1e9 * 16 / pp_ns, rel=1e-12) and pp["stddev_ts"] == 0
    assert tg["samples_ts"] == [pytest.approx(1e9 * 4 / tg_ns, rel=1e-12)] * 3
    assert pp["engine"] == "ours:numpy" and pp["backends"] == "numpy" and pp["numerics"] == "ggml"
    assert pp["type_k"] == pp["type_v"] == "f16"  # llama-bench's K/V cache, as compare gives ours
    assert pp["model_type"] == "llama 1M F32" and pp["model_n_params"] > 0
    assert fake_engines.engines["ours:numpy"].closed


def test_comma_lists_ranges_threads_depth_and_pg(capsys, fake_engines, model):
    code, out, err = run(capsys, "-m", model, "-p", "8-32*2", "-n", "4", "-pg", "8,2", "-d", "0,16", "-t", "1,2",
                         "-r", "1", "-o", "jsonl", "--engine", "llamacpp")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    names = [(r["n_threads"], r["n_depth"], r["n_prompt"], r["n_gen"]) for r in rows]
    per_depth = [(8, 0), (16, 0), (32, 0), (0, 4), (8, 2)]  # llama-bench order: pp..., tg..., pg...
    assert names == [(t, d, p, n) for t in (1, 2) for d in (0, 16) for p, n in per_depth]
    assert all(r["backends"] == "CPU" and r["engine"] == "llamacpp" for r in rows)
    assert rows[0]["type_k"] == "f16" and rows[0]["flash_attn"] == -1  # llama-bench's defaults


def test_markdown_output(capsys, fake_engines, model):
    code, out, _ = run(capsys, "-m", model, "-p", "16", "-n", "4", "-d", "8", "-r", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("| model ") and lines[0].endswith("|                  t/s |")
    assert "pp16 @ d8" in lines[2] and "tg4 @ d8" in lines[3]
    assert lines[-1].startswith("build: ")


def test_csv_output_parses(capsys, fake_engines, model):
    code, out, _ = run(capsys, "-m", model, "-p", "16", "-n", "0", "-r", "2", "-o", "csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1 and rows[0]["n_prompt"] == "16" and float(rows[0]["avg_ts"]) > 0


def test_ctrl_c_prints_what_was_measured(capsys, fake_engines, model):
    fake_engines.tune["ours:numba"] = {"interrupt_after_decodes": 1 + 4 * 2}  # warm-up + 2 repetitions of tg4
    code, out, err = run(capsys, "-m", model, "-p", "16", "-n", "4", "-r", "5", "-o", "json", "--engine",
                         "ours:numba")
    assert code == 130
    records = json.loads(out)  # still a complete JSON array
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(16, 0), (0, 4)]
    assert len(records[0]["samples_ns"]) == 5 and len(records[1]["samples_ns"]) == 2
    assert "tg4 has 2 of 5 samples" in err and "interrupted" in err


@pytest.mark.parametrize("args,message", [
    (["-p", "0", "-n", "0"], "nothing to run"),
    (["-p", "-5"], "-p"),
    (["-p", "abc"], "-p"),
    (["-n", "1.5"], "-n"),
    (["-r", "0"], "-r must be at least 1"),
    (["-r", "x"], "-r must be an integer"),
    (["-t", "0"], "-t"),
    (["-b", "0"], "-b"),
    (["-d", "1000"], "context length of 256"),
    (["-pg", "5"], "-pg"),
    (["--engine", "foo"], "unknown engine 'foo'"),
    (["--engine", "ours:cuda"], "unknown engine"),
    (["-o", "xml"], "unknown output format 'xml'"),
    (["--numerics", "f64"], "unknown numerics"),
    (["--engine", "llamacpp", "--numerics", "f32"], "--numerics is our engine's: llama.cpp computes in its own"),
    (["--seed", "-1"], "--seed"),
])
def test_bad_input_one_line_exit_2(capsys, fake_engines, model, args, message):
    base = ["-m", model] if args[0] == "-r" else ["-m", model, "-r", "1"]
    code, _, err = run(capsys, *base, *args)
    assert code == 2
    assert err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1
    assert not fake_engines.engines  # nothing was loaded


def test_missing_model_exit_2(capsys, fake_engines, tmp_path):
    code, _, err = run(capsys, "-m", str(tmp_path / "nope.gguf"))
    assert code == 2 and "no such file" in err


def test_parse_int_list_ranges():
    assert parse_int_list(["1-4+1"], "-t") == [1, 2, 3, 4]
    assert parse_int_list(["128-512*2", "7"], "-p") == [128, 256, 512, 7]
    with pytest.raises(GGUFParityError):
        parse_int_list(["4-8*1"], "-p")  # does not increase


def test_json_file_is_the_typed_result_and_report_reads_it(capsys, fake_engines, model, tmp_path):
    from validation.results import BenchResult

    saved = tmp_path / "bench.json"
    code, out, err = run(capsys, "-m", model, "-p", "16", "-n", "4", "-r", "3", "-o", "json", "--engine",
                         "ours:numpy", "--json", str(saved))
    assert code == 0, err
    printed = json.loads(out)
    written = json.loads(saved.read_text())
    assert (written["kind"], written["schema_version"]) == (BenchResult.kind, BenchResult.schema_version)
    assert written["rows"] == printed  # the printed rows are the record's rows, field for field
    assert written["engine"] == "ours:numpy" and written["complete"] is True
    assert {"date", "git", "versions", "machine"} <= set(written) and written["settings"]["reps"] == 3
    assert BenchResult.from_dict(written).to_dict() == written

    code = main(["report", str(saved), "--out", str(tmp_path / "rep")])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert code == 0
    assert "## Bench: ours:numpy on " in md
    pp = printed[0]
    assert f"| pp16 | {pp['n_threads']} | {pp['avg_ts']:.2f} ± {pp['stddev_ts']:.2f} | 3 |" in md


def test_report_reads_an_old_bench_json_array(capsys, fake_engines, model, tmp_path):
    # before bench results had a record, the only file bench gave was its -o json output: an array of rows
    code, out, err = run(capsys, "-m", model, "-p", "16", "-n", "4", "-r", "2", "-o", "json", "--engine", "llamacpp")
    assert code == 0, err
    old = tmp_path / "old.json"
    old.write_text(out)
    code = main(["report", str(old), "--out", str(tmp_path / "rep"), "--history", str(tmp_path / "h.csv")])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert code == 0
    rows = json.loads(out)
    assert "## Bench: llamacpp on " in md
    for row, name in zip(rows, ("pp16", "tg4")):
        assert f"| {name} | {row['n_threads']} | {row['avg_ts']:.2f} ± {row['stddev_ts']:.2f} | 2 |" in md
    history = list(csv.DictReader((tmp_path / "h.csv").open()))
    assert history[0]["kind"] == "bench"
    assert float(history[0][f"llamacpp:tg4 t={rows[1]['n_threads']} [t/s]"]) == pytest.approx(rows[1]["avg_ts"])


def test_ctrl_c_writes_the_measured_rows_marked_incomplete(capsys, fake_engines, model, tmp_path):
    fake_engines.tune["ours:numba"] = {"interrupt_after_decodes": 1 + 4 * 2}  # warm-up + 2 repetitions of tg4
    saved = tmp_path / "bench.json"
    code, out, _ = run(capsys, "-m", model, "-p", "16", "-n", "4", "-r", "5", "-o", "json", "--engine",
                       "ours:numba", "--json", str(saved))
    assert code == 130
    written = json.loads(saved.read_text())
    assert written["complete"] is False and written["rows"] == json.loads(out)
    assert [len(r["samples_ns"]) for r in written["rows"]] == [5, 2]


@pytest.mark.parametrize("spec", ["dump:/tmp/some-dump", "cmd:my-engine {request} {out}"])
def test_untimed_engines_are_refused_by_bench_and_compare_alike(capsys, fake_engines, model, spec):
    code, _, err = run(capsys, "-m", model, "-r", "1", "--engine", spec)
    code_c = main(["compare", "--no-progress", "-m", model, "--engine", spec])
    _, err_c = capsys.readouterr()
    assert code == 2 and code_c == 2
    assert err == err_c  # the same one line from both commands
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert f"'{spec}' cannot be timed" in err and "bench-compare validate" in err
    assert not fake_engines.engines  # refused before anything was loaded
