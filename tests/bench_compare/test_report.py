"""``bench-compare report``: Markdown + plots from compare and validation JSONs, the history CSV, and the regression
gate (pass, fail, wrong-shape baselines) through ``bench_compare.cli.main``."""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from bench_compare import report
from bench_compare.cli import main
from bench_compare.gate import ABSOLUTE_NOISE_FLOOR, load_baseline
from inference_engine.errors import GGUFParityError
from validation import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compare_result(pp_ratio=0.5, tg_ratio=0.8):
    def res(test, engine, median, unit="t/s", hib=True, kind="pp"):
        return {"test": test, "kind": kind, "engine": engine, "unit": unit, "higher_is_better": hib,
                "median": median, "p95": median, "min": median, "max": median, "mean": median, "stddev": 0.0,
                "n": 1, "samples": [median], "complete": True}

    return {
        "kind": "gguf-parity-compare", "schema_version": 1, "ours": "ours:numba", "reference": "llamacpp",
        "backend": "numba", "numerics": "f32", "date": "2025-01-01T00:00:00Z",
        "git": {"sha": "0123456789abcdef", "dirty": False},
        "machine": {"cpu": "Test CPU"}, "versions": {},
        "model": {"filename": "m.gguf", "sha256": "ab" * 32},
        "settings": {"n_threads": 2, "n_prompt": 64, "n_gen": 16, "n_depth": 64, "reps": 2, "sizes_chosen": "quick"},
        "results": [res("pp64", "ours:numba", 100.0 * pp_ratio), res("pp64", "llamacpp", 100.0),
                    res("tg16", "ours:numba", 50.0 * tg_ratio, kind="tg"), res("tg16", "llamacpp", 50.0, kind="tg"),
                    {**res("ttft cold", "ours:numba", 900.0, "ms", False, "ttft_cold"),
                     "extra": {"phases_median_ms": {"imports": 500.0, "load": 300.0, "prefill": 100.0}}},
                    {**res("ttft cold", "llamacpp", 450.0, "ms", False, "ttft_cold"),
                     "extra": {"phases_median_ms": {"imports": 200.0, "load": 200.0, "prefill": 50.0}}}],
        "ratios": {"pp64": pp_ratio, "tg16": tg_ratio, "ttft cold": 0.5},
    }


def validation_result(kld_mean=1e-4, passed=True, worst=2e-5):
    return {"passed": passed, "engine": "ours:numpy", "model": {"filename": "m.gguf"},
            "tensors": [{"name": "attn_norm-0", "nmse": worst / 1000}, {"name": "l_out-0", "nmse": worst},
                        {"name": "result_output", "nmse": worst / 20}],
            "logits": {"kld_mean": kld_mean, "kld_max": 10 * kld_mean, "top1_agreement": 0.99}}


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def run(capsys, *args):
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_report_with_plots(capsys, tmp_path):
    c = write(tmp_path, "c.json", compare_result())
    v = write(tmp_path, "v.json", validation_result())
    out_dir = tmp_path / "rep"
    code, out, err = run(capsys, c, v, "--out", str(out_dir))
    assert code == 0, err
    md = (out_dir / "report.md").read_text()
    assert "## Speed: ours:numba vs llama.cpp on m.gguf" in md
    assert "| pp64 | 50.00 t/s | 100.00 t/s | 0.50 |" in md
    assert "| ttft cold | 900.0 ms | 450.0 ms | 0.50 |" in md
    assert "### Cold start phases" in md and "| imports | 500.0 ms | 200.0 ms |" in md
    assert "**PASSED**" in md and "`l_out-0`" in md
    assert (out_dir / "ratios-1.png").read_bytes()[:8] == PNG_MAGIC
    for stem in (plots.HEATMAP, plots.WORST_PER_LAYER):  # the validation pictures, validation/plots.py's
        assert f"![{plots.CAPTIONS[stem]}]({stem}-2.png)" in md
        assert (out_dir / f"{stem}-2.png").read_bytes()[:8] == PNG_MAGIC
    assert f"report: {out_dir / 'report.md'}" in out
    assert not [f for f in os.listdir(out_dir) if f.endswith(".tmp")]


