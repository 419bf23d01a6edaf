"""The OpenAI-compatible API over the tiny llama fixture: output equal to ``bench-compare generate``, OpenAI's shapes
(through the official ``openai`` client and raw SSE), batching of concurrent requests, and 4xx for bad input."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest

from bench_compare.cli import main as cli_main
from inference_engine.engine import OurEngine
from inference_engine.generate import generate
from inference_engine.sampling import Sampler

openai = pytest.importorskip("openai", reason="the API tests use the official openai client (pip install -e '.[test]')")

PROMPT = "hello world, the river"
POOL_IDLE_TIMEOUT_S = 5.0


def reference(model_path, prompt: str, max_tokens: int, chat: bool = False):
    """Greedy generation through the one-sequence engine, tokenized as ``bench-compare generate`` does."""
    engine = OurEngine(model_path, n_ctx=128)
    tok = engine.tokenizer
    if chat:
        from inference_engine.chat import render_chat

        prompt = render_chat(engine.gguf, [{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = tok.encode(prompt, add_bos=None, parse_special=True)
    return ids, generate(engine, ids, max_tokens, Sampler(), tok.eog_ids, stream_decoder=tok.stream_decoder())


def client_for(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=30)


def model_id(server) -> str:
    return str(server.model_path)


def wait_idle(url: str) -> dict:
    deadline = time.monotonic() + POOL_IDLE_TIMEOUT_S
    while True:
        health = httpx.get(f"{url}/health").json()
        if (health["kv_blocks_in_use"], health["running"], health["waiting"]) == (0, 0, 0):
            return health
        assert time.monotonic() < deadline, f"the pool did not empty: {health}"
        time.sleep(0.02)


def test_models_and_health(tiny_server):
    models = client_for(tiny_server).models.list()
    assert [m.id for m in models.data] == [model_id(tiny_server)]
    health = httpx.get(f"{tiny_server.url}/health").json()
    assert health["status"] == "ok" and health["kv_blocks_total"] == 256 and health["n_ctx"] == 128


def test_greedy_completion_equals_bench_compare_generate(tiny_server, capsys):
    max_tokens = 12
    reference_flags = ["--backend", "numpy", "--numerics", "f32", "--kv-type", "f32"]  # the tiny server's settings
    assert cli_main(["generate", PROMPT, "-m", str(tiny_server.model_path), "-n", str(max_tokens), "--ctx", "128",
                     *reference_flags]) == 0
    cli_text = capsys.readouterr().out[:-1]  # generate ends with one newline
    ids, ref = reference(tiny_server.model_path, PROMPT, max_tokens)

    out = client_for(tiny_server).completions.create(model=model_id(tiny_server), prompt=PROMPT,
                                                     max_tokens=max_tokens, temperature=0, logprobs=0)
    choice = out.choices[0]
    assert choice.text == cli_text == ref.text
    tok = OurEngine(tiny_server.model_path, n_ctx=8).tokenizer
    assert choice.logprobs.tokens == [tok.decode([t]) for t in ref.token_ids]  # token for token
    assert choice.finish_reason == ("stop" if ref.stop_reason == "eog" else "length")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(ids), len(ref.token_ids))

    by_ids = client_for(tiny_server).completions.create(model=model_id(tiny_server), prompt=ids,
                                                        max_tokens=max_tokens, temperature=0)
    assert by_ids.choices[0].text == ref.text


def test_streaming_equals_non_streaming_and_ends_with_done(tiny_server):
    body = {"model": model_id(tiny_server), "prompt": PROMPT, "max_tokens": 10, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{tiny_server.url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[-1] in ("stop", "length") and all(f is None for f in finish[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    _, ref = reference(tiny_server.model_path, PROMPT, 10)
    assert streamed == ref.text

    # the openai client reads the same stream
    stream = client_for(tiny_server).completions.create(model=model_id(tiny_server), prompt=PROMPT, max_tokens=10,
                                                        temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == ref.text


def test_chat_completion_uses_the_gguf_template(tiny_server):
    _, ref = reference(tiny_server.model_path, PROMPT, 8, chat=True)
    client = client_for(tiny_server)
    messages = [{"role": "user", "content": PROMPT}]
    out = client.chat.completions.create(model=model_id(tiny_server), messages=messages, max_tokens=8, temperature=0,
                                         logprobs=True, top_logprobs=2)
    assert out.object == "chat.completion" and out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text
    entries = out.choices[0].logprobs.content
    assert len(entries) == len(ref.token_ids) and all(len(e.top_logprobs) == 2 for e in entries)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in entries)  # greedy takes the top one
    stream = client.chat.completions.create(model=model_id(tiny_server), messages=messages, max_tokens=8,
                                            temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text


def test_completion_logprobs_with_echo(tiny_server):
    ids, ref = reference(tiny_server.model_path, PROMPT, 5)
    r = httpx.post(f"{tiny_server.url}/v1/completions", json={
        "model": model_id(tiny_server), "prompt": PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 3,
        "echo": True}, timeout=30).json()
    choice = r["choices"][0]
    lp = choice["logprobs"]
    n = len(ids) + len(ref.token_ids)
    assert choice["text"] == PROMPT + ref.text
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts the first token
    assert all(len(t) <= 3 and v <= 0 for t, v in zip(lp["top_logprobs"][1:], lp["token_logprobs"][1:]))
    assert lp["text_offset"] == sorted(lp["text_offset"])
    # prompt log-probabilities equal log-softmax of the one-sequence engine's logits at each prompt position
    engine = OurEngine(tiny_server.model_path, n_ctx=128)
    logits = engine.capture(ids, names=["result_output"])["result_output"].astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    expected = [float(logits[p, ids[p + 1]] - logz[p]) for p in range(len(ids) - 1)]
    np.testing.assert_allclose(lp["token_logprobs"][1 : len(ids)], expected, rtol=0, atol=1e-4)


def test_stop_string_cuts_the_text(tiny_server):
    _, ref = reference(tiny_server.model_path, PROMPT, 16)
    text = ref.text
    if len(text) < 4:
        pytest.skip("the tiny model's greedy text is too short to cut")
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    out = client_for(tiny_server).completions.create(model=model_id(tiny_server), prompt=PROMPT, max_tokens=16,
                                                     temperature=0, stop=[stop])
    assert out.choices[0].text == text[: text.find(stop)] and out.choices[0].finish_reason == "stop"


def test_sampling_with_a_seed_repeats(tiny_server):
    client = client_for(tiny_server)
    args = {"model": model_id(tiny_server), "prompt": PROMPT, "max_tokens": 10, "temperature": 1.0, "top_p": 0.9,
            "seed": 1234, "extra_body": {"top_k": 40}}
    assert client.completions.create(**args).choices[0].text == client.completions.create(**args).choices[0].text


def test_concurrent_requests_share_steps_and_match_their_solo_output(tiny_server):
    prompts = [f"{PROMPT} {'stone ' * i}" for i in range(6)]
    solo = [reference(tiny_server.model_path, p, 12)[1].text for p in prompts]

    async def run_all():
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(p):
                body = {"model": model_id(tiny_server), "prompt": p, "max_tokens": 12, "temperature": 0,
                        "stream": True}
                text = []
                async with client.stream("POST", f"{tiny_server.url}/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            text.append(json.loads(line[6:])["choices"][0]["text"])
                return "".join(text)
            return await asyncio.gather(*(one(p) for p in prompts))

    before = _metric(tiny_server.url, "gguf_parity_batch_rows_bucket", 'le="1.0"'), _metric(
        tiny_server.url, "gguf_parity_batch_rows_count")
    assert asyncio.run(run_all()) == solo
    after = _metric(tiny_server.url, "gguf_parity_batch_rows_bucket", 'le="1.0"'), _metric(
        tiny_server.url, "gguf_parity_batch_rows_count")
    assert after[1] - before[1] > after[0] - before[0]  # some steps carried more than one row
    wait_idle(tiny_server.url)


def _metric(url: str, name: str, label: str = "") -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{label} not in /metrics")


def test_metrics_and_prefix_cache_hits(tiny_server):
    client = client_for(tiny_server)
    long_prompt = "the market light " * 3  # ~50 tokens: a dozen full blocks of 4
    for _ in range(2):
        client.completions.create(model=model_id(tiny_server), prompt=long_prompt, max_tokens=2, temperature=0)
    text = httpx.get(f"{tiny_server.url}/metrics").text
    for name in ("gguf_parity_requests_total", "gguf_parity_generation_tokens_total", "gguf_parity_queue_depth",
                 "gguf_parity_time_to_first_token_seconds_bucket", "gguf_parity_inter_token_seconds_bucket",
                 "gguf_parity_kv_blocks_in_use", "gguf_parity_prefix_cache_hit_rate"):
        assert name in text, name
    assert _metric(tiny_server.url, "gguf_parity_prefix_cache_hit_tokens_total") > 0
    assert 0 < _metric(tiny_server.url, "gguf_parity_prefix_cache_hit_rate") <= 1


BAD_BODIES = [
    ("bad json", b'{"model": "m", "prompt": ', 400),
    ("not an object", b"[1, 2]", 400),
    ("unknown field", {"prompt": "hi", "frobnicate": 1}, 400),
    ("unknown model", {"model": "no-such-model", "prompt": "hi"}, 404),
    ("negative max_tokens", {"prompt": "hi", "max_tokens": -1}, 400),
    ("zero max_tokens", {"prompt": "hi", "max_tokens": 0}, 400),
    ("max_tokens beyond the context", {"prompt": "hi", "max_tokens": 10**9}, 400),
    ("prompt longer than the context", {"prompt": "stone " * 500, "max_tokens": 1}, 400),
    ("absurd temperature", {"prompt": "hi", "temperature": 1e9}, 400),
    ("negative temperature", {"prompt": "hi", "temperature": -1}, 400),
    ("top_p zero", {"prompt": "hi", "top_p": 0}, 400),
    ("top_k negative", {"prompt": "hi", "top_k": -7}, 400),
    ("logprobs too many", {"prompt": "hi", "logprobs": 1000}, 400),
    ("token id out of the vocabulary", {"prompt": [1, 10**9]}, 400),
    ("empty prompt", {"prompt": ""}, 400),
    ("n > 1", {"prompt": "hi", "n": 3}, 400),
    ("presence penalty", {"prompt": "hi", "presence_penalty": 1.5}, 400),
    ("two prompts", {"prompt": ["a", "b"]}, 400),
    ("string max_tokens", {"prompt": "hi", "max_tokens": "lots"}, 400),
    ("logit_bias key not a token id", {"prompt": "hi", "logit_bias": {"the": 5}}, 400),
    ("logit_bias beyond 100", {"prompt": "hi", "logit_bias": {"3": 500}}, 400),
    ("logit_bias token outside the vocabulary", {"prompt": "hi", "logit_bias": {str(10**9): -100}}, 400),
]


def test_logit_bias_moves_sampling_not_the_logprobs(tiny_server):
    """OpenAI's logit_bias: -100 on the greedy token makes greedy pick another; the reported log-probabilities stay
    the model's (the benchmark sends it to keep end-of-generation tokens away)."""
    body = {"model": model_id(tiny_server), "prompt": PROMPT, "max_tokens": 1, "temperature": 0, "logprobs": 1}
    plain = httpx.post(f"{tiny_server.url}/v1/completions", json=body, timeout=30).json()["choices"][0]
    first = plain["logprobs"]["tokens"][0]
    tok = OurEngine(tiny_server.model_path, n_ctx=8).tokenizer
    banned = tok.encode(PROMPT + first, add_bos=None)[len(tok.encode(PROMPT, add_bos=None)):]
    biased = httpx.post(f"{tiny_server.url}/v1/completions", json={**body, "logit_bias": {str(banned[0]): -100}},
                        timeout=30).json()["choices"][0]
    assert biased["logprobs"]["tokens"][0] != first
    assert biased["logprobs"]["token_logprobs"][0] <= plain["logprobs"]["token_logprobs"][0]


