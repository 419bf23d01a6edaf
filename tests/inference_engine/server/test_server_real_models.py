"""Greedy output through the server equals ``bench-compare generate`` on the real models, with several requests
in flight at once (so the answers come out of batched decode steps, not one request alone).

The expected texts come from the generation loop ``bench-compare generate`` runs (``inference_engine.generate``
on one :class:`OurEngine`, prompts tokenized as the command does); the tiny-model test in ``test_api.py`` checks
the command itself against the server.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures.servers import start_server

from inference_engine.chat import render_chat
from inference_engine.engine import load_engine
from inference_engine.generate import generate
from inference_engine.sampling import Sampler

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]
MAX_TOKENS = 32
# The NumPy backend (the readable reference) decodes several times slower than Numba: its case generates fewer
# tokens, still batched with the other requests at every step.
MAX_TOKENS_NUMPY = 12
CTX = 512


def expected_texts(model: str, backend: str, chat: bool, numerics: str = "f32", kv_type: str = "f32",
                   max_tokens: int = MAX_TOKENS) -> tuple[list[str], str | None]:
    engine = load_engine(model, backend=backend, numerics=numerics, n_ctx=CTX, n_threads=2, kv_type=kv_type,
                         progress=False)
    tok = engine.tokenizer

    def run(text: str) -> str:
        ids = tok.encode(text, add_bos=None, parse_special=True)  # as cmd_generate
        return generate(engine, ids, max_tokens, Sampler(), tok.eog_ids, stream_decoder=tok.stream_decoder()).text

    plain = [run(p) for p in PROMPTS]
    chat_text = None
    if chat:
        chat_text = run(render_chat(engine.gguf, [{"role": "user", "content": PROMPTS[0]}]))
    return plain, chat_text


async def _all_at_once(url: str, bodies: list[tuple[str, dict]]) -> list[dict]:
    async with httpx.AsyncClient(timeout=600) as client:
        replies = await asyncio.gather(*(client.post(f"{url}{path}", json=body) for path, body in bodies))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json() for r in replies]


@pytest.mark.slow
@pytest.mark.parametrize("model,backend,chat,numerics,kv_type", [
    ("smollm2-135m", "numpy", True, "f32", "f32"), ("smollm2-135m", "numba", True, "f32", "f32"),
    ("gemma3-270m", "numba", False, "f32", "f32"),  # gemma3-270m: no chat template
    ("smollm2-135m", "numba", True, "ggml", "f16"),  # bench-compare serve's defaults (llama.cpp's server's)
])
def test_server_greedy_equals_generate(model, backend, chat, numerics, kv_type):
    max_tokens = MAX_TOKENS_NUMPY if backend == "numpy" else MAX_TOKENS
    expected, expected_chat = expected_texts(model, backend, chat, numerics, kv_type, max_tokens)
    with start_server(model, backend=backend, numerics=numerics, kv_type=kv_type, ctx=CTX, threads=2,
                      max_batch=8) as server:
        bodies = [("/v1/completions", {"model": model, "prompt": p, "max_tokens": max_tokens, "temperature": 0})
                  for p in PROMPTS]
        if chat:
            bodies.append(("/v1/chat/completions", {"model": model, "max_tokens": max_tokens, "temperature": 0,
                                                    "messages": [{"role": "user", "content": PROMPTS[0]}]}))
        replies = asyncio.run(_all_at_once(server.url, bodies))
    assert [r["choices"][0]["text"] for r in replies[: len(PROMPTS)]] == expected
    if chat:
        assert replies[-1]["choices"][0]["message"]["content"] == expected_chat
