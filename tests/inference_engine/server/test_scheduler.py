"""The scheduler's bounds: a full queue answers 429, a request that waits too long 503, a pool too small for two
requests at once runs them one after the other (never out of KV memory), a cancelled request gives its blocks back.

The engine is held still where a test needs a busy server: ``hold(runner)`` makes every forward step wait on an
event the test releases.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import httpx
import pytest
from fixtures.servers import start_server

from inference_engine.server.runner import BatchRunner
from inference_engine.server.scheduler import (
    Admitted,
    Delta,
    Failed,
    Finished,
    GenerationParams,
    QueueFull,
    Request,
    Scheduler,
)
from inference_engine.tokenizer import GGUFTokenizer

EVENT_TIMEOUT_S = 20.0


def hold(runner: BatchRunner) -> threading.Event:
    """Every step of ``runner`` waits until the returned event is set."""
    gate = threading.Event()
    step = runner.step

    def held_step(segments):
        assert gate.wait(EVENT_TIMEOUT_S), "the test never released the engine"
        return step(segments)

    runner.step = held_step
    return gate


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_full_queue_is_429_and_a_long_wait_is_503(tiny_model):
    with start_server(tiny_model("llama"), ctx=64, block_size=4, max_batch=1, max_queue=1,
                      queue_timeout_s=0.3) as server:
        served = server.app.state.served
        gate = hold(served.scheduler.runner)
        body = {"model": str(tiny_model("llama")), "prompt": "hello", "max_tokens": 3, "temperature": 0}

        async def scenario():
            async with httpx.AsyncClient(timeout=EVENT_TIMEOUT_S) as client:
                url = f"{server.url}/v1/completions"
                first = asyncio.create_task(client.post(url, json=body))  # admitted, its step held
                await asyncio.to_thread(wait_for, lambda: served.scheduler.n_running == 1, "the first request")
                second = asyncio.create_task(client.post(url, json=body))  # waits: max_batch is 1
                await asyncio.to_thread(wait_for, lambda: served.scheduler.n_waiting == 1, "the second request")
                third = await client.post(url, json=body)  # the queue (1) is full
                await asyncio.sleep(0.5)  # longer than the queue timeout
                gate.set()
                return await first, await second, third

        first, second, third = asyncio.run(scenario())
        assert first.status_code == 200
        assert second.status_code == 503 and second.json()["error"]["type"] == "service_unavailable"
        assert third.status_code == 429 and third.json()["error"]["type"] == "rate_limit_error"
        assert httpx.get(f"{server.url}/health").json()["kv_blocks_in_use"] == 0


@pytest.fixture
def scheduler(tiny_model):
    """A scheduler whose pool holds one full context (16 blocks of 4 for ctx 64), started and always stopped."""
    runner = BatchRunner(tiny_model("llama"), n_ctx=64, n_blocks=16, block_size=4)
    s = Scheduler(runner, GGUFTokenizer.from_gguf(runner.gguf), max_batch=4, max_queue=8, queue_timeout_s=30)
    s.start()
    yield s
    s.stop()


def submit(s: Scheduler, prompt: list[int], max_tokens: int, sink=None) -> tuple[Request, queue.Queue]:
    events: queue.Queue = queue.Queue()
    req = Request(prompt, GenerationParams(max_tokens=max_tokens, temperature=0.0), sink or events.put)
    s.submit(req)
    return req, events


def drain(events: queue.Queue) -> list:
    out = []
    while not out or not isinstance(out[-1], (Finished, Failed)):
        out.append(events.get(timeout=EVENT_TIMEOUT_S))
    return out


def test_requests_wait_for_blocks_instead_of_running_out(scheduler):
    # each needs 40 of the pool's 64 positions: they cannot run together, so the second waits for the first
    a, a_events = submit(scheduler, list(range(3, 23)), 20)
    b_events: queue.Queue = queue.Queue()
    a_done_when_b_admitted = []

    def b_sink(event):
        if isinstance(event, Admitted):
            a_done_when_b_admitted.append(a.done)
        b_events.put(event)

    submit(scheduler, list(range(30, 50)), 20, sink=b_sink)
    a_out, b_out = drain(a_events), drain(b_events)
    assert a_done_when_b_admitted == [True]
    assert isinstance(a_out[0], Admitted) and isinstance(b_out[0], Admitted)
    assert isinstance(a_out[-1], Finished) and isinstance(b_out[-1], Finished)
    for out in (a_out, b_out):
        assert sum(len(e.token_ids) for e in out if isinstance(e, Delta)) == out[-1].completion_tokens == 20
    wait_for(lambda: scheduler.runner.pool.n_in_use == 0 and scheduler.n_running == 0, "an empty pool")


def test_cancelled_requests_leave_at_once(scheduler):
    gate = hold(scheduler.runner)
    running, running_events = submit(scheduler, list(range(3, 23)), 20)
    waiting, _ = submit(scheduler, list(range(30, 50)), 20)
    wait_for(lambda: scheduler.n_running == 1 and scheduler.runner.pool.n_in_use == 10, "one running request")
    scheduler.cancel(waiting)
    scheduler.cancel(running)
    gate.set()
    wait_for(lambda: scheduler.runner.pool.n_in_use == 0 and scheduler.n_running == 0 and scheduler.n_waiting == 0,
             "the cancelled requests to leave")
    assert isinstance(running_events.get(timeout=1), Admitted)
    assert running_events.empty()  # a cancelled request's consumer is gone: nothing more is sent


def test_submit_beyond_the_queue_bound_raises(tiny_model):
    runner = BatchRunner(tiny_model("llama"), n_ctx=64, n_blocks=16, block_size=4)
    s = Scheduler(runner, GGUFTokenizer.from_gguf(runner.gguf), max_batch=1, max_queue=2)  # not started
    for _ in range(2):
        submit(s, [5, 6], 2)
    with pytest.raises(QueueFull):
        submit(s, [5, 6], 2)


def test_a_client_that_leaves_while_waiting_is_taken_out_of_the_queue(tiny_model):
    with start_server(tiny_model("llama"), ctx=64, block_size=4, max_batch=1, max_queue=4) as server:
        scheduler = server.app.state.served.scheduler
        gate = hold(scheduler.runner)
        body = {"model": str(tiny_model("llama")), "prompt": "hello", "max_tokens": 3, "temperature": 0}

        async def scenario():
            async with httpx.AsyncClient(timeout=EVENT_TIMEOUT_S) as client:
                url = f"{server.url}/v1/completions"
                first = asyncio.create_task(client.post(url, json=body))
                await asyncio.to_thread(wait_for, lambda: scheduler.n_running == 1, "the first request")
                with pytest.raises(httpx.ReadTimeout):  # gives up while waiting: the connection closes
                    await client.post(url, json=body, timeout=0.5)
                leaver = next(iter(scheduler.waiting), None) or scheduler._inbox[0]
                await asyncio.to_thread(wait_for, lambda: leaver.cancelled, "the server to notice")
                gate.set()
                return await first

        assert asyncio.run(scenario()).status_code == 200
        wait_for(lambda: scheduler.n_waiting == 0 and scheduler.runner.pool.n_in_use == 0, "an empty queue")


def test_a_long_prompt_is_prefilled_in_chunks_while_a_stream_keeps_decoding(tiny_model):
    runner = BatchRunner(tiny_model("llama"), n_ctx=64, n_blocks=32, block_size=4)
    s = Scheduler(runner, GGUFTokenizer.from_gguf(runner.gguf), max_batch=4, prefill_chunk=4)
    steps: list[list[tuple[int, int]]] = []
    step = runner.step

    def recording_step(segments):
        steps.append([(id(seq), n) for seq, n, _ in segments])
        return step(segments)

    runner.step = recording_step
    b_events: queue.Queue = queue.Queue()
    started = []

    def a_sink(event):  # once the first request streams, the long prompt arrives
        if isinstance(event, Delta) and not started:
            started.append(True)
            s.submit(Request(list(range(3, 23)), GenerationParams(max_tokens=2, temperature=0.0), b_events.put))
        a_events.put(event)

    a_events: queue.Queue = queue.Queue()
    a = Request([5, 6, 7], GenerationParams(max_tokens=12, temperature=0.0), a_sink)
    s.start()
    try:
        s.submit(a)
        a_out, b_out = drain(a_events), drain(b_events)
    finally:
        s.stop()
    assert isinstance(b_out[-1], Finished) and a_out[-1].completion_tokens == 12
    a_seq = id(a.seq)
    b_steps = [st for st in steps if any(k != a_seq and n > 1 for k, n in st)]
    assert len(b_steps) >= 5  # 20 prompt tokens in chunks of at most 4
    for st in b_steps:
        assert (a_seq, 1) in st and all(n <= 4 for _, n in st)  # the stream got its token in every one of them
