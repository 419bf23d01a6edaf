"""The ``bench-compare`` command line: thin Click commands that parse flags and call library functions.

Each command lives in its own module (``bench_compare/cmd_*.py``) and is imported only when it runs, so that
``bench-compare --help`` and cold start-up stay fast. User mistakes raise ``GGUFParityError`` and end here as one
line on stderr with exit code 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import sys

import click

from bench_compare.options import choose_platform_tricks
from inference_engine import compile_notice
from inference_engine.errors import CheckFailed, GGUFParityError
from inference_engine.registries import Registry

# click >= 8.2 raises this for a group called without a command; older versions print the help themselves.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())

# command name -> "module:attribute"
COMMANDS: dict[str, str] = {
    "models": "bench_compare.cmd_models:models",
    "inspect": "bench_compare.cmd_inspect:inspect_cmd",
    "generate": "bench_compare.cmd_generate:generate",
    "validate": "bench_compare.cmd_validate:validate",
    "bench": "bench_compare.cmd_bench:bench",
    "compare": "bench_compare.cmd_compare:compare",
    "report": "bench_compare.cmd_report:report",
    "engines": "bench_compare.cmd_engines:engines",
    "serve": "bench_compare.cmd_serve:serve",
    "sweep": "bench_compare.cmd_sweep:sweep",
}

COMMAND_HELP: dict[str, str] = {
    "models": "List and fetch the named real models.",
    "inspect": "Print a GGUF file's metadata and tensor table.",
    "generate": "Generate text with our engine (greedy by default).",
    "validate": "Diff our engine against llama.cpp tensor by tensor.",
    "bench": "llama-bench compatible benchmark of one engine.",
    "compare": "Benchmark our engine and llama.cpp side by side.",
    "report": "Merge result JSONs into a report; gate regressions.",
    "engines": "List every engine --engine accepts (ours, llama.cpp, plugins).",
    "serve": "Serve our engine over an OpenAI-compatible HTTP API.",
    "sweep": "Run a matrix of commands on this machine or a Ray cluster.",
}

COMMAND_REGISTRY: Registry[click.Command] = Registry("command", COMMANDS, base=click.Command)


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMAND_REGISTRY)

    def get_command(self, ctx, name):
        if name not in COMMAND_REGISTRY:
            return super().get_command(ctx, name)  # commands added with add_command (plugins, tests)
        return COMMAND_REGISTRY.get(name)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMAND_HELP.get(name, "")) for name in COMMAND_REGISTRY]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gguf-parity")
@click.option("--platform-tricks", type=click.Choice(["on", "off"]), default=None,
              help="The Numba backend's process-wide tricks (inference_engine.platform: Numba start-up patches, "
                   "glibc's malloc thresholds, LLVM's pages released); default: $GGUF_PARITY_PLATFORM_TRICKS, else "
                   "on.")
def cli(platform_tricks: str | None) -> None:
    """Is my engine computing what llama.cpp computes, and how fast is it next to llama.cpp?"""
    choose_platform_tricks(platform_tricks)


def main(argv: list[str] | None = None) -> int:
    with compile_notice.announcing(lambda text: click.echo(text, err=True)):  # a first run's kernel compile
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    # SIGINT inherited as ignored is left ignored. A background job of a non-interactive shell (a script's `cmd &`,
    # `nohup cmd &`, some CI runners) starts that way so that a terminal's Ctrl-C does not reach it: the launcher's
    # choice, and Python then installs no KeyboardInterrupt handler, so `kill -INT` does nothing either (SIGTERM
    # stops such a run). Ctrl-C handling (exit 130, the Numba compile guard, remember_interrupts) applies wherever
    # SIGINT has Python's default handler. `serve` is the exception, as uvicorn is: its SIGINT and SIGTERM handlers
    # (drain, then stop) are how a server is stopped, whoever started it.
    try:
        # click's own main() would print a blank line on Ctrl-C before its Abort; parse and invoke directly so
        # that an interrupt is the one line below. A command's ctx.exit(code) arrives as click.exceptions.Exit.
        args = list(sys.argv[1:] if argv is None else argv)
        with cli.make_context("bench-compare", args) as ctx:
            returned = cli.invoke(ctx)
    except (GGUFParityError, CheckFailed) as exc:  # exit 2 (bad input) or 1 (a check failed)
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except _NO_ARGS_IS_HELP as exc:  # bare `bench-compare`: the help text, as click shows it
        exc.show()
        return exc.exit_code
    except click.UsageError as exc:  # one line, not click's usage + hint + error block
        click.echo(f"error: {usage_error_line(exc)}", err=True)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return returned if isinstance(returned, int) else 0


def usage_error_line(exc: click.UsageError) -> str:
    """``--seed must be at least 0, got -1`` for a bad value (the flag first), Click's own text otherwise."""
    param = getattr(exc, "param", None)
    if isinstance(exc, click.BadParameter) and param is not None and getattr(param, "opts", None):
        flag = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        if isinstance(param, click.Argument):
            flag = param.human_readable_name
        return " ".join(f"{flag} {exc.message}".split())
    return " ".join(exc.format_message().split())


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
