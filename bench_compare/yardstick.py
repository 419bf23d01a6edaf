"""A user's own llama.cpp binary as ``compare``'s yardstick: ``--against llama-bench:PATH`` / ``llama-server:PATH``.

The in-process reference is llama-cpp-python's CPU build; a GPU engine's author needs llama.cpp built for the same
card (CUDA, Vulkan, ROCm, Metal). These are llama.cpp's own programs, built by the user, run as child processes:

* ``llama-bench:PATH`` beside our in-process engine (:mod:`bench_compare.binary_compare`, the pp / tg tests);
* ``llama-server:PATH`` as the reference side of an HTTP compare (:mod:`bench_compare.adapters.llama_server_bin`).

Before anything is loaded, :func:`check_binary` makes sure PATH is such a program: it exists, is a file, may be
executed, answers ``--help`` without crashing, and that help names the flags compare passes (llama-bench's ``-d``
arrived in 2025: an older build is refused when a depth is asked for). The engine under test as a program
(``--engine llama-bench:PATH``, any program taking llama-bench's flags) is checked the same way, the errors naming
``--engine``. Every problem is one line, exit 2.
:func:`run_child` runs the binary in its own process group and stops the whole group on Ctrl-C, so nothing it
started outlives the harness.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inference_engine.errors import GGUFParityError

KIND_BENCH = "llama-bench"
KIND_SERVER = "llama-server"
KINDS = (KIND_BENCH, KIND_SERVER)
# A binary's --help prints and exits at once (llama-server's loads its backends first: ~1 s with CUDA); 60 s means
# something is wrong (a wrapper script waiting for input, a hung driver).
HELP_TIMEOUT_S = 60.0
# Seconds between SIGTERM and SIGKILL when a child is stopped (Ctrl-C): llama-bench exits at once.
STOP_GRACE_S = 5.0
# What each program's --help must contain (flags compare passes; the first pair tells the two programs apart).
REQUIRED_FLAGS = {
    KIND_BENCH: ("--n-prompt", "--n-gen", "--repetitions", "--output", "--n-gpu-layers"),
    KIND_SERVER: ("--port", "--host", "--ctx-size", "--n-gpu-layers", "--alias"),
}
DEPTH_FLAG = "--n-depth"  # llama-bench's -d


@dataclass(frozen=True)
class Yardstick:
    """``--against KIND:PATH``: which llama.cpp program, and where."""

    kind: str
    path: Path

    @property
    def spec(self) -> str:
        return f"{self.kind}:{self.path}"


@dataclass(frozen=True)
class BinaryInfo:
    """What :func:`check_binary` learned: the resolved path, its sha256 and whether it takes ``-d``."""

    kind: str
    path: Path
    sha256: str
    has_depth: bool

    def to_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "sha256": self.sha256, "has_depth": self.has_depth}


def parse_against(text: str | None) -> Yardstick | None:
    """``llama-bench:PATH`` / ``llama-server:PATH`` -> :class:`Yardstick`; anything else (the named references
    ``llamacpp``, ``llamacpp-server``, ``none``) -> None."""
    if not text:
        return None
    for kind in KINDS:
        if text.startswith(kind + ":"):
            path = text[len(kind) + 1:].strip()
            if not path:
                raise GGUFParityError(f"--against {kind}: needs the binary's path, e.g. --against "
                                      f"{kind}:/path/to/llama.cpp/build/bin/{kind}")
            return Yardstick(kind, Path(path).expanduser())
    return None


def check_binary(yard: Yardstick, flag: str = "--against", llama: bool | None = None) -> BinaryInfo:
    """Refuse, in one line, a PATH that is not a working ``yard.kind`` (see the module docstring). ``flag``: where
    the user named it, ``--against`` (llama.cpp's program) or ``--engine`` (any program taking llama-bench's flags:
    the engine under test); ``llama``: whether it must be llama.cpp's own program (default: named by --against;
    ``--engine llama-server:PATH`` is llama.cpp's own server as the engine under test)."""
    path, kind = yard.path, yard.kind
    llama = flag == "--against" if llama is None else llama  # llama.cpp's own program, else one taking its flags
    program = f"llama.cpp's build/bin/{kind}" if llama else "your benchmark program"
    if not path.exists():
        raise GGUFParityError(f"{flag} {kind}: {path} does not exist; point it at {program}")
    if path.is_dir():
        raise GGUFParityError(f"{flag} {kind}: {path} is a directory; point it at {program}")
    if not os.access(path, os.X_OK):
        raise GGUFParityError(f"{flag} {kind}: {path} is not executable (chmod +x it, or point at {program})")
    try:
        done = subprocess.run([str(path), "--help"], check=False, capture_output=True, text=True, errors="replace",
                              timeout=HELP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GGUFParityError(f"{flag} {kind}: {path} --help did not finish within {HELP_TIMEOUT_S:.0f} s; "
                              f"is it {'llama.cpp' if llama else 'a program'} that takes {kind}'s "
                              "flags?") from None
    except OSError as exc:
        raise GGUFParityError(f"{flag} {kind}: {path} cannot be run: {exc.strerror or exc}") from None
    if done.returncode < 0:
        raise GGUFParityError(f"{flag} {kind}: {path} crashed on --help ({signal_name(-done.returncode)}); "
                              "this build is broken: rebuild it")
    text = done.stdout + done.stderr
    missing = [flag_ for flag_ in REQUIRED_FLAGS[kind] if flag_ not in text]
    if missing:
        other = next((k for k in KINDS if k != kind and all(f in text for f in REQUIRED_FLAGS[k])), None)
        hint = f" (it looks like {other})" if other else ""
        what = f"is not llama.cpp's {kind}" if llama else f"does not take {kind}'s flags"
        raise GGUFParityError(f"{flag} {kind}: {path} {what}{hint}: its --help has no {', '.join(missing)}")
    return BinaryInfo(kind, path.resolve(), file_sha256(path), DEPTH_FLAG in text)


def check_depth(info: BinaryInfo, depths: list[int], flag: str = "--against") -> None:
    """An old llama-bench (before -d, 2025), or a program without -d, runs depth-0 tests only."""
    if any(d > 0 for d in depths) and not info.has_depth:
        why = ("it is older than llama.cpp's depth tests; rebuild it from a newer llama.cpp" if flag == "--against"
               else "give it -d N (a prompt of N tokens prefilled untimed before each test)")
        raise GGUFParityError(f"{flag} llama-bench: {info.path} has no -d ({DEPTH_FLAG}): {why}, or pass -d 0")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def signal_name(number: int) -> str:
    """``11`` -> ``signal 11 (SIGSEGV)``."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


@dataclass
class ChildOutput:
    returncode: int
    stdout: str
    stderr: str

    def failure(self) -> str:
        """``crashed with signal 11 (SIGSEGV)`` / ``exited with code 1``, and stderr's last line."""
        how = (f"crashed with {signal_name(-self.returncode)}" if self.returncode < 0
               else f"exited with code {self.returncode}")
        tail = last_line(self.stderr)
        return how + (f": {tail}" if tail else "")


def last_line(text: str, limit: int = 300) -> str:
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else ""


def run_child(command: list[str], env: dict[str, str] | None = None) -> ChildOutput:
    """Run ``command`` to its end in its own process group (stdout and stderr kept in temporary files, not pipes:
    a chatty stderr cannot block it). On Ctrl-C or any error here the group is stopped (SIGTERM, then SIGKILL after
    :data:`STOP_GRACE_S`) before the exception goes on."""
    with tempfile.TemporaryFile("w+b") as out, tempfile.TemporaryFile("w+b") as err:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                   start_new_session=True)
        try:
            returncode = process.wait()
        except BaseException:
            stop_group(process)
            raise
        out.seek(0)
        err.seek(0)
        return ChildOutput(returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))


def stop_group(process: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)  # start_new_session: the group id is the child's pid
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            continue
