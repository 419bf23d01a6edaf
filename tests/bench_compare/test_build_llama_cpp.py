"""``python -m bench_compare.build_llama_cpp --sdist FILE [--target T]``: builds from a local archive, no download.

The archive here is a stand-in sdist written by the test: ``llama_cpp_python-<v>/vendor/llama.cpp`` holding a
two-line C program per target and a CMakeLists.txt that records the options it was configured with, so CMake and
the compiler really run (seconds) and the test sees which programs were built and with which flags. The real
llama.cpp build is the ``heavy`` test in ``test_llama_binaries_e2e.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from bench_compare import build_llama_cpp
from bench_compare.build_llama_cpp import main

pytestmark = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("cc") is None, reason="needs cmake and a C compiler"
)

TOP = "llama_cpp_python-9.9.9"
CMAKELISTS = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
option(LLAMA_BUILD_SERVER "server" ON)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
file(WRITE ${CMAKE_BINARY_DIR}/configured.txt "server=${LLAMA_BUILD_SERVER} cuda=${GGML_CUDA}")
file(WRITE ${CMAKE_BINARY_DIR}/commit.txt "${LLAMA_BUILD_COMMIT}")
file(WRITE ${CMAKE_BINARY_DIR}/prebuilt_ui.txt "${LLAMA_USE_PREBUILT_UI}")
add_executable(llama-bench main.c)
if (LLAMA_BUILD_SERVER)
    add_executable(llama-server main.c)
endif()
"""


COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"


def fake_sdist(tmp_path: Path, suffix: str = ".tar.gz", head: str | None = None) -> Path:
    """The stand-in sdist; ``head``: the submodule's git HEAD as llama-cpp-python's sdist keeps it
    (``vendor/llama.cpp/.git`` a ``gitdir:`` file into the outer ``.git/modules``, of which .device/prepare.sh's
    trimmed copy keeps HEAD only)."""
    source = tmp_path / "src" / TOP / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text(CMAKELISTS)
    (source / "main.c").write_text("int main(void) { return 0; }\n")
    if head is not None:
        (source / ".git").write_text("gitdir: ../../.git/modules/vendor/llama.cpp\n")
        modules = tmp_path / "src" / TOP / ".git" / "modules" / "vendor" / "llama.cpp"
        modules.mkdir(parents=True)
        (modules / "HEAD").write_text(head + "\n")
    archive = tmp_path / f"{TOP}{suffix}"
    with tarfile.open(archive, "w:xz" if suffix.endswith("xz") else "w:gz") as tar:
        tar.add(tmp_path / "src" / TOP, arcname=TOP)
    return archive


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.xz"])
def test_builds_one_target_from_a_local_sdist_without_the_server(tmp_path, capsys, suffix):
    archive = fake_sdist(tmp_path, suffix)
    out = tmp_path / "out"
    assert (
        main(
            [
                "--out",
                str(out),
                "--sdist",
                str(archive),
                "--target",
                "llama-bench",
                "--cmake-arg",
                "-DGGML_CUDA=ON",
                "-j",
                "2",
            ]
        )
        == 0
    )
    bench = out / "build" / "bin" / "llama-bench"
    assert capsys.readouterr().out.splitlines() == [f"llama-bench: {bench}"]
    assert bench.is_file() and not (out / "build" / "bin" / "llama-server").exists()
    assert (out / "build" / "configured.txt").read_text() == "server=OFF cuda=ON"
    assert not (out / "sdist").exists()  # nothing downloaded


