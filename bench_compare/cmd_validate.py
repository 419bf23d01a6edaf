"""``bench-compare validate``: diff our engine against llama.cpp (or our NumPy backend) tensor by tensor.

By default each of our tensors is computed from llama.cpp's own inputs (teacher-forced) and gated; the free-running
comparison is reported beside it, its logits gated against llama.cpp's own noise floor. ``--free-running`` gates the
free-running comparison instead.

Exit codes: 0 every check passed, 1 a check failed (the report is still written), 2 bad input (one line on stderr,
no report). The work is :func:`validation.run.validate`; this module only parses flags and presents the result.
Backend, numerics and threads default to :data:`inference_engine.defaults.VALIDATE`: the commands' defaults, but our
K/V cache in F32, as the llama.cpp reference's (the table's one exception; its docstring says why).
"""

from __future__ import annotations

import sys
from contextlib import nullcontext

import click

from bench_compare import engines
from bench_compare.options import (
    NON_NEGATIVE,
    POSITIVE,
    OutputFile,
    ReportDir,
    device_option,
    given_on_command_line,
    table_default,
)
from inference_engine import defaults
from inference_engine.backends import BACKENDS
from inference_engine.errors import CheckFailed, GGUFParityError
from validation.metrics import PRECISIONS
from validation.run import REFERENCES


class ValidationFailed(CheckFailed):
    """A validation that ran to the end and found a difference: exit code 1, not a user error (exit 2)."""


# The in-process checks' flags (click's parameter names -> the flag as typed). An HTTP engine is judged on the
# top-k log-probabilities it returns, so a run over HTTP would ignore each of them: given, they are an error.
IN_PROCESS_ONLY = {"backend": "--backend", "numerics": "--numerics",
                   "logit_lens": "--logit-lens", "corpus": "--corpus", "free_running": "--free-running",
                   "decode_steps": "--decode-steps", "depth": "--depth", "corpus_kld": "--corpus-kld", "ctx": "--ctx"}
HTTP_FLAGS = "--prompt, --smoke-tokens, --top-k, --threads, --precision, --against llamacpp|numpy|recording:DIR"
# A flag that only shapes another check, given without that check, would do nothing, silently: a user who asked for
# --depth 600 would read a verdict without it. (its name, the check's name, the error)
SHAPES_ANOTHER = (("depth", "decode_steps", "--depth sets where the decode steps run; without --decode-steps N it "
                   "does nothing (--decode-steps 4 --depth 0,600: four steps at each depth)"),
                  ("ctx", "corpus_kld", "--ctx sets --corpus-kld's window; without --corpus-kld it does nothing"))


def _refuse_ignored_flags(http_engine: str | None, values: dict) -> None:
    """One line, exit 2, for a flag given on the command line that this run would ignore (see above)."""
    if http_engine:
        given = [flag for name, flag in IN_PROCESS_ONLY.items() if given_on_command_line(name)]
        if given:
            raise GGUFParityError(f"{', '.join(given)} not used with --engine {http_engine}: an engine over HTTP is "
                                  f"validated on its top-k log-probabilities ({HTTP_FLAGS}); tensors, decode steps "
                                  "and the corpus KLD need an engine in this process")
        return
    for name, check, error in SHAPES_ANOTHER:
        if given_on_command_line(name) and not values[check]:
            raise GGUFParityError(error)


@click.command("validate")
@click.option("--model", "-m", default="smollm2-135m", show_default=True,
              help="A named model or a path to a .gguf file.")
@click.option("--backend", default=None,
              help=f"Our backend: {', '.join(BACKENDS)}.{table_default(defaults.VALIDATE, 'backend')}")
@engines.engine_options("Engine under test instead of ours:<backend>")
@device_option("Where our engine under test computes (the --against numpy reference: the CPU)")
@click.option("--numerics", default=None,
              help="ggml (emulate llama.cpp's CPU rounding; strict thresholds) or f32 (plain float32; loose)."
                   f"{table_default(defaults.VALIDATE, 'numerics')}")
