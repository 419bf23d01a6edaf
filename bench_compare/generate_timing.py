"""Timing an engine that only generates: ``generate(ids, n_tokens)`` and no ``prefill`` / ``decode`` (a
:class:`~inference_engine.protocol.GeneratingEngine` without the ``logits`` capability, e.g. ``mistralrs:``).

llama-bench's tests (:mod:`bench_compare.measure`) drive prefill and decode calls; such an engine only answers whole
requests. So each test becomes a request, and every sample records whether its time is the engine's own clock or
the harness's wall clock (``Measurement.timing``, kept in the result as ``extra.timing``):

* ``pp N``: a request of the N-token prompt for one token. The engine's own prompt time (``timings.prompt_s``: its
  prompt step, which also picks the first token) when it reports timings, else the wall clock around the call.
* ``tg N`` (``@ dD``): a request generating N + 1 tokens after a D-token prompt (at d0 a one-word prompt,
  :data:`TG_LEAD_TEXT`: a request needs one). Its first token comes from the prompt step, the other N from N decode
  steps, which is what ``timings.generation_s`` covers; without timings, the wall clock of that request minus the
  wall clock of a one-token request of the same prompt made just before it (untimed otherwise).
* ``pp N+tg M``: a request of M + 1 tokens; the engine's prompt plus generation time, else the wall clock.
* ``ttft hot``: the wall clock around a one-token request (the first token is the whole request).
* ``pp N @ dD`` is refused in one line: the depth would have to be in the cache untimed, and a request-only engine
  starts every request from its prompt.

Prompts: llama-bench's random token ids rarely survive detokenize -> tokenize (neighbouring pieces merge), and an
engine that takes text (mistral.rs's Python API) must be sent text that tokenizes back to the ids. So in a run with
such an engine, prompts (and depths) are random *words* of the exact token count under the model's own tokenizer
(:class:`~bench_compare.adapters.http_bench.PromptMaker`, as the HTTP benchmark uses), the same ids for every engine;
generated tokens stay llama-bench's random ids (llama.cpp is fed them, the generating engine picks its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from bench_compare.timing import NS_PER_S, Clock
from bench_compare.workload import (
    DEFAULT_SEED,
    KIND_PG,
    KIND_PP,
    KIND_TG,
    KIND_TTFT_HOT,
    TestSpec,
    TestTokens,
    draw_tokens,
)
from inference_engine.errors import GGUFParityError
from inference_engine.protocol import EngineCapabilityError, engine_capabilities

# The prompt of a tg test at depth 0 on a generating engine (a request must have one): one common word, with BOS
# where the model adds one.
TG_LEAD_TEXT = "The"

# How each sample was timed, by (test kind, engine reports timings): what the results say.
ENGINE_PROMPT = "engine's own prompt time (its prompt step, first token included)"
ENGINE_GENERATION = "engine's own generation time (the N decode steps after the first token)"
ENGINE_PROMPT_GENERATION = "engine's own prompt + generation time"
WALL_REQUEST = "wall clock around the request"
WALL_MINUS_FIRST = "wall clock of an (N+1)-token request minus that of a 1-token request of the same prompt"
TIMING_SOURCES: dict[tuple[str, bool], str] = {
    (KIND_PP, True): ENGINE_PROMPT, (KIND_PP, False): WALL_REQUEST + " (1 token)",
    (KIND_TG, True): ENGINE_GENERATION, (KIND_TG, False): WALL_MINUS_FIRST,
    (KIND_PG, True): ENGINE_PROMPT_GENERATION, (KIND_PG, False): WALL_REQUEST,
    (KIND_TTFT_HOT, True): WALL_REQUEST + " (1 token)", (KIND_TTFT_HOT, False): WALL_REQUEST + " (1 token)",
}


def generate_only(engine: Any) -> bool:
    """An engine that generates text but hands out no logits: timed by requests (this module)."""
    caps = engine_capabilities(engine)
    return "text" in caps and "logits" not in caps


def any_generate_only(engines: Iterable[Any]) -> bool:
    return any(generate_only(e) for e in engines)


def reports_timings(engine: Any) -> bool:
    return "timings" in engine_capabilities(engine)


def check_test(test: TestSpec, engine_name: str = "this engine") -> None:
    """One line for a test a request-only engine cannot run."""
    if test.kind == KIND_PP and test.n_depth > 0:
        raise GGUFParityError(f"{test.name}: {engine_name} only generates, so it cannot hold {test.n_depth} tokens "
                              "of depth in its cache untimed before a timed prompt; use -d 0 for pp tests (tg @ "
                              "depth works)")
    if test.kind not in (KIND_PP, KIND_TG, KIND_PG, KIND_TTFT_HOT):
        raise GGUFParityError(f"{test.name}: not a test a generating engine can run")


def _seconds(timings: dict | None, key: str) -> float | None:
    value = (timings or {}).get(key)
    return None if value is None else float(value)


def _lead_prompt(engine: Any, tokens: TestTokens) -> list[int]:
    """The prompt of a tg test: the depth, else :data:`TG_LEAD_TEXT` in the engine's tokenizer."""
    if tokens.depth:
        return list(tokens.depth)
    try:
        lead = list(engine.tokenize(TG_LEAD_TEXT, add_bos=True))
    except EngineCapabilityError:
        lead = []
    return lead or list(tokens.gen[:1])


