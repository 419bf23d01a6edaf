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
add_executable(llama-bench main.c)
if (LLAMA_BUILD_SERVER)
    add_executable(llama-server main.c)
endif()
"""


def fake_sdist(tmp_path: Path, suffix: str = ".tar.gz") -> Path:
    source = tmp_path / "src" / TOP / "vendor" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text(CMAKELISTS)
    (source / "main.c").write_text("int main(void) { return 0; }\n")
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
