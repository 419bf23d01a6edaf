"""``compare``: our engine and llama.cpp on the same model, the same random tokens, interleaved.

Tests (llama-bench semantics, see :mod:`bench_compare.measure`): ``pp{P}``, ``tg{N}``, ``tg{N} @ d{D}``,
``ttft hot``, then in fresh subprocesses ``ttft cold`` and ``peak rss``. Every depth (``-d``, one or a comma list
as ``-d 4096,16384``; default 512) runs ``pp{P} @ d{D}`` and ``tg{N} @ d{D}``, as llama-bench's ``-d`` does; a depth
is prefilled once per engine and extended or rewound between samples (:class:`~bench_compare.measure.DepthFill`),
not once per sample.

Every ratio comes with a confidence interval and a verdict (faster / slower / same within noise,
:mod:`bench_compare.intervals`); ``--precision 5%`` adds paired repetitions to each hot test, up to ``--max-reps``,
until its interval is that narrow. Every repetition runs ours then llama.cpp
(A, B, A, B, ...) so that drift on a shared machine hits both, and the ratios (higher is better for ours) are the
numbers to track, never the absolute times. The cold starts run after both hot engines are closed and released, in
alternating order (A B, B A, A B, ...).

Sizes: llama-bench's defaults (``-p 512 -n 128``, and depth 512), always, unless the model's context is shorter
(then the largest that fits, with a note saying so) or the user gives ``--budget SECONDS``: then a probe measures
each engine's costs (per prefill call and token, per decode step and per token of context it attends to, per cache
reset), :func:`project_seconds` adds up exactly the work the run will do, and the largest sizes from
:data:`SIZE_LADDER` whose projection fits are used (prompt and depth shrink together, generation on its own); the
note says so. Every run records its projection next to the seconds it actually took (``settings.projected_s`` /
``settings.measured_s``), so a wrong projection shows.
``--quick`` is a fixed small preset (for CI).

Before the probe, the progress bar and the clock start, each engine runs one untimed warm-up (:func:`warm_up`): a
first run compiles our Numba kernels there (most of a minute, announced: :mod:`inference_engine.compile_notice`),
not inside a measurement, a probed cost or the progress bar's projection.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench_compare import bandwidth, cold_runner, engines, generate_timing, noise, timing
from bench_compare.intervals import RatioInterval, interval_of, precise_enough
from bench_compare.measure import (
    DEFAULT_N_BATCH,
    DEFAULT_SEED,
    DEFAULT_TTFT_PROMPT,
    KIND_PP,
    Runner,
    TestSpec,
    draw_tokens,
    measure_ttft_hot,
    pg_test,
    pp_test,
    run_sample,
    tg_test,
    token_ids_for_model,
    ttft_hot_test,
)
from bench_compare.results import (
    REFERENCE_ENGINE,
    TestResult,
    compute_intervals,
    compute_ratios,
    from_measurement,
    model_description,
    provenance,
)
from bench_compare.timing import NS_PER_S, Clock
from inference_engine import compile_notice
from inference_engine.errors import GGUFParityError
from inference_engine.generate import ForcedTokens, generate_step
from inference_engine.gguf.file import open_gguf
from inference_engine.protocol import EngineCapabilityError
from inference_engine.store.named_models import resolve_model
from validation.results import CompareResult

DEFAULT_REPS = 3
# --precision's cap on repetitions per test: a 2-core VM's ~7% spread between repetitions needs ~10 pairs for +-5%
# (t(9) = 2.26, 0.07 * 2.26 / sqrt(10) = 5%); 20 leaves room for a noisier machine without running for ever.
DEFAULT_MAX_REPS = 20
DEFAULT_COLD_REPS = 3
# No time budget by default: llama-bench's sizes are what a compare is for (about two minutes on smollm2-135m on a
# 2-core machine; minutes more on a 1.5B model). ``--budget`` asks for sizes that fit.
DEFAULT_BUDGET_S: float | None = None

# (n_prompt, n_gen, n_depth), largest first; the first is llama-bench's default -p 512 -n 128 plus -d 512.
SIZE_LADDER: tuple[tuple[int, int, int], ...] = (
    (512, 128, 512), (256, 64, 256), (128, 32, 128), (64, 16, 64), (32, 8, 32), (16, 4, 16),
)
QUICK_SIZES = (64, 16, 64)
QUICK_REPS = 2
QUICK_COLD_REPS = 1

# The probe times prefills of two sizes (separating a fixed cost per call from the cost per token; some backends
# spend most of a short prefill in per-call overhead) and decodes at two context sizes (separating the fixed cost
# of a step from the attention over the cache, which a tg @ d512 pays 512 times over). The large size is big enough
# that the per-token figure is not noise times 512: on the old 8/32-token probe a 31 s run was projected at 108 s.
# Each is measured after an untimed run of the same size (first calls compile or allocate).
PROBE_PREFILL_SMALL = 16
PROBE_PREFILL_LARGE = 128
PROBE_DECODE = 4
# Each figure is the median of this many timings: on a shared machine one timing can be 10x the next (seen here:
# three single-timing probes of the same engines projected 3073 s, 513 s and 365 s for the same run).
PROBE_REPEATS = 3
# Untimed pause whenever the runner switches engine: measured here, NumPy's OpenBLAS worker threads keep spinning
# for ~30 ms of CPU after a call (llama.cpp's ~1 ms), which would otherwise be charged to the next engine's sample
# on a 2-core machine. 0.1 s covers that with margin and adds ~3 s to a default run.
INTERLEAVE_PAUSE_S = 0.1
# Seconds a fresh interpreter needs before the engine's own imports (python start-up, site, our package).
INTERPRETER_START_S = 0.5
# The warm-up before anything is timed: a prefill of this many tokens, then this many decoded tokens. 64 tokens take
# the kernels a 512-token prompt takes (measured: SmolLM2, ggml numerics, an empty Numba cache: this warm-up compiled
# 42 kernels, and pp512, tg128, tg128 @ d512, the TTFT prompt and the probe's sizes compiled none after it), at a
# few percent of a pp512's time; 2 decoded tokens take the one-token kernels (the first decode and a later one).
WARMUP_PROMPT_TOKENS = 64
WARMUP_DECODE_STEPS = 2
# The warm-up repeats until two runs in a row agree within this fraction (a steady state: caches, page faults, the
# CPU's clock settled), at most WARMUP_MAX_RUNS times. 10%: above the ~7% spread between repetitions measured on
# this project's 2-core VMs, so a machine that is merely noisy is not warmed up for ever; a first run that compiles
# or faults in the weights takes 2x-100x longer and is caught.
WARMUP_STEADY_TOLERANCE = 0.10
WARMUP_MAX_RUNS = 5


@dataclass
class Sizes:
    n_prompt: int
    n_gen: int
    n_depth: int
    how: str = "given"  # "given" | "default" | "auto-scaled" | "quick"
    depths: tuple[int, ...] | None = None  # -d's list (None: n_depth alone)
    note: str = ""
    projected_s: float | None = None  # the probe's projection of the measured part (only with --budget)


@dataclass
class CompareConfig:
    model: str = "smollm2-135m"
    backend: str = field(default_factory=engines.default_backend)
    # ggml: what llama.cpp computes (8-bit activations into integer dot products), so both engines do the same work
    numerics: str = "ggml"
    engine: str | None = None  # an engine spec to compare instead of ours:<backend>
    engine_opts: tuple[tuple[str, str], ...] = ()
    device: str | None = None  # --device for our engine (its ``device`` option); None: the backend's default
    n_prompt: int | None = None
    n_gen: int | None = None
    n_depth: int | None = None
    # -d as a list (each depth run as pp and tg at depth); None: n_depth, or the sizes ladder's
    depths: tuple[int, ...] | None = None
    reps: int = DEFAULT_REPS
    precision: float | None = None  # --precision: relative half-width of each ratio's interval to reach
    max_reps: int = DEFAULT_MAX_REPS
    cold_reps: int = DEFAULT_COLD_REPS
    n_threads: int | None = None
    cold: bool = True
    quick: bool = False
    seed: int = DEFAULT_SEED
    prompt: str = DEFAULT_TTFT_PROMPT
    budget_s: float | None = DEFAULT_BUDGET_S
    n_batch: int = DEFAULT_N_BATCH

    def depth_given(self) -> int | None:
        """The depth the sizes ladder keeps: -d's deepest (a list is never scaled), else -d, else None."""
        if self.depths is not None:
            return max(self.depths, default=0)
        return self.n_depth

    def engine_spec(self) -> engines.EngineSpec:
        """The engine compared with llama.cpp: ``--engine`` when given, else ours on ``--backend``."""
        if self.engine:
            return engines.with_device(engines.parse_engine_spec(self.engine, self.engine_opts), self.device)
        return engines.with_device(engines.EngineSpec("ours", self.backend), self.device)

    def validate(self) -> None:
        from inference_engine.backends import BACKENDS

        engines.check_numerics(self.numerics)
        if self.backend not in BACKENDS:
            raise GGUFParityError(f"unknown backend '{self.backend}'; choose one of: {BACKENDS.listing()}")
        engines.check_device(self.engine_spec())
        for name, value, low in (("-p", self.n_prompt, 1), ("-n", self.n_gen, 1), ("-d", self.n_depth, 0)):
            if value is not None and value < low:
                raise GGUFParityError(f"{name} must be at least {low} for compare (got {value})")
        if self.reps < 1:
            raise GGUFParityError(f"-r must be at least 1 (got {self.reps})")
        if self.precision is not None and self.max_reps < max(self.reps, 2):
            raise GGUFParityError(f"--max-reps must be at least -r and at least 2 for --precision (got "
                                  f"{self.max_reps})")
        if self.depths is not None and any(d < 0 for d in self.depths):
            raise GGUFParityError(f"-d takes depths of at least 0 (got {','.join(map(str, self.depths))})")
        if self.cold and self.cold_reps < 1:
            raise GGUFParityError(f"--cold-reps must be at least 1 (got {self.cold_reps})")
        if self.n_threads is not None and self.n_threads < 1:
            raise GGUFParityError(f"-t must be at least 1 (got {self.n_threads})")
        if self.budget_s is not None and self.budget_s <= 0:
            raise GGUFParityError(f"--budget must be positive (got {self.budget_s})")
        if not self.prompt.strip():
            raise GGUFParityError("--prompt must not be empty")


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def plan_tests(sizes: Sizes) -> list[TestSpec]:
    """pp and tg at depth 0, then at-depth tests in increasing depth (each depth's cache extends the last one's)."""
    tests = [pp_test(sizes.n_prompt), tg_test(sizes.n_gen)]
    depths = sizes.depths if sizes.depths is not None else (sizes.n_depth,)
    for depth in sorted({d for d in depths if d > 0}):
        tests += [pp_test(sizes.n_prompt, depth), tg_test(sizes.n_gen, depth)]
    return tests