def test_history_appends_one_row_per_run(capsys, tmp_path):
    c = write(tmp_path, "c.json", compare_result())
    v = write(tmp_path, "v.json", validation_result())
    hist = tmp_path / "history.csv"
    for _ in range(2):
        code, _, err = run(capsys, c, v, "--out", str(tmp_path / "r"), "--history", str(hist))
        assert code == 0, err
    df = pd.read_csv(hist)
    assert len(df) == 4 and list(df["kind"]) == ["compare", "validation"] * 2
    assert df.loc[0, "ratio:pp64"] == 0.5 and df.loc[1, "kld_mean"] == 1e-4
    assert df.loc[0, "git_sha"] == "0123456789abcdef" and df.loc[1, "worst_tensor"] == "l_out-0"


def test_gate_passes_against_itself_and_fails_on_regression(capsys, tmp_path):
    base = write(tmp_path, "base.json", compare_result(pp_ratio=0.5))
    same = write(tmp_path, "same.json", compare_result(pp_ratio=0.46))  # 8% worse: within 10%
    worse = write(tmp_path, "worse.json", compare_result(pp_ratio=0.40))  # 20% worse
    code, out, err = run(capsys, same, "--out", str(tmp_path / "a"), "--baseline", base, "--max-regression", "10")
    assert code == 0, err
    assert "gate: passed (3 metrics" in out
    code, out, err = run(capsys, worse, "--out", str(tmp_path / "b"), "--baseline", base, "--max-regression", "10")
    assert code == 1
    assert "regression: pp64 = 0.4, baseline 0.5" in err
    md = (tmp_path / "b" / "report.md").read_text()
    assert "## Regression gate" in md and "**REGRESSED**" in md and "**FAILED** (1 regressed)" in md
    # a looser threshold lets it through
    code, _, _ = run(capsys, worse, "--out", str(tmp_path / "c"), "--baseline", base, "--max-regression", "25")
    assert code == 0


def test_the_gate_uses_the_interval_not_the_point(capsys, tmp_path):
    """A ratio 20% under its baseline fails a 10% gate only when its whole interval is under the limit."""
    base = write(tmp_path, "base.json", compare_result(pp_ratio=0.5))
    noisy = compare_result(pp_ratio=0.40)
    noisy["ratio_intervals"] = {"pp64": {"ratio": 0.40, "low": 0.30, "high": 0.47, "n": 3, "confidence": 0.95,
                                         "verdict": "slower", "method": "paired log-ratio, Student t"}}
    code, out, err = run(capsys, write(tmp_path, "noisy.json", noisy), "--out", str(tmp_path / "a"), "--baseline",
                         base, "--max-regression", "10")
    assert code == 0, err  # the limit is 0.45, and the interval reaches 0.47
    md = (tmp_path / "a" / "report.md").read_text()
    assert "| `pp64` | 0.5 | 0.4 (0.3-0.47) | -20.0% | higher is better | within noise |" in md
    noisy["ratio_intervals"]["pp64"]["high"] = 0.44
    code, _, err = run(capsys, write(tmp_path, "sure.json", noisy), "--out", str(tmp_path / "b"), "--baseline",
                       base, "--max-regression", "10")
    assert code == 1 and "regression: pp64 = 0.4, baseline 0.5" in err


def test_gate_on_validation_metrics(capsys, tmp_path):
    base = write(tmp_path, "vb.json", validation_result(kld_mean=1e-4))
    worse = write(tmp_path, "vw.json", validation_result(kld_mean=2e-4))
    failed = write(tmp_path, "vf.json", validation_result(passed=False))
    code, _, err = run(capsys, worse, "--out", str(tmp_path / "a"), "--baseline", base, "--max-regression", "50")
    assert code == 1 and "kld_mean" in err and "kld_max" in err
    code, _, err = run(capsys, failed, "--out", str(tmp_path / "b"), "--baseline", base)
    assert code == 1 and "passed" in err


