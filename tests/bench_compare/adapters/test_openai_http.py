"""The HTTP engine and ``compare --engine openai:URL`` against a fake OpenAI server started on 127.0.0.1 here:
TTFT at the first text chunk, percentiles, and every way a server can misbehave ending in one line, exit 2."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

pytest.importorskip("httpx")
pytest.importorskip("httpx_sse")
pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from fake_openai_server import FIRST_TEXT_DELAY_S, SLOW_S, TOKEN_DELAY_S, FakeServer  # noqa: E402

from bench_compare import cli, engines  # noqa: E402
from bench_compare.adapters import http_bench, openai_http  # noqa: E402
from inference_engine.errors import GGUFParityError  # noqa: E402

# A test that waited on a stuck server would take SLOW_S; the client must give up after its read timeout instead.
READ_TIMEOUT = "0.3"
# For a test about something else that also runs llama.cpp in this process beside the fake server's thread: on a busy
# 2-core machine a stream paused 0.3 s there (a background suite run), which is no stuck server.
PATIENT_READ_TIMEOUT = "30"


@pytest.fixture(scope="module")
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture(scope="module")
def model(tiny_model):
    return str(tiny_model("llama"))


def _compare(url: str, model: str, *extra: str, read_timeout: str = READ_TIMEOUT) -> list[str]:
    return ["compare", "--engine", f"openai:{url}", "--against", "none", "-m", model, "-p", "8", "-n", "4",
            "-r", "1", "--warmup", "0", "--no-progress", "--engine-opt", f"read_timeout={read_timeout}", *extra]


def test_spec_reaches_the_factory(fake, model):
    spec = engines.parse_engine_spec(f"openai:{fake.url('ok')}")
    assert (spec.scheme, spec.target, spec.over_http) == ("openai", fake.url("ok"), True)
    with engines.make_engine(spec, model, n_threads=1, unknown_option="ignored") as engine:
        assert isinstance(engine, openai_http.OpenAIHTTPEngine)
        assert engine.model_name == "fake-model"  # the server's first listed model
        assert engine.capabilities == openai_http.CAPABILITIES
        with pytest.raises(GGUFParityError, match="cannot be had over HTTP"):
            engine.prefill([1, 2])
        with pytest.raises(GGUFParityError, match="hidden states"):
            engine.capture([1, 2])


def test_ttft_is_counted_at_the_first_chunk_with_text(fake, model):
    with openai_http.open_engine(fake.url("ok"), model) as engine:
        record = engine.stream(engine.completion_body("hello", 5))
    assert record.text == " w0 w1 w2 w3 w4"
    assert record.n_chunks == 6 and record.n_empty_chunks == 1  # the role-only first chunk is seen, not counted
    first_chunk = record.t_first_chunk - record.t_start
    assert record.ttft_s >= FIRST_TEXT_DELAY_S > first_chunk
    assert len(record.itl_s) == 4 and min(record.itl_s) >= TOKEN_DELAY_S * 0.5
    assert record.n_output_tokens(5) == (5, "finish_reason=length")


def test_greedy_body_is_neutral(fake, model):
    with openai_http.open_engine(fake.url("ok"), model, model_name="m") as engine:
        body = engine.completion_body("x", 3, logprobs=2, ban_eos=True)
    assert body["repeat_penalty"] == 1.0 and body["temperature"] == 0.0 and body["top_p"] == 1.0
    assert body["model"] == "m" and body["logprobs"] == 2
    assert body["logit_bias"] and all(v == -100.0 for v in body["logit_bias"].values())


def test_summarize_percentiles():
    values = list(range(1, 101))
    stats = http_bench.summarize([v / 1000 for v in values])
    assert stats["n"] == 100
    assert stats["mean"] == pytest.approx(0.0505)
    assert stats["median"] == pytest.approx(np.percentile(values, 50) / 1000)
    assert stats["p90"] == pytest.approx(0.0901) and stats["p99"] == pytest.approx(0.09901)
    assert http_bench.summarize([])["median"] is None


def test_prompts_have_the_asked_token_count_and_differ(model):
    from inference_engine.tokenizer import GGUFTokenizer

    maker = http_bench.PromptMaker(GGUFTokenizer.from_gguf(model), seed=3)
    a, na = maker.make(20, salt=1)
    b, nb = maker.make(20, salt=2)
    assert na == nb == 20 and a != b  # different first words: no shared prefix for a cache to reuse
    assert a.split()[0] != b.split()[0] or a[:8] != b[:8]


def test_compare_cli_end_to_end_with_concurrency(fake, model, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = cli.main(_compare(fake.url("ok"), model, "--concurrency", "1,3", "--json", str(out)))
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    # the typed record (validation.results.HttpCompareResult) with the one provenance block
    assert (result["kind"], result["schema_version"]) == ("http-compare", 1)
    assert {"date", "git", "versions", "machine"} <= set(result)
    summary = result["summary"][f"openai:{fake.url('ok')}"]
    assert set(summary) == {"pp8", "tg4", "c1", "c3"}
    assert summary["c3"]["requests"] == 3 * http_bench.DEFAULT_REQUESTS_PER_CLIENT
    assert summary["tg4"]["ttft_s"]["median"] >= FIRST_TEXT_DELAY_S
    assert summary["tg4"]["first_chunk_s"]["median"] < FIRST_TEXT_DELAY_S
    assert summary["c3"]["aggregate_tps"] > 0
    assert any("first streamed chunk that carries token text" in n for n in result["notes"])
    assert "TTFT ms" in capsys.readouterr().out


@pytest.mark.parametrize("mode, message", [
    ("malformed", "malformed JSON in stream chunk"),
    ("drop", "dropped"),
    ("error500", "HTTP 500"),
])
def test_misbehaving_server_is_one_line_exit_2(fake, model, mode, message, capsys):
    rc = cli.main(_compare(fake.url(mode), model))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err and fake.url(mode) in err


def test_slow_server_times_out_instead_of_hanging(fake, model, capsys):
    t0 = time.monotonic()
    rc = cli.main(_compare(fake.url("slow"), model))
    err = capsys.readouterr().err
    assert rc == 2 and "read timeout" in err and err.count("\n") == 1
    assert time.monotonic() - t0 < SLOW_S


def test_unreachable_url_is_one_line_exit_2(model, capsys):
    from bench_compare.adapters.llamacpp_server import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    rc = cli.main(_compare(url, model))
    err = capsys.readouterr().err
    assert rc == 2 and "cannot connect" in err and url in err and err.count("\n") == 1


def test_what_was_measured_is_kept_when_the_server_fails(fake, model, tmp_path, capsys):
    out = tmp_path / "partial.json"
    rc = cli.main(_compare(fake.url("fail-after-3"), model, "-r", "3", "--json", str(out)))
    assert rc == 2 and "dropped" in capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["complete"] is False and "dropped" in result["error"]
    assert len(result["requests"][f"openai:{fake.url('fail-after-3')}"]) == 3


@pytest.mark.parametrize("args, message", [
    (["--engine", "bogus:thing"], "unknown engine 'bogus:thing': no engine scheme 'bogus'"),
    (["--engine", "openai:ftp://x/v1"], "http(s) base URL"),
    (["--engine", "openai:http://127.0.0.1:1/v1", "--concurrency", "0"], "--concurrency needs integers"),
    (["--engine", "openai:http://127.0.0.1:1/v1", "--engine-opt", "novalue"], "KEY=VALUE"),
    (["--engine", "openai:http://127.0.0.1:1/v1", "-p", "4000"], "more than the context"),
    (["--engine", "openai:http://127.0.0.1:1/v1", "--against", "vllm"], "--against for an HTTP engine"),
])
def test_bad_flags_are_one_line_exit_2(model, args, message, capsys):
    rc = cli.main(["compare", "-m", model, "--against", "none", "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_openai_client_library_reads_the_fake_stream(fake):
    """The fake speaks the protocol the official client understands (so the tests above test the real thing)."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=fake.url("ok"), api_key="unused", timeout=10)
    texts = [c.choices[0].text for c in client.completions.create(model="fake-model", prompt="hi", max_tokens=3,
                                                                  stream=True)]
    assert texts == ["", " w0", " w1", " w2"]


