"""``bench-compare bench``: llama-bench's flags, tests and output formats, for any engine.

``-p``, ``-n``, ``-d`` and ``-t`` take comma lists and llama-bench's ranges (``128-512*2`` = 128,256,512;
``1-4+1``); ``-pg P,N`` may be repeated. Tests run in llama-bench's order (per thread count and depth: every
``pp``, every ``tg``, every ``pg``). Rows are printed as each test finishes (``-o json`` prints the array at the
end); Ctrl-C prints what was measured so far, including a test cut short, and exits 130.

The run is one :class:`validation.results.BenchResult` (provenance, model, settings, a typed row per test): the
printed formats are rendered from its rows, and ``--json FILE`` writes the record itself (atomically, also on
Ctrl-C, marked incomplete) for ``bench-compare report``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

import click

from bench_compare import engines, generate_timing
from bench_compare.llamabench_format import (
    OUTPUT_FORMATS,
    csv_header,
    csv_row,
    format_json,
    format_jsonl_line,
    make_record,
    markdown_footer,
    markdown_header,
    markdown_row,
)
from bench_compare.measure import (
    DEFAULT_N_BATCH,
    DEFAULT_SEED,
    Runner,
    TestSpec,
    pg_test,
    pp_test,
    tg_test,
    token_ids_for_model,
)
from bench_compare.options import OutputFile, device_option, given_on_command_line, table_default
from bench_compare.results import git_info, machine_info, model_description, package_versions, provenance, utc_now
from inference_engine import defaults
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.registries import numerics_help
from inference_engine.store.atomic import atomic_write_json
from inference_engine.store.named_models import DEFAULT_MODEL, resolve_model
from validation.provenance import gpu_provenance
from validation.results import BenchResult, BenchRow

LLAMA_BENCH_DEFAULT_PROMPT = (512,)
LLAMA_BENCH_DEFAULT_GEN = (128,)
LLAMA_BENCH_DEFAULT_REPS = 5

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?:([+*])(\d+))?)?$")


def parse_int_list(values: tuple[str, ...] | list[str], flag: str) -> list[int]:
    """llama-bench's ``parse_int_range`` over one or more occurrences of a flag: ``512``, ``128,256``,
    ``128-512*2``, ``1-8+1``. Negative or non-numeric values are user errors."""
    out: list[int] = []
    for value in values:
        for part in str(value).split(","):
            part = part.strip()
            m = _RANGE.match(part)
            if not m:
                raise GGUFParityError(
                    f"{flag}: '{part}' is not a non-negative integer or range (examples: 512, 128,256, 128-512*2)")
            first = int(m.group(1))
            last = int(m.group(2)) if m.group(2) else first
            op = m.group(3) or "+"
            step = int(m.group(4)) if m.group(4) else 1
            i = first
            while i <= last:
                out.append(i)
                nxt = i + step if op == "+" else i * step
                if nxt <= i:
                    raise GGUFParityError(f"{flag}: range '{part}' does not increase")
                i = nxt
    return out


def parse_positive_int(text: str, flag: str, minimum: int = 1) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise GGUFParityError(f"{flag} must be an integer, got '{text}'") from None
    if value < minimum:
        raise GGUFParityError(f"{flag} must be at least {minimum}, got {value}")
    return value


def parse_pg(values: tuple[str, ...]) -> list[tuple[int, int]]:
    pairs = []
    for v in values:
        parts = str(v).split(",")
        if len(parts) != 2:
            raise GGUFParityError(f"-pg takes two numbers 'PROMPT,GEN' (e.g. -pg 512,128), got '{v}'")
        p, n = (parse_int_list([x], "-pg")[0] for x in parts)
        pairs.append((p, n))
    return pairs


@dataclass(frozen=True)
class BenchPlan:
    threads: list[int]
    depths: list[int]
    prompts: list[int]
    gens: list[int]
    pgs: list[tuple[int, int]]

    def tests(self) -> list[TestSpec]:
        """llama-bench's order for one thread count: per depth, pp tests, tg tests, pg tests; zeros skipped."""
        tests: list[TestSpec] = []
        for d in self.depths:
            tests += [pp_test(p, d) for p in self.prompts if p > 0]
            tests += [tg_test(n, d) for n in self.gens if n > 0]
            tests += [pg_test(p, n, d) for p, n in self.pgs if p > 0 or n > 0]
        return tests


def make_plan(n_prompt, n_gen, pg, n_depth, threads, default_threads: int) -> BenchPlan:
    prompts = parse_int_list(n_prompt, "-p") if n_prompt else list(LLAMA_BENCH_DEFAULT_PROMPT)
    gens = parse_int_list(n_gen, "-n") if n_gen else list(LLAMA_BENCH_DEFAULT_GEN)
    depths = parse_int_list(n_depth, "-d") if n_depth else [0]
    thread_list = parse_int_list(threads, "-t") if threads else [default_threads]
    if any(t < 1 for t in thread_list):
        raise GGUFParityError("-t: thread counts must be at least 1")
    plan = BenchPlan(thread_list, depths, prompts, gens, parse_pg(pg))
    if not plan.tests():
        raise GGUFParityError("nothing to run: every -p, -n and -pg value is 0 (give e.g. -p 512 or -n 128)")
    return plan