@click.option("--precision", default=None, type=click.Choice(PRECISIONS, case_sensitive=False),
              help="The precision class the engine is judged in: ggml (claims llama.cpp's own CPU arithmetic: "
                   "strict fixed gates) or f32 | f16 | bf16 (gates from llama.cpp's own variance for that class). "
                   "Default: what the engine declares; ours: its --numerics; other engines: f32.")
@click.option("--prompt", default=None, help="Text to run through both engines (default: a built-in sentence).")
@click.option("--against", default="llamacpp", show_default=True,
              help=f"Reference engine: {', '.join(REFERENCES)}, or recording:DIR (a --record-reference directory: "
                   "llama.cpp's answers replayed where it cannot run). numpy: our NumPy engine in --numerics; in "
                   "ggml it computes llama.cpp's variants too (not flash attention), in f32 it is a float32 twin "
                   "with none.")
@click.option("--record-reference", "record_reference", default=None, type=ReportDir(), metavar="DIR",
              help="Also write every answer of the reference (and its variants) to DIR, for --against "
                   "recording:DIR on another machine; written only when the run finishes.")
@click.option("--logit-lens", is_flag=True, help="Also compare every layer's l_out through the output head.")
@click.option("--corpus", default=None, metavar="FILE.jsonl",
              help="Tokenizer parity corpus, one {\"text\": ...} per line (default: the built-in corpus).")
@click.option("--smoke-tokens", default=16, show_default=True, type=NON_NEGATIVE,
              help="Greedy tokens generated by both engines (0: skip).")
@click.option("--threads", "-t", default=None, type=POSITIVE,
              help=f"Threads for both engines.{table_default(defaults.VALIDATE, 'threads')}")
@click.option("--free-running", "free_running", is_flag=True,
              help="Gate the free-running comparison (each engine on its own values end to end) at the per-op "
                   "thresholds instead of the teacher-forced one (each op given the reference's inputs); the other "
                   "is reported either way.")
@click.option("--name-map", "name_map", default=None, metavar="FILE",
              help="For dump:/cmd: engines: their tensor names -> llama.cpp's (JSON object or 'theirs = ours' "
                   "lines); the same as --engine-opt name_map=FILE.")
@click.option("--decode-steps", "decode_steps", default=0, show_default=True, type=NON_NEGATIVE,
              help="Teacher-forced decode steps (llama.cpp's 1-token graph) compared per tensor at each --depth.")
@click.option("--depth", default="0", show_default=True, metavar="D[,D...]",
              help="Prefix lengths (tokens of the built-in long text) prefilled in chunks before the decode steps "
                   "(with --decode-steps); the prefix's last chunk is compared per tensor too.")
@click.option("--corpus-kld", "corpus_kld", default=None, is_flag=False, flag_value="builtin", metavar="[FILE.txt]",
              help="llama-perplexity's KLD statistics over a text (default: the built-in public-domain text), ours "
                   "and llama.cpp's own variant against llama.cpp.")
@click.option("--ctx", default=512, show_default=True, type=POSITIVE,
              help="Window of --corpus-kld (as llama-perplexity -c).")
@click.option("--json", "json_path", default=None, type=OutputFile(), metavar="PATH",
              help="Also write the result JSON here.")
@click.option("--report", "report_dir", default=None, type=ReportDir(), metavar="DIR",
              help="Report directory (default: reports/validate/<model>-<backend>-<numerics>-<timestamp>/).")
@click.option("--progress/--no-progress", default=None,
              help="A progress bar on stderr for --corpus-kld and --decode-steps (default: if a terminal).")
@click.option("--top-k", "top_k", default=5, show_default=True, type=int,
              help="Engines that give top-k log-probabilities only (HTTP servers, mistralrs:, GeneratingEngine "
                   "plugins): log-probabilities per position to compare. Refused for an engine with full logits.")