@dataclass
class EngineRates:
    """Costs measured by the probe, in seconds: a prefill call of n tokens costs ``prefill_call_s + n *
    prefill_token_s``; a decode step with c tokens in the cache ``decode_s + c * decode_ctx_s``; a cache reset
    ``reset_s``; a fresh process ``startup_s`` before its first token."""

    prefill_call_s: float
    prefill_token_s: float
    decode_s: float
    startup_s: float
    decode_ctx_s: float = 0.0
    reset_s: float = 0.0
    rewinds: bool = False  # the engine has ``rewind``: a depth is prefilled once, then kept between samples

    def prefill(self, n_tokens: int, n_batch: int = DEFAULT_N_BATCH) -> float:
        if n_tokens <= 0:
            return 0.0
        calls = -(-n_tokens // n_batch)
        return calls * self.prefill_call_s + n_tokens * self.prefill_token_s

    def generate(self, n_tokens: int, context: int) -> float:
        """``n_tokens`` decode steps starting with ``context`` tokens in the cache."""
        return n_tokens * self.decode_s + self.decode_ctx_s * (n_tokens * context + n_tokens * (n_tokens - 1) / 2)

    def sample(self, test: TestSpec, n_batch: int = DEFAULT_N_BATCH, depth_filled: bool = False) -> float:
        """Wall time of one :func:`bench_compare.measure.run_sample` of ``test`` (reset and depth included, unless
        ``depth_filled``: a rewind to a depth the cache already holds costs neither)."""
        fill = 0.0 if depth_filled else self.reset_s + self.prefill(test.n_depth, n_batch)
        return fill + self.prefill(test.n_prompt, n_batch) + self.generate(test.n_gen, test.n_depth + test.n_prompt)


def probe_rates(engine, allowed_ids: np.ndarray, seed: int, startup_s: float,
                clock: Clock | None = None) -> EngineRates:
    """Measure :class:`EngineRates` (each figure after an untimed run of the same size)."""
    clock = clock or timing.DEFAULT_CLOCK
    toks = draw_tokens(pg_test(PROBE_PREFILL_LARGE, PROBE_DECODE), allowed_ids, seed)

    def seconds(fn) -> float:
        t0 = clock()
        fn()
        return (clock() - t0) / NS_PER_S

    def prefill(n: int) -> float:
        engine.reset()
        return seconds(lambda: engine.prefill(toks.prompt[:n]))

    def decodes(n_past: int) -> float:
        def run() -> None:
            for _ in generate_step(engine, [], ForcedTokens(toks.gen), reset=False, n_past=n_past):
                pass  # each given token decoded, as the tg tests do

        return seconds(run) / PROBE_DECODE

    sizes = (PROBE_PREFILL_SMALL, PROBE_PREFILL_LARGE)
    for n in sizes:
        prefill(n)  # untimed: first calls of a size may compile or allocate
        decodes(n)
    # Small and large alternate, so that a change in the machine's load hits both sides of each difference.
    runs: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
    for _ in range(PROBE_REPEATS):
        for n in sizes:
            runs[n].append((prefill(n), decodes(n)))  # decodes at cache sizes n .. n + PROBE_DECODE - 1
    times = {n: float(np.median([t for t, _ in runs[n]])) for n in sizes}
    steps = {n: float(np.median([d for _, d in runs[n]])) for n in sizes}
    reset_s = float(np.median([seconds(engine.reset) for _ in range(PROBE_REPEATS)]))
    span = PROBE_PREFILL_LARGE - PROBE_PREFILL_SMALL
    per_token = max(times[PROBE_PREFILL_LARGE] - times[PROBE_PREFILL_SMALL], 0.0) / span
    per_call = max(times[PROBE_PREFILL_SMALL] - PROBE_PREFILL_SMALL * per_token, 0.0)
    per_ctx = max(steps[PROBE_PREFILL_LARGE] - steps[PROBE_PREFILL_SMALL], 0.0) / span
    mean_ctx = PROBE_PREFILL_SMALL + (PROBE_DECODE - 1) / 2
    decode_s = max(steps[PROBE_PREFILL_SMALL] - per_ctx * mean_ctx, 0.0)
    return EngineRates(per_call, per_token, decode_s, startup_s, decode_ctx_s=per_ctx, reset_s=reset_s,
                       rewinds=callable(getattr(engine, "rewind", None)))


def project_seconds(rates: list[EngineRates], sizes: tuple[int, int, int], reps: int, ttft_tokens: int,
                    cold_reps: int, n_batch: int = DEFAULT_N_BATCH, pause_s: float | None = None,
                    depths: tuple[int, ...] | None = None) -> float:
    """Projected wall time of the measured part of a compare run with ``sizes``: exactly the work the
    :class:`~bench_compare.measure.Runner` does (per test a warm-up with one generated token, then ``reps``
    samples, on each engine), the engine-switch pauses, and the cold starts. No safety factor: the projection is
    for this machine as loaded as during the probe, and the run records it next to the time it took."""
    p, n, d = sizes
    tests = plan_tests(Sizes(p, n, d, depths=depths)) + [ttft_hot_test(ttft_tokens)]
    pause_s = INTERLEAVE_PAUSE_S if pause_s is None else pause_s
    total = 0.0
    for r in rates:
        filled = 0  # the depth this engine's cache holds (DepthFill: extended, rewound, reset at depth 0)
        for test in tests:
            warmup = TestSpec(test.kind, test.n_prompt, min(test.n_gen, 1), test.n_depth)  # warmup_tokens()
            if r.rewinds and test.n_depth:
                extend = test.n_depth - filled if 0 < filled <= test.n_depth else test.n_depth
                total += (r.reset_s if extend == test.n_depth else 0.0) + r.prefill(extend, n_batch)
                total += r.sample(warmup, n_batch, True) + reps * r.sample(test, n_batch, True)
                filled = test.n_depth
                continue
            filled = 0
            total += r.sample(warmup, n_batch) + reps * r.sample(test, n_batch)
        rss = pg_test(p, n)  # the cold start's memory workload after the first token
        total += cold_reps * (INTERPRETER_START_S + r.startup_s + r.prefill(ttft_tokens, n_batch)
                              + r.sample(rss, n_batch) - r.reset_s)
    if len(rates) > 1:
        total += (len(tests) * len(rates) * (reps + 1) - 1) * pause_s
    return total


def size_candidates(ladder: tuple[tuple[int, int, int], ...]) -> list[tuple[int, int, int]]:
    """Every (prompt/depth step, gen step) combination of the ladder, largest first.

    Prompt and depth shrink together (both are prefill cost); generation shrinks on its own, so an engine with a
    slow prefill but a fast decode still gets a long ``tg`` test. Order: fewest steps down in total, then the
    longer generation first.
    """
    ranked = []
    for i, (p, _, d) in enumerate(ladder):
        for j, (_, n, _) in enumerate(ladder):
            ranked.append((i + j, j, (p, n, d)))
    ranked.sort(key=lambda r: (r[0], r[1]))
    seen, out = set(), []
    for _, _, s in ranked:
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


def context_needed(sizes: tuple[int, int, int], depths: tuple[int, ...] | None = None) -> int:
    """Positions the largest test of ``sizes`` fills: the deepest depth (``depths``, else ``sizes``') plus the prompt
    or generation run there."""
    p, n, d = sizes
    return max(d if depths is None else max(depths, default=0), 0) + max(p, n)


def fit_context(max_ctx: int, ladder: tuple[tuple[int, int, int], ...] = SIZE_LADDER,
                depths: tuple[int, ...] | None = None) -> Sizes:
    """The largest of :func:`size_candidates` whose tests fit the model's context (no time budget)."""
    top = ladder[0]
    fitting = [s for s in size_candidates(ladder) if context_needed(s, depths) <= max_ctx]
    chosen = fitting[0] if fitting else ladder[-1]
    if chosen == top:
        return Sizes(*chosen, how="default")
    return Sizes(*chosen, how="auto-scaled", note=(
        f"scaled down from -p {top[0]} -n {top[1]} -d {top[2]} to -p {chosen[0]} -n {chosen[1]} -d {chosen[2]} "
        f"to fit the model's context ({max_ctx} tokens)"))


def choose_sizes(rates: list[EngineRates], reps: int, ttft_tokens: int, cold_reps: int, budget_s: float,
                 max_ctx: int, ladder: tuple[tuple[int, int, int], ...] = SIZE_LADDER,
                 depths: tuple[int, ...] | None = None) -> Sizes:
    """The first (largest) of :func:`size_candidates` that fits the context and whose projected time fits
    ``budget_s``; the note says why larger sizes were passed over, with the projections."""
    top = ladder[0]
    fitting = [s for s in size_candidates(ladder) if context_needed(s, depths) <= max_ctx]
    reasons = [] if top in fitting else [f"the model's context ({max_ctx} tokens)"]
    chosen, largest_projected = None, None
    for s in fitting:
        projected = project_seconds(rates, s, reps, ttft_tokens, cold_reps, depths=depths)
        if projected <= budget_s:
            chosen = s
            break
        if largest_projected is None:
            largest_projected = projected
            reasons.append(f"the {budget_s:.0f} s time budget (-p {s[0]} -n {s[1]} -d {s[2]} is projected to take "
                           f"{projected:.0f} s)")
    if chosen is None:
        chosen = fitting[-1] if fitting else ladder[-1]
        projected = project_seconds(rates, chosen, reps, ttft_tokens, cold_reps, depths=depths)
        return Sizes(*chosen, how="auto-scaled", projected_s=projected, note=(
            f"even the smallest sizes (-p {chosen[0]} -n {chosen[1]} -d {chosen[2]}) are projected to take "
            f"{projected:.0f} s, over the {budget_s:.0f} s budget"))
    if chosen == top:
        return Sizes(*chosen, how="default", projected_s=projected,
                     note=f"projected {projected:.0f} s, within the {budget_s:.0f} s budget")
    return Sizes(*chosen, how="auto-scaled", projected_s=projected, note=(
        f"scaled down from -p {top[0]} -n {top[1]} -d {top[2]} to -p {chosen[0]} -n {chosen[1]} -d {chosen[2]} "
        f"(projected {projected:.0f} s) to fit {' and '.join(reasons)}; pass -p/-n/-d, or a larger --budget"))


@dataclass
class CompareSession:
    """A compare run in progress; ``results()`` is valid at any time (after Ctrl-C: what was measured)."""

    config: CompareConfig
    ours_name: str = ""
    runner: Runner | None = None
    cold_runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    cold_done: bool = False
    noise: dict[str, Any] = field(default_factory=dict)  # bench_compare.noise windows: "before", "during"
    before_window: noise.Window | None = None  # open from the engines' loading to the end of the warm-up
    bandwidth: dict[str, Any] | None = None  # bench_compare.bandwidth.read_bandwidth at the run's thread count
    sizes: Sizes | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    load_s: dict[str, float] = field(default_factory=dict)

    def results(self) -> list[TestResult]:
        out: list[TestResult] = []
        if self.runner is not None:
            out += [from_measurement(m) for m in self.runner.measurements if m.samples_ns]
        for engine, runs in self.cold_runs.items():
            out += cold_runner.cold_results(engine, runs, complete=self.cold_done)
        return out

    def ratios(self) -> dict[str, float]:
        return compute_ratios(self.results(), self.ours_name, REFERENCE_ENGINE)

    def intervals(self) -> dict[str, RatioInterval]:
        return compute_intervals(self.results(), self.ours_name, REFERENCE_ENGINE)


ProgressHook = Callable[[str], None]  # called with a short description after each unit of work


def run_compare(cfg: CompareConfig, session: CompareSession, *, clock: Clock | None = None,
                progress: Callable[[int], Any] | None = None, advance: ProgressHook | None = None,
                say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the whole comparison; fills ``session`` as it goes and returns the result JSON object.

    ``progress(total)`` is called once the number of work units is known; ``advance(desc)`` after each unit.
    """
    cfg.validate()
    clock = clock or timing.DEFAULT_CLOCK
    n_threads = cfg.n_threads or default_threads()
    path = resolve_model(cfg.model)
    gguf = open_gguf(path)
    max_ctx = int(gguf.arch_value("context_length", 0) or 0) or 1 << 30
    _check_sizes_fit(cfg, max_ctx)

    ours_spec = engines.with_llama_bench_kv(cfg.engine_spec())  # the same K/V cache type as llama.cpp's
    ref_spec = engines.parse_engine_spec(REFERENCE_ENGINE)
    session.ours_name = ours_spec.name
    advance = advance or (lambda desc: None)

    # Context for the largest possible run; the engines are made once (weights loaded once, kept warm).
    ladder_max = max(context_needed(s) for s in SIZE_LADDER + (QUICK_SIZES,))
    # pp and tg at the deepest depth; sizes not given may take the ladder's largest
    want_ctx = max(ladder_max, context_needed((cfg.n_prompt or SIZE_LADDER[0][0], cfg.n_gen or SIZE_LADDER[0][1],
                                               cfg.depth_given() or 0)))
    n_ctx = min(_round_up(want_ctx + 8, 256), max_ctx)

    # llama.cpp's repacked-weight verdict (a child-process probe on a machine's first run) before any load is timed
    engines.llamacpp_extra_bufts(path)
    # the machine's read bandwidth at this thread count (measured once per machine, on a machine without our engines)
    session.bandwidth = bandwidth.read_bandwidth(n_threads)
    session.before_window = noise.Window(name_processes=True)  # closed after the warm-up: loading is ours
    say(f"loading {ours_spec.name} and llama.cpp on {path.name} ({n_threads} threads)")
    made: dict[str, Any] = {}
    # a first run's kernel compile is announced through ``say`` (past the progress bar)
    with compile_notice.announcing(say):
        try:
            # the reference first: a model llama.cpp cannot load has nothing to compare
            for spec in (ref_spec, ours_spec):
                t0 = clock()
                engines.import_engine_modules(spec)
                made[spec.name] = engines.make_engine(spec, path, n_threads=n_threads, n_ctx=n_ctx,
                                                      numerics=cfg.numerics, n_batch=cfg.n_batch)
                session.load_s[spec.name] = (clock() - t0) / NS_PER_S
            ordered = {ours_spec.name: made[ours_spec.name], ref_spec.name: made[ref_spec.name]}  # ours first
            made.clear()
            made.update(ordered)
            return _run_with_engines(cfg, session, made, gguf, path, n_threads, n_ctx, max_ctx, ours_spec,
                                     ref_spec, clock, progress, advance, say)
        finally:
            release_engines(made)


def release_engines(made: dict[str, Any]) -> None:
    """Close the engines and drop this run's references to them (the dict is emptied), so that their memory is
    given back before anything else runs: the cold starts that follow the hot tests run in a machine's memory as
    the user's program would, not beside gigabytes the harness still holds."""
    for engine in made.values():
        engine.close()
    made.clear()
    gc.collect()  # an engine's object graph may hold cycles


def _run_with_engines(cfg, session, made, gguf, path, n_threads, n_ctx, max_ctx, ours_spec, ref_spec, clock,
                      progress, advance, say) -> dict[str, Any]:
    ours, ref = made[ours_spec.name], made[ref_spec.name]
    allowed = token_ids_for_model(gguf, min(ours.n_vocab, ref.n_vocab))
    ttft_tokens = len(ref.tokenize(cfg.prompt, add_bos=True))
    if ttft_tokens > n_ctx:
        raise GGUFParityError(f"the TTFT prompt is {ttft_tokens} tokens, more than the context of {n_ctx}")
    cold_reps = cfg.cold_reps if cfg.cold else 0  # --quick's one cold run is set by the command (a given one wins)
    reps = cfg.reps

    compiled_before = compile_notice.kernels_compiled()
    warmup_runs = warm_up(made, allowed, cfg.seed, n_ctx, clock, cfg.n_batch)
    kernels_compiled = {"warmup": compile_notice.kernels_compiled() - compiled_before}
    sizes = _pick_sizes(cfg, made, allowed, session, ttft_tokens, cold_reps, max_ctx, clock, say)
    session.sizes = sizes
    tests = plan_tests(sizes)
    generating = [name for name, engine in made.items() if generate_timing.generate_only(engine)]
    if generating and any(t.kind == KIND_PP and t.n_depth for t in tests):
        # a request cannot hold a depth untimed before a timed prompt (generate_timing.check_test): tg @ depth only
        tests = [t for t in tests if not (t.kind == KIND_PP and t.n_depth)]
        skipped = f"pp at depth skipped: {', '.join(generating)} only generates (tg at depth is measured)"
        sizes.note = f"{sizes.note}; {skipped}" if sizes.note else skipped
    if sizes.note:
        say(sizes.note)
    units = (len(tests) + 1) * 2 * (reps + 1) + 2 * cold_reps
    if progress is not None:
        progress(units)

    settings = {
        "n_threads": n_threads, "n_ctx": n_ctx, "reps": reps, "cold_reps": cold_reps, "seed": cfg.seed,
        "n_prompt": sizes.n_prompt, "n_gen": sizes.n_gen, "n_depth": sizes.n_depth, "sizes_chosen": sizes.how,
        "depths": list(sizes.depths) if sizes.depths is not None else None,
        "precision": cfg.precision, "max_reps": cfg.max_reps if cfg.precision is not None else None,
        "sizes_note": sizes.note, "prompt": cfg.prompt, "ttft_prompt_tokens": ttft_tokens, "quick": cfg.quick,
        "budget_s": cfg.budget_s, "projected_s": sizes.projected_s,
        "order": "interleaved per repetition: ours, llamacpp; cold starts after both engines are released, "
                 "alternating",
        "engines": {
            spec.name: engines.engine_settings(spec, n_threads=n_threads, n_ctx=n_ctx, numerics=cfg.numerics,
                                               n_batch=cfg.n_batch, model=path)
            for spec in (ours_spec, ref_spec)
        },
        "load_s_in_process": session.load_s,
        "warmup_runs": warmup_runs,  # per engine: until two runs in a row agreed (WARMUP_STEADY_TOLERANCE)
        "kernels_compiled": kernels_compiled,  # in this process: in the warm-up, and (never expected) measuring
    }
    session.settings = settings

    draw = None
    if generate_timing.any_generate_only((ours, ref)):  # timed by requests: prompts must survive text
        draw = generate_timing.text_safe_draw(gguf, cfg.seed)
        settings["prompt_tokens"] = "random words of exact token counts (an engine that only generates takes text)"
    runner = Runner({ours_spec.name: ours, ref_spec.name: ref}, allowed, reps=reps, clock=clock,
                    n_batch=cfg.n_batch, seed=cfg.seed, pause_s=INTERLEAVE_PAUSE_S, draw=draw,
                    on_progress=lambda label, test, what: advance(f"{test.name} {label}"),
                    until=_precise_enough(cfg.precision), max_reps=cfg.max_reps if cfg.precision else reps)
    session.runner = runner
    if session.before_window is not None:
        session.noise["before"] = _window_dict(session.before_window.close())
    during = noise.Window(name_processes=True)
    started_ns = clock()
    for test in tests:
        runner.run(test)
    measure_ttft_hot(runner, cfg.prompt)

    if cold_reps:
        # the hot engines go first (their memory back to the machine); then the cold starts alternate which engine
        # starts first (ours, llama.cpp; llama.cpp, ours; ...), so whatever the previous process left behind (a
        # page cache, freed memory the host must hand back) does not always fall on the same engine
        del ours, ref
        runner.engines = {}
        release_engines(made)
        session.cold_runs = {ours_spec.name: [], ref_spec.name: []}
        for rep in range(cold_reps):
            for spec in (ours_spec, ref_spec) if rep % 2 == 0 else (ref_spec, ours_spec):
                run = cold_runner.run_cold_start_subprocess(
                    spec, path, cfg.prompt, n_threads=n_threads, n_ctx=n_ctx, numerics=cfg.numerics,
                    n_batch=cfg.n_batch, rss_prompt=sizes.n_prompt, rss_gen=sizes.n_gen, seed=cfg.seed)
                session.cold_runs[spec.name].append(run)
                advance(f"cold start {spec.name}")
        session.cold_done = True
    settings["measured_s"] = (clock() - started_ns) / NS_PER_S  # next to projected_s: was the projection honest?
    session.noise["during"] = _window_dict(during.close())
    kernels_compiled["measuring"] = compile_notice.kernels_compiled() - compiled_before - kernels_compiled["warmup"]
    return build_result(session, gguf)


def warm_up(made: dict[str, Any], allowed: np.ndarray, seed: int, n_ctx: int, clock: Clock,
            n_batch: int = DEFAULT_N_BATCH) -> dict[str, int]:
    """Each engine's first calls, untimed, before the probe, the progress bar and the measurements: a prefill of
    :data:`WARMUP_PROMPT_TOKENS` and :data:`WARMUP_DECODE_STEPS` decoded tokens (first calls compile or allocate),
    repeated until two runs in a row agree within :data:`WARMUP_STEADY_TOLERANCE` (at most
    :data:`WARMUP_MAX_RUNS`). Returns the runs each engine took."""
    n_prompt = max(1, min(WARMUP_PROMPT_TOKENS, n_ctx - WARMUP_DECODE_STEPS))
    test = pg_test(n_prompt, WARMUP_DECODE_STEPS)
    tokens = draw_tokens(test, allowed, seed)
    runs: dict[str, int] = {}
    for name, engine in made.items():
        times: list[int] = []
        try:
            while len(times) < WARMUP_MAX_RUNS:
                times.append(run_sample(engine, test, tokens, clock, n_batch))
                if len(times) >= 2 and abs(times[-1] - times[-2]) <= WARMUP_STEADY_TOLERANCE * times[-2]:
                    break
        except EngineCapabilityError:  # an engine that only generates: the runner's warm-up requests serve it
            pass
        runs[name] = len(times)
    return runs


def build_result(session: CompareSession, gguf) -> dict[str, Any]:
    results = session.results()
    return CompareResult(
        ours=session.ours_name,
        reference=REFERENCE_ENGINE,
        backend=session.config.backend,
        # the compared engine's own (another engine than ours may not take --numerics: mistralrs says its own)
        numerics=session.settings.get("engines", {}).get(session.ours_name, {}).get("numerics",
                                                                                    session.config.numerics),
        model=model_description(gguf),
        settings=session.settings,
        provenance=provenance(),
        results=[r.to_dict() for r in results],
        ratios=compute_ratios(results, session.ours_name, REFERENCE_ENGINE),
        ratio_intervals={test: i.to_dict() for test, i in
                         compute_intervals(results, session.ours_name, REFERENCE_ENGINE).items()},
        ratio_orientation="higher is better for ours: throughput ours/llamacpp, time and memory llamacpp/ours",
        extra=_extra(session, results, gguf),
    ).to_dict()


def _extra(session: CompareSession, results: list[TestResult], gguf) -> dict[str, Any]:
    """The result's records beside the measurements: the machine's noise, and the memory wall."""
    out: dict[str, Any] = {}
    if session.noise:
        out["noise"] = {**session.noise, "warnings": noise.warnings(session.noise)}
    if session.bandwidth:
        out["memory_wall"] = bandwidth.memory_wall([r.to_dict() for r in results],
                                                   bandwidth.weight_bytes_per_token(gguf), session.bandwidth)
    return out


def _pick_sizes(cfg, made, allowed, session, ttft_tokens, cold_reps, max_ctx, clock, say) -> Sizes:
    sizes = _pick_base_sizes(cfg, made, allowed, session, ttft_tokens, cold_reps, max_ctx, clock, say)
    sizes.depths = cfg.depths
    return sizes


def _pick_base_sizes(cfg, made, allowed, session, ttft_tokens, cold_reps, max_ctx, clock, say) -> Sizes:
    given = (cfg.n_prompt, cfg.n_gen, cfg.depth_given())
    if cfg.quick:
        p, n, d = (g if g is not None else q for g, q in zip(given, QUICK_SIZES))
        return Sizes(p, n, d, how="quick", note=f"--quick: -p {p} -n {n} -d {d} -r {cfg.reps}, cold runs "
                     f"{cfg.cold_reps if cfg.cold else 0}")
    if all(g is not None for g in given):
        return Sizes(*given, how="given")
    # Sizes the user gave are kept; only the others move down the ladder.
    ladder = tuple(tuple(g if g is not None else s for g, s in zip(given, step)) for step in SIZE_LADDER)
    if cfg.budget_s is None:
        return fit_context(max_ctx, ladder, cfg.depths)
    for name, engine in made.items():
        if generate_timing.generate_only(engine):
            raise GGUFParityError(f"--budget probes prefill and decode calls, which {name} does not offer (it only "
                                  "generates); give -p, -n and -d instead")
    say(f"probing each engine's costs to fit the {cfg.budget_s:.0f} s budget")
    rates = [probe_rates(engine, allowed, cfg.seed, session.load_s[name], clock) for name, engine in made.items()]
    return choose_sizes(rates, cfg.reps, ttft_tokens, cold_reps, cfg.budget_s, max_ctx, ladder, cfg.depths)


def _check_sizes_fit(cfg: CompareConfig, max_ctx: int) -> None:
    depth = cfg.depth_given() or 0
    need = context_needed((cfg.n_prompt or 0, cfg.n_gen or 0, depth))
    if need > max_ctx:
        raise GGUFParityError(
            f"depth {depth} + prompt {cfg.n_prompt or 0} or gen {cfg.n_gen or 0} needs {need} tokens of context "
            f"but the model's context length is {max_ctx}")


def _window_dict(window) -> dict[str, Any] | None:
    return None if window is None else window.to_dict()


def _precise_enough(precision: float | None) -> Callable[[list], bool] | None:
    """``--precision``: a test is done once the interval of ours / llama.cpp (its first two engines) is that narrow."""
    if precision is None:
        return None

    def enough(measurements: list) -> bool:
        ours, ref = measurements[0], measurements[1]
        return precise_enough(interval_of(ours.samples, ref.samples, ours.higher_is_better), precision)

    return enough


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