@pytest.mark.parametrize("what,body,status", BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_requests_get_an_openai_error_and_the_server_stays_up(tiny_server, what, body, status):
    url = f"{tiny_server.url}/v1/completions"
    if isinstance(body, bytes):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(url, json={"model": model_id(tiny_server), **body} if "model" not in body else body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    assert httpx.get(f"{tiny_server.url}/health").json()["status"] == "ok"


@pytest.mark.parametrize("body", [
    {"messages": []},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3},
])
def test_bad_chat_requests(tiny_server, body):
    r = httpx.post(f"{tiny_server.url}/v1/chat/completions", json={"model": model_id(tiny_server), **body})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_oversized_body_is_refused(tiny_server):
    from inference_engine.server.app import MAX_BODY_BYTES

    r = httpx.post(f"{tiny_server.url}/v1/completions", content=b" " * (MAX_BODY_BYTES + 1),
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "error" in r.json()


def test_unknown_route_is_an_openai_shaped_404(tiny_server):
    r = httpx.get(f"{tiny_server.url}/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()


def test_neutral_llama_cpp_extras_are_accepted(tiny_server):
    r = httpx.post(f"{tiny_server.url}/v1/completions", json={
        "model": model_id(tiny_server), "prompt": "hi", "max_tokens": 2, "temperature": 0, "repeat_penalty": 1.0,
        "min_p": 0, "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0})
    assert r.status_code == 200, r.text


def test_client_disconnect_mid_stream_frees_its_blocks(tiny_server):
    body = {"model": model_id(tiny_server), "prompt": PROMPT, "max_tokens": 100, "temperature": 0.8, "seed": 3,
            "stream": True}
    with httpx.stream("POST", f"{tiny_server.url}/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # leave after the first chunk: the connection closes
    health = wait_idle(tiny_server.url)
    assert health["kv_blocks_in_use"] == 0
