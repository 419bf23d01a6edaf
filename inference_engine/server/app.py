"""The OpenAI-compatible HTTP API (FastAPI): ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``,
``/health`` and ``/metrics``, over the continuous-batching :class:`~inference_engine.server.scheduler.Scheduler`.

Every request is checked before it is queued (schema, model name, prompt and ``max_tokens`` against the context
and the KV pool); a refusal is a 4xx with OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``.
A streaming response starts only once the request holds its KV blocks, so a request that cannot be served yet
still gets a plain 429 / 503. Streams are server-sent events in OpenAI's chunk shapes ending with
``data: [DONE]``; a client that goes away (streaming or not) is cancelled at once, and its blocks go back to the
pool at the next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inference_engine.errors import GGUFParityError
from inference_engine.server.metrics import ServerMetrics
from inference_engine.server.responses import ChatShaper, CompletionShaper
from inference_engine.server.scheduler import (
    Admitted,
    Delta,
    Failed,
    Finished,
    GenerationParams,
    QueueFull,
    Scheduler,
    ShuttingDown,
)
from inference_engine.server.scheduler import Request as GenRequest
from inference_engine.server.schemas import ChatCompletionRequest, CompletionRequest
from inference_engine.server.served import ServedModel

log = logging.getLogger("inference_engine.server")

DISCONNECT_POLL_S = 0.25  # how often a request not yet streaming checks that its client is still there
ENDPOINTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
MAX_BODY_BYTES = 8 * 2**20  # far above any prompt that fits a context; refuses bodies that would only eat memory


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.kind, e.param, e.code), status_code=e.status)


def create_app(served: ServedModel, metrics: ServerMetrics) -> FastAPI:
    scheduler = served.scheduler

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            yield
        finally:
            scheduler.stop()

    app = FastAPI(title="gguf-parity server", lifespan=lifespan)
    app.state.served = served
    app.state.metrics = metrics

    app.add_middleware(CountAndLimit, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":
            message = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}"
        elif first.get("type") == "extra_forbidden":
            message = f"unrecognized request argument supplied: {'.'.join(loc)}"
        else:
            message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}"
        return error_response(APIError(400, message, param=".".join(loc) or None))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, str(exc.detail), kind))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error")
        return error_response(APIError(500, "internal server error; see the server log", "server_error"))

    # --- plain endpoints ------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        pool = scheduler.runner.pool
        return {
            "status": "ok",
            "model": served.model_id,
            "running": scheduler.n_running,
            "waiting": scheduler.n_waiting,
            "kv_blocks_total": pool.n_blocks,
            "kv_blocks_in_use": pool.n_in_use,
            "kv_blocks_cached": pool.n_cached,
            "block_size": pool.block_size,
            "n_ctx": served.n_ctx,
        }

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model_card(served)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        _check_model(served, model_id)
        return _model_card(served)

    # --- generation -----------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(served, body.model)
        prompt_ids, prompt_text = await asyncio.to_thread(_completion_prompt, served, body.prompt)
        max_tokens = _check_room(served, len(prompt_ids), body.max_tokens)
        params = _params(body, max_tokens, body.logprobs, prompt_logprobs=body.echo and body.logprobs is not None,
                         logit_bias=_logit_bias(served, body.logit_bias))
        gen, queue = await _start(served, prompt_ids, params, request)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        shaper = CompletionShaper(served, rid, created, body, prompt_text)
        if body.stream:
            return _stream(scheduler, gen, queue, shaper, request)
        return await _collect(scheduler, gen, queue, shaper, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(served, body.model)
        prompt_ids = await asyncio.to_thread(_chat_prompt, served, body)
        max_tokens = _check_room(served, len(prompt_ids), body.max_new_tokens)
        k = (body.top_logprobs or 0) if body.logprobs else None
        params = _params(body, max_tokens, k, prompt_logprobs=False, logit_bias=_logit_bias(served, body.logit_bias))
        gen, queue = await _start(served, prompt_ids, params, request)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        shaper = ChatShaper(served, rid, created, body)
        if body.stream:
            return _stream(scheduler, gen, queue, shaper, request)
        return await _collect(scheduler, gen, queue, shaper, request)

    return app


class CountAndLimit:
    """Pure ASGI middleware (Starlette's BaseHTTPMiddleware would hide client disconnects from the routes): counts
    requests by path and status, and refuses bodies over ``MAX_BODY_BYTES`` before they are read."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_and_count(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        try:
            if not length.isdigit() or int(length) > MAX_BODY_BYTES:
                response = error_response(APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes"))
                await response(scope, receive, send_and_count)
            else:
                await self.app(scope, receive, send_and_count)
        finally:
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "other"  # bounded label values, whatever clients send
            self.metrics.requests.labels(endpoint, str(status["code"])).inc()


# --- request checks ------------------------------------------------------------------------------------------
def _model_card(served: ServedModel) -> dict:
    return {"id": served.model_id, "object": "model", "created": served.created, "owned_by": "gguf-parity"}


def _check_model(served: ServedModel, name: str) -> None:
    if name not in served.aliases:
        raise APIError(404, f"the model '{name}' does not exist; this server serves '{served.model_id}'",
                       "invalid_request_error", "model", "model_not_found")


def _completion_prompt(served: ServedModel, prompt) -> tuple[list[int], str]:
    tok = served.tokenizer
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "the prompt is empty", param="prompt")
        ids = tok.encode(prompt, add_bos=None, parse_special=True)  # as `bench-compare generate` does
        text = prompt
    else:
        n_vocab = served.scheduler.runner.n_vocab
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise APIError(400, f"token id {bad[0]} is not in this model's vocabulary (0..{n_vocab - 1})",
                           param="prompt")
        ids = list(prompt)
        text = tok.decode(ids)
    if not ids:
        raise APIError(400, "the prompt encodes to no tokens", param="prompt")
    return ids, text


def _chat_prompt(served: ServedModel, body: ChatCompletionRequest) -> list[int]:
    from inference_engine.chat import render_chat

    try:
        text = render_chat(served.gguf, [m.as_template_message() for m in body.messages], add_generation_prompt=True)
    except GGUFParityError as e:
        raise APIError(400, str(e), param="messages") from None
    ids = served.tokenizer.encode(text, add_bos=None, parse_special=True)  # as `generate --chat`
    if not ids:
        raise APIError(400, "the messages render to an empty prompt", param="messages")
    return ids


def _check_room(served: ServedModel, n_prompt: int, max_tokens: int | None) -> int:
    """``max_tokens`` checked against the context (None: whatever the context leaves)."""
    n_ctx = served.n_ctx
    if n_prompt >= n_ctx:
        raise APIError(400, f"the prompt has {n_prompt} tokens; this server's context holds {n_ctx} "
                       "(prompt + completion)", param="prompt", code="context_length_exceeded")
    if max_tokens is None:
        return n_ctx - n_prompt
    if n_prompt + max_tokens > n_ctx:
        raise APIError(400, f"this model's maximum context length is {n_ctx} tokens; you requested "
                       f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the completion)",
                       param="max_tokens", code="context_length_exceeded")
    return max_tokens


