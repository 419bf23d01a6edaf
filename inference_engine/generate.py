"""Generation loop over any engine: prefill the prompt, then decode one token at a time, streaming text.

Stops at any end-of-generation id (the tokenizer's ``eog_ids``: EOS, EOT, ``<end_of_turn>``...), after
``max_tokens`` tokens, or when the context is full. Timings follow llama.cpp's conventions: time to first token
(TTFT) covers the prefill and picking the first token; decode speed is the tokens produced by single-token decode
steps divided by the time spent in those steps (sampling excluded, as llama.cpp's eval time; the first token comes
from the prefill, so ``n - 1`` decode steps for ``n`` tokens).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from inference_engine.errors import GGUFParityError
from inference_engine.sampling import Sampler


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

    engine.reset()
    start = time.perf_counter()
    logits = engine.prefill(list(prompt_ids))
    token = sampler(logits)
    result.ttft_s = time.perf_counter() - start
    result.token_ids.append(token)
    emit(token)

    while True:
        if token in eog:
            result.stop_reason = "eog"
            break
        if result.n_generated >= max_tokens:
            result.stop_reason = "max_tokens"
            break
        if len(prompt_ids) + result.n_generated >= engine.n_ctx:
            result.stop_reason = "context"
            break
        step_start = time.perf_counter()
        logits = engine.decode(token)
        result.decode_s += time.perf_counter() - step_start
        result.decode_steps += 1
        token = sampler(logits)
        result.token_ids.append(token)
        emit(token)

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
