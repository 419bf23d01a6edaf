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
    names = ("pp16", "tg4", "pp16 @ d8", "tg4 @ d8", "ttft hot")  # llama-bench's -d: pp and tg at the depth
    assert tests == [(t, e) for t in names for e in ("ours:numpy", "llamacpp")]
    assert result["ratios"] == {name: 0.5 for name in names}
    # a fake clock has no noise: every pair's ratio is 0.5, so the interval is the point and the verdict certain
    pp16 = result["ratio_intervals"]["pp16"]
    assert (pp16["ratio"], pp16["low"], pp16["high"], pp16["n"], pp16["verdict"]) == (0.5, 0.5, 0.5, 3, "slower")
    pp = result["results"][0]
    assert pp["unit"] == "t/s" and pp["samples"] == [1e9 * 16 / 16500] * 3 and pp["median"] == 1e9 * 16 / 16500
    assert {"median", "p95", "min", "max", "stddev", "samples", "samples_ns"} <= set(pp)
    # self-describing
    assert len(result["model"]["sha256"]) == 64 and result["git"]["sha"]
    assert result["versions"]["llama-cpp-python"] and result["machine"]["logical_cpus"]
    s = result["settings"]
    assert (s["n_prompt"], s["n_gen"], s["n_depth"], s["reps"], s["sizes_chosen"]) == (16, 4, 8, 3, "given")
    assert s["engines"]["llamacpp"]["type_k"] == "f16" and s["engines"]["llamacpp"]["flash_attn"] == "auto"
    assert s["engines"]["ours:numpy"]["type_k"] == s["engines"]["ours:numpy"]["type_v"] == "f16"  # the same cache
    # interleaved: after both warm-ups, ours then llama.cpp, per repetition
    prefills = [name for (name, call, n) in fake_engines.calls if call == "prefill" and n == 16]
    assert prefills == ["ours:numpy", "llamacpp"] * 8  # pp16, then pp16 @ d8
    # stdout table and report folder
    assert "| pp16 |" in out and "| 0.50 | 0.50-0.50 | slower |" in out
    assert (report_dir / "report.md").is_file() and (report_dir / "compare.json").is_file()
    assert (report_dir / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(e.closed for e in fake_engines.engines.values())


def test_quick_preset(capsys, fake_engines, model, tmp_path):
    path = tmp_path / "q.json"
    code, _, err = compare(capsys, "-m", model, "--quick", "--no-cold", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert (s["n_prompt"], s["n_gen"], s["n_depth"], s["reps"], s["sizes_chosen"]) == (64, 16, 64, 2, "quick")


@pytest.mark.parametrize("extra, reps, cold_reps", [
    ((), 2, 1),  # --quick's own: two repetitions, one cold start per engine
    (("-r", "3"), 3, 1),  # a -r given wins, even one equal to the default (3)
    (("--cold-reps", "2"), 2, 2),
])
def test_quick_lowers_the_defaults_and_a_given_value_wins(capsys, fake_engines, model, tmp_path, monkeypatch, extra,
                                                          reps, cold_reps):
    from bench_compare import cold_runner

    starts = []
    monkeypatch.setattr(cold_runner, "run_cold_start_subprocess", lambda spec, *a, **k: starts.append(spec.name) or {
        "phases_ns": {"load": 10, "prefill": 20}, "total_ns": 30, "n_prompt_tokens": 3, "peak_rss_bytes": 1 << 20,
        "peak_rss_ttft_bytes": 1 << 20, "rss_after_imports_bytes": 1 << 19})
    path = tmp_path / "q.json"
    code, _, err = compare(capsys, "-m", model, "--quick", "--json", str(path), *extra)
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert (s["reps"], s["cold_reps"], len(starts)) == (reps, cold_reps, 2 * cold_reps)
    assert f"-r {reps}, cold runs {cold_reps}" in s["sizes_note"]


def test_cold_reps_with_no_cold_is_one_line(capsys, fake_engines, model, tmp_path):
    code, _, err = compare(capsys, "-m", model, "--no-cold", "--cold-reps", "3", "--json", str(tmp_path / "c.json"))
    assert code == 2 and err.strip() == ("error: --cold-reps counts the cold starts that --no-cold skips: give one "
                                         "or the other")
    assert not (tmp_path / "c.json").exists()


def test_default_sizes_shrink_to_the_context(capsys, fake_engines, model, tmp_path):
    path = tmp_path / "a.json"
    code, _, err = compare(capsys, "-m", model, "--no-cold", "-r", "1", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    # the tiny model has a context of 256: the largest candidate with depth + gen <= 256 is 128/128/128
    assert (s["n_prompt"], s["n_gen"], s["n_depth"]) == (128, 128, 128)
    assert "context (256 tokens)" in s["sizes_note"] and "context (256 tokens)" in err


def test_a_budget_shrinks_the_default_sizes_and_says_why(capsys, fake_engines, model, tmp_path):
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


def test_unknown_model_exit_2(capsys, fake_engines):
    code, _, err = compare(capsys, "-m", "no-such-model")
    assert code == 2 and "unknown model" in err


@pytest.mark.parametrize("extra, message", [
    (("--engine", "llamacpp", "--numerics", "f32"), "--numerics not used with --engine llamacpp: that engine computes "
                                                    "in its own way"),
    (("--engine", "llamacpp", "--backend", "numpy"), "--backend not used with --engine llamacpp"),
])
def test_our_engine_s_flags_with_llamacpp_under_test_are_one_line(capsys, fake_engines, model, tmp_path, extra,
                                                                    message):
    json_path = tmp_path / "c.json"
    code, _, err = compare(capsys, "-m", model, "--quick", "--json", str(json_path), *extra)
    assert code == 2 and message in err and err.count("\n") == 1 and not json_path.exists(), err


def test_probe_measures_each_cost_of_the_fake_exactly():
    import numpy as np
    from bench_fakes import (
        DECODE_CTX_NS,
        DECODE_NS,
        PREFILL_CALL_NS,
        PREFILL_TOKEN_NS,
        RESET_NS,
        FakeClock,
        FakeEngine,
    )

    from bench_compare.compare_run import probe_rates

    clock = FakeClock()
    rates = probe_rates(FakeEngine("x", clock), np.arange(10, 200), seed=1, startup_s=2.0, clock=clock)
    assert rates.prefill_call_s == pytest.approx(PREFILL_CALL_NS / 1e9, rel=1e-9)
    assert rates.prefill_token_s == pytest.approx(PREFILL_TOKEN_NS / 1e9, rel=1e-9)
    assert rates.decode_s == pytest.approx(DECODE_NS / 1e9, rel=1e-9)
    assert rates.decode_ctx_s == pytest.approx(DECODE_CTX_NS / 1e9, rel=1e-9)
    assert rates.reset_s == pytest.approx(RESET_NS / 1e9, rel=1e-9)
    assert rates.prefill(600) == pytest.approx(2 * PREFILL_CALL_NS / 1e9 + 600 * PREFILL_TOKEN_NS / 1e9)


# The fakes cost exactly the linear model the projection assumes (per call, token, step, context token, reset); only
# the fakes' rounding of a cost to whole nanoseconds (odd costs at speed 2) can separate the two.
PROJECTION_REL_TOL = 1e-6


@pytest.mark.parametrize("ours_speed, budget", [(1.0, "1000"), (1e-3, "60"), (1e-5, "200")])
def test_the_projection_equals_what_the_run_takes(capsys, fake_engines, tiny_model, tmp_path, ours_speed, budget):
    # a model with room for llama-bench's full sizes, so that every ladder step is reachable
    model = str(tiny_model("llama", n_ctx=2048))
    fake_engines.tune["ours:numba"] = {"speed": ours_speed}
    fake_engines.tune["llamacpp"] = {"speed": SLOWER}
    path = tmp_path / "p.json"
    code, out, err = compare(capsys, "-m", model, "--backend", "numba", "--no-cold", "-r", "2", "--budget", budget,
                             "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert s["measured_s"] == pytest.approx(s["projected_s"], rel=PROJECTION_REL_TOL)
    assert s["measured_s"] <= float(budget) or "even the smallest" in s["sizes_note"]
    assert f"projected {s['projected_s']:.0f} s" in out  # the closing line shows both


def test_default_sizes_are_llama_bench_s_without_a_probe(capsys, fake_engines, tiny_model, tmp_path):
    # even an engine that needs 20 s per token gets pp512 / tg128 / d512 unless the user sets a budget
    fake_engines.tune["ours:numba"] = {"speed": 1e-6}
    path = tmp_path / "d.json"
    code, _, err = compare(capsys, "-m", str(tiny_model("llama", n_ctx=2048)), "--backend", "numba", "--no-cold",
                           "-r", "1", "--json", str(path))
    assert code == 0, err
    s = json.loads(path.read_text())["settings"]
    assert (s["n_prompt"], s["n_gen"], s["n_depth"], s["sizes_chosen"]) == (512, 128, 512, "default")
    assert s["sizes_note"] == "" and s["projected_s"] is None and "probing" not in err
    assert not [c for c in fake_engines.calls if c[1] == "prefill" and c[2] == 16]  # no probe prefills ran


def test_the_projection_counts_every_call_the_runner_makes():
    # one engine, 1 s per prefill call, 0 per token, 1 s per decode, 1 s per reset, 1 rep, no cold runs:
    # pp: 2 x (reset + call); tg8: warm-up reset + 1 step, then reset + 8 steps; pp16 @ d4: 2 x (reset + depth call
    # + call); tg8 @ d4: reset + depth call + 1 step, then reset + depth call + 8 steps; ttft: 2 x (reset + call)
    rates = [EngineRates(prefill_call_s=1.0, prefill_token_s=0.0, decode_s=1.0, startup_s=0.0, reset_s=1.0)]
    assert project_seconds(rates, (16, 8, 4), reps=1, ttft_tokens=10, cold_reps=0) == 4 + 11 + 6 + 13 + 4
    # an engine that rewinds fills the depth once (reset + depth call), then pp16 @ d4 is 2 calls and tg8 @ d4 1 + 8
    # steps on the cache it keeps
    rates[0].rewinds = True
    assert project_seconds(rates, (16, 8, 4), reps=1, ttft_tokens=10, cold_reps=0) == 4 + 11 + (2 + 2) + 9 + 4


def test_results_and_reports_name_the_cpu_and_its_instruction_set(capsys, fake_engines, model, tmp_path):
    from inference_engine.cpu_features import cpu_features

    cpu = cpu_features()
    label = f"{cpu.name}, {cpu.label}"  # e.g. "AMD EPYC, AVX2"
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "-p", "16", "-n", "4", "-d", "0", "-r", "1", "--no-cold",
                             "--json", str(json_path), "--report", str(report_dir))
    assert code == 0, err
    machine = json.loads(json_path.read_text())["machine"]
    assert (machine["cpu"], machine["isa"], machine["cpu_isa"]) == (cpu.name, cpu.label, label)
    assert machine["isa_flags"] == cpu.isa
    assert f"| test ({label}) |" in out  # the table header
    assert label in (report_dir / "report.md").read_text()


@pytest.mark.heavy
def test_compare_runs_on_the_1_5b_model(capsys, tmp_path):
    """The real engines on qwen2.5-coder-1.5b with small sizes: every test measured on both, the extra-buffer
    verdict recorded (a crash of llama.cpp's repacked kernels would have been caught by the probe)."""
    path = tmp_path / "q.json"
    code, _, err = compare(capsys, "-m", "qwen2.5-coder-1.5b", "-p", "32", "-n", "4", "-d", "32", "-r", "1",
                             "--cold-reps", "1", "-t", "2", "--json", str(path))
    assert code == 0, err
    result = json.loads(path.read_text())
    assert set(result["ratios"]) == {"pp32", "tg4", "pp32 @ d32", "tg4 @ d32", "ttft hot", "ttft cold", "peak rss"}
    bufts = result["settings"]["engines"]["llamacpp"]
    assert isinstance(bufts["extra_bufts"], bool) and bufts["extra_bufts_reason"]


def test_cold_starts_alternate_after_the_hot_engines_are_released(capsys, fake_engines, model, tmp_path, monkeypatch):
    """The cold starts run only once both hot engines are closed (their memory given back), and the engine that
    starts first alternates (ours, llama.cpp; llama.cpp, ours; ...), so neither always follows the other's process."""
    from bench_compare import cold_runner

    starts: list[tuple[str, bool]] = []

    def fake_cold_start(spec, model_path, prompt, **kwargs):
        starts.append((spec.name, all(e.closed for e in fake_engines.engines.values())))
        return {"phases_ns": {"load": 10, "prefill": 20}, "total_ns": 30, "n_prompt_tokens": 3,
                "peak_rss_bytes": 1 << 20, "peak_rss_ttft_bytes": 1 << 20, "rss_after_imports_bytes": 1 << 19}

    monkeypatch.setattr(cold_runner, "run_cold_start_subprocess", fake_cold_start)
    path = tmp_path / "r.json"
    code, _, err = compare(capsys, "-m", model, "-p", "16", "-n", "4", "-d", "0", "-r", "1", "--cold-reps", "3",
                           "--json", str(path))
    assert code == 0, err
    ours = starts[0][0]
    assert ours.startswith("ours:")
    assert [name for name, _ in starts] == [ours, "llamacpp", "llamacpp", ours, ours, "llamacpp"]
    assert all(released for _, released in starts)
    assert {"ttft cold", "peak rss"} <= set(json.loads(path.read_text())["ratios"])


# --- a first run's kernel compile: announced, untimed, outside the projection (issue 34) --------------------------
COMPILE_NS = 46_000_000_000  # SmolLM2's kernels compiled in a first compare on a 2-core machine: ~46 s


@pytest.fixture
def compiling_ours(fake_engines, monkeypatch):
    """Our fake engine's first call costs a compile (announced as Numba's would be, once per process)."""
    from inference_engine import compile_notice

    monkeypatch.setattr(compile_notice, "_announced", False)
    fake_engines.tune["ours:numba"] = {"first_call_ns": COMPILE_NS}
    return fake_engines


def test_a_first_run_compile_is_announced_and_kept_out_of_the_samples(capsys, compiling_ours, model, tmp_path):
    from inference_engine.compile_notice import NOTICE

    path = tmp_path / "c.json"
    code, _, err = compare(capsys, "-m", model, "--backend", "numba", "-p", "16", "-n", "4", "-d", "8", "-r", "3",
                           "--no-cold", "--json", str(path))
    assert code == 0, err
    assert err.count(NOTICE) == 1
    result = json.loads(path.read_text())
    pp = next(r for r in result["results"] if r["test"] == "pp16" and r["engine"] == "ours:numba")
    assert pp["samples"] == [1e9 * 16 / 16500] * 3  # the compile is in no sample
    assert result["settings"]["kernels_compiled"] == {"warmup": 1, "measuring": 0}
    assert result["settings"]["measured_s"] < COMPILE_NS / 1e9  # nor in the measured part
    # the warm-up (64 tokens, then 2 decoded) ran first, on both engines, before any test's own warm-up, until two
    # runs in a row agreed: ours compiled in its first, so its second and third agree; llama.cpp's first two agree
    assert [c for c in compiling_ours.calls if c[1] == "prefill"][:5] == [("ours:numba", "prefill", 64)] * 3 + [
        ("llamacpp", "prefill", 64)] * 2
    assert result["settings"]["warmup_runs"] == {"ours:numba": 3, "llamacpp": 2}


@pytest.mark.parametrize("budget", [None, 1000.0])
def test_the_progress_bar_and_the_budget_projection_start_after_the_compile(compiling_ours, tiny_model, budget):
    """The progress total is set (its projection starts) only once the compile is done; with --budget the probe
    measures post-compile costs, so the projection still equals the measured time."""
    from bench_compare.compare_run import CompareConfig, CompareSession, run_compare

    cfg = CompareConfig(model=str(tiny_model("llama", n_ctx=2048)), backend="numba", reps=2, cold=False,
                        budget_s=budget, n_prompt=None if budget else 16, n_gen=None if budget else 4,
                        n_depth=None if budget else 8)
    at_total: list[bool] = []
    result = run_compare(cfg, CompareSession(cfg),
                         progress=lambda n: at_total.append(compiling_ours.engines["ours:numba"].first_call_done))
    assert at_total == [True]
    s = result["settings"]
    assert s["kernels_compiled"] == {"warmup": 1, "measuring": 0}
    if budget is not None:
        assert s["measured_s"] == pytest.approx(s["projected_s"], rel=PROJECTION_REL_TOL)