class Output:
    """Streams llama-bench output from a :class:`BenchResult`: header first, then each row as it is added to the
    result, footer (json: the array of rows at the end)."""

    def __init__(self, fmt: str, result: BenchResult, stream=None):
        self.fmt, self.result = fmt, result
        self.stream = stream or sys.stdout
        self.started = False

    def emit(self, record: BenchRow) -> None:
        self.result.rows.append(record)
        if not self.started:
            self.started = True
            if self.fmt == "md":
                self._write(markdown_header() + "\n")
            elif self.fmt == "csv":
                self._write(csv_header())
        if self.fmt == "md":
            self._write(markdown_row(record) + "\n")
        elif self.fmt == "csv":
            self._write(csv_row(record))
        elif self.fmt == "jsonl":
            self._write(format_jsonl_line(record))

    def finish(self) -> None:
        if self.fmt == "json":
            self._write(format_json(self.result.rows))
        elif self.fmt == "md" and self.started:
            self._write(markdown_footer(self.result.build_commit, self.result.build_number) + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


@click.command("bench")
@click.option("-m", "--model", "model", default=DEFAULT_MODEL, show_default=True, metavar="MODEL",
              help="Named model or .gguf path.")
@click.option("-p", "--n-prompt", "n_prompt", multiple=True, metavar="N[,N...]", help="Prompt sizes (default 512).")
@click.option("-n", "--n-gen", "n_gen", multiple=True, metavar="N[,N...]", help="Generation sizes (default 128).")
@click.option("-pg", "pg", multiple=True, metavar="P,N", help="Prompt then generate: PROMPT,GEN (repeatable).")
@click.option("-d", "--n-depth", "n_depth", multiple=True, metavar="N[,N...]",
              help="Depths prefilled untimed first (default 0).")
@click.option("-r", "--repetitions", "reps", default=str(LLAMA_BENCH_DEFAULT_REPS), show_default=True, metavar="N",
              help="Repetitions after one warm-up.")
@click.option("-t", "--threads", "threads", multiple=True, metavar="N[,N...]",
              help=f"Thread counts.{table_default(defaults.COMMANDS, 'threads')}")
@click.option("-b", "--batch-size", "n_batch", default=str(DEFAULT_N_BATCH), show_default=True, metavar="N",
              help="Prefill chunk size.")
@click.option("-o", "--output", "fmt", default="md", show_default=True, metavar="FORMAT",
              help="md | json | jsonl | csv")
@engines.engine_options(f"Engine (default: ours:<backend>, backend {defaults.COMMANDS.shown('backend')})")
@device_option()
@click.option("--numerics", default=None, metavar="MODE",
              help=f"{numerics_help()} (our engine; ggml: llama.cpp's own arithmetic, so both do the same work)"
                   f"{table_default(defaults.COMMANDS, 'numerics')}")
@click.option("--seed", default=str(DEFAULT_SEED), show_default=True, metavar="N", help="Seed of the random tokens.")
@click.option("--no-warmup", is_flag=True, help="Skip the warm-up run.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: if a terminal).")
@click.option("--json", "json_path", metavar="PATH", default=None, type=OutputFile(),
              help="Also write the result JSON here (for bench-compare report).")
def bench(model, n_prompt, n_gen, pg, n_depth, reps, threads, n_batch, fmt, engine, engine_opts, numerics, seed,
          no_warmup, progress, json_path, device) -> None:
    """llama-bench compatible benchmark of one engine (pp / tg / pg tests, optional depth)."""
    if fmt not in OUTPUT_FORMATS:
        raise GGUFParityError(f"unknown output format '{fmt}'; choose one of: {', '.join(OUTPUT_FORMATS)}")
    spec = engines.with_llama_bench_kv(engines.with_device(engines.parse_engine_spec(
        engine or f"ours:{defaults.COMMANDS.resolve().backend}", engines.parse_engine_opts(engine_opts)), device))
    run = defaults.COMMANDS.resolve(backend=spec.backend, numerics=numerics)  # numerics: MLX's own where ours:mlx
    numerics = run.numerics
    if spec.over_http:
        raise GGUFParityError(f"bench drives an engine's prefill/decode in this process; '{spec.name}' is reached "
                              "over HTTP: use bench-compare compare --engine SPEC --against none (pp/tg over HTTP)")
    engines.check_timed(spec)
    engines.check_device(spec)
    engines.check_numerics(numerics)
    if spec.is_reference and given_on_command_line("numerics"):  # else recorded as llama.cpp's, untrue
        raise GGUFParityError("--numerics is our engine's: llama.cpp computes in its own arithmetic (bench "
                              "--engine ours:B --numerics MODE, or compare, to set ours)")
    reps_n = parse_positive_int(reps, "-r")
    batch = parse_positive_int(n_batch, "-b")
    seed_n = parse_positive_int(seed, "--seed", minimum=0)
    plan = make_plan(n_prompt, n_gen, pg, n_depth, threads, run.threads)
    tests = plan.tests()

    path = resolve_model(model)
    gguf = open_gguf(path)
    model_desc = model_description(gguf)
    max_ctx = int(model_desc.get("context_length") or 0)
    need = max(t.n_ctx_needed for t in tests)
    if max_ctx and need > max_ctx:
        worst = max(tests, key=lambda t: t.n_ctx_needed)
        raise GGUFParityError(f"test {worst.name} needs {need} tokens of context (depth + prompt + gen) but "
                              f"{path.name} has a context length of {max_ctx}")
    n_ctx = need

    if spec.is_reference:
        v = package_versions()
        build_commit, build_number = v.get("ggml_commit") or "unknown", v.get("ggml") or "unknown"
    else:
        build_commit = git_info()["sha"][:10]
        build_number = f"gguf-parity {package_versions().get('gguf-parity')}"
    cpu = machine_info()["cpu_isa"]  # llama-bench's cpu_info, with the instruction set: "AMD EPYC, AVX2"
    result = BenchResult(provenance=provenance(), backend=spec.backend or "", numerics=numerics, model=model_desc,
                         engine=spec.name, build_commit=build_commit, build_number=build_number,
                         settings={"reps": reps_n, "n_batch": batch, "seed": seed_n, "warmup": not no_warmup,
                                   "threads": plan.threads, "tests": [t.name for t in tests]})
    out = Output(fmt, result)
    show = sys.stderr.isatty() if progress is None else progress
    from tqdm import tqdm

    bar = tqdm(total=len(plan.threads) * len(tests) * (reps_n + (0 if no_warmup else 1)), file=sys.stderr,
               disable=not show, desc="bench", unit="run", leave=False)
    runner = None
    settings = None
    started = utc_now()
    try:
        for n_threads in plan.threads:
            eng = engines.make_engine(spec, path, n_threads=n_threads, n_ctx=n_ctx, numerics=numerics, n_batch=batch)
            result.provenance["machine"]["gpu"] = gpu_provenance()  # known once the engine chose its device
            try:
                settings = engines.engine_settings(spec, n_threads=n_threads, n_ctx=n_ctx, numerics=numerics,
                                                   n_batch=batch, model=path)
                result.settings.setdefault("engine", settings)  # the engine's own (first thread count's)
                allowed = token_ids_for_model(gguf, eng.n_vocab)
                if spec.is_reference:  # llama-bench prints llama.cpp's own description (llama_model_desc)
                    llama_type = eng.model_info.get("model_type", model_desc["model_type"])
                    model_desc = dict(model_desc, model_type=llama_type)
                    result.model = model_desc
                draw = None
                if generate_timing.generate_only(eng):  # it only generates: timed by requests, prompts as text
                    for test in tests:
                        generate_timing.check_test(test, spec.name)
                    draw = generate_timing.text_safe_draw(gguf, seed_n)
                runner = Runner({spec.name: eng}, allowed, reps=reps_n, n_batch=batch, seed=seed_n,
                                warmup=not no_warmup, draw=draw,
                                on_progress=lambda label, test, what: bar.update(1))
                for test in tests:
                    bar.set_description(f"{test.name} t={n_threads}")
                    started = utc_now()  # llama-bench's test_time: when the test started
                    [m] = runner.run(test)
                    out.emit(_record(m, model_desc, settings, build_commit, cpu, started, _gpu_name(result)))
                    if m.timing:  # the row's time is a request's: say whose clock (and keep it in the result)
                        result.settings.setdefault("timing", {})[m.test.name] = m.timing
                        click.echo(f"note: {m.test.name} t={n_threads}: {m.timing}", err=True)
            finally:
                eng.close()
    except KeyboardInterrupt:
        bar.close()
        if runner is not None and runner.measurements:
            last = runner.measurements[-1]
            if not last.complete and last.samples_ns:
                click.echo(f"interrupted: {last.test.name} has {len(last.samples_ns)} of {last.reps_planned} "
                           "samples", err=True)
                out.emit(_record(last, model_desc, settings, build_commit, cpu, started, _gpu_name(result)))
        out.finish()
        result.complete = False
        _save(result, json_path)
        raise
    bar.close()
    out.finish()
    _save(result, json_path)


def _save(result: BenchResult, json_path: str | None) -> None:
    if json_path:
        atomic_write_json(json_path, result.to_dict())
        click.echo(f"json: {json_path}", err=True)


def _gpu_name(result: BenchResult) -> str:
    """llama-bench's ``gpu_info``: the GPU our engine ran on (provenance's ``machine.gpu``), "" on the CPU."""
    return str((result.provenance.get("machine", {}).get("gpu") or {}).get("name") or "")


def _record(m, model_desc, settings, build_commit, cpu, test_time, gpu: str = "") -> BenchRow:
    return make_record(model=model_desc, settings=settings, n_prompt=m.test.n_prompt, n_gen=m.test.n_gen,
                       n_depth=m.test.n_depth, samples_ns=m.samples_ns, test_time=test_time,
                       build_commit=build_commit, cpu_info=cpu, gpu_info=gpu)
