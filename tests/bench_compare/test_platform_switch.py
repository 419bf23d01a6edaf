"""``bench-compare --platform-tricks on|off``: the choice reaches the process (and its children) before any command;
bad values are one line, exit 2."""

from __future__ import annotations

import click
import pytest

from bench_compare import cli
from inference_engine import platform


@pytest.fixture
def fresh_platform(monkeypatch):
    """The process as a new one has it: nothing configured, the variable unset, and both as they were afterwards.
    The CLI writes the variable itself (for its children), so the fixture must record it even when it was unset:
    ``delenv`` of an absent variable records nothing to undo, and an ``off`` left behind would switch the tricks off
    in every later test's child processes."""
    monkeypatch.setattr(platform, "_record", None)
    monkeypatch.setenv(platform.ENV, "unset-by-this-fixture")  # records the variable's state before the test
    monkeypatch.delenv(platform.ENV)


@pytest.fixture
def record_command():
    seen = []

    @click.command("platform-record")
    def platform_record():
        seen.append(platform.applied())

    cli.cli.add_command(platform_record)
    yield seen
    cli.cli.commands.pop("platform-record", None)


def test_off_is_recorded_before_the_command_and_handed_to_children(fresh_platform, record_command):
    assert cli.main(["--platform-tricks", "off", "platform-record"]) == 0
    assert record_command == [{"configured": True, "enabled": False, "by": "--platform-tricks off",
                               **dict.fromkeys(platform.TRICKS, False)}]
    import os

    assert os.environ[platform.ENV] == "off"  # cold-start children run with the same choice


def test_on_applies_nothing_until_the_numba_backend_is_built(fresh_platform, record_command):
    assert cli.main(["--platform-tricks", "on", "platform-record"]) == 0
    assert record_command == [{"configured": False}]


def test_bad_values_are_one_line_exit_2(fresh_platform, record_command, monkeypatch, capsys):
    assert cli.main(["--platform-tricks", "maybe", "platform-record"]) == 2
    assert "'maybe' is not one of 'on', 'off'" in capsys.readouterr().err
    monkeypatch.setenv(platform.ENV, "fast")
    assert cli.main(["platform-record"]) == 2
    err = capsys.readouterr().err
    assert err == "error: GGUF_PARITY_PLATFORM_TRICKS='fast' is not supported: use one of on, off\n"
    assert record_command == []
