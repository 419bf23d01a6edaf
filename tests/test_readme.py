"""The README's two set-up commands are what a newcomer runs, and CI must run the same test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.strip().splitlines() if line.strip() and not line.startswith("#")]


def test_readme_opens_with_two_setup_commands():
    commands = _readme_commands()
    assert len(commands) == 2, commands
    assert "bench-compare compare" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    test_command = _readme_commands()[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines
