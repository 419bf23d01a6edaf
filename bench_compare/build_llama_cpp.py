"""Build llama.cpp's own ``llama-bench`` and ``llama-server`` from PyPI, for ``compare --against llama-bench:PATH``.

``python -m bench_compare.build_llama_cpp --out DIR [--cmake-arg -DGGML_CUDA=ON ...]`` downloads llama-cpp-python's
source distribution (the version installed here, or ``--version``; ``pip download --no-binary :all:``), takes the
llama.cpp inside it (``vendor/llama.cpp``: exactly the llama.cpp the in-process reference runs) and builds the two
programs with CMake::

    cmake -S vendor/llama.cpp -B DIR/build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF [--cmake-arg ...]
    cmake --build DIR/build --target llama-bench llama-server -j N

then prints the two paths (``DIR/build/bin/llama-bench``, ``DIR/build/bin/llama-server``). A CPU build takes
10-25 minutes on 2 cores; ``--cmake-arg -DGGML_CUDA=ON`` (or ``-DGGML_VULKAN=ON``, ``-DGGML_HIP=ON``;
Metal is on by default on macOS) builds for a GPU. Needs ``cmake`` and a C++ compiler (``pip install cmake ninja``
brings the first). Everything goes under DIR; an existing build there is reused (CMake rebuilds what changed).

``--sdist FILE`` builds from an archive already here instead of downloading (a machine without network access):
llama-cpp-python's sdist, or any ``.tar.gz`` / ``.tar.xz`` whose top folder holds ``vendor/llama.cpp`` (such as
the trimmed copy ``.device/prepare.sh`` carries to the lent GPU machine). ``--target llama-bench`` builds that
program alone (and configures without the server: ``-DLLAMA_BUILD_SERVER=OFF``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from inference_engine.errors import GGUFParityError

PACKAGE = "llama-cpp-python"
TARGETS = ("llama-bench", "llama-server")
# LLAMA_USE_PREBUILT_UI=OFF: llama-server's build otherwise downloads its web UI from a Hugging Face bucket (llama.cpp
# of llama-cpp-python 0.3.36, tools/ui/CMakeLists.txt); nothing here uses that UI, and this project fetches nothing at
# run time from anywhere but PyPI. (Offline the download fails and the build goes on without the UI; behind a firewall
# that drops packets it would wait.) A --cmake-arg comes later on the command line, so a user's own setting wins.
CMAKE_ARGS = ("-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
              "-DLLAMA_USE_PREBUILT_UI=OFF")


def installed_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFParityError(f"{PACKAGE} is not installed here: pass --version X.Y.Z") from None


def fetch_sources(version: str, out: Path) -> Path:
    """The llama.cpp sources inside llama-cpp-python ``version``'s sdist, downloaded and unpacked under ``out``."""
    source = out / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (source / "CMakeLists.txt").exists():
        return source
    sdist_dir = out / "sdist"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{PACKAGE}=={version}",
            "-d",
            str(sdist_dir),
        ],
        "pip download",
    )
    archives = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        raise GGUFParityError(f"pip download left no llama_cpp_python-{version}.tar.gz in {sdist_dir}")
    return unpack_sources(archives[0], out)


def unpack_sources(archive: str | os.PathLike, out: Path) -> Path:
    """The llama.cpp sources (``<top folder>/vendor/llama.cpp``) of a local sdist ``archive``, unpacked under ``out``
    (once: an unpacked copy there is reused)."""
    archive = Path(archive)
    if not archive.is_file():
        raise GGUFParityError(f"--sdist {archive}: no such file (give llama-cpp-python's .tar.gz sdist)")
    try:
        with tarfile.open(archive) as tar:
            top = next((m.name.split("/")[0] for m in tar if m.name.split("/")[0] not in ("", ".")), None)
            source = out / (top or "") / "vendor" / "llama.cpp"
            if top and not (source / "CMakeLists.txt").exists():
                if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: no paths outside ``out``
                    tar.extractall(out, filter="data")
                else:
                    tar.extractall(out)  # an sdist the user chose to build
    except tarfile.TarError as exc:
        raise GGUFParityError(f"--sdist {archive}: not a readable tar archive ({exc})") from None
    if not top or not (source / "CMakeLists.txt").exists():
        raise GGUFParityError(
            f"{archive.name} has no <top folder>/vendor/llama.cpp/CMakeLists.txt: not llama-cpp-python's sdist"
        )
    return source


