"""Greedy output through the server equals ``bench-compare generate`` on the real models, with several requests
in flight at once (so the answers come out of batched decode steps, not one request alone)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures.servers import start_server

from bench_compare.cli import main as cli_main

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are"]
MAX_TOKENS = 32


def generate_cli(capsys, model: str, prompt: str, backend: str, chat: bool = False) -> str:
    argv = ["generate", prompt, "-m", model, "-n", str(MAX_TOKENS), "--backend", backend, "--ctx", "512"]
    assert cli_main(argv + (["--chat"] if chat else [])) == 0
    return capsys.readouterr().out[:-1]  # generate ends with one newline


async def _all_at_once(url: str, bodies: list[tuple[str, dict]]) -> list[dict]:
    async with httpx.AsyncClient(timeout=300) as client:
        replies = await asyncio.gather(*(client.post(f"{url}{path}", json=body) for path, body in bodies))
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    return [r.json() for r in replies]


@pytest.mark.slow
@pytest.mark.parametrize("model,backend", [("smollm2-135m", "numpy"), ("smollm2-135m", "numba"),
                                           ("gemma3-270m", "numpy")])
def test_server_greedy_equals_generate(capsys, model, backend):
    expected = [generate_cli(capsys, model, p, backend) for p in PROMPTS]
    expected_chat = generate_cli(capsys, model, PROMPTS[0], backend, chat=True)
    with start_server(model, backend=backend, ctx=512, threads=2, max_batch=8) as server:
        bodies = [("/v1/completions", {"model": model, "prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0})
                  for p in PROMPTS]
        bodies.append(("/v1/chat/completions", {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                "messages": [{"role": "user", "content": PROMPTS[0]}]}))
        replies = asyncio.run(_all_at_once(server.url, bodies))
    assert [r["choices"][0]["text"] for r in replies[:-1]] == expected
    assert replies[-1]["choices"][0]["message"]["content"] == expected_chat
