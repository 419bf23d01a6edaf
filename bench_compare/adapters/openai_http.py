"""Any OpenAI-compatible server as an engine: ``--engine openai:http://127.0.0.1:8080/v1``.

Only ``POST {base}/completions`` (streamed as server-sent events) and ``GET {base}/models`` are used. What HTTP can
and cannot give, honestly:

* tokenize / detokenize: locally, with the GGUF's own tokenizer (``inference_engine.tokenizer``), whose ids equal
  llama.cpp's (the project's tokenizer parity check). The server is sent text; :func:`check_text_round_trip`
  says when a text would not tokenize back to the intended ids.
* generation with per-position top-k log-probabilities (``logprobs: k``) and timings of every streamed chunk.
* NOT full logits (only the top k), NOT hidden states or any intermediate tensor, NOT teacher forcing: the
  protocol's ``prefill`` / ``decode`` / ``capture`` raise a one-line :class:`GGUFParityError` saying so.

Every request has a timeout (connect, read between chunks, and a total deadline); a server that is down, slow,
answers malformed JSON or drops the stream raises a one-line :class:`GGUFParityError` naming the URL and what
happened (never a hang, never a traceback).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from inference_engine.errors import GGUFParityError, one_line

# Seconds. Connecting to a loopback or LAN server takes milliseconds; 10 s means it is not listening.
CONNECT_TIMEOUT_S = 10.0
# Seconds without a byte while waiting for the next chunk (a prefill of a few thousand tokens on a slow CPU takes
# well under a minute; longer means the server is stuck). Overridable with --engine-opt read_timeout=S.
READ_TIMEOUT_S = 120.0
# Seconds one whole request may take, however steadily it streams (--engine-opt request_timeout=S).
REQUEST_TIMEOUT_S = 600.0

# What this engine can do over HTTP, and what it cannot (the harness prints the second list in its reports).
CAPABILITIES = frozenset({"tokenize", "text", "timings", "top_logprobs"})  # inference_engine.protocol.CAPABILITIES
NOT_OVER_HTTP = {
    "logits": "full logits (only the server's top-k log-probabilities per position)",
    "capture": "hidden states and per-tensor intermediates (attn_norm-N, l_out-N, ...)",
    "teacher_forcing": "teacher-forced per-op checks (the server computes from its own values end to end)",
    "token_ids_in": "token ids as the prompt, unless the server accepts them (checked per server)",
}

# Greedy decoding with every sampler and penalty neutral: temperature 0 alone is not greedy on llama-cpp-python's
# server (its repeat_penalty defaults to 1.1, min_p to 0.05), so each is sent explicitly.
GREEDY_PARAMS: dict[str, Any] = {
    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
    "frequency_penalty": 0.0, "presence_penalty": 0.0, "seed": 0,
}


def streamed(body: dict) -> dict:
    """``body`` as a streamed request that asks for the usage chunk at the end (OpenAI's ``stream_options``: the
    server's token counts and prefix-cache hits; a server that does not know it ignores it)."""
    return {"stream_options": {"include_usage": True}, **body, "stream": True}


@dataclass
class StreamRecord:
    """One streamed completion as the client saw it; times are ``time.perf_counter()`` seconds."""

    t_start: float
    t_first_chunk: float | None = None  # any chunk, including a role-only or empty one
    t_first_text: float | None = None  # the first chunk carrying token text: TTFT is counted here
    text_times: list[float] = field(default_factory=list)  # arrival of every chunk that carried text
    t_end: float | None = None
    text: str = ""
    n_chunks: int = 0  # chunks with a choice (one token each on llama.cpp's server)
    n_empty_chunks: int = 0  # chunks with a choice but no text (role-only first chunk, partial UTF-8)
    finish_reason: str | None = None
    usage: dict | None = None
    timings: dict | None = None  # llama.cpp's server: its own per-request timings (cache_n: prompt tokens reused)
    logprobs: list[dict] = field(default_factory=list)  # per chunk: {"tokens", "token_logprobs", "top_logprobs"}

    def cached_prompt_tokens(self) -> int | None:
        """Prompt tokens the server said it took from its prefix cache instead of computing them: the OpenAI
        usage's ``prompt_tokens_details.cached_tokens`` (ours, and servers that fill it) or llama.cpp's
        ``timings.cache_n``; None when the server says nothing (llama-cpp-python's server)."""
        details = (self.usage or {}).get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return int(details["cached_tokens"])
        if self.timings and isinstance(self.timings.get("cache_n"), int):
            return int(self.timings["cache_n"])
        return None

    def n_output_tokens(self, max_tokens: int) -> tuple[int, str]:
        """Output tokens and how they were counted: the server's usage, else ``max_tokens`` when it stopped for
        length (exact by the API's definition), else the number of chunks (one token each on llama.cpp's server)."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return int(self.usage["completion_tokens"]), "usage"
        if self.finish_reason == "length":
            return max_tokens, "finish_reason=length"
        return self.n_chunks, "chunks"

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first_text is None else self.t_first_text - self.t_start

    @property
    def e2e_s(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_start

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive text-carrying chunks."""
        return [b - a for a, b in zip(self.text_times, self.text_times[1:])]


class OpenAIClient:
    """A thin, timeout-guarded client for one OpenAI-compatible base URL (``http://host:port/v1``)."""

    def __init__(self, base_url: str, *, api_key: str | None = None, connect_timeout: float = CONNECT_TIMEOUT_S,
                 read_timeout: float = READ_TIMEOUT_S, request_timeout: float = REQUEST_TIMEOUT_S):
        import httpx

        base = (base_url or "").strip().rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise GGUFParityError(
                f"openai engine needs an http(s) base URL such as openai:http://127.0.0.1:8080/v1, got '{base_url}'")
        self.base_url = base
        self.request_timeout = float(request_timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(connect=connect_timeout, read=read_timeout, write=read_timeout,
                                      pool=connect_timeout)
        self._client = httpx.Client(timeout=self._timeout, headers=headers)

    def close(self) -> None:
        self._client.close()

    def _error(self, path: str, what: str) -> GGUFParityError:
        return GGUFParityError(f"{self.base_url}{path}: {one_line(what, 160)}")

    def _http_error(self, path: str, exc: Exception, record: StreamRecord | None = None) -> GGUFParityError:
        import httpx

        got = f" after {record.n_chunks} chunks" if record is not None and record.n_chunks else ""
        if isinstance(exc, httpx.ConnectError):
            return self._error(path, f"cannot connect (is the server running?): {exc}")
        if isinstance(exc, httpx.ConnectTimeout):
            return self._error(path, f"no connection within {self._timeout.connect:g} s")
        if isinstance(exc, httpx.ReadTimeout):
            return self._error(path, f"no data for {self._timeout.read:g} s{got} (read timeout; the server is stuck "
                                     "or too slow: raise --engine-opt read_timeout=S)")
        if isinstance(exc, httpx.RemoteProtocolError):
            return self._error(path, f"the server dropped the connection{got}: {exc}")
        if isinstance(exc, httpx.TimeoutException):
            return self._error(path, f"timed out{got}: {type(exc).__name__}")
        return self._error(path, f"{type(exc).__name__}{got}: {exc}")

    def list_models(self) -> list[str]:
        import httpx

        try:
            response = self._client.get(f"{self.base_url}/models")
        except httpx.HTTPError as exc:
            raise self._http_error("/models", exc) from None
        data = self._json_body("/models", response)
        models = data.get("data") if isinstance(data, dict) else None
        if not isinstance(models, list):
            raise self._error("/models", f"expected {{'data': [...]}}, got {one_line(response.text, 80)}")
        return [str(m.get("id")) for m in models if isinstance(m, dict) and m.get("id") is not None]

    def _json_body(self, path: str, response) -> Any:
        if response.status_code >= 400:
            raise self._error(path, f"HTTP {response.status_code}: {response.text}")
        try:
            return response.json()
        except ValueError:
            raise self._error(path, f"malformed JSON in the response: {response.text[:80]!r}") from None

    def complete(self, body: dict) -> dict:
        """One non-streamed ``/completions`` request; the parsed JSON."""
        import httpx

        try:
            response = self._client.post(f"{self.base_url}/completions", json={**body, "stream": False})
        except httpx.HTTPError as exc:
            raise self._http_error("/completions", exc) from None
        data = self._json_body("/completions", response)
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
            raise self._error("/completions", f"no choices in the response: {response.text[:80]!r}")
        return data

    def stream_completion(self, body: dict, record: StreamRecord | None = None) -> StreamRecord:
        """One streamed ``/completions`` request, every chunk timed into ``record`` (kept, partly filled, when an
        error is raised). The stream must end with ``data: [DONE]`` or a ``finish_reason``."""
        import httpx
        from httpx_sse import SSEError, connect_sse

        record = record or StreamRecord(t_start=time.perf_counter())
        deadline = record.t_start + self.request_timeout
        path = "/completions"
        done = False
        try:
            with connect_sse(self._client, "POST", f"{self.base_url}{path}", json=streamed(body)) as source:
                response = source.response
                if response.status_code >= 400:
                    response.read()
                    raise self._error(path, f"HTTP {response.status_code}: {response.text}")
                for event in source.iter_sse():
                    now = time.perf_counter()
                    if now > deadline:
                        raise self._error(path, f"the request took longer than {self.request_timeout:g} s "
                                                f"(request timeout) after {record.n_chunks} chunks")
                    if record.t_first_chunk is None:
                        record.t_first_chunk = now
                    data = event.data.strip()
                    if not data:
                        continue  # a keep-alive or comment-only event
                    if data == "[DONE]":
                        done = True
                        break
                    self._take_chunk(record, data, now)
        except GGUFParityError:
            raise
        except SSEError as exc:
            raise self._error(path, f"not an event stream: {exc}") from None
        except httpx.HTTPError as exc:
            raise self._http_error(path, exc, record) from None
        record.t_end = time.perf_counter()
        if not done and record.finish_reason is None:
            raise self._error(path, f"the stream ended after {record.n_chunks} chunks without a finish_reason or "
                                    "[DONE] (dropped stream)")
        return record

    def _take_chunk(self, record: StreamRecord, data: str, now: float) -> None:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise self._error("/completions", f"malformed JSON in stream chunk {record.n_chunks + 1}: "
                                              f"{data[:60]!r}") from None
        if not isinstance(chunk, dict):
            raise self._error("/completions", f"stream chunk is not a JSON object: {data[:60]!r}")
        if chunk.get("error"):
            raise self._error("/completions", f"the server reported an error mid-stream: {chunk['error']}")
        if isinstance(chunk.get("usage"), dict):
            record.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            record.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                raise self._error("/completions", f"malformed choice in stream chunk: {data[:60]!r}")
            record.n_chunks += 1
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):  # chat-style delta, tolerated
                text = choice["delta"].get("content")
            if text:
                record.text += text
                record.text_times.append(now)
                if record.t_first_text is None:
                    record.t_first_text = now
            else:
                record.n_empty_chunks += 1
            if isinstance(choice.get("logprobs"), dict):
                record.logprobs.append(choice["logprobs"])
            if choice.get("finish_reason"):
                record.finish_reason = str(choice["finish_reason"])


class OpenAIHTTPEngine:
    """The Engine protocol, as far as HTTP allows (see the module docstring), over one OpenAI-compatible server.

    ``model`` is the GGUF the server runs (a named model or a path): it gives the tokenizer and the model's
    identity for reports; the server is not asked for it.
    """

    capabilities = CAPABILITIES

    def __init__(self, base_url: str, model: str | Path, *, model_name: str | None = None,
                 api_key: str | None = None, read_timeout: float = READ_TIMEOUT_S,
                 request_timeout: float = REQUEST_TIMEOUT_S, label: str | None = None):
        from inference_engine.gguf.file import open_gguf
        from inference_engine.store.named_models import resolve_model
        from inference_engine.tokenizer import GGUFTokenizer

        self.client = OpenAIClient(base_url, api_key=api_key, read_timeout=read_timeout,
                                   request_timeout=request_timeout)
        self.name = label or f"openai:{self.client.base_url}"
        self.model_path = Path(resolve_model(str(model), progress=False))
        self._gguf = open_gguf(self.model_path)
        self.tokenizer = GGUFTokenizer.from_gguf(self._gguf)
        self._model_name = model_name
        self.server_info: dict[str, Any] = {}

    # --- identity -----------------------------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        """The ``model`` field sent with each request: the user's, else the server's first listed model."""
        if self._model_name is None:
            models = self.client.list_models()
            if not models:
                raise GGUFParityError(f"{self.client.base_url}/models lists no model; pass "
                                      "--engine-opt model_name=NAME")
            self._model_name = models[0]
        return self._model_name

    @property
    def model_info(self) -> dict[str, Any]:
        return {
            "file": str(self.model_path), "sha256": self._gguf.sha256, "architecture": self._gguf.architecture,
            "engine": self.name, "base_url": self.client.base_url, "server_model": self._model_name,
            "backend": "http", "numerics": "server's own", **self.server_info,
        }

    @property
    def n_vocab(self) -> int:
        return self.tokenizer.n_vocab

    @property
    def n_ctx(self) -> int:
        return int(self._gguf.arch_value("context_length") or 0)

    # --- tokens (local, with the GGUF's tokenizer) ----------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # --- what HTTP cannot do ----------------------------------------------------------------------------------------
    def _not_over_http(self, what: str):
        raise GGUFParityError(f"{self.name}: {NOT_OVER_HTTP[what]} cannot be had over HTTP; use a Python plugin "
                              "or a tensor dump for that check")

    def reset(self) -> None:
        """Nothing to reset: each request is independent."""

    def prefill(self, ids: list[int]):
        self._not_over_http("logits")

    def decode(self, token_id: int):
        self._not_over_http("logits")

    def capture(self, ids: list[int], names: Iterable[str] | None = None):
        self._not_over_http("capture")

    # --- generation -------------------------------------------------------------------------------------------------
    def completion_body(self, prompt: str, max_tokens: int, *, logprobs: int | None = None, echo: bool = False,
                        ban_eos: bool = False) -> dict:
        """A greedy ``/completions`` body (see :data:`GREEDY_PARAMS`); ``ban_eos`` biases end-of-generation tokens
        away so the server produces exactly ``max_tokens`` (timed tg runs)."""
        body: dict[str, Any] = {"model": self.model_name, "prompt": prompt, "max_tokens": int(max_tokens),
                                **GREEDY_PARAMS}
        if logprobs is not None:
            body["logprobs"] = int(logprobs)
        if echo:
            body["echo"] = True
        if ban_eos:
            body["logit_bias"] = {str(t): -100.0 for t in sorted(self.tokenizer.eog_ids)}
        return body

    def stream(self, body: dict, record: StreamRecord | None = None) -> StreamRecord:
        return self.client.stream_completion(body, record)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> OpenAIHTTPEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_text_round_trip(tokenizer, ids: list[int], add_bos: bool) -> str:
    """The text to send for ``ids`` to a server that takes only text; refuses (one line) when the text would not
    tokenize back to exactly ``ids``, since then the server would compute on different tokens."""
    body = ids[1:] if add_bos and ids and ids[0] == tokenizer.bos_id else ids
    text = tokenizer.decode(body)
    back = tokenizer.encode(text, add_bos=add_bos)
    if back != list(ids):
        raise GGUFParityError(
            f"the prompt's token ids do not survive detokenize -> tokenize ({len(ids)} ids became {len(back)}); "
            "this server takes text only, so give a prompt text that tokenizes to itself")
    return text


def _float_opt(options: dict, key: str, default: float) -> float:
    value = options.get(key)
    if value is None:
        return default
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise GGUFParityError(f"--engine-opt {key} must be a number of seconds, got '{value}'") from None
    if out <= 0:
        raise GGUFParityError(f"--engine-opt {key} must be positive, got '{value}'")
    return out


def open_engine(target: str, model: str, **options) -> OpenAIHTTPEngine:
    """Any OpenAI-compatible server at URL (/v1/completions, streamed; tokenizer from the GGUF).

    Factory for ``--engine openai:URL`` (``engines.ENGINE_SCHEMES['openai']``). Options used: ``model_name``,
    ``api_key``, ``read_timeout``, ``request_timeout``; others (n_threads, n_ctx, numerics, ...) are ignored: the
    server was started with its own."""
    return OpenAIHTTPEngine(
        target, model, model_name=options.get("model_name"), api_key=options.get("api_key"),
        read_timeout=_float_opt(options, "read_timeout", READ_TIMEOUT_S),
        request_timeout=_float_opt(options, "request_timeout", REQUEST_TIMEOUT_S),
    )
