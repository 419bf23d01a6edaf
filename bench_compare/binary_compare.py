"""``compare`` with a program on one side or both: llama.cpp's own ``llama-bench`` as the yardstick (``--against
llama-bench:PATH``), and/or the engine under test as a program that takes llama-bench's flags and prints its JSON
(``--engine llama-bench:PATH``: an engine in any language, timed by its own benchmark program).

The sides: the engine under test is in this process (ours, a plugin, ...) or such a program; the reference is
llama-bench (``--against llama-bench:PATH``) or, with a program engine and no such ``--against``, llama.cpp in this
process (llama-cpp-python with llama-bench's defaults, as ``compare`` runs it). The tests are compare's throughput
tests (``pp{P}``, ``tg{N}``, and both at each ``-d`` depth), with compare's sizes (llama-bench's defaults, or what
fits the model's context, or ``--quick``). For each test, in order, the engine under test first:

1. an in-process side: one warm-up, then ``-r`` repetitions (:class:`~bench_compare.measure.Runner`, exactly as
   ``compare``);
2. a program: one run of ``PROGRAM -m MODEL -p P -n N [-d D] -r R -t T -ngl 99 -o json``
   (:mod:`bench_compare.llama_bench_bin`), which does its own warm-up and ``-r`` repetitions.

The two sides of a test run one after the other, not interleaved per repetition (a program is a separate
process), so the ratio's interval is **unpaired**: the ratio of the two sides' geometric means with Welch's t
interval on the log-samples (:func:`bench_compare.intervals.unpaired_interval_of`); it covers each side's own
spread, not a change in the machine between the two blocks. ``--precision`` and ``--budget`` (which add paired
repetitions, or probe both engines in this process) are refused with a program.

Not measured (said in the output and recorded under ``extra.not_measured``, never invented): hot and cold TTFT and
peak RSS, which llama-bench does not report. An in-process engine stays loaded while a program runs (both hold the
weights: on a GPU, both copies must fit in its memory).

A failure of a program (a crash, an error exit, JSON without samples) ends the run with one line (exit 2); what
was measured before it is printed and nothing is written, as after Ctrl-C (which also stops the program).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_compare import compare_run, engines, generate_timing, llama_bench_bin, timing
from bench_compare.compare_run import CompareConfig, CompareSession
from bench_compare.intervals import RatioInterval, unpaired_interval_of
from bench_compare.measure import KIND_PP, Runner, token_ids_for_model
from bench_compare.results import TestResult, model_description, paired_results, provenance, ratio_of
from bench_compare.timing import NS_PER_S, Clock
from bench_compare.yardstick import KIND_BENCH, BinaryInfo, Yardstick, check_binary, check_depth
from inference_engine import compile_notice
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.store.named_models import resolve_model
from validation.results import CompareResult

REFERENCE = llama_bench_bin.ENGINE_NAME
ORDER = ("per test: the engine under test, then the reference; an in-process side: a warm-up, then -r repetitions; "
         "a program: one run (its own warm-up and -r repetitions); not interleaved per repetition, so the intervals "
         "are unpaired (Welch)")


@dataclass(frozen=True)
class Program:
    """A side of the compare that is a program taking llama-bench's flags: its name in the results, what
    :func:`~bench_compare.yardstick.check_binary` learned, and the flag that named it."""

    name: str
    info: BinaryInfo
    flag: str

    @property
    def is_yardstick(self) -> bool:
        """Named by ``--against`` (llama.cpp's llama-bench), not ``--engine`` (the engine under test)."""
        return self.flag == "--against"


@dataclass
class BinaryCompareSession(CompareSession):
    """A compare with a program on one side or both, in progress; ``results()`` is valid at any time (after Ctrl-C
    or a failure of a program: what was measured)."""

    binary_results: list[TestResult] = field(default_factory=list)
    reference: str = REFERENCE

    def results(self) -> list[TestResult]:
        """Test by test, the engine under test first, then the reference."""
        everything = super().results() + self.binary_results
        tests = list(dict.fromkeys(r.test for r in everything))
        rank = {self.ours_name: 0, self.reference: 1}
        return sorted(everything, key=lambda r: (tests.index(r.test), rank.get(r.engine, 2)))

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
    """What a program on either side cannot do, refused before anything is loaded."""
    if cfg.budget_s is not None:
        raise GGUFParityError("--budget probes both engines in this process; with a llama-bench:PATH program give "
                              "-p, -n and -d instead")
    if cfg.precision is not None:
        raise GGUFParityError("--precision adds paired repetitions; a llama-bench:PATH program runs its own -r "
                              "repetitions in one process: give -r instead")


def run_binary_compare(cfg: CompareConfig, yard: Yardstick | None, session: BinaryCompareSession, *,
                       clock: Clock | None = None, progress: Callable[[int], Any] | None = None,
                       advance: Callable[[str], None] | None = None,
                       say: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run the comparison (see the module docstring): ``cfg``'s engine against ``yard`` (llama-bench), or, with no
    ``yard``, a program engine against llama.cpp in this process. Fills ``session`` as it goes and returns the
    result."""
    cfg.validate()
    check_config(cfg)
    engine_spec = cfg.engine_spec()
    programs: list[Program] = []
    if engine_spec.is_program:  # before the model is opened: a wrong PATH costs nothing
        if not engine_spec.target:
            raise GGUFParityError("--engine llama-bench: needs your benchmark program's path, e.g. --engine "
                                  "llama-bench:./target/release/my-bench")
        engine_yard = Yardstick(KIND_BENCH, Path(engine_spec.target).expanduser())
        programs.append(Program(engine_spec.name, check_binary(engine_yard, "--engine"), "--engine"))
    if yard is not None:
        programs.append(Program(REFERENCE, check_binary(yard), "--against"))
    if not programs:
        raise ValueError("run_binary_compare needs a program: --engine llama-bench:PATH or --against llama-bench:PATH")
    clock = clock or timing.DEFAULT_CLOCK
    advance = advance or (lambda desc: None)
    n_threads = cfg.n_threads or compare_run.default_threads()
    path = resolve_model(cfg.model)
    gguf = open_gguf(path)
    max_ctx = int(gguf.arch_value("context_length", 0) or 0) or 1 << 30
    compare_run._check_sizes_fit(cfg, max_ctx)
    # no probe without --budget: the sizes are given, --quick's, or the largest that fit the context
    sizes = compare_run._pick_sizes(cfg, {}, None, session, 0, 0, max_ctx, clock, say)
    if cfg.quick:  # compare's --quick note counts cold runs, which a program has none of
        sizes.note = f"--quick: -p {sizes.n_prompt} -n {sizes.n_gen} -d {sizes.n_depth} -r {cfg.reps}"
    session.sizes = sizes
    tests = compare_run.plan_tests(sizes)
    for program in programs:
        check_depth(program.info, [t.n_depth for t in tests], program.flag)

    session.ours_name = engine_spec.name
    session.reference = REFERENCE if yard is not None else compare_run.REFERENCE_ENGINE
    in_process = None  # the side run here: ours (or a plugin) under test, or llama.cpp as the reference
    if not engine_spec.is_program:
        in_process = engines.with_llama_bench_kv(engine_spec)  # the same K/V cache type as llama-bench's
    elif yard is None:
        in_process = engines.parse_engine_spec(compare_run.REFERENCE_ENGINE)
        engines.llamacpp_extra_bufts(path)  # its repacked-weight verdict (a child-process probe) before timing
    n_ctx = min(compare_run._round_up(max(t.n_ctx_needed for t in tests) + 8, 256), max_ctx)
    say(f"{session.ours_name} against {session.reference} on {path.name} ({n_threads} threads)")
    made: dict[str, Any] = {}
    with compile_notice.announcing(say):
        try:
            if in_process is not None:
                t0 = clock()
                engines.import_engine_modules(in_process)
                made[in_process.name] = engines.make_engine(in_process, path, n_threads=n_threads, n_ctx=n_ctx,
                                                            numerics=cfg.numerics, n_batch=cfg.n_batch)
                session.load_s[in_process.name] = (clock() - t0) / NS_PER_S
            return _measure(cfg, session, made, gguf, path, programs, tests, n_threads, n_ctx, in_process, clock,
                            progress, advance, say)
        finally:
            compare_run.release_engines(made)


def _measure(cfg, session, made, gguf, path, programs, tests, n_threads, n_ctx, in_process, clock, progress, advance,
             say) -> dict[str, Any]:
    sizes = session.sizes
    warmup_runs: dict[str, int] = {}
    runner = None
    if in_process is not None:
        engine = made[in_process.name]
        allowed = token_ids_for_model(gguf, engine.n_vocab)
        warmup_runs = compare_run.warm_up(made, allowed, cfg.seed, n_ctx, clock, cfg.n_batch)
        if generate_timing.generate_only(engine) and any(t.kind == KIND_PP and t.n_depth for t in tests):
            tests = [t for t in tests if not (t.kind == KIND_PP and t.n_depth)]
            skipped = f"pp at depth skipped: {in_process.name} only generates (tg at depth is measured)"
            sizes.note = f"{sizes.note}; {skipped}" if sizes.note else skipped
        runner = Runner({in_process.name: engine}, allowed, reps=cfg.reps, clock=clock, n_batch=cfg.n_batch,
                        seed=cfg.seed, on_progress=lambda label, test, what: advance(f"{test.name} {label}"))
    if sizes.note:
        say(sizes.note)
    if progress is not None:  # an in-process side: warm-up and reps; a program: one run
        progress(len(tests) * ((cfg.reps + 1 if runner is not None else 0) + len(programs)))
    engine_settings = {}
    if in_process is not None:
        engine_settings[in_process.name] = engines.engine_settings(
            in_process, n_threads=n_threads, n_ctx=n_ctx, numerics=cfg.numerics, n_batch=cfg.n_batch, model=path)
    for program in programs:
        engine_settings[program.name] = {
            "engine": program.name, **program.info.to_dict(), "n_threads": n_threads,
            "n_gpu_layers": llama_bench_bin.N_GPU_LAYERS,
            "command": llama_bench_bin.bench_command(str(program.info.path), str(path), tests[0], cfg.reps,
                                                     n_threads)}
    session.settings = {
        "n_threads": n_threads, "n_ctx": n_ctx, "reps": cfg.reps, "cold_reps": 0, "seed": cfg.seed,
        "n_prompt": sizes.n_prompt, "n_gen": sizes.n_gen, "n_depth": sizes.n_depth, "sizes_chosen": sizes.how,
        "depths": list(sizes.depths) if sizes.depths is not None else None, "sizes_note": sizes.note,
        "quick": cfg.quick, "order": ORDER,
        "against": f"{KIND_BENCH}:{programs[-1].info.path}" if session.reference == REFERENCE else session.reference,
        "engines": engine_settings,
        "load_s_in_process": session.load_s,
        "warmup_runs": warmup_runs,
    }
    session.runner = runner
    started_ns = clock()
    for test in tests:
        if runner is not None and in_process.name == session.ours_name:
            runner.run(test)
        for program in programs:
            record = llama_bench_bin.run_test(str(program.info.path), str(path), test, cfg.reps, n_threads,
                                              program.name)
            if "build" not in engine_settings[program.name]:  # its identity and settings, from its first record
                engine_settings[program.name].update(llama_bench_bin.settings_of(record))
                engine_settings[program.name]["build"] = llama_bench_bin.build_info(record)
            session.binary_results.append(llama_bench_bin.to_result(record, test, program.name))
            advance(f"{test.name} {program.name}")
        if runner is not None and in_process.name != session.ours_name:  # llama.cpp, the reference: second
            runner.run(test)
    session.settings["measured_s"] = (clock() - started_ns) / NS_PER_S
    return build_result(session, gguf, programs)


def notes(session: BinaryCompareSession, programs: list[Program]) -> list[str]:
    """Each program's identity, then what a program does not measure (printed as ``note:`` lines and recorded)."""
    lines = [program_note("yardstick" if p.is_yardstick else "engine", session.settings["engines"][p.name])
             for p in programs]
    return lines + [f"{test}: not measured ({why})" for test, why in llama_bench_bin.NOT_MEASURED.items()]


def program_note(role: str, settings: dict[str, Any]) -> str:
    """``yardstick: llama-bench PATH, build 0c1e570 (1), backends CPU, ...`` from a program's recorded settings."""
    build = settings.get("build", {})
    number = build.get("build_number")  # 0: CMake counted no commits (sources without git history)
    counted = f" ({number})" if number else ""
    return (f"{role}: {settings.get('kind', KIND_BENCH)} {settings.get('path')}, build {build.get('build_commit')}"
            f"{counted}, backends {build.get('backends')}, cpu {build.get('cpu_info') or '-'}, gpu "
            f"{build.get('gpu_info') or '-'}, -ngl {settings.get('n_gpu_layers')}")


def build_result(session: BinaryCompareSession, gguf, programs: list[Program]) -> dict[str, Any]:
    results = session.results()
    prov = provenance()
    for program in programs:  # reference_binary: the yardstick; engine_binary: the engine under test
        settings = session.settings["engines"][program.name]
        key = "reference_binary" if program.is_yardstick else "engine_binary"
        prov[key] = {**{k: settings.get(k) for k in ("kind", "path", "sha256")}, **settings.get("build", {})}
    program_engine = session.config.engine_spec().is_program  # its own arithmetic: no backend or numerics of ours
    ours = session.settings["engines"][session.ours_name]
    return CompareResult(
        ours=session.ours_name,
        reference=session.reference,
        backend="" if program_engine else session.config.backend,
        numerics="" if program_engine else ours.get("numerics", session.config.numerics),
        model=model_description(gguf),
        settings=session.settings,
        provenance=prov,
        results=[r.to_dict() for r in results],
        ratios=session.ratios(),
        ratio_intervals={t: i.to_dict() for t, i in session.intervals().items()},
        ratio_orientation=f"higher is better for ours: throughput {session.ours_name}/{session.reference}",
        extra={"not_measured": dict(llama_bench_bin.NOT_MEASURED), "notes": notes(session, programs)},
    ).to_dict()
