"""The CLI shell: exit codes and one-line errors, whatever the command."""

import click
import pytest

from bench_compare import cli
from inference_engine.errors import GGUFParityError


@pytest.fixture
def extra_command():
    added = []

    def add(fn):
        cli.cli.add_command(fn)
        added.append(fn.name)
        return fn

    yield add
    for name in added:
        cli.cli.commands.pop(name, None)


def test_ctx_exit_code_is_returned(extra_command):
    @extra_command
    @click.command("exit-one")
    @click.pass_context
    def exit_one(ctx):
        ctx.exit(1)

    assert cli.main(["exit-one"]) == 1


def test_user_error_is_one_line_exit_2(extra_command, capsys):
    @extra_command
    @click.command("bad-input")
    def bad_input():
        raise GGUFParityError("thing is wrong;\n supported: a, b")

    assert cli.main(["bad-input"]) == 2
    err = capsys.readouterr().err
    assert err == "error: thing is wrong; supported: a, b\n"


def test_unknown_command_and_bad_flag_exit_2(capsys):
    assert cli.main(["no-such-command"]) == 2
    assert cli.main(["models", "--no-such-flag"]) == 2


def test_every_registered_command_imports():
    ctx = click.Context(cli.cli)
    for name in cli.COMMANDS:
        assert cli.cli.get_command(ctx, name) is not None, name


# The commands that run an engine on a model, and the spellings each must take for the model and the threads:
# a user moving from one command to the next (compare -> validate) types the same flags.
ENGINE_COMMANDS = ("bench", "compare", "generate", "serve", "validate")


@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_model_and_threads_are_spelled_alike_on_every_command(name):
    command = cli.cli.get_command(click.Context(cli.cli), name)
    spellings = {p.name: set(p.opts) for p in command.params if isinstance(p, click.Option)}
    assert {"-m", "--model"} <= spellings["model"], spellings["model"]
    assert {"-t", "--threads"} <= spellings["threads"], spellings["threads"]