def test_both_targets_by_default_and_the_unpacked_sources_are_reused(tmp_path):
    archive = fake_sdist(tmp_path)
    out = tmp_path / "out"
    paths = build_llama_cpp.build(out, sdist=archive, jobs=2)
    assert set(paths) == {"llama-bench", "llama-server"} and all(p.is_file() for p in paths.values())
    assert subprocess.run([str(paths["llama-bench"])], check=False, timeout=30).returncode == 0
    assert (out / "build" / "configured.txt").read_text() == "server=ON cuda="
    assert (out / "build" / "prebuilt_ui.txt").read_text() == "OFF"  # llama-server's web UI: never downloaded
    unpacked = out / TOP / "vendor" / "llama.cpp" / "CMakeLists.txt"
    unpacked.write_text(CMAKELISTS.replace("server=", "again server="))
    build_llama_cpp.build(out, sdist=archive, jobs=2)  # not unpacked over: the edited CMakeLists.txt ran
    assert (out / "build" / "configured.txt").read_text() == "again server=ON cuda="


def test_a_missing_or_foreign_archive_is_one_line(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "out"), "--sdist", str(tmp_path / "nope.tar.gz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err and "nope.tar.gz" in err

    other = tmp_path / "other.tar.gz"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "setup.py").write_text("")
    with tarfile.open(other, "w:gz") as tar:
        tar.add(tmp_path / "pkg", arcname="pkg")
    assert main(["--out", str(tmp_path / "out"), "--sdist", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vendor/llama.cpp/CMakeLists.txt" in err


def test_an_unknown_target_is_refused_when_parsed(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path), "--target", "llama-cli"])
    assert exc.value.code == 2 and "invalid choice: 'llama-cli'" in capsys.readouterr().err


def test_the_sources_commit_becomes_the_binarys_build_commit(tmp_path):
    """llama-bench reports ``build_commit`` from CMake's LLAMA_BUILD_COMMIT; CMake finds none in an sdist (no git
    objects), so the build reads the submodule's HEAD itself: the GPU build on the lent machine said "unknown"."""
    out = tmp_path / "out"
    build_llama_cpp.build(out, sdist=fake_sdist(tmp_path, head=COMMIT), jobs=2, targets=("llama-bench",))
    assert (out / "build" / "commit.txt").read_text() == COMMIT[:7]


def test_a_users_own_build_commit_wins_and_no_metadata_passes_none(tmp_path):
    archive = fake_sdist(tmp_path, head=COMMIT)
    out = tmp_path / "out"
    build_llama_cpp.build(out, sdist=archive, jobs=2, targets=("llama-bench",),
                          cmake_args=("-DLLAMA_BUILD_COMMIT=mine",))
    assert (out / "build" / "commit.txt").read_text() == "mine"
    bare = tmp_path / "bare"
    bare.mkdir()
    build_llama_cpp.build(bare / "out", sdist=fake_sdist(bare), jobs=2, targets=("llama-bench",))
    assert (bare / "out" / "build" / "commit.txt").read_text() == ""


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("detached", COMMIT[:7]),
        ("branch", COMMIT[:7]),
        ("packed", COMMIT[:7]),
        ("no-head", None),
        ("not-a-commit", None),
        ("foreign-gitfile", None),
    ],
)
def test_source_commit_reads_git_metadata_without_git(tmp_path, layout, expected):
    source = tmp_path / "llama.cpp"
    gitdir = source / ".git"
    gitdir.mkdir(parents=True)
    if layout == "detached":
        (gitdir / "HEAD").write_text(COMMIT + "\n")
    elif layout == "branch":
        (gitdir / "HEAD").write_text("ref: refs/heads/master\n")
        (gitdir / "refs" / "heads").mkdir(parents=True)
        (gitdir / "refs" / "heads" / "master").write_text(COMMIT + "\n")
    elif layout == "packed":
        (gitdir / "HEAD").write_text("ref: refs/heads/master\n")
        (gitdir / "packed-refs").write_text(f"# pack-refs with: peeled\n{COMMIT} refs/heads/master\n")
    elif layout == "not-a-commit":
        (gitdir / "HEAD").write_text("garbage\n")
    elif layout == "foreign-gitfile":
        gitdir.rmdir()
        (source / ".git").write_text("something else\n")
    assert build_llama_cpp.source_commit(source) == expected
