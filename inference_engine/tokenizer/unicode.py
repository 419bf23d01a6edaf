"""llama.cpp's own Unicode character classes, for pre-tokenizer regexes that agree with it on every code point.

The BPE pre-tokenizer regexes use ``\\p{L}``, ``\\p{N}``, ``\\p{P}`` and ``\\s``. llama.cpp answers those from its
table src/unicode-data.cpp (generated from the Unicode Character Database current when it was written: Unicode 16
for llama-cpp-python 0.3.36), while the regex engine inside ``tokenizers`` (Oniguruma) has an older Unicode: about
4400 newer code points (e.g. U+1C89, U+A7CB, the Todhri script) are classed differently, and a text holding one
tokenizes differently. llama.cpp itself solves the same problem by "collapsing" text before running a regex: every
non-ASCII code point is replaced by one stand-in per class (src/unicode.cpp, unicode_regex_split). We do the same:
:func:`collapse` maps each non-ASCII character to a stand-in that every Unicode version classes the same way, the
regexes split the collapsed text, and the splits are applied to the original text (same length in code points).

The class table is ``inference_engine/data/llama_cpp_unicode_classes.json``, extracted from llama.cpp's
unicode-data.cpp by ``python -m inference_engine.tokenizer.unicode path/to/unicode-data.cpp``.
"""

from __future__ import annotations

import bisect
import json
import re
import sys
from importlib import resources

CLASSES_RESOURCE = "data/llama_cpp_unicode_classes.json"

# unicode_cpt_flags bits (src/unicode.h)
_NUMBER, _LETTER, _ACCENT_MARK, _PUNCTUATION, _SYMBOL = 0x0002, 0x0004, 0x0010, 0x0020, 0x0040

# One stand-in per class, each classed the same by every Unicode version and by Oniguruma: whitespace (not \r, \n
# or space, which the regexes name), letter, number, punctuation, symbol, mark, and everything else (controls,
# format characters, separators that are not whitespace, unassigned code points).
STAND_INS = {
    "W": "\u2000",  # EN QUAD, Zs
    "L": "\u00c0",  # LATIN CAPITAL LETTER A WITH GRAVE, Lu
    "N": "\u00b2",  # SUPERSCRIPT TWO, No
    "P": "\u00a1",  # INVERTED EXCLAMATION MARK, Po
    "S": "\u00a2",  # CENT SIGN, Sc
    "M": "\u0300",  # COMBINING GRAVE ACCENT, Mn
    "O": "\u0080",  # <control>, Cc
}


def _class_of(flags: int, whitespace: bool) -> str:
    if whitespace:
        return "W"
    for bit, name in ((_LETTER, "L"), (_NUMBER, "N"), (_PUNCTUATION, "P"), (_SYMBOL, "S"), (_ACCENT_MARK, "M")):
        if flags & bit:
            return name
    return "O"


class _CollapseTable(dict):
    """``str.translate`` table: ASCII stays, other code points become their class's stand-in (filled lazily)."""

    def __init__(self, starts: list[int], classes: list[str]):
        super().__init__()
        self._starts = starts
        self._classes = classes

    def __missing__(self, cp: int) -> int:
        if cp < 128:
            value = cp
        else:
            value = ord(STAND_INS[self._classes[bisect.bisect_right(self._starts, cp) - 1]])
        self[cp] = value
        return value


_TABLE: _CollapseTable | None = None


def _table() -> _CollapseTable:
    global _TABLE
    if _TABLE is None:
        data = json.loads(resources.files("inference_engine").joinpath(CLASSES_RESOURCE).read_text("utf-8"))
        starts = [start for start, _ in data["ranges"]]
        classes = [cls for _, cls in data["ranges"]]
        _TABLE = _CollapseTable(starts, classes)
    return _TABLE


def collapse(text: str) -> str:
    """``text`` with every non-ASCII character replaced by the stand-in of its llama.cpp class."""
    return text if text.isascii() else text.translate(_table())


def extract_classes(unicode_data_cpp: str) -> dict:
    """Parse llama.cpp's src/unicode-data.cpp into merged ``[start, class]`` ranges."""
    with open(unicode_data_cpp, encoding="utf-8") as fh:
        source = fh.read()
    flags_part = source[source.index("unicode_ranges_flags") : source.index("unicode_set_whitespace")]
    ws_part = source[source.index("unicode_set_whitespace") : source.index("unicode_map_lowercase")]
    ranges = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}", flags_part)]
    whitespace = sorted(int(h, 16) for h in re.findall(r"0x([0-9A-Fa-f]+)", ws_part))
    # Split the ranges at each whitespace code point so that it gets its own class.
    bounds = sorted({start for start, _ in ranges} | set(whitespace) | {w + 1 for w in whitespace})
    starts = [start for start, _ in ranges]
    merged: list[list] = []
    for start in bounds:
        if start >= 0x110000:
            break
        flags = ranges[bisect.bisect_right(starts, start) - 1][1]
        cls = _class_of(flags, start in whitespace)
        if not merged or merged[-1][1] != cls:
            merged.append([start, cls])
    return {
        "source": "llama.cpp src/unicode-data.cpp (llama-cpp-python 0.3.36): unicode_ranges_flags and "
        "unicode_set_whitespace as classes W whitespace, L letter, N number, P punctuation, S symbol, M mark, O other",
        "ranges": merged,
    }


if __name__ == "__main__":  # regenerate the data file from a llama.cpp checkout
    if len(sys.argv) != 3:
        sys.exit("usage: python -m inference_engine.tokenizer.unicode path/to/unicode-data.cpp out.json")
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        json.dump(extract_classes(sys.argv[1]), out, separators=(",", ":"))
        out.write("\n")