def source_commit(source: Path) -> str | None:
    """The llama.cpp commit ``source`` was checked out at (7 hex digits), read from its git metadata without git: an
    sdist's ``vendor/llama.cpp/.git`` is a ``gitdir:`` file into the outer ``.git/modules``, of which a trimmed copy
    may keep only ``HEAD``, so CMake's own ``git rev-parse`` finds nothing and the binary reports "unknown"."""
    dot = source / ".git"
    try:
        if dot.is_file():
            link = dot.read_text(encoding="utf-8").strip()
            if not link.startswith("gitdir:"):
                return None
            gitdir = (source / link.removeprefix("gitdir:").strip()).resolve()
        elif dot.is_dir():
            gitdir = dot
        else:
            return None
        head = (gitdir / "HEAD").read_text(encoding="utf-8").strip()
        if head.startswith("ref:"):  # a branch: its file, else its line in packed-refs
            ref = head.removeprefix("ref:").strip()
            loose = gitdir / ref
            if loose.is_file():
                head = loose.read_text(encoding="utf-8").strip()
            else:
                packed = gitdir / "packed-refs"
                lines = packed.read_text(encoding="utf-8").splitlines() if packed.is_file() else []
                head = next((line.split()[0] for line in lines if line.endswith(f" {ref}")), "")
    except (OSError, UnicodeDecodeError):
        return None
    return head[:7] if re.fullmatch(r"[0-9a-f]{40}", head) else None


def build(
    out: str | os.PathLike,
    version: str | None = None,
    cmake_args: tuple[str, ...] = (),
    jobs: int | None = None,
    sdist: str | os.PathLike | None = None,
    targets: tuple[str, ...] = TARGETS,
) -> dict[str, Path]:
    """Build ``targets`` (some of :data:`TARGETS`) under ``out`` from llama-cpp-python ``version``'s sdist (downloaded)
    or the local archive ``sdist``; returns ``{target: path}``."""
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise GGUFParityError(f"--target {', '.join(unknown) or '(none)'}: supported: {', '.join(TARGETS)}")
    if shutil.which("cmake") is None:
        raise GGUFParityError("cmake is not installed (pip install cmake ninja, or your system's package)")
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    source = unpack_sources(sdist, out) if sdist is not None else fetch_sources(version or installed_version(), out)
    build_dir = out / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (build_dir / "Makefile").exists() else []
    server = [] if "llama-server" in targets else ["-DLLAMA_BUILD_SERVER=OFF"]
    commit = source_commit(source)  # what llama-bench reports as build_commit (a user's own -D... comes later: wins)
    provenance = [f"-DLLAMA_BUILD_COMMIT={commit}"] if commit else []
    _run(
        ["cmake", "-S", str(source), "-B", str(build_dir), *generator, *CMAKE_ARGS, *server, *provenance,
         *cmake_args],
        "cmake configure",
    )
    if not jobs:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _run(["cmake", "--build", str(build_dir), "--target", *targets, "-j", str(jobs)], "cmake build")
    paths = {t: build_dir / "bin" / t for t in targets}
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise GGUFParityError(f"the build finished without {', '.join(missing)}")
    return paths


def _run(command: list[str], what: str) -> None:
    done = subprocess.run(command, check=False, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise GGUFParityError(f"{what} failed (exit {done.returncode}): {' '.join(command)}")


def _joined_cmake_args(argv: list[str]) -> list[str]:
    """``--cmake-arg -DGGML_CUDA=ON`` as ``--cmake-arg=-DGGML_CUDA=ON``: argparse takes a value that starts with '-'
    for an option and would refuse the documented form."""
    out: list[str] = []
    args = iter(argv)
    for arg in args:
        value = next(args, None) if arg == "--cmake-arg" else None
        out.append(arg if value is None else f"{arg}={value}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench_compare.build_llama_cpp", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", required=True, help="directory for the sources and the build")
    parser.add_argument(
        "--version", default=None, help=f"{PACKAGE} version whose llama.cpp to build (default: the installed one)"
    )
    parser.add_argument("--cmake-arg", action="append", default=[], help="extra CMake argument, e.g. -DGGML_CUDA=ON")
    parser.add_argument("-j", "--jobs", type=int, default=None, help="parallel build jobs (default: all CPUs)")
    parser.add_argument(
        "--sdist",
        default=None,
        metavar="FILE",
        help="build from this local llama-cpp-python sdist (.tar.gz / .tar.xz) instead of downloading",
    )
    parser.add_argument(
        "--target",
        action="append",
        choices=TARGETS,
        default=None,
        help="a program to build (repeatable; default: both)",
    )
    args = parser.parse_args(_joined_cmake_args(sys.argv[1:] if argv is None else argv))
    try:
        paths = build(
            args.out,
            args.version,
            tuple(args.cmake_arg),
            args.jobs,
            sdist=args.sdist,
            targets=tuple(args.target or TARGETS),
        )
    except GGUFParityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for target, path in paths.items():
        print(f"{target}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