def test_against_llamacpp_in_process_then_report_and_gate(fake, model, tmp_path, capsys):
    """The in-process reference side (llama.cpp on the tiny model) gives ratios; `report` renders the HTTP result,
    appends history and gates it against itself as the baseline."""
    pytest.importorskip("llama_cpp")
    out = tmp_path / "http.json"
    rc = cli.main(_compare(fake.url("ok"), model, "--against", "llamacpp", "--concurrency", "1,2", "-t", "1",
                           "-c", "128", "-r", "2", "--json", str(out), read_timeout=PATIENT_READ_TIMEOUT))
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    result = json.loads(out.read_text())
    assert result["sides"]["llamacpp"]["kind"] == "in-process"
    assert "c2" not in result["summary"]["llamacpp"]  # one sequence in-process: no concurrency above 1
    assert result["summary"]["llamacpp"]["tg4"]["output_tokens"] == 2 * 4  # two rounds
    assert result["summary"]["llamacpp"]["c1"]["rounds"] == 2
    assert result["ratios"]["tg4"]["tps"] > 0 and "c2" not in result["ratios"]
    for name in ("pp8 tps", "tg4 tps", "tg4 tpot", "c1 aggregate_tps", "c1 e2e"):  # both rounds paired
        interval = result["ratio_intervals"][name]
        assert interval["n"] == 2 and interval["low"] <= interval["ratio"] <= interval["high"]
        assert interval["verdict"] in ("faster", "slower", "same")
    assert "| c1 | aggregate tok/s |" in printed.out and "95% CI" in printed.out
    rc = cli.main(["report", str(out), "--out", str(tmp_path / "rep"), "--history", str(tmp_path / "h.csv"),
                   "--baseline", str(out), "--max-regression", "50"])
    assert rc == 0, capsys.readouterr().err
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## HTTP compare" in text and "`tg4 tps`" in text  # the gate checked the flattened ratios
    assert "ratio:tg4 tps" in (tmp_path / "h.csv").read_text()


