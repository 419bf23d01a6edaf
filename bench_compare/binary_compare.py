"""``compare --against llama-bench:PATH``: our engine in this process, the user's own llama-bench as the yardstick.

The tests are compare's throughput tests (``pp{P}``, ``tg{N}``, and both at each ``-d`` depth), with compare's
sizes (llama-bench's defaults, or what fits the model's context, or ``--quick``). For each test, in order:

1. ours: one warm-up, then ``-r`` repetitions (:class:`~bench_compare.measure.Runner`, exactly as ``compare``);
2. the binary: one run of ``llama-bench -p P -n N [-d D] -r R -t T -ngl 99 -o json``
   (:mod:`bench_compare.llama_bench_bin`), which does its own warm-up and ``-r`` repetitions.

The two sides of a test run one after the other, not interleaved per repetition (the binary is a separate
process), so the ratio's interval is **unpaired**: the ratio of the two sides' geometric means with Welch's t
interval on the log-samples (:func:`bench_compare.intervals.unpaired_interval_of`); it covers each side's own
spread, not a change in the machine between the two blocks. ``--precision`` and ``--budget`` (which add paired
repetitions, or probe both engines in this process) are refused with the binary.

Not measured (said in the output and recorded under ``extra.not_measured``, never invented): hot and cold TTFT and
peak RSS, which llama-bench does not report. Our engine stays loaded while the binary runs (both hold the weights:
on a GPU, both copies must fit in its memory).

A failure of the binary (a crash, an error exit, JSON without samples) ends the run with one line (exit 2); what
was measured before it is printed and nothing is written, as after Ctrl-C (which also stops the binary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench_compare import compare_run, engines, generate_timing, llama_bench_bin, timing
from bench_compare.compare_run import CompareConfig, CompareSession
from bench_compare.intervals import RatioInterval, unpaired_interval_of
from bench_compare.measure import KIND_PP, Runner, token_ids_for_model
from bench_compare.results import TestResult, model_description, paired_results, provenance, ratio_of
from bench_compare.timing import NS_PER_S, Clock
from bench_compare.yardstick import Yardstick, check_binary, check_depth
from inference_engine import compile_notice
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.store.named_models import resolve_model
from validation.results import CompareResult

REFERENCE = llama_bench_bin.ENGINE_NAME
ORDER = ("per test: ours (warm-up, then -r repetitions), then one llama-bench run (its own warm-up and -r "
         "repetitions); not interleaved per repetition, so the intervals are unpaired (Welch)")


@dataclass
class BinaryCompareSession(CompareSession):
    """A compare against a binary in progress; ``results()`` is valid at any time (after Ctrl-C or a failure of
    the binary: what was measured)."""

    binary_results: list[TestResult] = field(default_factory=list)
    reference: str = REFERENCE

    def results(self) -> list[TestResult]:
        ours = super().results()
        by_test = {r.test: r for r in self.binary_results}
        out: list[TestResult] = []
        for r in ours:  # ours then the binary, test by test
            out.append(r)
            if r.test in by_test:
                out.append(by_test.pop(r.test))
        return out + list(by_test.values())

    def ratios(self) -> dict[str, float]:
        return unpaired_ratios(self.results(), self.ours_name, self.reference)

    def intervals(self) -> dict[str, RatioInterval]:
        return unpaired_intervals(self.results(), self.ours_name, self.reference)


def unpaired_intervals(results: list[TestResult], ours: str, reference: str) -> dict[str, RatioInterval]:
    out: dict[str, RatioInterval] = {}
    for a, b in paired_results(results, ours, reference):
        interval = unpaired_interval_of(a.samples, b.samples, a.higher_is_better)
        if interval is not None:
            out[a.test] = interval
    return out


def unpaired_ratios(results: list[TestResult], ours: str, reference: str) -> dict[str, float]:
    intervals = unpaired_intervals(results, ours, reference)
    return {a.test: intervals[a.test].ratio if a.test in intervals else ratio_of(a, b)
            for a, b in paired_results(results, ours, reference)}


def check_config(cfg: CompareConfig) -> None:
    """What a binary yardstick cannot do, refused before anything is loaded."""
    if cfg.budget_s is not None:
        raise GGUFParityError("--budget probes both engines in this process; with --against llama-bench:PATH give "
                              "-p, -n and -d instead")
    if cfg.precision is not None:
        raise GGUFParityError("--precision adds paired repetitions; llama-bench runs its own -r repetitions in one "
                              "process: give -r instead")


def run_binary_compare(cfg: CompareConfig, yard: Yardstick, session: BinaryCompareSession, *,
                       clock: Clock | None = None, progress: Callable[[int], Any] | None = None,
                       advance: Callable[[str], None] | None = None,
                       say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the comparison (see the module docstring); fills ``session`` as it goes and returns the result."""
    cfg.validate()
    check_config(cfg)
    info = check_binary(yard)  # before the model is opened: a wrong PATH costs nothing
    clock = clock or timing.DEFAULT_CLOCK
    advance = advance or (lambda desc: None)
    n_threads = cfg.n_threads or compare_run.default_threads()
    path = resolve_model(cfg.model)
    gguf = open_gguf(path)
    max_ctx = int(gguf.arch_value("context_length", 0) or 0) or 1 << 30
    compare_run._check_sizes_fit(cfg, max_ctx)
    # no probe without --budget: the sizes are given, --quick's, or the largest that fit the context
    sizes = compare_run._pick_sizes(cfg, {}, None, session, 0, 0, max_ctx, clock, say)
    if cfg.quick:  # compare's --quick note counts cold runs, which a binary yardstick has none of
        sizes.note = f"--quick: -p {sizes.n_prompt} -n {sizes.n_gen} -d {sizes.n_depth} -r {cfg.reps}"
    session.sizes = sizes
    tests = compare_run.plan_tests(sizes)
    check_depth(info, [t.n_depth for t in tests])

    ours_spec = engines.with_llama_bench_kv(cfg.engine_spec())  # the same K/V cache type as llama-bench's
    session.ours_name = ours_spec.name
    n_ctx = min(compare_run._round_up(max(t.n_ctx_needed for t in tests) + 8, 256), max_ctx)
    say(f"loading {ours_spec.name} on {path.name} ({n_threads} threads); the yardstick: {info.path}")
    made: dict[str, Any] = {}
    with compile_notice.announcing(say):
        try:
            t0 = clock()
            engines.import_engine_modules(ours_spec)
            made[ours_spec.name] = engines.make_engine(ours_spec, path, n_threads=n_threads, n_ctx=n_ctx,
                                                       numerics=cfg.numerics, n_batch=cfg.n_batch)
            session.load_s[ours_spec.name] = (clock() - t0) / NS_PER_S
            return _measure(cfg, session, made, gguf, path, info, tests, n_threads, n_ctx, ours_spec, clock,
                            progress, advance, say)
        finally:
            compare_run.release_engines(made)


