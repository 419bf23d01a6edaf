"""Continuous batching: one thread owns the model and runs one forward pass per step for every live request.

Each step (:meth:`Scheduler._step`):

1. New requests move from the inbox to the waiting queue; cancelled ones (a client that went away) leave at once,
   their KV blocks back in the pool; requests that waited longer than ``queue_timeout_s`` get a 503.
2. Waiting requests are admitted in arrival order while there is a free slot (``max_batch``) and the pool can give
   them blocks for prompt + ``max_tokens`` (reusing cached prefix blocks). A request is never admitted into a pool
   that cannot finish it, so nothing runs out of KV memory midway; the rest keep waiting (bounded queue).
3. One batch: one row per decoding request, plus prompt chunks of requests still prefilling, at most
   ``prefill_chunk`` prompt rows per step, so a long prompt is spread over several steps while the running streams
   keep getting a token per step (with no stream running, up to ``IDLE_PREFILL_CHUNK`` rows).
4. One forward (:class:`~inference_engine.server.runner.BatchRunner`), then for every request whose prompt is done:
   sample, log-probabilities, text (stop strings), and an event to its consumer. Finished requests release their
   blocks (full blocks stay cached for prefix reuse).

Consumers get events through a callback (``Request.sink``), called on this thread: the HTTP layer forwards them to
its event loop. Events: :class:`Admitted`, :class:`Delta` (text, token ids, log-probabilities), :class:`Finished`
(finish reason, usage) or :class:`Failed` (HTTP status and message).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.generate import PREFILL_CHUNK
from inference_engine.paged_kv_cache import PagedSequence, PoolExhausted
from inference_engine.sampling import Sampler
from inference_engine.server.runner import BatchRunner
from inference_engine.server.text import TextAssembler, TokenLogprob, token_logprobs

log = logging.getLogger("inference_engine.server")

DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_QUEUE = 64
DEFAULT_QUEUE_TIMEOUT_S = 60.0
DEFAULT_PREFILL_CHUNK = 128  # prompt rows per step: bounds how long one step stalls the running streams
IDLE_PREFILL_CHUNK = PREFILL_CHUNK  # prompt rows per step when nothing is decoding (llama.cpp's n_ubatch)


class QueueFull(GGUFParityError):
    """The waiting queue is at its bound (HTTP 429)."""


class ShuttingDown(GGUFParityError):
    """The server is stopping and takes no new requests (HTTP 503)."""


@dataclass
class Admitted:
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Delta:
    text: str
    token_ids: list[int]  # ids generated since the previous Delta
    logprobs: list[TokenLogprob]  # one per token id, when the request asked for log-probabilities
    prompt_logprobs: list[TokenLogprob] | None = None  # echo + logprobs: the prompt's, once, before any token


@dataclass
class Finished:
    reason: str  # "stop" (end-of-generation token or a stop string) or "length" (max_tokens or the context)
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass
class Failed:
    status: int
    message: str
    kind: str = "server_error"


Event = Admitted | Delta | Finished | Failed


@dataclass
class GenerationParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: int | None = None  # alternatives per token; None: no log-probabilities
    prompt_logprobs: bool = False  # echo with logprobs: every prompt token's log-probability too
    # token id -> bias added to its logit before sampling (OpenAI's logit_bias); log-probabilities stay the model's
    logit_bias: dict[int, float] | None = None


_ids = itertools.count()


@dataclass(eq=False)
class Request:
    prompt_ids: list[int]
    params: GenerationParams
    sink: Callable[[Event], None]
    id: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    cancelled: bool = False
    seq: PagedSequence | None = None
    sampler: Sampler | None = None
    text: TextAssembler | None = None
    generated: list[int] = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  # generated ids not yet in a Delta (their text held back)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    first_token_at: float | None = None
    last_token_at: float | None = None
    done: bool = False


class SchedulerMetrics:
    """Hooks the scheduler calls (no-ops here; the server's Prometheus metrics override them)."""

    def on_admitted(self, req: Request, cached_tokens: int) -> None: ...
    def on_token(self, req: Request, first: bool, since_last_s: float) -> None: ...
    def on_finished(self, req: Request, reason: str) -> None: ...
    def on_step(self, rows: int, prompt_rows: int) -> None: ...


class Scheduler:
    """The serving loop around a :class:`BatchRunner`, on its own thread (:meth:`start` / :meth:`stop`)."""

    def __init__(
        self,
        runner: BatchRunner,
        tokenizer,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_queue: int = DEFAULT_MAX_QUEUE,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        metrics: SchedulerMetrics | None = None,
    ):
        limits = (("--max-batch", max_batch), ("--max-queue", max_queue), ("--prefill-chunk", prefill_chunk))
        for name, value in limits:
            if value < 1:
                raise GGUFParityError(f"{name} must be at least 1, got {value}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.eog = frozenset(tokenizer.eog_ids)
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.prefill_chunk = prefill_chunk
        self.metrics = metrics or SchedulerMetrics()
        self._wake = threading.Condition()
        self._inbox: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps = 0

    # --- the consumers' side (any thread) -----------------------------------------------------------------
    @property
    def n_waiting(self) -> int:
        return len(self.waiting) + len(self._inbox)

    @property
    def n_running(self) -> int:
        return len(self.running)

    def submit(self, req: Request) -> None:
        """Queue ``req``; raises :class:`QueueFull` or :class:`ShuttingDown` instead of queueing beyond bounds."""
        with self._wake:
            if self._stop:
                raise ShuttingDown("the server is shutting down")
            if len(self.waiting) + len(self._inbox) >= self.max_queue:
                raise QueueFull(f"{self.max_queue} requests are already waiting; retry later")
            self._inbox.append(req)
            self._wake.notify()

    def cancel(self, req: Request) -> None:
        """The consumer is gone: free the request's slot and blocks at the next step boundary (idempotent)."""
        if not req.done:
            req.cancelled = True
            with self._wake:
                self._wake.notify()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current step; every request still queued or running gets a 503."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the scheduler thread -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._stop:
                    break
                if not (self._inbox or self.waiting or self.running):
                    self._wake.wait()
                    continue
            try:
                worked = self._step()
            except Exception:
                log.exception("scheduler step failed")
                for req in list(self.running):
                    self._finish(req, Failed(500, "internal error while generating; see the server log"))
                worked = True
            if not worked:
                with self._wake:  # only waiting requests that do not fit yet: wait for a change
                    if not self._stop and not self._inbox:
                        self._wake.wait(0.05)
        for req in list(self.running) + list(self.waiting) + self._take_inbox():
            self._finish(req, Failed(503, "the server is shutting down", "service_unavailable"))

    def _take_inbox(self) -> list[Request]:
        with self._wake:
            new, self._inbox = self._inbox, []
        return new

    def _step(self) -> bool:
        """One scheduling step; False when nothing could run (requests wait for blocks)."""
        self.waiting.extend(self._take_inbox())
        self._drop_cancelled_and_expired()
        self._admit()
        segments, owners = self._build_batch()
        if not segments:
            return False
        logits = self.runner.step(segments)
        self.steps += 1
        self.metrics.on_step(sum(n for _, n, _ in segments), sum(n for s, n, _ in segments if n > 1))
        for req, rows in zip(owners, logits):
            if req.cancelled:
                continue
            self._after_forward(req, rows)
        return True

    def _drop_cancelled_and_expired(self) -> None:
        now = time.monotonic()
        for req in [r for r in self.running if r.cancelled]:
            self._finish(req, None)
        kept: deque[Request] = deque()
        for req in self.waiting:
            if req.cancelled:
                self._finish(req, None)
            elif now - req.arrival > self.queue_timeout_s:
                self._finish(req, Failed(503, f"no KV-cache room within {self.queue_timeout_s:g} s; retry later",
                                         "service_unavailable"))
            else:
                kept.append(req)
        self.waiting = kept

    def _admit(self) -> None:
        pool = self.runner.pool
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            try:
                n_positions = len(req.prompt_ids) + req.params.max_tokens
                # prompt log-probabilities need every prompt row computed: no prefix reuse for those
                req.seq = pool.allocate(req.prompt_ids, n_positions, reuse=not req.params.prompt_logprobs)
            except PoolExhausted:
                return  # first come, first served: later requests do not overtake it
            self.waiting.popleft()
            p = req.params
            req.sampler = Sampler(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed)
            req.text = TextAssembler(self.tokenizer.stream_decoder(), p.stop)
            self.running.append(req)
            self.metrics.on_admitted(req, req.seq.n_cached)
            req.sink(Admitted(len(req.prompt_ids), req.seq.n_cached))

    def _build_batch(self):
        segments, owners = [], []
        for req in self.running:
            if req.seq.n_tokens - req.seq.n_computed == 1:  # decoding: the last sampled token (or a prompt's tail)
                segments.append((req.seq, 1, req.params.prompt_logprobs and not req.generated))
                owners.append(req)
        # chunking keeps running streams flowing; with none decoding, a prompt goes in llama.cpp-sized batches
        budget = self.prefill_chunk if segments else max(self.prefill_chunk, IDLE_PREFILL_CHUNK)
        for req in self.running:
            todo = req.seq.n_tokens - req.seq.n_computed
            if todo > 1 and budget > 0:
                n = min(todo, budget)
                budget -= n
                segments.append((req.seq, n, req.params.prompt_logprobs))
                owners.append(req)
        return segments, owners

    def _after_forward(self, req: Request, rows: np.ndarray) -> None:
        seq = req.seq
        if req.params.prompt_logprobs and not req.generated:
            self._collect_prompt_logprobs(req, rows)
        if seq.n_computed < seq.n_tokens:
            return  # still prefilling
        logits = rows[-1]
        token = req.sampler(_biased(logits, req.params.logit_bias))
        now = time.monotonic()
        first = req.first_token_at is None
        self.metrics.on_token(req, first, 0.0 if first else now - req.last_token_at)
        if first:
            req.first_token_at = now
        req.last_token_at = now
        req.generated.append(token)
        seq.tokens.append(token)
        lp = [token_logprobs(logits, token, req.params.logprobs)] if req.params.logprobs is not None else []
        eog = token in self.eog
        text = "" if eog else req.text.feed(token)
        reason = None
        if eog or req.text.stopped:
            reason = "stop"
        elif len(req.generated) >= req.params.max_tokens or seq.n_tokens >= self.runner.n_ctx:
            reason = "length"
        if reason is not None:
            text += req.text.finish()
        prompt_lp = None
        if req.params.prompt_logprobs and len(req.generated) == 1:
            prompt_lp = req.prompt_logprobs
        req.unsent.append(token)
        if text or lp or prompt_lp is not None or reason is not None:
            req.sink(Delta(text, req.unsent, lp, prompt_lp))  # ids whose text was held back ride along
            req.unsent = []
        if reason is not None:
            self._finish(req, Finished(reason, len(req.prompt_ids), len(req.generated), seq.n_cached))

    def _collect_prompt_logprobs(self, req: Request, rows: np.ndarray) -> None:
        """Rows of a prompt chunk: row ``i`` (position ``p``) predicts the prompt token at ``p + 1``."""
        prompt = req.prompt_ids
        if not req.prompt_logprobs:
            req.prompt_logprobs.append(TokenLogprob(prompt[0], None, []))
        end = req.seq.n_computed  # positions computed so far; these rows are the last len(rows) of them
        k = req.params.logprobs or 0
        for i, p in enumerate(range(end - len(rows), end)):
            if p + 1 < len(prompt):
                req.prompt_logprobs.append(token_logprobs(rows[i], prompt[p + 1], k))

    def _finish(self, req: Request, event: Event | None) -> None:
        """Take ``req`` out (running or waiting), give its blocks back, tell its consumer (unless it left)."""
        if req.done:
            return
        req.done = True
        if req.seq is not None:
            self.runner.pool.release(req.seq)
        if req in self.running:
            self.running.remove(req)
        reason = event.reason if isinstance(event, Finished) else ("cancelled" if event is None else "failed")
        self.metrics.on_finished(req, reason)
        if event is not None:
            try:
                req.sink(event)
            except Exception:  # noqa: BLE001  (a consumer that cannot take it any more has gone)
                log.debug("could not deliver the end of request %s", req.id)


def _biased(logits: np.ndarray, bias: dict[int, float] | None) -> np.ndarray:
    """``logits`` with the request's logit_bias added (a copy; the unbiased row still gives the log-probabilities)."""
    if not bias:
        return logits
    out = np.array(logits, dtype=np.float32, copy=True)
    ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
    out[ids] += np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
    return out
