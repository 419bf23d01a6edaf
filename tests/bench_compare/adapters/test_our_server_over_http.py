"""Our own engine through the third way in: `bench-compare serve`'s OpenAI API, driven by `--engine openai:URL`
exactly as a user's server would be. The fidelity verdict over HTTP must equal the in-process one (both pass against
llama.cpp), and the serving benchmark must run against llama.cpp's own server, both on 127.0.0.1 and stopped.

The fidelity test runs on the real smollm2: a tiny random model's greedy tokens are arbitrary bytes (partial UTF-8),
whose streamed text cannot be compared piece by piece over HTTP (the server holds incomplete characters back)."""

from __future__ import annotations

import json

import pytest
from fixtures.servers import start_server

from bench_compare import cli
from bench_compare.adapters.llamacpp_server import server_available

ARCH = "llama"  # the serving benchmark runs on a tiny model: speed only, no text compared


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model(ARCH, "Q8_0")


@pytest.mark.slow
def test_validate_our_server_over_http_gives_the_in_process_verdict(tmp_path, capsys):
    from inference_engine.store.named_models import resolve_model

    smollm2 = resolve_model("smollm2-135m", progress=False)
    in_process = cli.main(["validate", "--model", str(smollm2), "--backend", "numba", "--numerics", "ggml",
                           "--smoke-tokens", "8", "--threads", "2", "--report", str(tmp_path / "in-process"),
                           "--json", str(tmp_path / "in-process.json")])
    capsys.readouterr()
    out = tmp_path / "http.json"
    with start_server(smollm2, backend="numba", numerics="ggml", threads=2) as server:
        over_http = cli.main(["validate", "--engine", f"openai:{server.url}/v1", "--model", str(smollm2),
                              "--smoke-tokens", "8", "--threads", "2", "--json", str(out),
                              "--report", str(tmp_path / "http")])
        printed = capsys.readouterr()
        # the same server against our NumPy reference (where llama.cpp does not run): its floor, llama.cpp's
        # variants as our engine computes them, for the f32 class a server is judged in
        against_numpy = cli.main(["validate", "--engine", f"openai:{server.url}/v1", "--model", str(smollm2),
                                  "--smoke-tokens", "4", "--threads", "2", "--against", "numpy",
                                  "--json", str(tmp_path / "numpy.json"), "--report", str(tmp_path / "numpy")])
        numpy_printed = capsys.readouterr()
    assert against_numpy == 0, numpy_printed.err + numpy_printed.out
    numpy_result = json.loads((tmp_path / "numpy.json").read_text())
    assert numpy_result["reference"] == "ours:numpy" and numpy_result["passed"]
    assert {"K/V F16 (flash attention off)", "weights F32"} <= set(numpy_result["noise_floor"]["variants"])
    assert "no flash attention" in numpy_result["noise_floor"]["errors"]["llama.cpp defaults (K/V F16, flash "
                                                                         "attention auto)"]
    assert in_process == 0
    assert over_http == in_process, printed.err + printed.out
    result = json.loads(out.read_text())
    assert result["passed"]
    assert result["prompt_sent_as"] == "token ids"  # our server takes the harness's ids as they are
    # Both verdicts are on the same text: with no --prompt, the HTTP check runs the in-process validate's prompt.
    assert result["prompt_tokens"] == json.loads((tmp_path / "in-process.json").read_text())["prompt"]["n_tokens"]
    # The server's greedy text is our engine's own, token for token; against llama.cpp it may part only as the
    # in-process smoke rule allows (on this prompt none parted in 8 tokens, measured on a 2-core AMD EPYC).
    from inference_engine.engine import OurEngine
    from inference_engine.generate import generate
    from validation.run import DEFAULT_PROMPT

    ours = OurEngine(smollm2, backend="numba", numerics="ggml", n_ctx=256)
    own = generate(ours, ours.tokenize(DEFAULT_PROMPT), max_tokens=result["n_tokens"])
    assert result["greedy"]["server_text"] == ours.detokenize(own.token_ids)
    d = result["greedy"]["first_divergence"]
    assert d is None or d["near_tie"] or d["reference_variants_agreeing"] or d["within_reference_gap_shift"]


@pytest.mark.slow
def test_compare_our_server_against_llamacpps_server(model, tmp_path, capsys):
    ok, why = server_available()
    if not ok:
        pytest.skip(f"llama.cpp's server is not installed: {why}")
    out = tmp_path / "compare.json"
    with start_server(model, backend="numpy", numerics="ggml") as server:
        rc = cli.main(["compare", "--engine", f"openai:{server.url}/v1", "-m", str(model), "--against",
                       "llamacpp-server", "--concurrency", "1,4", "-p", "16", "-n", "8", "-r", "1", "--warmup", "1",
                       "--no-progress", "-t", "1", "-c", "512", "--json", str(out)])
        printed = capsys.readouterr()
    assert rc == 0, printed.err
    result = json.loads(out.read_text())
    engine = f"openai:{server.url}/v1"
    assert set(result["summary"]) == {engine, "llamacpp-server"}
    for side in result["summary"].values():
        assert side["tg8"]["output_tokens"] == 8 and side["c4"]["aggregate_tps"] > 0


def test_a_rerun_with_the_same_seed_is_named_as_served_from_the_prefix_cache(model, tmp_path, capsys):
    """Our server keeps finished prompts in its prefix cache and says so in the usage chunk: a second run with the
    same --seed sends it the same prompts, and the result names those requests; a run with a drawn seed does not."""
    runs = []
    with start_server(model, backend="numpy", numerics="ggml") as server:
        for i, extra in enumerate([["--seed", "11"], ["--seed", "11"], []]):
            out = tmp_path / f"{i}.json"
            rc = cli.main(["compare", "--engine", f"openai:{server.url}/v1", "-m", str(model), "--against", "none",
                           "-p", "64", "-n", "2", "-r", "1", "--warmup", "0", "--no-progress", "--json", str(out),
                           *extra])
            assert rc == 0, capsys.readouterr().err
            runs.append(json.loads(out.read_text()))
    pp = [next(iter(run["summary"].values()))["pp64"]["cached_tokens"] for run in runs]
    assert pp[0]["reported"] == 1 and pp[0]["reused"] == 0  # a new prompt: at most chance sharing
    assert pp[1]["reused"] == 1 and pp[1]["most"] >= 48  # the same prompt again: served from the cache
    assert pp[2]["reused"] == 0
    assert not any("prefix cache in" in note for note in runs[0]["notes"] + runs[2]["notes"])
    assert any("served prompt tokens from its prefix cache in pp64 1 of 1" in note for note in runs[1]["notes"])