def _logit_bias(served: ServedModel, bias: dict[str, float] | None) -> dict[int, float] | None:
    """The request's logit_bias with its token ids checked against this model's vocabulary."""
    if not bias:
        return None
    n_vocab = served.scheduler.runner.n_vocab
    out = {int(t): b for t, b in bias.items()}
    bad = [t for t in out if t >= n_vocab]
    if bad:
        raise APIError(400, f"logit_bias token id {bad[0]} is not in this model's vocabulary (0..{n_vocab - 1})",
                       param="logit_bias")
    return out


def _params(body, max_tokens: int, logprobs: int | None, prompt_logprobs: bool,
            logit_bias: dict[int, float] | None = None) -> GenerationParams:
    return GenerationParams(
        logit_bias=logit_bias,
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k_or_off,
        seed=body.sampling_seed,
        stop=body.stop_list,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )


async def _start(served: ServedModel, prompt_ids: list[int], params: GenerationParams, request: Request):
    """Queue the request; return once it holds its KV blocks (or raise the refusal as an API error). A client
    that leaves while its request waits is taken out of the queue."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def sink(event) -> None:  # scheduler thread -> this request's event loop
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    gen = GenRequest(prompt_ids, params, sink)
    try:
        served.scheduler.submit(gen)
    except QueueFull as e:
        raise APIError(429, str(e), "rate_limit_error", code="queue_full") from None
    except ShuttingDown as e:
        raise APIError(503, str(e), "service_unavailable") from None
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
                break
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    served.scheduler.cancel(gen)
                    raise APIError(499, "the client closed the connection", "client_closed_request") from None
    except asyncio.CancelledError:
        served.scheduler.cancel(gen)
        raise
    if isinstance(event, Failed):
        raise APIError(event.status, event.message, event.kind)
    assert isinstance(event, Admitted), event
    return gen, queue


async def _collect(scheduler: Scheduler, gen: GenRequest, queue: asyncio.Queue, shaper, request: Request):
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return Response(status_code=499)
                continue
            if isinstance(event, Delta):
                shaper.add(event)
            elif isinstance(event, Finished):
                return JSONResponse(shaper.final(event))
            elif isinstance(event, Failed):
                raise APIError(event.status, event.message, event.kind)
    finally:
        scheduler.cancel(gen)  # no-op when it finished; frees the slot when the client left


def _stream(scheduler: Scheduler, gen: GenRequest, queue: asyncio.Queue, shaper, request: Request):
    async def events() -> AsyncIterator[str]:
        try:
            for chunk in shaper.opening_chunks():
                yield _sse(chunk)
            while True:
                event = await queue.get()
                if isinstance(event, Delta):
                    for chunk in shaper.delta_chunks(event):
                        yield _sse(chunk)
                elif isinstance(event, Finished):
                    for chunk in shaper.closing_chunks(event):
                        yield _sse(chunk)
                    break
                elif isinstance(event, Failed):
                    yield _sse(error_body(event.message, event.kind))
                    break
            yield "data: [DONE]\n\n"
        finally:
            scheduler.cancel(gen)  # a client that disconnected mid-stream ends here (the task is cancelled)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
