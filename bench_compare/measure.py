"""What one benchmark sample is, for any engine behind the Engine protocol.

The tests follow llama-bench (tools/llama-bench/llama-bench.cpp in the vendored llama.cpp):

* ``pp N``   one prefill of N random tokens on a fresh KV cache, fed in chunks of ``n_batch``; t/s = N / time.
* ``tg N``   N single-token decode steps; t/s = N / time.
* ``@ dD``   before the timed part, D random tokens are prefilled *untimed* (llama-bench's ``-d``).
* ``pp N+tg M`` (``-pg``) prefill then generate, timed together; t/s = (N + M) / time.
* ``ttft hot``  weights loaded and warm, fresh KV cache: from the tokenized prompt to the first greedy token
  (prefill + argmax), in milliseconds.

Every test is warmed up once, then repeated (``reps`` times, or with ``until`` more rounds up to ``max_reps``
until the caller's precision target is met); the :class:`Runner` can interleave several engines per repetition
(A, B, A, B, ...) so that machine drift hits all of them alike, with an optional untimed pause at each switch
(an engine's idle worker threads may still spin: NumPy's OpenBLAS burns ~30 ms of CPU after a call here).
The clock is injected (``timing.Clock``) so the arithmetic is tested with a fake clock. Results accumulate as
they are measured, so a run interrupted with Ctrl-C still has everything finished before the interrupt.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from bench_compare import timing
from bench_compare.timing import NS_PER_MS, Clock, Stats, summarize, tokens_per_second
from bench_compare.workload import (  # noqa: F401  (re-exported: the harness reads them from here)
    DEFAULT_SEED,
    DEPTH_STREAM,
    KIND_PEAK_RSS,
    KIND_PG,
    KIND_PP,
    KIND_TG,
    KIND_TTFT_COLD,
    KIND_TTFT_HOT,
    NORMAL_TOKEN_TYPE,
    TestSpec,
    TestTokens,
    draw_tokens,
    llama_bench_test_name,
    normal_token_ids,
    pg_test,
    pp_test,
    tg_test,
    token_ids_for_model,
    ttft_hot_test,
)
from inference_engine.errors import GGUFParityError
from inference_engine.generate import ForcedTokens, generate_step, prefill_chunked
from inference_engine.protocol import Engine
from inference_engine.sampling import greedy

DEFAULT_N_BATCH = 512  # llama-bench's n_ubatch: the chunk size llama.cpp actually computes a prefill in
# --- one sample -------------------------------------------------------------------------------------------------
@dataclass
class DepthFill:
    """The depth tokens one engine's KV cache holds at positions ``0..len(tokens)-1``, so that a depth is prefilled
    once per engine and depth instead of once per sample (a 16384-token depth takes minutes to prefill on a CPU).

    Before a sample at depth, :meth:`prepare` rewinds the cache to the longest prefix it shares with the sample's
    depth tokens (``engine.rewind``, the protocol's optional method: exact, the cache then holds what a fresh
    prefill of that prefix leaves) and prefills the rest, untimed; an engine without ``rewind``, or one that refuses
    it, is reset and prefilled in full, as llama-bench does before every repetition."""

    tokens: list[int] = field(default_factory=list)
    rewinds: int = 0
    full_fills: int = 0

    def prepare(self, engine: Engine, depth: list[int], n_batch: int) -> None:
        keep = 0
        for a, b in zip(self.tokens, depth):
            if a != b:
                break
            keep += 1
        rewind = getattr(engine, "rewind", None)
        self.tokens = []  # until the cache holds ``depth`` (an interrupted prefill leaves nothing to trust)
        if keep and callable(rewind) and rewind(keep):
            self.rewinds += 1
        else:
            keep = 0
            engine.reset()
            self.full_fills += 1 if depth else 0
        prefill_chunked(engine, depth[keep:], n_batch)  # untimed
        self.tokens = list(depth)


def run_sample(
    engine: Engine,
    test: TestSpec,
    tokens: TestTokens,
    clock: Clock | None = None,
    n_batch: int = DEFAULT_N_BATCH,
    fill: DepthFill | None = None,
) -> int:
    """One timed repetition of ``test`` on ``engine``; returns nanoseconds. Cache reset and depth are untimed (with
    ``fill``, the depth the engine's cache already holds is kept rather than prefilled again)."""
    clock = clock or timing.DEFAULT_CLOCK
    if fill is not None:
        fill.prepare(engine, tokens.depth, n_batch)
    else:
        engine.reset()
        if tokens.depth:
            prefill_chunked(engine, tokens.depth, n_batch)  # untimed
    if test.kind == KIND_TTFT_HOT:
        start = clock()
        next(generate_step(engine, tokens.prompt, greedy, n_batch=n_batch, reset=False, n_past=len(tokens.depth)))
        return clock() - start  # the prefill and the first greedy token
    start = clock()
    # llama-bench's pp / tg / pg: the prompt in chunks, then each given token decoded (forced, not sampled)
    for _ in generate_step(engine, tokens.prompt, ForcedTokens(tokens.gen), n_batch=n_batch, reset=False,
                           n_past=len(tokens.depth)):
        pass
    return clock() - start


def warmup_tokens(test: TestSpec, tokens: TestTokens) -> TestTokens:
    """llama-bench warms up with the full prompt and a single generated token."""
    return TestTokens(tokens.depth, tokens.prompt, tokens.gen[:1])


# --- results ----------------------------------------------------------------------------------------------------
@dataclass
class Measurement:
    """The samples of one test on one engine (``samples_ns`` grows as repetitions finish)."""

    test: TestSpec
    engine: str
    samples_ns: list[int] = field(default_factory=list)
    reps_planned: int = 0
    timing: str | None = None  # how a generate-only engine's samples were timed (bench_compare.generate_timing)

    @property
    def complete(self) -> bool:
        return len(self.samples_ns) >= self.reps_planned

    @property
    def samples_ts(self) -> list[float]:
        return [tokens_per_second(self.test.n_tokens, ns) for ns in self.samples_ns]

    @property
    def samples_ms(self) -> list[float]:
        return [ns / NS_PER_MS for ns in self.samples_ns]

    @property
    def unit(self) -> str:
        return "t/s" if self.test.is_throughput else "ms"

    @property
    def samples(self) -> list[float]:
        """Samples in :attr:`unit` (t/s for throughput tests, ms for latencies)."""
        return self.samples_ts if self.test.is_throughput else self.samples_ms

    @property
    def higher_is_better(self) -> bool:
        return self.test.is_throughput

    def stats(self) -> Stats:
        return summarize(self.samples)

    def stats_ns(self) -> Stats:
        return summarize(self.samples_ns)


ProgressCallback = Callable[[str, TestSpec, str], None]  # (engine label, test, "warmup" | "sample")


class Runner:
    """Runs tests on one or more engines: per test, a warm-up on each engine, then ``reps`` rounds in which each
    engine runs once, in the given order (A, B, A, B, ...).

    ``measurements`` fills in as samples finish, so after a ``KeyboardInterrupt`` it holds what was measured.
    """

    def __init__(
        self,
        engines: dict[str, Engine],
        allowed_ids: np.ndarray,
        *,
        reps: int,
        clock: Clock | None = None,
        n_batch: int = DEFAULT_N_BATCH,
        seed: int = DEFAULT_SEED,
        warmup: bool = True,
        on_progress: ProgressCallback | None = None,
        pause_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        draw: Callable[[TestSpec], TestTokens] | None = None,
        until: Callable[[list[Measurement]], bool] | None = None,
        max_reps: int | None = None,
    ):
        if reps < 1:
            raise GGUFParityError(f"repetitions must be at least 1 (got {reps})")
        if max_reps is not None and max_reps < reps:
            raise GGUFParityError(f"the most repetitions ({max_reps}) must be at least -r ({reps})")
        if n_batch < 1:
            raise GGUFParityError(f"batch size must be at least 1 (got {n_batch})")
        self.engines = engines
        self.allowed_ids = allowed_ids
        self.reps = reps
        self.clock = clock or timing.DEFAULT_CLOCK  # looked up at run time, so tests can swap the module's clock
        self.n_batch = n_batch
        self.seed = seed
        self.warmup = warmup
        self.on_progress = on_progress
        self.pause_s = pause_s
        self.sleep = sleep
        # the tokens of a test (default: llama-bench's random ids; generate_timing.text_safe_draw for text engines)
        self.draw = draw or (lambda test: draw_tokens(test, self.allowed_ids, self.seed))
        # adaptive repetitions: after ``reps`` rounds, more rounds (up to ``max_reps``) until ``until(this test's
        # measurements)`` says the result is precise enough
        self.until = until
        self.max_reps = max_reps if max_reps is not None else reps
        self.measurements: list[Measurement] = []
        self.fills: dict[str, DepthFill] = {}  # per engine: the depth its cache holds (kept between samples)
        self._last_engine: str | None = None

    def check_fits(self, test: TestSpec) -> None:
        for label, engine in self.engines.items():
            if test.n_ctx_needed > engine.n_ctx:
                raise GGUFParityError(
                    f"test {test.name} needs {test.n_ctx_needed} tokens of context (depth {test.n_depth} + prompt "
                    f"{test.n_prompt} + gen {test.n_gen}) but {label} has a context of {engine.n_ctx}"
                )

    def run(self, test: TestSpec, tokens: TestTokens | None = None) -> list[Measurement]:
        """Measure ``test`` on every engine; returns this test's measurements (also kept in ``measurements``)."""
        self.check_fits(test)
        if tokens is None:
            tokens = self.draw(test)
        current = [Measurement(test, label, reps_planned=self.reps) for label in self.engines]
        self.measurements.extend(current)
        if self.warmup:
            for m, (label, engine) in zip(current, self.engines.items()):
                self._switch_to(label)
                self._sample(m, engine, test, warmup_tokens(test, tokens))
                self._progress(label, test, "warmup")
        done = 0
        while done < self.reps or (self.until is not None and done < self.max_reps and not self.until(current)):
            for m in current:
                m.reps_planned = max(m.reps_planned, done + 1)  # an extra round is planned before it starts
            for m, (label, engine) in zip(current, self.engines.items()):
                self._switch_to(label)
                m.samples_ns.append(self._sample(m, engine, test, tokens))
                self._progress(label, test, "sample")
            done += 1
        return current

    def _sample(self, m: Measurement, engine: Engine, test: TestSpec, tokens: TestTokens) -> int:
        """One sample: prefill / decode calls, or requests for an engine that only generates (recorded in ``m``)."""
        from bench_compare import generate_timing

        if generate_timing.generate_only(engine):
            ns, m.timing = generate_timing.run_generate_sample(engine, test, tokens, self.clock)
            return ns
        fill = self.fills.setdefault(m.engine, DepthFill())
        return run_sample(engine, test, tokens, self.clock, self.n_batch, fill)

    def _switch_to(self, label: str) -> None:
        """Pause (untimed) when another engine ran last, so its idle worker threads stop spinning first."""
        if self.pause_s > 0 and self._last_engine is not None and self._last_engine != label:
            self.sleep(self.pause_s)
        self._last_engine = label

    def run_all(self, tests: Iterable[TestSpec]) -> list[Measurement]:
        for test in tests:
            self.run(test)
        return self.measurements

    def _progress(self, label: str, test: TestSpec, what: str) -> None:
        if self.on_progress is not None:
            self.on_progress(label, test, what)


def ttft_prompt_tokens(engine: Engine, prompt: str) -> list[int]:
    """The hot-TTFT prompt as this engine tokenizes it (with BOS, as a chat front end would)."""
    ids = engine.tokenize(prompt, add_bos=True)
    if not ids:
        raise GGUFParityError("the TTFT prompt tokenizes to nothing; give a non-empty --prompt")
    return list(ids)


def measure_ttft_hot(runner: Runner, prompt: str) -> list[Measurement]:
    """Hot TTFT on every engine of ``runner``: each engine gets its own tokenization of ``prompt``.

    The engines should tokenize alike (tokenizer parity is validated elsewhere); when they do, they run the same
    ids interleaved. When they do not, each runs its own ids (one engine after the other) and the token count of
    each is recorded in its test (``n_prompt``), so the difference is visible rather than hidden.
    """
    per_engine = {label: ttft_prompt_tokens(engine, prompt) for label, engine in runner.engines.items()}
    distinct = {tuple(ids) for ids in per_engine.values()}
    if len(distinct) == 1:
        ids = next(iter(per_engine.values()))
        test = ttft_hot_test(len(ids))
        return runner.run(test, TestTokens([], ids, []))
    results = []
    all_engines = runner.engines
    try:
        for label, engine in all_engines.items():
            runner.engines = {label: engine}
            ids = per_engine[label]
            results += runner.run(ttft_hot_test(len(ids)), TestTokens([], ids, []))
    finally:
        runner.engines = all_engines
    return results


DEFAULT_TTFT_PROMPT = (
    "You are a helpful assistant. Read the following note and answer briefly.\n"
    "The river town kept its old stone bridge, although the new road crossed the valley two miles upstream. "
    "Every spring the water rose to the second arch, and every summer the children counted the swallows that "
    "nested under it. The council had argued for years about whether to repair the bridge or let it fall, and "
    "in the end the decision was made by a storm that took the third arch away one night in October.\n"
    "Question: what decided the fate of the bridge?\nAnswer:"
)
