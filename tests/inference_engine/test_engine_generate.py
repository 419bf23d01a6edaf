"""Sampling and the generation loop (inference_engine/sampling.py, generate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.generate import generate
from inference_engine.sampling import Sampler

# Sampled frequencies over N_DRAWS draws against the softmax probabilities: the binomial standard deviation is
# sqrt(p(1-p)/N) <= 0.008 at N = 4000, so 0.04 is five sigma.
N_DRAWS = 4000
FREQUENCY_ATOL = 0.04


class ScriptedEngine:
    """An engine whose logits pick the scripted tokens in order (one-hot at each step)."""

    def __init__(self, script: list[int], n_vocab: int = 10, n_ctx: int = 100):
        self.script, self.n_vocab, self.n_ctx = script, n_vocab, n_ctx
        self.calls: list[tuple[str, object]] = []
        self.step = 0

    def _logits(self) -> np.ndarray:
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[self.script[self.step]] = 5.0
        self.step += 1
        return logits

    def reset(self):
        self.calls.append(("reset", None))
        self.step = 0

    def prefill(self, ids):
        self.calls.append(("prefill", list(ids)))
        return self._logits()

    def decode(self, token):
        self.calls.append(("decode", token))
        return self._logits()

    def detokenize(self, ids):
        return " ".join(str(i) for i in ids)


class Pieces:
    """A stream decoder that turns id i into the text 'ti '."""

    def __init__(self):
        self.fed: list[int] = []

    def feed(self, token_id):
        self.fed.append(token_id)
        return f"t{token_id} "

    def flush(self):
        return "!"


def test_generate_stops_at_max_tokens_and_times_decode_steps():
    engine = ScriptedEngine([3, 4, 5, 6, 7, 8])
    result = generate(engine, [1, 2], max_tokens=4)
    assert result.token_ids == [3, 4, 5, 6] and result.stop_reason == "max_tokens"
    assert engine.calls == [("reset", None), ("prefill", [1, 2]), ("decode", 3), ("decode", 4), ("decode", 5)]
    assert result.decode_steps == 3 and result.prompt_tokens == 2
    assert result.ttft_s > 0 and result.decode_s > 0 and result.decode_tokens_per_s > 0
    assert result.text == "3 4 5 6"
    line = result.timings_line()
    assert "prompt tokens: 2" in line and "TTFT" in line and "tokens/s" in line


def test_generate_stops_at_any_end_of_generation_id_without_printing_it():
    engine = ScriptedEngine([3, 9, 4])
    shown: list[str] = []
    decoder = Pieces()
    result = generate(engine, [1], max_tokens=10, eog_ids={8, 9}, on_text=shown.append, stream_decoder=decoder)
    assert result.token_ids == [3, 9] and result.stop_reason == "eog"
    assert decoder.fed == [3] and shown == ["t3 ", "!"] and result.text == "t3 !"


def test_generate_stops_when_the_context_is_full():
    engine = ScriptedEngine([3] * 10, n_ctx=5)
    result = generate(engine, [1, 2], max_tokens=10)
    assert result.stop_reason == "context" and len(result.token_ids) == 3  # 2 prompt + 3 generated = 5 positions


def test_generate_one_token_needs_no_decode_step():
    result = generate(ScriptedEngine([3]), [1], max_tokens=1)
    assert result.token_ids == [3] and result.decode_steps == 0 and np.isnan(result.decode_tokens_per_s)


def test_generate_refuses_max_tokens_below_one():
    with pytest.raises(GGUFParityError, match="--max-tokens must be at least 1, got 0"):
        generate(ScriptedEngine([3]), [1], max_tokens=0)


def test_greedy_generation_on_a_model_follows_prefill_and_decode(tiny_model):
    engine = OurEngine(tiny_model("llama"), n_ctx=64)
    prompt = engine.tokenize("hello world", add_bos=False)
    result = generate(engine, prompt, max_tokens=6, stream_decoder=engine.tokenizer.stream_decoder())
    engine.reset()
    expected = [int(np.argmax(engine.prefill(prompt)))]
    while len(expected) < 6:
        expected.append(int(np.argmax(engine.decode(expected[-1]))))
    assert result.token_ids == expected
    assert result.text == engine.detokenize(expected)


# --- sampling -----------------------------------------------------------------------------------------------------
def test_greedy_is_the_argmax_lowest_id_on_ties():
    assert Sampler()(np.array([0.0, 2.0, 2.0, 1.0])) == 1


def test_top_k_one_and_tiny_top_p_are_greedy():
    logits = np.random.default_rng(0).standard_normal(50)
    for sampler in (Sampler(temperature=1.0, top_k=1, seed=1), Sampler(temperature=1.0, top_p=1e-6, seed=1)):
        assert all(sampler(logits) == int(np.argmax(logits)) for _ in range(20))


def test_same_seed_same_tokens():
    logits = np.random.default_rng(1).standard_normal(100)
    a, b = (Sampler(temperature=0.8, top_k=40, top_p=0.9, seed=7) for _ in range(2))
    first, second = [a(logits) for _ in range(30)], [b(logits) for _ in range(30)]
    assert first == second and len(set(first)) > 1


def test_sampling_follows_the_tempered_softmax():
    logits = np.array([1.0, 2.0, 0.5, 3.0])
    sampler = Sampler(temperature=2.0, seed=3)
    counts = np.bincount([sampler(logits) for _ in range(N_DRAWS)], minlength=4) / N_DRAWS
    p = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    np.testing.assert_allclose(counts, p, atol=FREQUENCY_ATOL)


@pytest.mark.parametrize("sampler, said", [
    (Sampler(), "greedy"),
    (Sampler(top_k=5, seed=3), "greedy"),  # temperature 0: the filters change nothing
    (Sampler(temperature=0.8, top_k=40, top_p=0.9, seed=7), "sampled: temperature 0.8, top-k 40, top-p 0.9, seed 7"),
    (Sampler(temperature=1.0), "sampled: temperature 1, no seed"),
])
def test_a_sampler_says_what_a_rerun_needs(sampler, said):
    assert sampler.describe() == said


def test_top_k_and_top_p_keep_only_the_head():
    logits = np.array([3.0, 2.9, 0.0, -1.0, 2.8])
    top2 = Sampler(temperature=1.0, top_k=2, seed=4)
    assert {top2(logits) for _ in range(200)} == {0, 1}
    # top-p 0.5 at temperature 1: p = (0.35, 0.32, 0.29, ...) -> the first two reach 0.5.
    nucleus = Sampler(temperature=1.0, top_p=0.5, seed=5)
    assert {nucleus(logits) for _ in range(200)} == {0, 1}


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"top_k": -1}, "--top-k"),
        ({"top_p": 0.0}, "--top-p"),
        ({"top_p": 1.5}, "--top-p"),
        ({"temperature": -0.1}, "--temperature"),
    ],
)
def test_bad_sampling_settings_are_refused(kwargs, needle):
    with pytest.raises(GGUFParityError, match=needle):
        Sampler(**kwargs)
