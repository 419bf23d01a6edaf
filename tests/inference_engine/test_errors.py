"""inference_engine.errors.one_line: how an exception's message or foreign text enters an error line."""

import pytest

from inference_engine.errors import one_line


@pytest.mark.parametrize("what, expected", [
    (ValueError("bad\n  value\tthere"), "bad value there"),
    (KeyError(), "KeyError"),  # no message: the type says what happened
    ("server said:\n\n  no", "server said: no"),
    ("", ""),  # a text with nothing in it stays empty, so a caller's fallback (`or ...`) still applies
])
def test_one_line_flattens_whitespace(what, expected):
    assert one_line(what) == expected


def test_a_cut_line_says_it_was_cut_within_the_limit():
    text = "x" * 50 + "\n" + "y" * 300
    cut = one_line(text, 80)
    assert len(cut) == 80 and cut.endswith("...") and cut.startswith("x" * 50 + " y")
    assert one_line("z" * 80, 80) == "z" * 80  # exactly the limit: nothing cut