def validate(model, backend, engine, engine_opts, numerics, precision, prompt, against, record_reference, logit_lens,
             corpus, smoke_tokens, threads, free_running, decode_steps, depth, corpus_kld, ctx, name_map, json_path,
             report_dir, top_k, device, progress) -> None:
    """Diff our engine against a reference tensor by tensor; exit 0 pass, 1 fail, 2 bad input. With --engine
    openai:URL (or llamacpp-server): top-k log-probabilities against llama.cpp in-process, or a recording of it
    (no tensors over HTTP).

    Our K/V cache is F32 here (the other commands': F16), as the reference's: llama.cpp runs an F32 K/V cache
    without flash attention, and decode steps copy its K/V into ours (--engine ours:B --engine-opt kv_type=f16
    for F16)."""
    if name_map is not None:
        if not engine:
            raise GGUFParityError("--name-map applies to an --engine that reads dumps (dump:DIR, 'cmd:...')")
        engine_opts = (*engine_opts, f"name_map={name_map}")
    spec = engines.parse_engine_spec(engine, engines.parse_engine_opts(engine_opts)) if engine else None
    if spec is not None:
        spec = engines.with_device(spec, device)  # our engine's option; refused for any other engine
    _refuse_ignored_flags(spec.name if spec is not None and spec.over_http else None,
                          {"decode_steps": decode_steps, "corpus_kld": corpus_kld})
    run = defaults.VALIDATE.resolve(backend=backend, numerics=numerics, threads=threads, device=device)
    if spec is not None and spec.over_http:
        if record_reference is not None:
            raise GGUFParityError("--record-reference records the in-process checks (validate without an HTTP "
                                  "--engine); an HTTP engine replays such a recording with --against recording:DIR")
        from bench_compare.adapters import http_cli

        result = http_cli.run_validate(spec=spec, model=model, prompt=prompt, threads=threads,
                                       n_tokens=smoke_tokens, top_k=top_k, json_path=json_path,
                                       report_dir=report_dir, against=against, precision=precision)
        if not result["passed"]:
            failed = [name for name, ok in result["checks"].items() if not ok]
            raise ValidationFailed(f"HTTP validation failed: {', '.join(failed)}")
        return
    from validation.progress import ProgressBar, silent
    from validation.report import check_report_target, default_report_dir, print_result, write_json, write_report_dir
    from validation.run import ValidateOptions
    from validation.run import validate as run_validate

    options = ValidateOptions(model=model, backend=run.backend, numerics=run.numerics, prompt=prompt,
                              precision=precision and precision.lower(),
                              top_k=top_k if given_on_command_line("top_k") else None,
                              against=against, logit_lens=logit_lens, corpus=corpus, smoke_tokens=smoke_tokens,
                              threads=run.threads, kv_type=run.kv_type, device=run.device,
                              free_running=free_running, decode_steps=decode_steps, depth=depth,
                              corpus_kld=corpus_kld, ctx=ctx,
                              record_reference=None if record_reference is None else str(record_reference))
    ours_opener = None
    if spec is not None and spec.backend is not None and set(spec.engine_options()) <= {"device"}:
        options.backend = spec.backend  # ours:<backend> (--engine-opt device=D): the same as --backend (--device D)
        options.device = spec.engine_options().get("device", options.device)
    elif spec is not None:
        options.engine = spec.name

        def ours_opener(opts, model_path):
            kv = {"kv_type": opts.kv_type} if spec.scheme == "ours" and "kv_type" not in spec.engine_options() else {}
            return engines.make_engine(spec, model_path, n_threads=opts.threads, n_ctx=opts.n_ctx,
                                       numerics=opts.numerics, **kv)
    options.check()
    if report_dir:
        check_report_target(report_dir)
    show = sys.stderr.isatty() if progress is None else progress
    with ProgressBar() if show else nullcontext(silent) as bar:
        options.progress = bar
        result = run_validate(options, ours_opener=ours_opener)
    print_result(result)
    directory = write_report_dir(result, report_dir or default_report_dir(result))
    click.echo(f"report: {directory}")
    if json_path:
        click.echo(f"json: {write_json(result, json_path)}")
    if result.get("interrupted"):  # Ctrl-C in a minutes-long check: what finished is written, then exit 130
        click.echo(f"interrupted during {result['interrupted']}: the report holds the checks that finished", err=True)
        raise click.exceptions.Exit(130)
    if not result["passed"]:
        failed = [name for name, ok in result["checks"].items() if ok is False]
        raise ValidationFailed(f"validation failed: {', '.join(failed)}"
                               + (f" (first failing tensor: {result['first_failure']})"
                                  if result.get("first_failure") else ""))
