"""A first run's kernel compile is announced, once, and a run whose kernels come from Numba's cache says nothing
(``inference_engine/compile_notice.py``, issue 34)."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from inference_engine import compile_notice
from inference_engine.compile_notice import NOTICE

REPO = Path(__file__).resolve().parents[2]
# A child imports Numba and compiles (or loads) one small function: seconds; a minute means it hung.
CHILD_TIMEOUT_S = 120

KERNEL = """
from numba import njit


@njit(cache=True)
def twice(x):
    return 2 * x
"""
# The child: the listener as numba_kernels installs it, counting the test's own module as "ours".
CHILD = """
import sys
from inference_engine import compile_notice

compile_notice.KERNEL_MODULE_PREFIX = "fake_kernels"
compile_notice.set_announcer(lambda text: print(text, file=sys.stderr))
compile_notice.install_listener()
import fake_kernels

assert fake_kernels.twice(21) == 42
print(compile_notice.kernels_compiled())
"""


@pytest.fixture
def fresh_notice(monkeypatch):
    """The module's once-per-process state as a new process has it."""
    monkeypatch.setattr(compile_notice, "_announced", False)
    monkeypatch.setattr(compile_notice, "_compiled", 0)
    monkeypatch.setattr(compile_notice, "_announcer", None)


def test_the_first_compile_of_our_kernels_is_announced_once(fresh_notice):
    heard: list[str] = []
    with compile_notice.announcing(heard.append):
        compile_notice.kernel_compile_started("numba.np.arrayobj")  # Numba's own helper: not ours
        assert heard == [] and compile_notice.kernels_compiled() == 0
        compile_notice.kernel_compile_started("inference_engine.backends.numba_kernels.q8_0")
        compile_notice.kernel_compile_started("inference_engine.backends.numba_kernels.ops")
    assert heard == [NOTICE]
    assert compile_notice.kernels_compiled() == 2
    assert compile_notice.set_announcer(None) is None  # announcing() put the previous announcer back


def test_without_an_announcer_nothing_is_said_and_compiles_are_still_counted(fresh_notice, capsys):
    compile_notice.kernel_compile_started("inference_engine.backends.numba_kernels.q8_0")
    assert compile_notice.kernels_compiled() == 1
    assert capsys.readouterr() == ("", "")
    heard: list[str] = []
    with compile_notice.announcing(heard.append):  # an announcer set later still hears the next compile
        compile_notice.kernel_compile_started("inference_engine.backends.numba_kernels.ops")
    assert heard == [NOTICE]


def test_numba_compiling_announces_and_numba_loading_from_its_cache_does_not(tmp_path):
    """Real Numba, one small cached function: the first process compiles it (announced), the second loads it from
    the cache (no compile event, nothing said)."""
    pytest.importorskip("numba")
    (tmp_path / "fake_kernels.py").write_text(KERNEL)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], check=True, capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=CHILD_TIMEOUT_S)

    first, second = run(), run()
    assert (first.stdout, first.stderr.count(NOTICE)) == ("1\n", 1), first.stderr[-2000:]
    assert (second.stdout, second.stderr.count(NOTICE)) == ("0\n", 0), second.stderr[-2000:]


def test_importing_the_kernels_installs_the_listener():
    pytest.importorskip("numba")
    import inference_engine.backends.numba_kernels  # noqa: F401

    assert compile_notice._installed


def _first_stderr_line(args: list[str], env: dict[str, str], timeout_s: float) -> str:
    """The first line a command writes on stderr; the command is then stopped (what follows is a compile)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stderr, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                pytest.fail(f"nothing on stderr within {timeout_s} s: {' '.join(args)}")
        return proc.stderr.readline().rstrip("\n")
    finally:
        proc.kill()
        proc.wait(timeout=CHILD_TIMEOUT_S)
        proc.stderr.close()


@pytest.mark.slow  # a cold run stopped at its notice (seconds); two runs on the suite's warm cache (seconds each)
def test_generate_announces_a_first_compile_and_not_a_cached_run(tiny_model, tmp_path):
    """The real CLI: on an empty cache the notice is its first line on stderr (before the wait, not after it; the
    run is stopped there instead of waiting out the whole compile); once the cache holds the model's kernels (the
    suite's own cache, which earlier tests usually filled: the first cached run compiles only what is missing) a
    run says nothing."""
    pytest.importorskip("numba")
    args = [sys.executable, "-m", "bench_compare.cli", "generate", "hi", "--model", str(tiny_model("llama", "Q8_0")),
            "--backend", "numba", "-n", "2"]
    cold = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    assert _first_stderr_line(args, cold, CHILD_TIMEOUT_S) == NOTICE

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(args, check=True, capture_output=True, text=True, cwd=REPO, timeout=600)

    run()  # fills whatever the suite's cache lacks
    cached = run()
    assert NOTICE not in cached.stderr, cached.stderr[-2000:]