def test_write_baseline_then_gate(capsys, tmp_path):
    c = write(tmp_path, "c.json", compare_result())
    v = write(tmp_path, "v.json", validation_result())
    base = tmp_path / "baseline.json"
    code, _, err = run(capsys, c, v, "--out", str(tmp_path / "r"), "--write-baseline", str(base))
    assert code == 0, err
    b = json.loads(base.read_text())
    assert b["kind"] == "gguf-parity-baseline" and b["ratios"]["pp64"] == 0.5
    assert b["validation"]["kld_mean"] == 1e-4 and b["validation"]["passed"] is True
    code, _, err = run(capsys, c, v, "--out", str(tmp_path / "r2"), "--baseline", str(base))
    assert code == 0, err


@pytest.mark.parametrize("baseline", [
    [1, 2, 3],
    {"something": 1},
    {"ratios": {"pp64": "fast"}},
    {"ratios": [0.5]},
    "not json at all",
])
def test_wrong_shape_baseline_exit_2(capsys, tmp_path, baseline):
    c = write(tmp_path, "c.json", compare_result())
    p = tmp_path / "bad.json"
    p.write_text(baseline if isinstance(baseline, str) else json.dumps(baseline))
    code, _, err = run(capsys, c, "--out", str(tmp_path / "r"), "--baseline", str(p))
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()  # nothing written before the inputs are known good


def test_baseline_sharing_no_metric_exit_2(capsys, tmp_path):
    c = write(tmp_path, "c.json", compare_result())
    b = write(tmp_path, "b.json", {"ratios": {"pp512": 0.5}})
    code, _, err = run(capsys, c, "--out", str(tmp_path / "r"), "--baseline", b)
    assert code == 2 and "shares no metric" in err and "pp512" in err


@pytest.mark.parametrize("args,message", [
    (["{missing}"], "no such result file"),
    (["{notresult}"], "not a gguf-parity result"),
    (["{c}", "--max-regression", "5"], "--max-regression needs --baseline"),
    (["{c}", "--baseline", "{c}", "--max-regression", "-5"], "non-negative"),
    (["{c}", "--baseline", "{c}", "--max-regression", "ten"], "must be a number"),
])
def test_bad_input_exit_2(capsys, tmp_path, args, message):
    paths = {"missing": str(tmp_path / "nope.json"), "notresult": write(tmp_path, "n.json", {"a": 1}),
             "c": write(tmp_path, "c.json", compare_result())}
    code, _, err = run(capsys, *[a.format(**paths) for a in args], "--out", str(tmp_path / "r"))
    assert code == 2 and message in err


def test_failed_report_leaves_nothing_half_written(tmp_path, monkeypatch):
    loaded = [report.load_result(write(tmp_path, "c.json", compare_result()))]
    out = tmp_path / "rep"
    report.write_report(loaded, out)
    before = (out / "report.md").read_text()

    def broken(result):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(report, "ratio_chart_png", broken)
    with pytest.raises(RuntimeError):
        report.write_report(loaded, out)
    assert (out / "report.md").read_text() == before
    assert sorted(os.listdir(out)) == ["ratios.png", "report.md"]


def test_zero_baseline_tolerates_rounding_but_not_errors(capsys, tmp_path):
    base = write(tmp_path, "b.json", {"validation": {"worst_nmse": 0.0}})
    rounding = write(tmp_path, "r.json", validation_result(worst=ABSOLUTE_NOISE_FLOOR / 10))
    wrong = write(tmp_path, "w.json", validation_result(worst=1e-6))
    assert run(capsys, rounding, "--out", str(tmp_path / "a"), "--baseline", base)[0] == 0
    assert run(capsys, wrong, "--out", str(tmp_path / "b"), "--baseline", base)[0] == 1