def _measure(cfg, session, made, gguf, path, info, tests, n_threads, n_ctx, ours_spec, clock, progress, advance,
             say) -> dict[str, Any]:
    ours = made[ours_spec.name]
    sizes = session.sizes
    allowed = token_ids_for_model(gguf, ours.n_vocab)
    warmup_runs = compare_run.warm_up(made, allowed, cfg.seed, n_ctx, clock, cfg.n_batch)
    if generate_timing.generate_only(ours) and any(t.kind == KIND_PP and t.n_depth for t in tests):
        tests = [t for t in tests if not (t.kind == KIND_PP and t.n_depth)]
        skipped = f"pp at depth skipped: {ours_spec.name} only generates (tg at depth is measured)"
        sizes.note = f"{sizes.note}; {skipped}" if sizes.note else skipped
    if sizes.note:
        say(sizes.note)
    if progress is not None:
        progress(len(tests) * (cfg.reps + 2))  # ours: warm-up and reps; the binary: one run
    session.settings = {
        "n_threads": n_threads, "n_ctx": n_ctx, "reps": cfg.reps, "cold_reps": 0, "seed": cfg.seed,
        "n_prompt": sizes.n_prompt, "n_gen": sizes.n_gen, "n_depth": sizes.n_depth, "sizes_chosen": sizes.how,
        "depths": list(sizes.depths) if sizes.depths is not None else None, "sizes_note": sizes.note,
        "quick": cfg.quick, "order": ORDER, "against": f"{info.kind}:{info.path}",
        "engines": {
            ours_spec.name: engines.engine_settings(ours_spec, n_threads=n_threads, n_ctx=n_ctx,
                                                    numerics=cfg.numerics, n_batch=cfg.n_batch, model=path),
            REFERENCE: {"engine": REFERENCE, **info.to_dict(), "n_threads": n_threads,
                        "n_gpu_layers": llama_bench_bin.N_GPU_LAYERS,
                        "command": llama_bench_bin.bench_command(str(info.path), str(path), tests[0], cfg.reps,
                                                                 n_threads)},
        },
        "load_s_in_process": session.load_s,
        "warmup_runs": warmup_runs,
    }
    runner = Runner({ours_spec.name: ours}, allowed, reps=cfg.reps, clock=clock, n_batch=cfg.n_batch,
                    seed=cfg.seed, on_progress=lambda label, test, what: advance(f"{test.name} {label}"))
    session.runner = runner
    started_ns = clock()
    for test in tests:
        runner.run(test)
        record = llama_bench_bin.run_test(str(info.path), str(path), test, cfg.reps, n_threads)
        if not session.binary_results:  # the build's identity and llama-bench's own settings, from its first record
            session.settings["engines"][REFERENCE].update(llama_bench_bin.settings_of(record))
            session.settings["engines"][REFERENCE]["build"] = llama_bench_bin.build_info(record)
        session.binary_results.append(llama_bench_bin.to_result(record, test))
        advance(f"{test.name} {REFERENCE}")
    session.settings["measured_s"] = (clock() - started_ns) / NS_PER_S
    return build_result(session, gguf)


