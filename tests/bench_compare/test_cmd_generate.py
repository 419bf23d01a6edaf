"""``bench-compare generate``: streams the greedy continuation, ends with one timings line, refuses bad flags."""

from __future__ import annotations

import numpy as np
import pytest

from bench_compare import cli
from inference_engine.defaults import COMMANDS
from inference_engine.engine import OurEngine
from inference_engine.generate import generate


def run(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["generate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_streams_the_greedy_continuation(tiny_model, capsys):
    path = tiny_model("llama")
    code, out, err = run(capsys, "hello world", "--model", path, "--max-tokens", 5, "--ctx", 64)
    assert code == 0, err
    run_as = COMMANDS.resolve()  # generate's defaults
    engine = OurEngine(path, backend=run_as.backend, numerics=run_as.numerics, kv_type=run_as.kv_type, n_ctx=64,
                       n_threads=run_as.threads)
    prompt = engine.tokenizer.encode("hello world")
    expected = generate(
        engine, prompt, 5, eog_ids=engine.tokenizer.eog_ids, stream_decoder=engine.tokenizer.stream_decoder()
    )
    assert out == expected.text + "\n"
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert f"prompt tokens: {len(prompt)}" in lines[0] and "TTFT:" in lines[0] and "tokens/s" in lines[0]
    assert lines[0].endswith(f"| greedy | {run_as.label()}")  # how the tokens were picked, what ran


def test_generate_with_chat_template_and_sampling(tiny_model, capsys):
    path = tiny_model("qwen2")
    args = (
        "hi",
        "--model",
        path,
        "-n",
        4,
        "--ctx",
        128,
        "--chat",
        "--temperature",
        0.7,
        "--top-k",
        20,
        "--top-p",
        0.9,
        "--seed",
        3,
        "--numerics",
        "ggml",
        "--kv-type",
        "f16",
        "--threads",
        1,
    )
    first = run(capsys, *args)
    second = run(capsys, *args)
    assert first[0] == 0, first[2]
    assert first[1] == second[1]  # same seed, same text
    assert "prompt tokens:" in first[2]


def test_a_sampled_run_names_its_seed_and_that_seed_gives_the_same_text(tiny_model, capsys):
    args = ("hi", "--model", tiny_model("llama"), "-n", 6, "--ctx", 64, "--temperature", 1.5, "--top-k", 8)
    code, out, err = run(capsys, *args)
    assert code == 0, err
    settings = err.strip().split(" | ")[-2]
    assert settings.startswith("sampled: temperature 1.5, top-k 8, seed ")  # a seed drawn for the run, named
    seed = int(settings.rsplit(" ", 1)[1])
    again = run(capsys, *args, "--seed", seed)
    assert again[0] == 0 and again[1] == out and again[2].strip().split(" | ")[-2] == settings


@pytest.mark.parametrize("extra, named", [(["--seed", "3"], "--seed"), (["--top-k", "5", "--top-p", "0.5"],
                                                                         "--top-k, --top-p")])
def test_sampling_flags_without_a_temperature_are_one_line(tiny_model, capsys, extra, named):
    code, out, err = run(capsys, "hi", "--model", tiny_model("llama"), "-n", 2, "--ctx", 64, *extra)
    assert code == 2 and out == ""
    assert err == (f"error: {named} only apply when sampling, and --temperature is 0 (greedy): give --temperature > 0 "
                   "too\n")


def test_unknown_model_is_a_one_line_error(capsys):
    code, _, err = run(capsys, "hi", "--model", "no-such-model")
    assert code == 2 and err.startswith("error: unknown model")


@pytest.mark.slow
def test_generate_on_smollm2_says_paris(capsys):
    code, out, err = run(capsys, "The capital of France is", "--max-tokens", 4, "--threads", 1)
    assert code == 0, err
    assert "Paris" in out
    assert np.isfinite(float(err.split("TTFT:")[1].split("ms")[0]))
