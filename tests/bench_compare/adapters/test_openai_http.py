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


@pytest.fixture(scope="module")
def fake():
    with FakeServer() as server:
        yield server


@pytest.fixture(scope="module")
def model(tiny_model):
    return str(tiny_model("llama"))


def _compare(url: str, model: str, *extra: str) -> list[str]:
    return ["compare", "--engine", f"openai:{url}", "--against", "none", "-m", model, "-p", "8", "-n", "4",
            "-r", "1", "--warmup", "0", "--no-progress", "--engine-opt", f"read_timeout={READ_TIMEOUT}", *extra]


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
    (["--engine", "bogus:thing"], "unknown engine 'bogus:thing'; choose one of"),
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
                           "-c", "128", "--json", str(out)))
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    assert result["sides"]["llamacpp"]["kind"] == "in-process"
    assert "c2" not in result["summary"]["llamacpp"]  # one sequence in-process: no concurrency above 1
    assert result["summary"]["llamacpp"]["tg4"]["output_tokens"] == 4
    assert result["ratios"]["tg4"]["tps"] > 0 and "c2" not in result["ratios"]
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
