"""validation.progress: the CLI's bar, one per phase, and the silent default."""

from __future__ import annotations

import io

from validation.progress import ProgressBar, silent


def test_one_bar_per_phase_restarted_when_the_phase_changes():
    out = io.StringIO()
    with ProgressBar(file=out) as bar:
        bar("corpus KLD, 2 windows of 64", 0, 6)
        bar("corpus KLD, 2 windows of 64", 4, 6)
        first = bar._bar
        assert first.n == 4 and first.total == 6
        bar("decode steps at depth 0, 512", 1, 10)
        assert bar._bar is not first and bar._bar.n == 1 and bar._bar.total == 10
    assert bar._bar is None  # closed with the run
    text = out.getvalue()
    assert "corpus KLD, 2 windows of 64" in text and "4/6" in text and "decode steps at depth 0, 512" in text


def test_silent_takes_the_hook_arguments_and_shows_nothing(capsys):
    assert silent("phase", 1, 2) is None
    assert capsys.readouterr() == ("", "")
