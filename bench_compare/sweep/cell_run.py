"""One cell = one fresh process running an existing ``bench-compare`` command; its own typed JSON is the result.

:func:`run_cell` runs wherever the executor put it (this process for the local executor, a Ray worker on the chosen
node for Ray) and returns an *outcome*: the result JSON the command wrote, or the error and the tail of its log. It
never raises for a failing command, so one crash cannot take the sweep down. The child writes its JSON into a
private temporary directory; on Linux it is killed if the process that started it dies (a Ray worker on a node that
went away: the parent-death signal, :func:`exec_dying_with_parent`), so an orphan never measures on beside the next
cell. A process killed mid-cell (a node that went away, a forced cancel) cannot remove its directory; the directory is
named after that process, and the next cell on the same machine removes it (:func:`remove_stale_scratch`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench_compare.sweep.matrix import Cell

LOG_TAIL_LINES = 40
LOG_KEPT_CHARS = 200_000  # the whole log up to this size is kept next to the cell's record


PR_SET_PDEATHSIG = 1
SCRATCH_PREFIX = "bench-sweep-"  # + the pid of the process running the cell + "-"


def command_line(cell: Cell, json_path: str, report_dir: str) -> list[str]:
    """The cell's process: ``bench-compare <command> ...`` under this Python; on Linux started through
    :func:`exec_dying_with_parent` (``python -m bench_compare.sweep.cell_run PARENT_PID -- ARGS``), which asks the
    kernel to kill it when its parent dies and then becomes the command (no ``preexec_fn``: Ray workers run threads)."""
    args = cell.argv(json_path, report_dir)
    if sys.platform.startswith("linux"):
        return [sys.executable, "-m", "bench_compare.sweep.cell_run", str(os.getpid()), "--", *args]
    return [sys.executable, "-m", "bench_compare.cli", *args]


def exec_dying_with_parent(parent_pid: int, args: list[str]) -> None:  # pragma: no cover - replaces the process
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # kept across exec
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "bench_compare.cli", *args])


def log_tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _pid_is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_scratch(root: str | None = None) -> list[str]:
    """Remove the cell directories (``SCRATCH_PREFIX`` + pid + ``-...``) under ``root`` (the temporary directory) whose
    process no longer exists: cells killed mid-run. A live process's directory, or a name that is not ours, is left
    alone. Returns the paths removed."""
    root = root or tempfile.gettempdir()
    removed = []
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries:
            pid_text, dash, _ = entry.name.removeprefix(SCRATCH_PREFIX).partition("-")
            if (not entry.name.startswith(SCRATCH_PREFIX) or not dash or not pid_text.isdigit()
                    or not entry.is_dir(follow_symlinks=False) or _pid_is_alive(int(pid_text))):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                removed.append(entry.path)
    return removed


def run_cell(cell_dict: dict[str, Any], node: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """Run one cell in a fresh process; ``node`` (``{id, labels}``) is recorded with the outcome."""
    cell = Cell.from_dict(cell_dict)
    started = time.time()
    remove_stale_scratch()
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as tmp:
        json_path = os.path.join(tmp, "result.json")
        argv = command_line(cell, json_path, os.path.join(tmp, "report"))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace", env=env)
        error = None
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            log, _ = proc.communicate()
            error = f"timed out after {timeout_s:g} s"
        except BaseException:  # Ctrl-C: stop the child, keep nothing of this cell
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        result = None
        if error is None and proc.returncode != 0:
            error = f"exit code {proc.returncode}: {_last_error_line(log)}"
        if error is None:
            try:
                with open(json_path, encoding="utf-8") as fh:
                    result = json.load(fh)
            except (OSError, json.JSONDecodeError) as exc:
                error = f"the command wrote no readable result JSON ({exc.__class__.__name__})"
    return {"status": "failed" if error else "done", "result": result, "error": error,
            "log": log[-LOG_KEPT_CHARS:], "log_tail": log_tail(log), "returncode": proc.returncode,
            "argv": ["bench-compare", *cell.argv("RESULT.json")], "started": started, "ended": time.time(),
            "node": node}


def _last_error_line(log: str) -> str:
    lines = [line for line in log.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["(no output)"])[-1].strip()[:300]


if __name__ == "__main__":  # python -m bench_compare.sweep.cell_run PARENT_PID -- ARGS (see command_line)
    exec_dying_with_parent(int(sys.argv[1]), sys.argv[3:])
