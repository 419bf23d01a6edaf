"""inference_engine.errors: how an exception's message or foreign text enters an error line (one_line), and a file
the user named read as text with every problem one line (read_user_text)."""

import os

import pytest

from inference_engine.errors import GGUFParityError, one_line, read_user_text


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


def test_a_user_text_file_is_read_as_utf8(tmp_path):
    (tmp_path / "a.txt").write_text("héllo\n", encoding="utf-8")
    assert read_user_text(tmp_path / "a.txt", "text file") == "héllo\n"


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing.txt", "missing.txt: no such text file (UTF-8 please)"),
    (lambda d: d, ": is a directory, not a text file (UTF-8 please)"),
    (lambda d: os.mkfifo(d / "pipe") or d / "pipe", "pipe: is not a regular file, not a text file (UTF-8 please)"),
    (lambda d: (d / "bin.txt").write_bytes(b"ok\x91\xff") and d / "bin.txt",
     "bin.txt: not UTF-8 text (invalid start byte at byte 2); a text file is text (UTF-8 please)"),
])
def test_each_way_a_user_text_file_is_wrong_is_one_line_naming_it(tmp_path, make, message):
    with pytest.raises(GGUFParityError) as caught:
        read_user_text(make(tmp_path), "text file", "UTF-8 please")
    assert str(caught.value).endswith(message) and str(caught.value).startswith(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_user_text_file_is_one_line(tmp_path):
    path = tmp_path / "locked.txt"
    path.write_text("x")
    path.chmod(0)
    with pytest.raises(GGUFParityError, match="locked.txt: cannot read the text file \\(Permission denied\\)"):
        read_user_text(path, "text file")
