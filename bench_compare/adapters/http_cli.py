"""The HTTP modes of ``bench-compare compare`` and ``validate`` (``--engine openai:URL`` / ``llamacpp-server`` /
``llama-server:PATH``).

Every engine and server opened here is closed in ``finally`` (servers the harness started are stopped on success,
error and Ctrl-C). A request that fails mid-run ends the run with its one-line error (exit 2), after printing, and
writing where asked, what was measured before it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from bench_compare import engines
from bench_compare.interrupts import remember_interrupts
from inference_engine.errors import GGUFParityError
from inference_engine.store.atomic import atomic_write_json, atomic_write_text

AGAINST_CHOICES = ("llamacpp-server", "llamacpp", "none")


def parse_int_list(text: str | None, flag: str, default: list[int], minimum: int) -> list[int]:
    if text is None:
        return list(default)
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise GGUFParityError(f"{flag} takes integers separated by commas (e.g. 1,4,16), got '{text}'") from None
    if not values or any(v < minimum for v in values):
        raise GGUFParityError(f"{flag} needs integers >= {minimum}, got '{text}'")
    return values


def _close_later(stack: ExitStack, engine):
    stack.callback(engine.close)
    return engine


def _write_outputs(result: dict, markdown: str, json_path: str | None, report_dir: str | None, name: str) -> None:
    if json_path:
        atomic_write_json(json_path, result)
        click.echo(f"json: {json_path}")
    if report_dir:
        out = Path(report_dir)
        atomic_write_json(out / f"{name}.json", result)
        click.echo(f"report: {atomic_write_text(out / 'report.md', markdown)}")


def run_compare(*, spec: engines.EngineSpec, against: str, model: str, threads: int | None, n_ctx: int,
                cfg, json_path: str | None, report_dir: str | None, progress: bool) -> None:
    """``compare --engine openai:URL``: the serving benchmark (see ``http_bench``)."""
    from bench_compare import yardstick
    from bench_compare.adapters import http_bench
    from bench_compare.adapters.llamacpp_server import ONE_REQUEST_AT_A_TIME_NOTE

    yard = yardstick.parse_against(against)  # its kind checked by cmd_compare
    if yard is None and against not in AGAINST_CHOICES:
        raise GGUFParityError(f"--against for an HTTP engine must be one of {', '.join(AGAINST_CHOICES)} or "
                              f"llama-server:PATH, got '{against}'")
    info = yardstick.check_binary(yard) if yard is not None else None  # before anything starts
    cfg.check(n_ctx)
    notes = []
    sides = []
    with ExitStack() as stack:
        slots = {"n_parallel": str(max(cfg.concurrency))} if spec.scheme == "llama-server" else {}  # one a client
        engine = _close_later(stack, engines.make_engine(spec, model, n_threads=threads, n_ctx=n_ctx, **slots))
        engine.model_name  # noqa: B018 - asks /models now: an unreachable URL fails before anything is measured
        prompts = http_bench.PromptMaker(engine.tokenizer, seed=cfg.seed)
        sides.append(_with_settings(http_bench.HttpSide(engine), engine))
        if info is not None:
            from bench_compare.adapters import llama_server_bin

            ref = _close_later(stack, llama_server_bin.open_engine(info, model, n_threads=threads, n_ctx=n_ctx,
                                                                   n_parallel=max(cfg.concurrency)))
            sides.append(_with_settings(http_bench.HttpSide(ref), ref))
        elif against == "llamacpp-server":
            ref = _close_later(stack, engines.make_engine("llamacpp-server", model, n_threads=threads, n_ctx=n_ctx))
            sides.append(_with_settings(http_bench.HttpSide(ref), ref))
        elif against == "llamacpp":
            ref = _close_later(stack, engines.make_engine("llamacpp", model, n_threads=threads, n_ctx=n_ctx))
            side = http_bench.InProcessSide(ref, engine.tokenizer)
            side.settings = ref.model_info
            sides.append(side)
            notes.append("llama.cpp in-process runs one sequence: the concurrency sweep above 1 is HTTP only")
        if any(s.name == "llamacpp-server" for s in sides):
            notes.append(ONE_REQUEST_AT_A_TIME_NOTE)
        measured = http_bench.Measurements()
        import sys

        from tqdm import tqdm

        bar = tqdm(total=http_bench.n_runs(cfg, sides), file=sys.stderr, disable=not progress, desc="http compare",
                   leave=False)

        interrupts = stack.enter_context(remember_interrupts())

        def advance(desc: str) -> None:
            interrupts.check()  # a Ctrl-C that an HTTP stream's finalizer swallowed stops the run here
            bar.set_description(desc)
            bar.update(1)

        error = None
        try:
            http_bench.run_http_bench(cfg, sides, prompts, measured, advance)
        except GGUFParityError as exc:
            error = str(exc)
        except KeyboardInterrupt:
            bar.close()
            result = http_bench.build_result(cfg, sides, measured, model_info=engine.model_info, notes=notes,
                                             error="interrupted")
            click.echo("interrupted; measured so far (nothing was written):")
            click.echo(http_bench.markdown(result))
            raise
        finally:
            bar.close()
        result = http_bench.build_result(cfg, sides, measured, model_info=engine.model_info, notes=notes,
                                         error=error)
    click.echo(http_bench.markdown(result))
    _write_outputs(result, http_bench.markdown(result), json_path, report_dir, "http_compare")
    if error:
        raise GGUFParityError(error)


def _with_settings(side, engine):
    side.settings = dict(engine.model_info)
    return side


# The references an HTTP engine is validated against in this process (validation.run.REFERENCES' openers).
HTTP_REFERENCES = ("llamacpp", "numpy")


def _validation_reference(model: str, threads: int | None, against: str = "llamacpp"):
    """The reference as ``validate`` holds every engine up to, not the benchmark's llama-bench settings, so that the
    verdict over HTTP means what the in-process verdict means: llama.cpp (F32 K/V, flash attention off; its variants
    are the noise floor), or our NumPy engine computing llama.cpp's arithmetic and variants
    (:mod:`validation.numpy_reference`, ggml numerics)."""
    from inference_engine.store.named_models import resolve_model
    from validation.run import REFERENCES, ValidateOptions

    options = ValidateOptions(model=model, threads=threads)  # ggml numerics, F32 K/V: validate's reference settings
    return REFERENCES.get(against)(options, resolve_model(model, progress=False))


def run_validate(*, spec: engines.EngineSpec, model: str, prompt: str | None, threads: int | None, n_tokens: int,
                 top_k: int, json_path: str | None, report_dir: str | None, against: str = "llamacpp",
                 precision: str | None = None) -> dict:
    """``validate --engine openai:URL``: top-k logprob fidelity against llama.cpp in-process (``http_fidelity``), or
    against a recording of it (``--against recording:DIR``, :mod:`validation.recording`), judged in ``precision``'s
    class (None: :data:`validation.precision.DEFAULT_PLUGIN_PRECISION`, a server declares none)."""
    from bench_compare.adapters import http_fidelity
    from validation import recording
    from validation.metrics import THRESHOLD_TABLE
    from validation.precision import DEFAULT_PLUGIN_PRECISION

    precision = THRESHOLD_TABLE.validate(precision.lower()) if precision else DEFAULT_PLUGIN_PRECISION
    if top_k < 1 or n_tokens < 1:
        raise GGUFParityError(f"--top-k and --smoke-tokens must be >= 1 for an HTTP engine, got {top_k}, {n_tokens}")
    recorded = recording.parse_against(against)
    if recorded is None and against not in HTTP_REFERENCES:
        raise GGUFParityError(f"--against {against}: an HTTP engine is validated against "
                              f"{' or '.join(HTTP_REFERENCES)} (in this process) or {recording.PREFIX}DIR")
    from validation.run import DEFAULT_PROMPT  # the in-process validate's: both verdicts are on the same text

    options = {"logits_all": "true"} if spec.scheme == "llamacpp-server" else {}  # its logprobs need logits_all
    text = prompt or DEFAULT_PROMPT
    if recorded is not None:  # checked before the engine is opened or a server started
        from inference_engine.gguf.file import open_gguf
        from inference_engine.store.named_models import resolve_model

        replay = recording.Recording(recorded)
        made_with = recording.recorded_prompt(replay, DEFAULT_PROMPT)
        text = prompt or made_with
        recording.check_replay_over_http(replay, text, made_with, n_tokens, open_gguf(resolve_model(model)).sha256,
                                         precision)
    with ExitStack() as stack:
        engine = _close_later(stack, engines.make_engine(spec, model, n_threads=threads, **options))
        engine.model_name  # noqa: B018 - fail fast on an unreachable URL
        reference = (recording.RecordedEngine(replay) if recorded is not None else
                     _close_later(stack, _validation_reference(model, threads, against)))
        result = http_fidelity.run_http_fidelity(engine, reference, text, n_tokens=n_tokens, top_k=top_k,
                                                 precision=precision)
    if recorded is not None:
        result["recording"] = {"mode": "replayed", **replay.describe()}
    md = http_fidelity.markdown(result)
    click.echo(md)
    _write_outputs(result, md, json_path, report_dir, "http_validate")
    return result