def test_bench_points_http_engines_to_compare(model, capsys):
    rc = cli.main(["bench", "-m", model, "--engine", "openai:http://127.0.0.1:1/v1"])
    err = capsys.readouterr().err
    assert rc == 2 and "compare --engine SPEC --against none" in err and err.count("\n") == 1


def test_a_client_failing_mid_sweep_keeps_the_other_requests(fake, model, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    # requests 1-2: pp8, tg4; 3-6: two clients x two requests at concurrency 2, of which the 5th and 6th drop
    rc = cli.main(_compare(fake.url("fail-after-4"), model, "--concurrency", "2", "--json", str(out)))
    assert rc == 2 and "dropped" in capsys.readouterr().err
    requests = json.loads(out.read_text())["requests"][f"openai:{fake.url('fail-after-4')}"]
    assert [r["test"] for r in requests] == ["pp8", "tg4", "c2", "c2"]


def test_engines_list_shows_the_http_engines(capsys):
    """The two HTTP schemes are lines of the one engine registry, listed with their factories' descriptions."""
    assert cli.main(["engines", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    openai = next(ln for ln in lines if ln.split()[0] == "openai:URL")
    server = next(ln for ln in lines if ln.split()[0] == "llamacpp-server")
    assert "OpenAI-compatible server" in openai
    assert "llama.cpp's own OpenAI server" in server
    assert engines.parse_engine_spec("llamacpp-server").over_http
    assert not engines.parse_engine_spec("llamacpp").over_http


def _request(test: str, rnd: int, ttft: float, e2e: float, *, level: int = 1, n_out: int = 4,
             cached: int | None = None) -> http_bench.RequestResult:
    itl = [(e2e - ttft) / (n_out - 1)] * (n_out - 1)
    return http_bench.RequestResult(test, level, 8, n_out, n_out, "usage", ttft, ttft, e2e, itl,
                                    (e2e - ttft) / (n_out - 1), 0.0, e2e, rnd, cached)


def test_ratios_pair_the_rounds_so_common_drift_cancels():
    """The engine is twice as fast as the reference in every round while the machine drifts by +-30% between
    rounds: paired per round, the ratio is exactly 2 with a zero-width interval ("faster"); the drift would have
    widened an unpaired comparison of the two sides' samples."""
    drift = [1.0, 1.3, 0.7]
    engine = [_request("tg4", i, 0.1 * d, 0.4 * d) for i, d in enumerate(drift)]
    reference = [_request("tg4", i, 0.2 * d, 0.8 * d) for i, d in enumerate(drift)]
    paired = http_bench.paired_intervals(http_bench.round_values(engine, {}), http_bench.round_values(reference, {}))
    for metric in ("tps", "ttft", "tpot", "e2e"):  # throughput engine/reference, times reference/engine
        interval = paired["tg4"][metric]
        assert interval.n == 3 and interval.verdict == "faster"
        assert interval.ratio == pytest.approx(2.0) and interval.low == pytest.approx(2.0)
    from bench_compare import intervals

    unpaired = intervals.unpaired_interval_of([r.tps() for r in engine], [r.tps() for r in reference], True)
    assert unpaired.low < 1.5 and unpaired.high > 2.5  # what pairing removed


def test_concurrency_rounds_give_aggregate_ratios_and_an_unfinished_round_none():
    engine = [_request("c2", rnd, 0.1, 0.5, level=2) for rnd in (0, 1) for _client in (0, 1)]
    reference = [_request("c2", rnd, 0.3, 1.5, level=2) for rnd in (0, 1) for _client in (0, 1)]
    # both rounds finished on the reference side; the engine's second round was cut off (no wall time)
    values_e = http_bench.round_values(engine, {2: [0.5]})
    values_r = http_bench.round_values(reference, {2: [1.5, 3.0]})
    assert values_e["c2"]["aggregate_tps"] == {0: pytest.approx(8 / 0.5)}
    assert values_r["c2"]["aggregate_tps"] == {0: pytest.approx(8 / 1.5), 1: pytest.approx(8 / 3.0)}
    paired = http_bench.paired_intervals(values_e, values_r)
    assert paired["c2"]["aggregate_tps"].n == 1 and paired["c2"]["aggregate_tps"].verdict == "unknown"
    assert paired["c2"]["aggregate_tps"].ratio == pytest.approx(3.0)
    assert paired["c2"]["ttft"].n == 2 and paired["c2"]["ttft"].ratio == pytest.approx(3.0)
    summary = http_bench.summarize_side(engine, {2: [0.5]})["c2"]
    assert summary["rounds"] == 1 and summary["aggregate_tps"] == pytest.approx(8 / 0.5)  # the finished round only


def test_prompts_served_from_a_prefix_cache_are_named():
    rows = [_request("pp8", 0, 0.1, 0.1, cached=1), _request("pp8", 1, 0.01, 0.01, cached=7),
            _request("tg4", 0, 0.1, 0.4)]
    summary = {"srv": http_bench.summarize_side(rows, {})}
    assert summary["srv"]["pp8"]["cached_tokens"] == {"reported": 2, "reused": 1, "most": 7}
    assert summary["srv"]["tg4"]["cached_tokens"] == {"reported": 0, "reused": 0, "most": None}
    (note,) = http_bench.cache_notes(summary)
    assert note.startswith("srv served prompt tokens from its prefix cache in pp8 1 of 2 (up to 7 tokens)")
    # a BOS and a first word shared by chance are not a cached prompt
    assert http_bench.cache_notes({"srv": http_bench.summarize_side(rows[:1], {})}) == []


def test_each_run_draws_its_own_prompt_seed_unless_given(fake, model, tmp_path, capsys):
    configs = []
    for i, extra in enumerate([[], [], ["--seed", "5"]]):
        out = tmp_path / f"{i}.json"
        assert cli.main(_compare(fake.url("ok"), model, "--json", str(out), *extra)) == 0, capsys.readouterr().err
        result = json.loads(out.read_text())
        configs.append((result["config"]["seed"], result["config"]["seed_given"], result["notes"][1]))
    (a, a_given, a_note), (b, _, _), (c, c_given, c_note) = configs
    assert a != b and not a_given and f"--seed {a} repeats them" in a_note
    assert (c, c_given) == (5, True) and "a server kept running since may serve from its prefix cache" in c_note


@pytest.mark.parametrize("args, message", [
    (["--engine", "openai:http://127.0.0.1:1/v1", "--against", "none", "--precision", "5%"],
     "--precision not used by an HTTP compare"),
    (["--engine", "openai:http://127.0.0.1:1/v1", "--against", "none", "--no-cold", "--budget", "60"],
     "--no-cold, --budget not used by an HTTP compare"),
    (["--concurrency", "1,4"], "--concurrency only for an HTTP engine"),
    (["--requests-per-client", "3", "-c", "512"], "--requests-per-client, -c only for an HTTP engine"),
])
def test_flags_of_the_other_mode_are_refused(model, args, message, capsys):
    rc = cli.main(["compare", "-m", model, "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1
