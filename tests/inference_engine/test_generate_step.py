"""The one generation loop: ``generate_step`` yields (token, logits) lazily, decodes only what the caller asks for,
stops at a full context or when forced tokens run out, and times prefill and decode apart from sampling."""

from __future__ import annotations

import numpy as np

from inference_engine.generate import ForcedTokens, StepTimings, generate_step

N_VOCAB = 8


class CountingEngine:
    """Logits that make token (last id + 1) % N_VOCAB the greedy pick; records every call."""

    name = "counting"
    n_vocab = N_VOCAB

    def __init__(self, n_ctx: int = 16):
        self.n_ctx = n_ctx
        self.calls: list[tuple[str, list[int]]] = []

    def reset(self):
        self.calls.append(("reset", []))

    def _logits(self, last: int) -> np.ndarray:
        out = np.zeros(N_VOCAB, np.float32)
        out[(last + 1) % N_VOCAB] = 1.0
        return out

    def prefill(self, ids):
        self.calls.append(("prefill", list(ids)))
        return self._logits(ids[-1])

    def decode(self, token):
        self.calls.append(("decode", [token]))
        return self._logits(token)


def test_greedy_steps_are_lazy():
    engine = CountingEngine()
    steps = generate_step(engine, [1, 2], n_batch=1)
    assert [next(steps)[0], next(steps)[0], next(steps)[0]] == [3, 4, 5]
    # chunked prefill, then one decode per step after the first; the last token is not decoded until asked
    assert engine.calls == [("reset", []), ("prefill", [1]), ("prefill", [2]), ("decode", [3]), ("decode", [4])]


def test_forced_tokens_are_all_decoded_then_the_loop_ends():
    engine = CountingEngine()
    timings = StepTimings()
    out = [t for t, _ in generate_step(engine, [], ForcedTokens([5, 6, 7]), reset=False, n_past=4, timings=timings)]
    assert out == [5, 6, 7] and [c for c in engine.calls if c[0] == "decode"] == [("decode", [5]), ("decode", [6]),
                                                                               ("decode", [7])]
    assert timings.decode_steps == 3 and timings.prefill_s >= 0.0


def test_stops_when_the_context_is_full():
    engine = CountingEngine(n_ctx=5)
    assert [t for t, _ in generate_step(engine, [0, 1])] == [2, 3, 4]  # positions 2, 3, 4 of 5


def test_a_long_prompt_is_prefilled_in_llama_cpps_ubatch_rows():
    """PREFILL_CHUNK rows a pass unless told otherwise (llama.cpp's n_ubatch); n_batch=None: the prompt at once."""
    from inference_engine.generate import PREFILL_CHUNK

    prompt = [i % N_VOCAB for i in range(2 * PREFILL_CHUNK + 76)]
    engine = CountingEngine(n_ctx=4096)
    next(generate_step(engine, prompt))
    assert [len(ids) for kind, ids in engine.calls if kind == "prefill"] == [PREFILL_CHUNK, PREFILL_CHUNK, 76]
    engine = CountingEngine(n_ctx=4096)
    next(generate_step(engine, prompt, n_batch=None))
    assert [len(ids) for kind, ids in engine.calls if kind == "prefill"] == [len(prompt)]
