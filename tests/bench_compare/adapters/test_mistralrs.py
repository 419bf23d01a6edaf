"""``--engine mistralrs:``: mistral.rs (the ``mistralrs`` package, a Rust engine) on the same GGUF, against llama.cpp.

The real engine on real models (marked ``slow``: smollm2-135m, and gemma3-270m for a refusal), and on tiny written
models for the one-line refusals; skipped where ``mistralrs`` is not installed (``pip install
'gguf-parity[mistralrs]'``). The generic request-timing path it goes through is tested on a fake in
``tests/bench_compare/test_generate_timing.py``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("mistralrs")

from bench_compare.adapters import mistralrs as adapter  # noqa: E402
from bench_compare.engines import make_engine  # noqa: E402
from inference_engine.errors import GGUFParityError  # noqa: E402
from inference_engine.protocol import (  # noqa: E402
    REQUIRED_ENGINE_MEMBERS,
    EngineCapabilityError,
    engine_capabilities,
    missing_engine_members,
)

PROMPT = "The capital of France is"
THREADS = 2
# Greedy steps compared with llama.cpp. On this prompt all 16 agreed when measured (mistralrs 0.9.5, llama.cpp
# 0.3.36); the test holds the first 8, so that a near tie late in the continuation (mistral.rs multiplies in F32,
# llama.cpp through 8-bit activations) is not a failure.
AGREE_STEPS = 8
TOP_K = 5


@pytest.fixture(scope="module")
def smollm2():
    from inference_engine.store.named_models import resolve_model

    return resolve_model("smollm2-135m", progress=False)


@pytest.fixture(scope="module")
def engine(smollm2):
    eng = make_engine("mistralrs:", smollm2, n_threads=THREADS)
    yield eng
    eng.close()


def test_unavailable_says_how_to_install(monkeypatch):
    assert adapter.unavailable() is None  # installed here
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mistralrs" else real(name, *a))
    assert "pip install 'gguf-parity[mistralrs]'" in adapter.unavailable()


def test_engines_list_shows_it(capsys):
    from bench_compare.cli import main

    assert main(["engines", "list"]) == 0
    out = capsys.readouterr().out
    assert "mistralrs:[MODEL]" in out and "top-k log-probabilities, no logits" in out


def test_unknown_option_is_one_line(tiny_model):
    with pytest.raises(GGUFParityError, match=r"unknown --engine-opt colour; it takes verbose, max_seqs"):
        make_engine("mistralrs:", tiny_model("llama"), colour="red")


def test_an_architecture_it_refuses_is_one_line(capsys, tiny_model):
    """mistral.rs 0.9.5 has no GGUF loader for qwen2moe: its own error, quoted in one line, exit 2."""
    from bench_compare.cli import main

    path = tiny_model("qwen2moe")
    with pytest.raises(GGUFParityError) as err:
        make_engine("mistralrs:", path)
    assert str(err.value) == (f"mistral.rs 0.9.5 cannot load {path.name} (architecture 'qwen2moe'): Unknown "
                              "normal-model GGUF architecture `qwen2moe`")
    code = main(["bench", "--engine", "mistralrs:", "-m", str(path), "-p", "8", "-n", "2", "-r", "1"])
    out, err_text = capsys.readouterr()
    assert code == 2 and err_text.strip().splitlines() == [f"error: {err.value}"] and out == ""


def assert_prompt_refused(path, text: str, architecture: str) -> None:
    """mistral.rs's ids for ``text`` part from the GGUF's (llama.cpp's): one line, before anything is generated."""
    eng = make_engine("mistralrs:", path, n_threads=THREADS)
    try:
        with pytest.raises(GGUFParityError, match=rf"^mistral.rs tokenizes this {architecture} model's text "
                                                  r"differently from the GGUF's tokenizer .*llama/Unigram"):
            eng.generate(eng.tokenizer.encode(text, add_bos=True), 1)  # the GGUF's ids, as validate sends
    finally:
        eng.close()


@pytest.mark.slow
def test_tokenize_is_mistralrs_own_tokenizer(engine):
    """validate's tokenizer parity holds mistral.rs's own tokenizer (``Runner.tokenize_text``) up against
    llama.cpp's, not the GGUF reader's (measured: on Qwen2.5's vocabulary it splits the added token '</s>', one id
    in llama.cpp, into three)."""
    text = "The capital of France is"
    assert engine.tokenize(text, add_bos=False) == engine.tokenizer.encode(text, add_bos=False)
    calls, runner = [], engine._runner

    class Spy:
        def __getattr__(self, name):
            return getattr(runner, name)

        def tokenize_text(self, *args):
            calls.append(args)
            return runner.tokenize_text(*args)

    engine._runner = Spy()
    try:
        engine.tokenize("Hello", add_bos=True)
    finally:
        engine._runner = runner
    assert calls == [("Hello", True, None)]


def test_a_vocabulary_it_reads_differently_is_one_line(tiny_model):
    """A SentencePiece GGUF vocabulary: mistral.rs 0.9.5 reads it as Unigram and its ids part from the GGUF's (and
    llama.cpp's), so the prompt check refuses the request rather than measure another prompt."""
    assert_prompt_refused(tiny_model("llama", vocab="spm"), "hello world abc", "llama")


@pytest.mark.slow
def test_generate_gives_n_steps_with_k_logprobs_on_the_given_ids(engine):
    ids = engine.tokenize(PROMPT, add_bos=True)
    out = engine.generate(ids, 6, top_k=TOP_K)
    assert engine.last_usage == {"prompt_tokens": len(ids), "completion_tokens": 6, "finish_reason": "length"}
    assert len(out["steps"]) == 6
    for step in out["steps"]:
        top = step["top_logprobs"]
        assert len(top) == TOP_K and all(isinstance(t, int) and lp <= 0 for t, lp in top)
        assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert step["token"] == top[0][0]  # greedy: the most probable
    assert out["text"].strip() and out["text"].strip() in engine.detokenize([s["token"] for s in out["steps"]])
    timings = out["timings"]
    assert timings["prompt_s"] > 0 and timings["generation_s"] >= 0
    assert engine.generate(ids, 3)["steps"][0]["top_logprobs"] == []  # top_k=0: the tokens only


@pytest.mark.slow
def test_greedy_tokens_agree_with_llamacpp(engine, smollm2):
    from inference_engine.generate import generate_step

    ids = engine.tokenize(PROMPT, add_bos=True)
    ours = engine.generate(ids, AGREE_STEPS, top_k=TOP_K)["steps"]
    ref = make_engine("llamacpp", smollm2, n_threads=THREADS, n_ctx=256)
    try:
        theirs = []
        for step, (token, logits) in zip(range(AGREE_STEPS), generate_step(ref, ids)):
            top = np.argsort(-logits)[:TOP_K]
            theirs.append((token, {int(t) for t in top}))
    finally:
        ref.close()
    assert [s["token"] for s in ours] == [t for t, _ in theirs]
    overlap = [len({t for t, _ in s["top_logprobs"]} & top) for s, (_, top) in zip(ours, theirs)]
    assert min(overlap) >= TOP_K - 1  # a near tie may swap the 5th and 6th: measured 4 or 5 at every step


@pytest.mark.slow
def test_no_logits_prefill_decode_capture_raise(engine):
    assert engine_capabilities(engine) == {"top_logprobs", "text", "tokenize", "timings"}
    assert missing_engine_members(engine) == [] and set(REQUIRED_ENGINE_MEMBERS) <= set(dir(engine))
    for call in (lambda: engine.prefill([1, 2]), lambda: engine.decode(3), lambda: engine.capture([1, 2])):
        with pytest.raises(EngineCapabilityError, match="not logits"):
            call()


@pytest.mark.slow
def test_its_log_lines_stay_out_of_our_output(capfd, smollm2):
    eng = make_engine("mistralrs:", smollm2, n_threads=THREADS)
    try:
        eng.generate(eng.tokenize(PROMPT), 2, top_k=2)
        assert eng.model_info["numerics"].startswith("mistral.rs's own")
    finally:
        eng.close()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.slow
def test_verbose_lets_them_through(capfd, smollm2):
    eng = make_engine("mistralrs:", smollm2, n_threads=THREADS, verbose="1")
    try:
        eng.generate(eng.tokenize(PROMPT), 1)
    finally:
        eng.close()
    out, err = capfd.readouterr()
    assert "mistralrs" in out + err


@pytest.mark.slow
def test_a_prompt_it_cannot_tokenize_as_llamacpp_does_is_one_line():
    """gemma3-270m loads, but mistral.rs reads its SentencePiece vocabulary as Unigram and splits words into
    letters: the prompt check refuses it rather than measuring another prompt."""
    from inference_engine.store.named_models import resolve_model

    assert_prompt_refused(resolve_model("gemma3-270m", progress=False), PROMPT, "gemma3")


@pytest.mark.slow
def test_bench_runs_it_by_requests(capsys, smollm2):
    from bench_compare.cli import main

    code = main(["bench", "--engine", "mistralrs:", "-m", str(smollm2), "-p", "8", "-n", "4", "-r", "1", "-t",
                 str(THREADS), "-o", "jsonl"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"n_prompt": 8' in out and '"n_gen": 4' in out and "engine's own prompt time" in err
