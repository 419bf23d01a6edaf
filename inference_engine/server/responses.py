"""OpenAI's response shapes, built from the scheduler's events: ``text_completion`` objects with the legacy
``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset) for ``/v1/completions``, ``chat.completion`` /
``chat.completion.chunk`` objects with ``logprobs.content`` for ``/v1/chat/completions``, and ``usage``.

A shaper serves one request: ``add`` + ``final`` build the non-streaming answer, ``opening_chunks`` /
``delta_chunks`` / ``closing_chunks`` the chunks of a stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference_engine.server.scheduler import Delta, Finished
from inference_engine.server.text import TokenLogprob

if TYPE_CHECKING:
    from inference_engine.server.schemas import ChatCompletionRequest, CompletionRequest
    from inference_engine.server.served import ServedModel


def _usage(f: Finished) -> dict:
    return {
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    }


class CompletionShaper:
    """``/v1/completions`` shapes: ``text_completion`` objects, legacy ``logprobs`` (tokens, token_logprobs,
    top_logprobs, text_offset), ``echo`` prepends the prompt (and its log-probabilities)."""

    def __init__(self, served: ServedModel, rid: str, created: int, body: CompletionRequest, prompt_text: str):
        self.served, self.rid, self.created, self.body = served, rid, created, body
        self.prompt_text = prompt_text
        self.text_parts: list[str] = []
        self.offset = 0  # characters of text sent so far (text_offset of the next token)
        self.lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        self.echoed = False

    def _tok(self, token_id: int) -> str:
        return self.served.tokenizer.decode([token_id])

    def _logprobs_of(self, entries: list[TokenLogprob], texts: list[str]) -> dict:
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for e, piece in zip(entries, texts):
            out["tokens"].append(piece)
            out["token_logprobs"].append(e.logprob)
            out["top_logprobs"].append(None if e.logprob is None else {self._tok(i): lp for i, lp in e.top})
            out["text_offset"].append(self.offset)
            self.offset += len(piece)
        return out

    def _piece(self, event: Delta) -> tuple[str, dict | None]:
        text = event.text
        lp = None
        if self.body.echo and not self.echoed:
            self.echoed = True
            text = self.prompt_text + text
            if event.prompt_logprobs is not None:
                entries = list(event.prompt_logprobs)
                lp = self._logprobs_of(entries, [self._tok(e.token_id) for e in entries])
        if self.body.logprobs is not None and event.logprobs:
            gen = self._logprobs_of(event.logprobs, [self._tok(e.token_id) for e in event.logprobs])
            lp = gen if lp is None else {k: lp[k] + gen[k] for k in lp}
        return text, lp

    def _chunk(self, text: str, logprobs, finish_reason) -> dict:
        return {"id": self.rid, "object": "text_completion", "created": self.created, "model": self.served.model_id,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}]}

    def add(self, event: Delta) -> None:
        text, lp = self._piece(event)
        self.text_parts.append(text)
        if lp is not None:
            for k in self.lp:
                self.lp[k].extend(lp[k])

    def final(self, f: Finished) -> dict:
        if self.body.echo and not self.echoed:
            self.text_parts.insert(0, self.prompt_text)
        out = self._chunk("".join(self.text_parts), self.lp if self.body.logprobs is not None else None, f.reason)
        out["usage"] = _usage(f)
        return out

    def opening_chunks(self) -> list[dict]:
        return []

    def delta_chunks(self, event: Delta) -> list[dict]:
        text, lp = self._piece(event)
        return [self._chunk(text, lp, None)] if text or lp else []

    def closing_chunks(self, f: Finished) -> list[dict]:
        chunks = []
        if self.body.echo and not self.echoed:
            self.echoed = True
            chunks.append(self._chunk(self.prompt_text, None, None))
        chunks.append(self._chunk("", None, f.reason))
        if self.body.include_usage:
            chunks.append({"id": self.rid, "object": "text_completion", "created": self.created,
                           "model": self.served.model_id, "choices": [], "usage": _usage(f)})
        return chunks


class ChatShaper:
    """``/v1/chat/completions`` shapes: ``chat.completion`` / ``chat.completion.chunk`` objects, ``logprobs.content``
    entries ``{token, logprob, bytes, top_logprobs}``; a stream opens with the assistant role."""

    def __init__(self, served: ServedModel, rid: str, created: int, body: ChatCompletionRequest):
        self.served, self.rid, self.created, self.body = served, rid, created, body
        self.parts: list[str] = []
        self.content: list[dict] = []

    def _entry(self, token_id: int, logprob: float, top: list[tuple[int, float]]) -> dict:
        text = self.served.tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8")),
                "top_logprobs": [self._top(i, lp) for i, lp in top]}

    def _top(self, token_id: int, logprob: float) -> dict:
        text = self.served.tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, event: Delta) -> list[dict]:
        return [self._entry(e.token_id, e.logprob, e.top) for e in event.logprobs] if self.body.logprobs else []

    def _chunk(self, delta: dict, logprobs, finish_reason) -> dict:
        return {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                "model": self.served.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}

    def add(self, event: Delta) -> None:
        self.parts.append(event.text)
        self.content.extend(self._logprobs(event))

    def final(self, f: Finished) -> dict:
        return {
            "id": self.rid, "object": "chat.completion", "created": self.created, "model": self.served.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(self.parts)},
                         "logprobs": {"content": self.content} if self.body.logprobs else None,
                         "finish_reason": f.reason}],
            "usage": _usage(f),
        }

    def opening_chunks(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None, None)]

    def delta_chunks(self, event: Delta) -> list[dict]:
        entries = self._logprobs(event)
        if not event.text and not entries:
            return []
        return [self._chunk({"content": event.text}, {"content": entries} if self.body.logprobs else None, None)]

    def closing_chunks(self, f: Finished) -> list[dict]:
        chunks = [self._chunk({}, None, f.reason)]
        if self.body.include_usage:
            chunks.append({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                           "model": self.served.model_id, "choices": [], "usage": _usage(f)})
        return chunks