def run_generate_sample(engine: Any, test: TestSpec, tokens: TestTokens, clock: Clock) -> tuple[int, str]:
    """One timed repetition of ``test`` on a generating engine: (nanoseconds, how they were measured)."""
    check_test(test, getattr(engine, "name", "this engine"))
    own = reports_timings(engine)
    n_gen = len(tokens.gen)
    if test.kind == KIND_TTFT_HOT:
        start = clock()
        engine.generate(list(tokens.prompt), 1)
        return clock() - start, TIMING_SOURCES[(KIND_TTFT_HOT, own)]
    if test.kind == KIND_PP:
        start = clock()
        out = engine.generate(list(tokens.depth) + list(tokens.prompt), 1)
        wall = clock() - start
        prompt_s = _seconds(out.get("timings"), "prompt_s") if own else None
        if prompt_s is None:
            return wall, TIMING_SOURCES[(KIND_PP, False)]
        return round(prompt_s * NS_PER_S), TIMING_SOURCES[(KIND_PP, True)]
    if test.kind == KIND_TG:
        prompt = _lead_prompt(engine, tokens)
        first_ns = 0
        if not own:
            start = clock()
            engine.generate(prompt, 1)
            first_ns = clock() - start
        start = clock()
        out = engine.generate(prompt, n_gen + 1)
        wall = clock() - start
        gen_s = _seconds(out.get("timings"), "generation_s") if own else None
        if gen_s is None:
            return max(wall - first_ns, 0), TIMING_SOURCES[(KIND_TG, False)]
        return round(gen_s * NS_PER_S), TIMING_SOURCES[(KIND_TG, True)]
    # pp N + tg M: the prompt, then M decode steps after the first token
    start = clock()
    out = engine.generate(list(tokens.depth) + list(tokens.prompt), n_gen + 1)
    wall = clock() - start
    timings = out.get("timings") if own else None
    prompt_s, gen_s = _seconds(timings, "prompt_s"), _seconds(timings, "generation_s")
    if prompt_s is None or gen_s is None:
        return wall, TIMING_SOURCES[(KIND_PG, False)]
    return round((prompt_s + gen_s) * NS_PER_S), TIMING_SOURCES[(KIND_PG, True)]


# --- prompts that survive detokenize -> tokenize --------------------------------------------------------------------
def text_safe_draw(gguf, seed: int = DEFAULT_SEED) -> Callable[[TestSpec], TestTokens]:
    """``test -> TestTokens`` for a run with a generating engine on the opened GGUF ``gguf``: depth and prompt are
    random words of exactly the test's token counts under the GGUF's own tokenizer (whose ids equal llama.cpp's; BOS
    included where the model adds one), generated tokens llama-bench's random ids. A pure function of (test sizes,
    seed, vocabulary)."""
    from bench_compare.adapters.http_bench import PromptMaker
    from bench_compare.workload import token_ids_for_model
    from inference_engine.tokenizer import GGUFTokenizer

    tokenizer = GGUFTokenizer.from_gguf(gguf)
    maker = PromptMaker(tokenizer, seed)
    allowed = token_ids_for_model(gguf, tokenizer.n_vocab)

    def words(n: int, role: str, test: TestSpec) -> list[int]:
        if n <= 0:
            return []
        text, _ = maker.make(n, f"{role}:{test.n_depth}:{test.n_prompt}:{test.n_gen}")
        ids = tokenizer.encode(text)
        if len(ids) != n:
            raise GGUFParityError(f"{test.name}: this vocabulary gave no text of exactly {n} tokens that tokenizes "
                                  f"back to itself (nearest {len(ids)}), which an engine taking text needs")
        return ids

    def draw(test: TestSpec) -> TestTokens:
        gen = draw_tokens(test, allowed, seed).gen
        return TestTokens(words(test.n_depth, "depth", test), words(test.n_prompt, "prompt", test), gen)

    return draw


# --- cold starts ----------------------------------------------------------------------------------------------------
def cold_first_token(engine: Any, ids: list[int], clock: Clock) -> tuple[int, int]:
    """A cold start's first token on a generating engine: (token id, nanoseconds of the one-token request)."""
    start = clock()
    out = engine.generate(list(ids), 1)
    return int(out["steps"][0]["token"]), clock() - start


def run_workload(engine: Any, prompt_ids: list[int], gen_ids: list[int]) -> None:
    """The peak-RSS workload of a cold start (a prompt, then as many tokens as ``gen_ids``) as one request."""
    engine.generate(list(prompt_ids), max(1, len(gen_ids)))


def workload_tokens(model: str, n_prompt: int, n_gen: int, seed: int) -> tuple[list[int], list[int]]:
    """:func:`text_safe_draw`'s tokens for the cold start's ``pp n_prompt + tg n_gen`` workload."""
    from bench_compare.workload import pg_test
    from inference_engine.gguf.file import open_gguf
    from inference_engine.store.named_models import resolve_model

    toks = text_safe_draw(open_gguf(resolve_model(model, progress=False)), seed)(pg_test(n_prompt, n_gen))
    return toks.prompt, toks.gen


def timing_notes(result: dict[str, Any]) -> list[str]:
    """One line per engine whose results carry ``extra.timing``: how each of its tests was timed."""
    by_engine: dict[str, list[str]] = {}
    for r in result.get("results", []):
        how = (r.get("extra") or {}).get("timing")
        if how:
            by_engine.setdefault(r["engine"], []).append(f"{r['test']}: {how}")
    return [f"{engine} (generates only) timed by requests: " + "; ".join(parts)
            for engine, parts in by_engine.items()]
