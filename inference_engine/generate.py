"""The one generation loop over any engine (:func:`generate_step`), and text generation built on it (:func:`generate`).

:func:`generate_step` is mlx-lm's ``generate_step`` for our Engine protocol: it prefills the prompt in chunks of
``n_batch`` rows (:data:`PREFILL_CHUNK` unless given; None: all at once) and then yields ``(token, logits)`` one step
at a time, the token picked by the sampler from the logits of the position before it; the next step decodes that
token. It ends when the sampler returns ``None`` (a :class:`ForcedTokens` sampler that has run out: llama-bench's
``tg`` decodes given tokens this way) or when the context is full; the caller stops it whenever it likes
(end-of-generation, a token budget). ``generate`` (CLI ``generate``), the benchmark's decode timing
(``bench_compare.measure``), cold start (``bench_compare.cold_start``), the greedy smoke test (``validation.smoke``),
compare's cost probe (``bench_compare.compare_run``) and the server build on it.

:func:`generate`:

Stops at any end-of-generation id (the tokenizer's ``eog_ids``: EOS, EOT, ``<end_of_turn>``...), after
``max_tokens`` tokens, or when the context is full. Timings follow llama.cpp's conventions: time to first token
(TTFT) covers the prefill and picking the first token; decode speed is the tokens produced by single-token decode
steps divided by the time spent in those steps (sampling excluded, as llama.cpp's eval time; the first token comes
from the prefill, so ``n - 1`` decode steps for ``n`` tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.sampling import Sampler, greedy

# Prompt rows per forward pass: llama.cpp's default n_ubatch (what llama-cli, llama-server and llama-bench compute a
# prompt in). A longer prompt in one pass grows every activation with it (the 1.5B's FFN at 1,536 rows: 55 MB, past
# glibc's 32 MiB mmap threshold, so mapped and faulted in again at every layer; its attention scores with the square
# of the prompt): measured 2026-11-27 (AMD EPYC Zen 4, AVX-512, 2 threads, numba, ggml), a 1,536-token prompt on
# qwen2.5-coder-1.5b prefilled at 217-240 t/s in one pass with 41,000-43,000 page faults, 257-261 t/s in chunks of
# 512 with none.
PREFILL_CHUNK = 512


@dataclass
class StepTimings:
    """Filled by :func:`generate_step` when passed in: seconds in prefill and in decode calls (sampling excluded,
    as llama.cpp's eval time), and the number of decode calls."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0


class ForcedTokens:
    """A "sampler" that ignores the logits and returns the given tokens in order, then ``None`` (which ends
    :func:`generate_step`): decoding given tokens, as llama-bench's ``tg`` test and the smoke test's lockstep do."""

    def __init__(self, tokens: Iterable[int]):
        self._tokens = iter(tokens)

    def __call__(self, logits) -> int | None:
        return next(self._tokens, None)


def prefill_chunked(engine, ids: Sequence[int], n_batch: int | None = None) -> np.ndarray | None:
    """Feed ``ids`` in chunks of at most ``n_batch`` (all at once if None); the last chunk's logits (None if no ids)."""
    logits = None
    step = n_batch or max(len(ids), 1)
    for start in range(0, len(ids), step):
        logits = engine.prefill(list(ids[start : start + step]))
    return logits


def generate_step(
    engine,
    prompt_ids: Sequence[int],
    sampler: Callable[[np.ndarray | None], int | None] | None = None,
    *,
    n_batch: int | None = PREFILL_CHUNK,
    reset: bool = True,
    n_past: int = 0,
    timings: StepTimings | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[tuple[int, np.ndarray | None]]:
    """Prefill ``prompt_ids`` then yield ``(token, logits)`` one step at a time (see the module docstring).

    ``reset=False`` continues on the engine's cache, which already holds ``n_past`` positions (a benchmark's depth).
    ``sampler`` defaults to greedy. ``logits`` is None only for a first step with no prompt (a forced token).
    """
    sampler = sampler or greedy
    if reset:
        engine.reset()
        n_past = 0
    steps = engine.async_steps() if hasattr(engine, "async_steps") else None
    if steps is not None and (isinstance(sampler, ForcedTokens) or (_is_greedy(sampler) and len(prompt_ids))):
        yield from _launched_steps(engine, steps, prompt_ids, sampler, n_batch, n_past, timings, clock)
        return
    t0 = clock()
    logits = prefill_chunked(engine, prompt_ids, n_batch)
    if timings is not None:
        timings.prefill_s += clock() - t0
    position = n_past + len(prompt_ids)  # where the next token goes in the cache
    while True:
        token = sampler(logits)
        if token is None or position >= engine.n_ctx:
            return  # out of forced tokens, or no room in the context for this token
        token = int(token)
        yield token, logits
        # decoded only when the caller asks for the next step (a caller that stops pays for no extra decode)
        t0 = clock()
        logits = engine.decode(token)
        if timings is not None:
            timings.decode_s += clock() - t0
            timings.decode_steps += 1
        position += 1


def _is_greedy(sampler) -> bool:
    return sampler is greedy or (isinstance(sampler, Sampler) and sampler.greedy)


def _launched_steps(engine, steps, prompt_ids, sampler, n_batch, n_past, timings, clock):
    """:func:`generate_step` over an engine's :meth:`~inference_engine.engine.OurEngine.async_steps`, for greedy or
    forced tokens: the same tokens, logits, timings and cache state, with the device kept busy. The prompt's chunks
    are launched one after the other and the first token read from the last; from then on each step is launched
    before the one before it is read: the next forced token, or (greedy) the pending step's pick on the device,
    unread (mlx-lm's ``generate_step``). The first token has nothing launched behind it (a caller that takes one
    token pays for no extra step); a caller that stops later leaves one step launched, which the cache forgets."""
    forced = isinstance(sampler, ForcedTokens)
    t0 = clock()
    pending = None
    size = n_batch or max(len(prompt_ids), 1)
    for start in range(0, len(prompt_ids), size):
        pending = steps.prefill(list(prompt_ids[start : start + size]))
    logits = pending.logits() if pending is not None else None  # waits for the prompt
    token = sampler(logits) if forced else pending.token()
    if timings is not None:
        timings.prefill_s += clock() - t0
    position = n_past + len(prompt_ids)  # where the token yielded next goes in the cache
    if token is None or position >= engine.n_ctx:
        return
    yield int(token), logits
    t0 = clock()
    current = steps.decode(int(token))  # the step holding the next token's logits, launched
    position += 1
    while True:
        token = sampler(None) if forced else current  # forced: known now; greedy: the launched step's pick
        if token is None or position >= engine.n_ctx:
            current.wait()  # the last step decoded counts, as in the plain loop
            _count_decode(timings, clock() - t0)
            return
        launched = steps.decode(token)  # before ``current`` is read: the device has the next step queued
        if not forced:
            token = current.token()
        logits = current.logits()
        _count_decode(timings, clock() - t0)
        stopped = True
        try:
            yield int(token), logits
            stopped = False
        finally:
            if stopped:  # the caller took this token and no more: forget the step launched for it
                steps.rewind(position)
        t0 = clock()
        current, position = launched, position + 1


def _count_decode(timings: StepTimings | None, seconds: float) -> None:
    if timings is not None:
        timings.decode_s += seconds
        timings.decode_steps += 1


@dataclass
class GenerationResult:
    prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)  # generated ids, an end-of-generation id included
    text: str = ""
    stop_reason: str = ""  # "eog", "max_tokens" or "context"
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0

    @property
    def n_generated(self) -> int:
        return len(self.token_ids)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")

    def timings_line(self) -> str:
        return (
            f"prompt tokens: {self.prompt_tokens} | TTFT: {self.ttft_s * 1e3:.1f} ms | "
            f"decode: {self.decode_tokens_per_s:.2f} tokens/s ({self.decode_steps} steps) | "
            f"generated: {self.n_generated} | stop: {self.stop_reason}"
        )

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.n_generated,
            "stop_reason": self.stop_reason,
            "ttft_ms": self.ttft_s * 1e3,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "decode_steps": self.decode_steps,
        }


