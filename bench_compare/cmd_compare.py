"""``bench-compare compare``: our engine and llama.cpp side by side (see :mod:`bench_compare.compare_run`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from bench_compare import (
    bandwidth,
    binary_compare,
    compare_run,
    engines,
    generate_timing,
    intervals,
    llama_bench_bin,
    report,
    yardstick,
)
from bench_compare.cmd_bench import parse_positive_int
from bench_compare.measure import DEFAULT_SEED
from bench_compare.options import Number, OutputFile, ReportDir, device_option, given_on_command_line, table_default
from bench_compare.results import REFERENCE_ENGINE
from inference_engine import defaults
from inference_engine.backends import BACKENDS
from inference_engine.errors import GGUFParityError
from inference_engine.registries import numerics_help
from inference_engine.store.atomic import atomic_write_json
from inference_engine.store.named_models import DEFAULT_MODEL
from validation.results import CompareResult


def _quick_or_given(name: str, flag: str, text: str, quick: bool, quick_value: int) -> int:
    """--quick lowers a default (repetitions, cold starts); a value given on the command line still wins, even one
    equal to the default."""
    if quick and not given_on_command_line(name):
        return quick_value
    return parse_positive_int(text, flag)


def _optional_int(text: str | None, flag: str, minimum: int) -> int | None:
    return None if text is None else parse_positive_int(text, flag, minimum)


def _depths(text: str | None) -> tuple[int, ...] | None:
    """-d: one depth (``512``) or a comma list (``4096,16384``), each >= 0; None when not given."""
    if text is None:
        return None
    if "," not in text:
        return (parse_positive_int(text, "-d", 0),)
    from bench_compare.adapters.http_cli import parse_int_list

    return tuple(parse_int_list(text, "-d", [], 0))


@click.command("compare")
@click.option("--model", "-m", "model", metavar="MODEL", default=DEFAULT_MODEL, show_default=True,
              help="Named model or .gguf path.")
@click.option("--backend", metavar="BACKEND", default=None,
              help=f"{' | '.join(BACKENDS)}{table_default(defaults.COMMANDS, 'backend')}")
@engines.engine_options("Engine to compare with llama.cpp instead of ours:<backend>")
@device_option()
@click.option("--numerics", metavar="MODE", default=None,
              help=f"{numerics_help()} (our engine; ggml: llama.cpp's own arithmetic, so both do the same work)"
                   f"{table_default(defaults.COMMANDS, 'numerics')}")
@click.option("-p", "n_prompt", metavar="N", default=None,
              help="Prompt size (default 512, llama-bench's; smaller only to fit the context or --budget).")
@click.option("-n", "n_gen", metavar="N", default=None,
              help="Generated tokens (default 128, llama-bench's; smaller only to fit the context or --budget).")
@click.option("-d", "n_depth", metavar="N[,N...]", default=None,
              help="Depths: pp and tg run again at each, e.g. -d 4096,16384 (default 512, scaled; 0: none).")
@click.option("-r", "reps", metavar="N", default=str(compare_run.DEFAULT_REPS), show_default=True,
              help="Repetitions (the least, with --precision); HTTP engines: rounds of each test and concurrency "
                   "level, the sides interleaved.")
@click.option("--precision", metavar="PCT", default=None,
              help="Repeat each test (paired, interleaved) until its ratio's 95% confidence interval is within "
                   "+-PCT, e.g. 5%, or --max-reps is reached.")
@click.option("--max-reps", metavar="N", default=str(compare_run.DEFAULT_MAX_REPS), show_default=True,
              help="With --precision: the most repetitions per test.")
@click.option("-t", "--threads", "threads", metavar="N", default=None,
              help=f"Threads for both engines.{table_default(defaults.COMMANDS, 'threads')}")
@click.option("--cold-reps", metavar="N", default=str(compare_run.DEFAULT_COLD_REPS), show_default=True,
              help="Fresh-process cold starts per engine.")
@click.option("--no-cold", is_flag=True, help="Skip cold TTFT and peak RSS (the subprocess runs).")
@click.option("--quick", is_flag=True,
              help=f"Small fixed preset for CI: -p {compare_run.QUICK_SIZES[0]} -n {compare_run.QUICK_SIZES[1]} "
                   f"-d {compare_run.QUICK_SIZES[2]} -r {compare_run.QUICK_REPS}, {compare_run.QUICK_COLD_REPS} "
                   "cold run each; any of them given on the command line wins.")
@click.option("--budget", metavar="SECONDS", default=compare_run.DEFAULT_BUDGET_S, type=Number(0.0, lo_open=True),
              help="Shrink the sizes not given with -p/-n/-d until the measurements are projected (from a short "
                   "probe) to take at most SECONDS. Default: no budget, llama-bench's sizes.")
@click.option("--prompt", metavar="TEXT", default=None,
              help="Text prompt for TTFT (default: a built-in ~110-token paragraph).")
@click.option("--seed", metavar="N", default=str(DEFAULT_SEED), show_default=True,
              help="The random prompts' seed. HTTP engines: drawn anew for each run unless given (a server kept "
                   "running would serve a repeated prompt from its prefix cache).")
@click.option("--json", "json_path", metavar="PATH", default=None, type=OutputFile(),
              help="Write the result JSON here.")
@click.option("--report", "report_dir", metavar="DIR", default=None, type=ReportDir(empty=False),
              help="Write report.md + ratios.png (+ compare.json) here.")
@click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr.")
@click.option("--against", metavar="REF", default="llamacpp-server", show_default=True,
              help="The yardstick. An engine in this process: llamacpp (llama.cpp in this process; its default) | "
                   "llama-bench:PATH (your own llama.cpp llama-bench, any backend: CUDA, Vulkan, ROCm, Metal, CPU). "
                   "HTTP engines: llamacpp-server (started here) | llama-server:PATH (your own llama-server, "
                   "started here) | llamacpp (in-process) | none.")
@click.option("--concurrency", metavar="LIST", default="1", show_default=True,
              help="HTTP engines only: concurrent clients per sweep level, e.g. 1,4,16.")
@click.option("--warmup", metavar="N", default="2", show_default=True, help="HTTP engines only: warm-up requests.")
@click.option("--requests-per-client", metavar="N", default="2", show_default=True,
              help="HTTP engines only: requests each client sends per concurrency level.")
@click.option("-c", "n_ctx", metavar="N", default="2048", show_default=True,
              help="HTTP engines only: context of the llama.cpp server / in-process reference.")
def compare(model, backend, engine, engine_opts, numerics, n_prompt, n_gen, n_depth, reps, precision, max_reps,
            threads, cold_reps, no_cold, quick, budget, prompt, seed, json_path, report_dir, progress, against,
            concurrency, warmup, requests_per_client, n_ctx, device) -> None:
    """Benchmark our engine and llama.cpp side by side, interleaved: pp, tg, tg @ depth, hot and cold TTFT and
    peak RSS, with ratios (higher is better for ours). With --engine openai:URL: a serving benchmark over HTTP."""
    spec = engines.parse_engine_spec(engine, engines.parse_engine_opts(engine_opts)) if engine else None
    if spec is not None:
        engines.check_timed(spec)
        engines.with_device(spec, device)  # --device is our engine's: refused for any other
    yard = yardstick.parse_against(against)
    http = spec is not None and spec.over_http
    program = spec is not None and spec.is_program  # llama-bench:PATH, your benchmark program: binary_compare
    if http and yard is not None and yard.kind != yardstick.KIND_SERVER:
        raise GGUFParityError(f"--against {yard.kind}:PATH measures an in-process engine; an HTTP engine's yardstick "
                              "is llama-server:PATH (your own llama-server, started here)")
    if not http and yard is not None and yard.kind != yardstick.KIND_BENCH:
        raise GGUFParityError(f"--against {yard.kind}:PATH is the yardstick of an HTTP engine (--engine openai:URL); "
                              "for an in-process engine use --against llama-bench:PATH")
    if not http and yard is None and against != IN_PROCESS_REFERENCE and given_on_command_line("against"):
        raise GGUFParityError(f"--against {against}: an engine in this process is measured against llamacpp "
                              "(llama.cpp in this process, the default) or llama-bench:PATH (your own build); "
                              "llamacpp-server, llama-server:PATH and none are for an engine over HTTP (--engine "
                              "openai:URL); bench times one engine alone")
    not_ours = spec is not None and (program or spec.is_reference)
    _refuse_other_mode_flags(http, spec.name if not_ours else None)  # after the yardstick: the bigger mistake
    if http:
        return _http_compare(spec, against, model, threads, n_ctx, n_prompt, n_gen, n_depth, reps, concurrency, warmup,
                             requests_per_client, seed, json_path, report_dir, progress, quick)
    if no_cold and given_on_command_line("cold_reps"):
        raise GGUFParityError("--cold-reps counts the cold starts that --no-cold skips: give one or the other")
    budget_s = None if budget is None else float(budget)
    depths = _depths(n_depth)
    run = defaults.COMMANDS.resolve(backend=backend or (spec.backend if spec is not None else None),
                                    numerics=numerics, threads=_optional_int(threads, "-t", 1))
    cfg = compare_run.CompareConfig(
        model=model, backend=run.backend, numerics=run.numerics, engine=engine,
        engine_opts=engines.parse_engine_opts(engine_opts), device=device,
        n_prompt=_optional_int(n_prompt, "-p", 1), n_gen=_optional_int(n_gen, "-n", 1),
        n_depth=None if depths is None else max(depths), depths=depths if depths and len(depths) > 1 else None,
        reps=_quick_or_given("reps", "-r", reps, quick, compare_run.QUICK_REPS),
        precision=None if precision is None else intervals.parse_precision(precision),
        max_reps=parse_positive_int(max_reps, "--max-reps", 2),
        cold_reps=_quick_or_given("cold_reps", "--cold-reps", cold_reps, quick, compare_run.QUICK_COLD_REPS),
        n_threads=run.threads, cold=not no_cold, quick=quick,
        seed=parse_positive_int(seed, "--seed", 0), budget_s=budget_s,
        prompt=prompt if prompt is not None else compare_run.DEFAULT_TTFT_PROMPT,
    )
    cfg.validate()
    binary = yard is not None or program  # a program on one side or both: binary_compare
    session = binary_compare.BinaryCompareSession(cfg) if binary else compare_run.CompareSession(cfg)
    from tqdm import tqdm

    bar = None  # made once the work is counted: an error before it (a bad program, a file) prints no bar first

    def set_total(n: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=n, file=sys.stderr, disable=not progress, desc="compare", unit="run", leave=False,
                       mininterval=0.5 if sys.stderr.isatty() else 10.0)
        else:
            bar.reset(total=n)

    def advance(desc: str) -> None:
        if bar is not None:
            bar.set_description(desc)
            bar.update(1)

    def say(text: str) -> None:
        if bar is not None:
            bar.clear()
        click.echo(text, err=True)

    def close_bar() -> None:
        if bar is not None:
            bar.close()

    t0 = time.monotonic()
    try:
        if not binary:
            result = compare_run.run_compare(cfg, session, progress=set_total, advance=advance, say=say)
        else:
            result = binary_compare.run_binary_compare(cfg, yard, session, progress=set_total, advance=advance,
                                                       say=say)
    except (KeyboardInterrupt, llama_bench_bin.BinaryFailed) as exc:
        close_bar()
        partial = _partial_result(session)
        if partial["results"]:
            what = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{exc.program} failed"
            click.echo(f"{what}; measured so far (nothing was written):")
            click.echo(report.compare_table(partial))
        raise
    except BaseException:
        close_bar()
        raise
    close_bar()
    elapsed = time.monotonic() - t0
    result["settings"]["wall_s"] = round(elapsed, 1)

    click.echo(f"\n{report.compare_summary_line(result)}")
    if result["settings"].get("sizes_note"):
        click.echo(f"note: {result['settings']['sizes_note']}")
    for line in generate_timing.timing_notes(result):  # an engine that only generates: whose clock timed what
        click.echo(f"note: {line}")
    for line in result.get("notes", []):  # a binary yardstick: what it does not measure
        click.echo(f"note: {line}")
    for line in result.get("noise", {}).get("warnings", []):  # bench_compare.noise: was the machine quiet?
        click.echo(f"warning: {line}")
    click.echo("")
    click.echo(report.compare_table(result))
    click.echo(report.verdict_line(result))
    wall = bandwidth.memory_wall_lines(result)
    if wall:
        click.echo("\n" + "\n".join(wall))
    phases = report.cold_phase_table(result)
    if phases:
        click.echo("\ncold start phases:\n" + phases)
    projected = result["settings"].get("projected_s")
    measured = result["settings"].get("measured_s")
    took = f"\ncompare took {elapsed:.0f} s"
    if projected is not None and measured is not None:
        took += f" (measurements {measured:.0f} s, projected {projected:.0f} s)"
    click.echo(took)
    if json_path:
        atomic_write_json(json_path, result)
        click.echo(f"json: {json_path}")
    if report_dir:
        out = Path(report_dir)
        atomic_write_json(out / "compare.json", result)
        loaded = report.load_result(out / "compare.json")
        click.echo(f"report: {report.write_report([loaded], out)}")


# An in-process compare's named yardstick (besides llama-bench:PATH); --against's default names the HTTP one.
IN_PROCESS_REFERENCE = "llamacpp"
# The flags of one mode that the other has no use for (click's parameter names -> the flag as typed)
OURS_ONLY = {"backend": "--backend", "numerics": "--numerics"}  # how our engine computes: not a program's
IN_PROCESS_ONLY = {**OURS_ONLY, "precision": "--precision", "max_reps": "--max-reps", "cold_reps": "--cold-reps",
                   "no_cold": "--no-cold", "budget": "--budget", "prompt": "--prompt"}
HTTP_ONLY = {"concurrency": "--concurrency", "warmup": "--warmup", "requests_per_client": "--requests-per-client",
             "n_ctx": "-c"}


def _refuse_other_mode_flags(http: bool, not_ours: str | None = None) -> None:
    """A flag given on the command line that this mode would ignore is an error (one line, exit 2), not a silent
    no-op: an HTTP run has no --precision, an in-process run no --concurrency, an engine under test that is not ours
    (``not_ours``: its ``--engine`` spec, a benchmark program or llama.cpp itself) no --backend or --numerics."""
    given = [flag for name, flag in (IN_PROCESS_ONLY if http else HTTP_ONLY).items() if given_on_command_line(name)]
    if not given and not_ours:
        given = [flag for name, flag in OURS_ONLY.items() if given_on_command_line(name)]
        if given:
            raise GGUFParityError(f"{', '.join(given)} not used with --engine {not_ours}: that engine computes in its "
                                  "own way, and llama.cpp runs as compare always runs it")
    if not given:
        return
    if http:
        raise GGUFParityError(f"{', '.join(given)} not used by an HTTP compare (--engine openai:URL | llamacpp-server);"
                              " it takes -p -n -d -r (rounds per test and concurrency level), -t, --concurrency, "
                              "--requests-per-client, --warmup, -c, --seed")
    raise GGUFParityError(f"{', '.join(given)} only for an HTTP engine (--engine openai:URL | llamacpp-server); this "
                          "compare runs engines in-process")


def _http_prompt_seed(seed: str) -> tuple[int, bool]:
    """(seed, given): --seed as given, else one drawn for this run, so a rerun against a server kept running does
    not send it prompts its prefix cache holds from the last run."""
    if given_on_command_line("seed"):
        return parse_positive_int(seed, "--seed", 0), True
    import secrets

    return secrets.randbelow(1 << 31), False


def _http_compare(spec, against, model, threads, n_ctx, n_prompt, n_gen, n_depth, reps, concurrency, warmup,
                  requests_per_client, seed, json_path, report_dir, progress, quick):
    """``compare --engine openai:URL | llamacpp-server``: the serving benchmark (bench_compare.adapters)."""
    from bench_compare.adapters import http_cli
    from bench_compare.adapters.http_bench import HttpBenchConfig

    quick_sizes = ([64], [16], [0]) if quick else ([512], [128], [0])
    cfg = HttpBenchConfig(
        n_prompt=http_cli.parse_int_list(n_prompt, "-p", quick_sizes[0], 1),
        n_gen=http_cli.parse_int_list(n_gen, "-n", quick_sizes[1], 1),
        depths=http_cli.parse_int_list(n_depth, "-d", quick_sizes[2], 0),
        concurrency=http_cli.parse_int_list(concurrency, "--concurrency", [1], 1),
        reps=parse_positive_int(reps, "-r"), warmup=parse_positive_int(warmup, "--warmup", 0),
        requests_per_client=parse_positive_int(requests_per_client, "--requests-per-client"),
    )
    cfg.seed, cfg.seed_given = _http_prompt_seed(seed)
    http_cli.run_compare(spec=spec, against=against, model=model, threads=_optional_int(threads, "-t", 1),
                         n_ctx=parse_positive_int(n_ctx, "-c"), cfg=cfg, json_path=json_path,
                         report_dir=report_dir, progress=progress)


def _partial_result(session: compare_run.CompareSession) -> dict:
    results = session.results()
    reference = getattr(session, "reference", REFERENCE_ENGINE)  # a binary yardstick's own name
    return CompareResult(ours=session.ours_name, reference=reference, results=[r.to_dict() for r in results],
                         ratios=session.ratios(),
                         ratio_intervals={t: i.to_dict() for t, i in session.intervals().items()}).to_dict()