def test_non_finite_nmse_written_as_strings_is_the_worst(tmp_path):
    v = validation_result()
    v["tensors"].append({"name": "ffn_out-1", "nmse": "inf"})
    v["tensors"].append({"name": "ffn_out-2", "nmse": "nan"})
    m = report.validation_metrics(report.load_result(write(tmp_path, "v.json", v)))
    assert m["worst_nmse"] == float("inf") and m["worst_tensor"] == "ffn_out-1"


def test_load_baseline_from_a_validation_result(tmp_path):
    b = load_baseline(write(tmp_path, "v.json", validation_result()))
    assert b["ratios"] == {} and b["validation"]["worst_nmse"] == 2e-5 and b["validation"]["passed"] is True
    with pytest.raises(GGUFParityError):
        load_baseline(write(tmp_path, "x.json", {"validation": {"kld_mean": None}}))


def test_cold_phases_show_whether_numba_kernels_came_from_the_cache():
    from bench_compare.report import cold_phase_table

    result = compare_result()
    result["results"][4]["extra"]["numba_cache"] = [{"loaded": 0, "compiled": 12, "compiled_uncached": 0},
                                                    {"loaded": 12, "compiled": 0, "compiled_uncached": 0}]
    table = cold_phase_table(result)
    assert "| numba kernels | cached/compiled 0/12 12/0 | - |" in table
    assert "numba kernels" not in cold_phase_table(compare_result())  # llama.cpp-only runs: no such row


def test_compare_table_header_names_the_cpu_and_isa():
    from bench_compare.report import compare_table

    result = compare_result()
    result["machine"] = {"cpu": "AMD EPYC", "isa": "AVX2", "cpu_isa": "AMD EPYC, AVX2"}
    assert compare_table(result).splitlines()[0].startswith("| test (AMD EPYC, AVX2) |")
    del result["machine"]["cpu_isa"]  # results written before cpu_isa existed
    assert compare_table(result).splitlines()[0].startswith("| test (AMD EPYC, AVX2) |")


def bench_result():
    row = {"build_commit": "abc", "build_number": 0, "cpu_info": "Test CPU", "gpu_info": "", "backends": "numba",
           "engine": "ours:numba", "numerics": "ggml", "model_filename": "/m/m.gguf", "model_type": "llama 1M F32",
           "model_size": 1000, "model_n_params": 250, "n_batch": 512, "n_ubatch": 512, "n_threads": 2,
           "type_k": "f32", "type_v": "f32", "flash_attn": 0, "n_prompt": 64, "n_gen": 0, "n_depth": 0,
           "test_time": "2025-01-01T00:00:00Z", "avg_ns": 1_000_000, "stddev_ns": 0, "avg_ts": 64000.0,
           "stddev_ts": 0.0, "samples_ns": [1_000_000], "samples_ts": [64000.0]}
    return {"kind": "gguf-parity-bench", "schema_version": 1, "engine": "ours:numba", "numerics": "ggml",
            "model": {"filename": "m.gguf"}, "date": "2025-01-01T00:00:00Z", "rows": [row]}


def test_bench_results_are_reported_but_never_gated(capsys, tmp_path):
    bench = write(tmp_path, "bench.json", bench_result())
    base = write(tmp_path, "base.json", compare_result(pp_ratio=0.5))
    same = write(tmp_path, "same.json", compare_result(pp_ratio=0.5))
    code, out, err = run(capsys, bench, same, "--out", str(tmp_path / "a"), "--baseline", base)
    assert code == 0, err
    assert "gate: passed (3 metrics" in out  # the compare result's ratios; nothing from the bench result
    md = (tmp_path / "a" / "report.md").read_text()
    assert "## Bench: ours:numba on m.gguf" in md and "| pp64 | 2 | 64000.00 ± 0.00 | 1 |" in md
    code, _, err = run(capsys, same, "--out", str(tmp_path / "b"), "--baseline", bench)
    assert code == 2 and "not gated" in err and len(err.strip().splitlines()) == 1
