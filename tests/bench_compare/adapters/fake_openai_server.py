"""A tiny OpenAI-compatible server (Starlette + uvicorn) for the HTTP tests, with misbehaviours on demand.

The base URL's first path segment picks the behaviour: ``http://127.0.0.1:PORT/<mode>/v1``.

* ``ok``: a role-only first chunk (no text) at once, then :data:`FIRST_TEXT_DELAY_S` later the first text chunk,
  then one text chunk per :data:`TOKEN_DELAY_S`, ``finish_reason``, ``data: [DONE]``.
* ``malformed``: one chunk of broken JSON.
* ``drop``: two text chunks, then the connection is closed mid-stream.
* ``slow``: nothing for :data:`SLOW_S` seconds (longer than the tests' read timeout).
* ``fail-after-N``: ``ok`` for N completions, then ``drop``.
* ``error500``: HTTP 500.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

FIRST_TEXT_DELAY_S = 0.05
TOKEN_DELAY_S = 0.01
SLOW_S = 3.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_app():
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    counts: dict[str, int] = {}

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    def chunk(text: str, finish: str | None = None) -> str:
        body = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "fake-model",
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]}
        return f"data: {json.dumps(body)}\n\n"

    async def completions(request: Request):
        mode = request.path_params["mode"]
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        counts[mode] = counts.get(mode, 0) + 1
        if mode.startswith("fail-after-"):
            mode = "ok" if counts[mode] <= int(mode.rsplit("-", 1)[1]) else "drop"
        if mode == "error500":
            return Response("internal trouble", status_code=500)
        if mode == "slow":
            await asyncio.sleep(SLOW_S)

        async def events():
            if mode == "malformed":
                yield "data: {not json\n\n"
                return
            yield chunk("")  # role-only / empty first chunk: TTFT must not count it
            await asyncio.sleep(FIRST_TEXT_DELAY_S)
            for i in range(n):
                if mode == "drop" and i == 2:
                    raise RuntimeError("connection dropped on purpose")
                yield chunk(f" w{i}", "length" if i == n - 1 else None)
                await asyncio.sleep(TOKEN_DELAY_S)
            yield "data: [DONE]\n\n"

        if not body.get("stream"):
            return JSONResponse({"choices": [{"index": 0, "text": " w0", "finish_reason": "length",
                                              "logprobs": None}]})
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/{mode}/v1/models", models),
                             Route("/{mode}/v1/completions", completions, methods=["POST"])])


class FakeServer:
    """uvicorn in a thread on a free 127.0.0.1 port; ``stop()`` (or the context manager) shuts it down."""

    def __init__(self):
        import uvicorn

        self.port = _free_port()
        config = uvicorn.Config(make_app(), host="127.0.0.1", port=self.port, log_level="error", lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    def start(self) -> FakeServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
