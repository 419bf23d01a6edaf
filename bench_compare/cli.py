"""The ``bench-compare`` command line: thin Click commands that parse flags and call library functions.

Each command lives in its own module (``bench_compare/cmd_*.py``) and is imported only when it runs, so that
``bench-compare --help`` and cold start-up stay fast. User mistakes raise ``GGUFParityError`` and end here as one
line on stderr with exit code 2; Ctrl-C exits with 130.
"""

from __future__ import annotations

import importlib
import sys

import click

from inference_engine.errors import GGUFParityError

# command name -> "module:attribute"
COMMANDS: dict[str, str] = {
    "models": "bench_compare.cmd_models:models",
    "inspect": "bench_compare.cmd_inspect:inspect_cmd",
    "generate": "bench_compare.cmd_generate:generate",
    "validate": "bench_compare.cmd_validate:validate",
    "bench": "bench_compare.cmd_bench:bench",
    "compare": "bench_compare.cmd_compare:compare",
    "report": "bench_compare.cmd_report:report",
    "serve": "bench_compare.cmd_serve:serve",
}

COMMAND_HELP: dict[str, str] = {
    "models": "List and fetch the named real models.",
    "inspect": "Print a GGUF file's metadata and tensor table.",
    "generate": "Generate text with our engine (greedy by default).",
    "validate": "Diff our engine against llama.cpp tensor by tensor.",
    "bench": "llama-bench compatible benchmark of one engine.",
    "compare": "Benchmark our engine and llama.cpp side by side.",
    "report": "Merge result JSONs into a report; gate regressions.",
    "serve": "Serve our engine over an OpenAI-compatible HTTP API.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return super().get_command(ctx, name)  # commands added with add_command (plugins, tests)
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMAND_HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gguf-parity")
def cli() -> None:
    """Is my engine computing what llama.cpp computes, and how fast is it next to llama.cpp?"""


def main(argv: list[str] | None = None) -> int:
    try:
        # With standalone_mode=False, click returns a command's ctx.exit(code) as the return value.
        returned = cli.main(args=argv, prog_name="bench-compare", standalone_mode=False)
    except GGUFParityError as exc:
        click.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return returned if isinstance(returned, int) else 0


def entry_point() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
