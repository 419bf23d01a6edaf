"""Unmapping a library's read-only pages: only clean read-only mappings are chosen; LLVM keeps working after."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inference_engine.platform.library_pages import read_only_file_spans, still_mapped

LIBRARY = "/site-packages/llvmlite/binding/libllvmlite.so"


def smaps_mapping(header: str, rss_kb: int | None, anonymous_kb: int) -> str:
    """One mapping as /proc/<pid>/smaps shows it: its header line, then the two fields the parser reads."""
    rss = "" if rss_kb is None else f"Rss:{rss_kb:>20} kB\n"
    return f"{header}\n{rss}Anonymous:{anonymous_kb:>14} kB\n"


SMAPS = "".join(smaps_mapping(header, rss_kb, anonymous_kb) for header, rss_kb, anonymous_kb in [
    (f"7f0000000000-7f0000300000 r--p 00000000 08:01 123 {LIBRARY}", 2048, 0),  # clean, read-only
    (f"7f0000300000-7f0005300000 r-xp 00300000 08:01 123 {LIBRARY}", 30000, 0),  # clean, code
    (f"7f0005300000-7f0005400000 r--p 05300000 08:01 123 {LIBRARY}", 1024, 1024),  # relocated: anonymous pages
    (f"7f0005400000-7f0005500000 rw-p 05400000 08:01 123 {LIBRARY}", 1024, 512),  # writable
    ("7f0006000000-7f0006100000 r-xp 00000000 08:01 124 /usr/lib/not_libllvmlite.so", 1024, 0),  # another file
    ("7f0007000000-7f0007100000 rw-p 00000000 00:00 0", None, 1024),  # no file
])


def test_only_clean_read_only_mappings_of_the_library_are_chosen(tmp_path):
    """The relocated read-only data (anonymous pages) and the writable data are left alone, as is another file."""
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert read_only_file_spans("libllvmlite.so", str(smaps)) == [(0x7F0000000000, 0x7F0000300000),
                                                                  (0x7F0000300000, 0x7F0005300000)]


_CHILD = """
import numba, numpy as np
from inference_engine.platform.library_pages import release_read_only_pages
def rss():
    return [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")][0]
before = rss()
released = release_read_only_pages()
after = rss()
@numba.njit
def total(a):  # compiled after the release: LLVM's optimizer and code generator mapped back as they run
    s = 0.0
    for v in a:
        s += v
    return s
print(released, before - after, total(np.arange(10.0)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
def test_llvm_is_unmapped_and_still_compiles():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True).stdout.split()
    released, dropped_kib, total = int(out[0]), int(out[1]), float(out[2])
    assert released > 0 and dropped_kib > 0  # some of LLVM was resident and is not any more
    assert total == 45.0


MAPS = """\
7f0000000000-7f0000300000 r--p 00000000 08:01 123 /site-packages/llvmlite/binding/libllvmlite.so
7f0000300000-7f0005300000 r-xp 00300000 08:01 123 /site-packages/llvmlite/binding/libllvmlite.so
7f0005400000-7f0005500000 rw-p 05400000 08:01 123 /site-packages/llvmlite/binding/libllvmlite.so
7f0007000000-7f0007100000 rw-p 00000000 00:00 0
"""
SPANS = [(0x7F0000000000, 0x7F0000300000), (0x7F0000300000, 0x7F0005300000)]


def test_remembered_spans_are_used_only_while_they_are_still_the_librarys(tmp_path):
    """A span that is now split, writable, another file's or gone sends the release back to smaps."""
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert still_mapped(SPANS, "libllvmlite.so", str(maps))
    assert not still_mapped(SPANS, "libother.so", str(maps))
    assert not still_mapped(SPANS + [(0x7F0007000000, 0x7F0007100000)], "libllvmlite.so", str(maps))  # anonymous
    maps.write_text(MAPS.replace("7f0000300000-7f0005300000 r-xp", "7f0000300000-7f0005300000 rwxp"))
    assert not still_mapped(SPANS, "libllvmlite.so", str(maps))
    maps.write_text(MAPS.replace("7f0000300000-7f0005300000", "7f0000300000-7f0004300000"))  # split by mprotect
    assert not still_mapped(SPANS, "libllvmlite.so", str(maps))


_COMPILING_CHILD = """
import re, sys
import numba, numpy as np
from inference_engine.platform import library_pages
def llvm_kib():
    inside, total = False, 0
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith("/libllvmlite.so")
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total
if sys.argv[1] == "listen":
    library_pages.release_after_each_compilation()
else:
    library_pages.release_read_only_pages()
released = llvm_kib()
@numba.njit
def total(a):
    s = 0.0
    for v in a:
        s += v
    return s
print(released, llvm_kib(), total(np.arange(10.0)))
"""
# LLVM resident after a compilation, above what it was after the release, that still counts as "given back": a
# compilation maps tens of MiB of LLVM's code (55 MiB on the Xeon VM); its writable data may take a few more pages.
GIVEN_BACK_SLACK_KIB = 1024
# The least a compilation without the listener must leave resident for the comparison to mean anything.
COMPILER_CODE_KIB = 8 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
def test_pages_a_compilation_maps_back_are_given_back_when_it_ends():
    def run(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", _COMPILING_CHILD, mode], capture_output=True, text=True,
                             check=True).stdout.split()
        assert float(out[2]) == 45.0
        return int(out[0]), int(out[1])

    released, after_compile = run("once")
    assert after_compile - released > COMPILER_CODE_KIB  # without the listener, the compiler's pages stay
    released, after_compile = run("listen")
    assert after_compile - released <= GIVEN_BACK_SLACK_KIB