def notes(reference: dict[str, Any]) -> list[str]:
    """The yardstick's identity, then what it does not measure (printed as ``note:`` lines and recorded)."""
    build = reference.get("build", {})
    number = build.get("build_number")  # 0: CMake counted no commits (sources without git history)
    counted = f" ({number})" if number else ""
    identity = (f"yardstick: {REFERENCE} {reference.get('path')}, build {build.get('build_commit')}{counted}, "
                f"backends {build.get('backends')}, cpu {build.get('cpu_info') or '-'}"
                f", gpu {build.get('gpu_info') or '-'}, -ngl {reference.get('n_gpu_layers')}")
    return [identity] + [f"{test}: not measured ({why})" for test, why in llama_bench_bin.NOT_MEASURED.items()]


def build_result(session: BinaryCompareSession, gguf) -> dict[str, Any]:
    results = session.results()
    reference = session.settings["engines"][REFERENCE]
    prov = provenance()
    prov["reference_binary"] = {**{k: reference.get(k) for k in ("kind", "path", "sha256")},
                                **reference.get("build", {})}
    return CompareResult(
        ours=session.ours_name,
        reference=REFERENCE,
        backend=session.config.backend,
        numerics=session.settings["engines"][session.ours_name].get("numerics", session.config.numerics),
        model=model_description(gguf),
        settings=session.settings,
        provenance=prov,
        results=[r.to_dict() for r in results],
        ratios=session.ratios(),
        ratio_intervals={t: i.to_dict() for t, i in session.intervals().items()},
        ratio_orientation="higher is better for ours: throughput ours/llama-bench",
        extra={"not_measured": dict(llama_bench_bin.NOT_MEASURED), "notes": notes(reference)},
    ).to_dict()
