"""``bench-compare compare`` on fake engines and a fake clock: interleaving, exact ratios, JSON and report files,
size selection, Ctrl-C, bad input."""

from __future__ import annotations

import json

import pytest

from bench_compare.cli import main
from bench_compare.compare_run import SIZE_LADDER, EngineRates, choose_sizes, project_seconds, size_candidates

SLOWER = 2.0  # the fake llama.cpp runs twice as fast as the fake "ours": every ratio must be exactly 0.5


@pytest.fixture
def model(tiny_model):
    return str(tiny_model("llama"))


def compare(capsys, *args):
    code = main(["compare", "--no-progress", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_compare_json_and_report(capsys, fake_engines, model, tmp_path):
    fake_engines.tune["llamacpp"] = {"speed": SLOWER}
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "--backend", "numpy", "-p", "16", "-n", "4", "-d", "8", "-r", "3",
                             "--no-cold", "--json", str(json_path), "--report", str(report_dir))
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert result["kind"] == "gguf-parity-compare" and result["ours"] == "ours:numpy"
    tests = [(r["test"], r["engine"]) for r in result["results"]]
    assert tests == [(t, e) for t in ("pp16", "tg4", "tg4 @ d8", "ttft hot") for e in ("ours:numpy", "llamacpp")]
    assert result["ratios"] == {"pp16": 0.5, "tg4": 0.5, "tg4 @ d8": 0.5, "ttft hot": 0.5}
    pp = result["results"][0]
    assert pp["unit"] == "t/s" and pp["samples"] == [1e9 * 16 / 16500] * 3 and pp["median"] == 1e9 * 16 / 16500
    assert {"median", "p95", "min", "max", "stddev", "samples", "samples_ns"} <= set(pp)
    # self-describing
    assert len(result["model"]["sha256"]) == 64 and result["git"]["sha"]
    assert result["versions"]["llama-cpp-python"] and result["machine"]["logical_cpus"]
    s = result["settings"]
    assert (s["n_prompt"], s["n_gen"], s["n_depth"], s["reps"], s["sizes_chosen"]) == (16, 4, 8, 3, "given")
    assert s["engines"]["llamacpp"]["type_k"] == "f16" and s["engines"]["llamacpp"]["flash_attn"] == "auto"
    # interleaved: after both warm-ups, ours then llama.cpp, per repetition
    prefills = [name for (name, call, n) in fake_engines.calls if call == "prefill" and n == 16]
    assert prefills == ["ours:numpy", "llamacpp"] * 4
    # stdout table and report folder
    assert "| pp16 |" in out and "| 0.50 |" in out
    assert (report_dir / "report.md").is_file() and (report_dir / "compare.json").is_file()
    assert (report_dir / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(e.closed for e in fake_engines.engines.values())


def test_quick_preset(capsys, fake_engines, model, tmp_path):
    path = tmp_path / "q.json"
    code, _, err = compare(capsys, "-m", model, "--quick", "--no-cold", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert (s["n_prompt"], s["n_gen"], s["n_depth"], s["reps"], s["sizes_chosen"]) == (64, 16, 64, 2, "quick")


def test_default_sizes_shrink_to_the_context(capsys, fake_engines, model, tmp_path):
    path = tmp_path / "a.json"
    code, _, err = compare(capsys, "-m", model, "--no-cold", "-r", "1", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    # the tiny model has a context of 256: the largest candidate with depth + gen <= 256 is 128/128/128
    assert (s["n_prompt"], s["n_gen"], s["n_depth"]) == (128, 128, 128)
    assert "context (256 tokens)" in s["sizes_note"] and "context (256 tokens)" in err


def test_default_sizes_shrink_to_the_budget(capsys, fake_engines, model, tmp_path):
    # 1e-5 speed: prefill 0.1 s/token, decode 2 s/token on the fake clock; the budget allows only small sizes
    fake_engines.tune["ours:numba"] = {"speed": 1e-5}
    path = tmp_path / "b.json"
    code, _, err = compare(capsys, "-m", model, "--backend", "numba", "--no-cold", "-r", "1", "--budget", "200",
                           "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert s["sizes_chosen"] == "auto-scaled" and "200 s time budget" in s["sizes_note"]
    chosen = (s["n_prompt"], s["n_gen"], s["n_depth"])
    assert chosen in size_candidates(SIZE_LADDER) and chosen != (128, 128, 128)  # below the context-limited size
    assert s["n_gen"] < 128  # decode (2 s/token) is what the budget cuts most


def test_choose_sizes_picks_the_largest_that_fits():
    rates = [EngineRates(prefill_call_s=0.01, prefill_token_s=0.001, decode_s=0.01, startup_s=1.0)] * 2
    full = project_seconds(rates, SIZE_LADDER[0], 3, 100, 3)
    assert choose_sizes(rates, 3, 100, 3, full * 1.01, 8192).how == "default"
    second = project_seconds(rates, SIZE_LADDER[1], 3, 100, 3)
    budget = (full + second) / 2
    picked = choose_sizes(rates, 3, 100, 3, budget, 8192)
    chosen = (picked.n_prompt, picked.n_gen, picked.n_depth)
    candidates = size_candidates(SIZE_LADDER)
    assert project_seconds(rates, chosen, 3, 100, 3) <= budget and "budget" in picked.note
    assert all(project_seconds(rates, c, 3, 100, 3) > budget for c in candidates[: candidates.index(chosen)])
    tiny = choose_sizes(rates, 3, 100, 3, 1e-9, 8192)
    assert (tiny.n_prompt, tiny.n_gen, tiny.n_depth) == SIZE_LADDER[-1] and "even the smallest" in tiny.note


def test_slow_prefill_fast_decode_keeps_a_long_generation():
    # prefill 0.2 s/token but decode 1 ms/token: the budget forces short prompts, not short generations
    rates = [EngineRates(prefill_call_s=0.0, prefill_token_s=0.2, decode_s=0.001, startup_s=0.0)]
    picked = choose_sizes(rates, 1, 10, 0, 200.0, 8192)
    assert picked.n_gen == 128 and picked.n_prompt < 512


def test_size_candidates_order():
    c = size_candidates(SIZE_LADDER)
    assert c[0] == (512, 128, 512) and c[1] == (256, 128, 256) and c[2] == (512, 64, 512)
    assert c[-1] == (16, 4, 16) and len(c) == len(SIZE_LADDER) ** 2


def test_ctrl_c_writes_nothing_and_prints_partial(capsys, fake_engines, model, tmp_path):
    fake_engines.tune["llamacpp"] = {"interrupt_after_decodes": 1 + 4 * 2}  # during tg4, third repetition
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "-p", "16", "-n", "4", "-d", "8", "-r", "3", "--no-cold",
                             "--json", str(json_path), "--report", str(report_dir))
    assert code == 130
    assert not json_path.exists() and not report_dir.exists()
    assert "interrupted" in out and "| pp16 |" in out and "tg4 (partial)" in out
    assert "interrupted" in err


@pytest.mark.parametrize("args,message", [
    (["--backend", "cuda"], "unknown backend 'cuda'"),
    (["--numerics", "x"], "unknown numerics"),
    (["-r", "0"], "-r must be at least 1"),
    (["-p", "0"], "-p must be at least 1"),
    (["-n", "-3"], "-n must be at least 1"),
    (["-d", "abc"], "-d must be an integer"),
    (["-d", "1000", "-n", "8", "-p", "8"], "context length is 256"),
    (["-t", "0"], "-t must be at least 1"),
    (["--budget", "soon"], "--budget"),
    (["--cold-reps", "0"], "--cold-reps"),
])
def test_bad_input_exit_2(capsys, fake_engines, model, args, message):
    code, _, err = compare(capsys, "-m", model, *args)
    assert code == 2 and err.startswith("error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_model_exit_2(capsys, fake_engines):
    code, _, err = compare(capsys, "-m", "no-such-model")
    assert code == 2 and "unknown model" in err


def test_probe_separates_per_call_and_per_token_cost():
    import numpy as np
    from bench_fakes import DECODE_CTX_NS, DECODE_NS, PREFILL_CALL_NS, PREFILL_TOKEN_NS, FakeClock, FakeEngine

    from bench_compare.compare_run import probe_rates

    clock = FakeClock()
    rates = probe_rates(FakeEngine("x", clock), np.arange(10, 200), seed=1, startup_s=2.0, clock=clock)
    assert rates.prefill_call_s == pytest.approx(PREFILL_CALL_NS / 1e9, rel=1e-9)
    assert rates.prefill_token_s == pytest.approx(PREFILL_TOKEN_NS / 1e9, rel=1e-9)
    # 4 decodes after the 32-token probe prefill: cache sizes 32..35
    assert rates.decode_s == pytest.approx((DECODE_NS + DECODE_CTX_NS * 33.5) / 1e9, rel=1e-9)
    assert rates.prefill(600) == pytest.approx(2 * PREFILL_CALL_NS / 1e9 + 600 * PREFILL_TOKEN_NS / 1e9)