def generate(
    engine,
    prompt_ids: list[int],
    max_tokens: int,
    sampler: Sampler | None = None,
    eog_ids: Iterable[int] = (),
    on_text: Callable[[str], None] | None = None,
    stream_decoder=None,
) -> GenerationResult:
    """Generate up to ``max_tokens`` tokens after ``prompt_ids`` on a fresh cache of ``engine``.

    ``stream_decoder`` (``tokenizer.stream_decoder()``) turns ids into complete UTF-8 text as they come; each piece
    goes to ``on_text``. Without one, ``text`` is filled by ``engine.detokenize`` at the end.
    """
    if max_tokens < 1:
        raise GGUFParityError(f"--max-tokens must be at least 1, got {max_tokens}")
    sampler = sampler or Sampler()
    eog = frozenset(int(i) for i in eog_ids)
    result = GenerationResult(prompt_tokens=len(prompt_ids))
    pieces: list[str] = []

    def emit(token_id: int) -> None:
        if stream_decoder is not None and token_id not in eog:
            piece = stream_decoder.feed(token_id)
            if piece:
                pieces.append(piece)
                if on_text:
                    on_text(piece)

    timings = StepTimings()
    start = time.perf_counter()
    result.stop_reason = "context"  # unless the loop below ends otherwise
    for token, _ in generate_step(engine, prompt_ids, sampler, timings=timings):
        if not result.token_ids:
            result.ttft_s = time.perf_counter() - start
        result.token_ids.append(token)
        emit(token)
        if token in eog:
            result.stop_reason = "eog"
            break
        if result.n_generated >= max_tokens:
            result.stop_reason = "max_tokens"
            break
    result.decode_s, result.decode_steps = timings.decode_s, timings.decode_steps

    if stream_decoder is not None:
        tail = stream_decoder.flush()
        if tail:
            pieces.append(tail)
            if on_text:
                on_text(tail)
        result.text = "".join(pieces)
    else:
        result.text = engine.detokenize([t for t in result.token_ids if t not in eog])
    return result
