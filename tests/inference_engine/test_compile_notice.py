"""A first run's kernel compile is announced, once, and a run whose kernels come from Numba's cache says nothing
(``inference_engine/compile_notice.py``, issue 34)."""

from __future__ import annotations

import os
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


@pytest.mark.slow  # compiles the kernels a tiny model needs from an empty cache: 10-40 s
def test_generate_announces_a_first_compile_and_not_a_cached_run(tiny_model, tmp_path):
    pytest.importorskip("numba")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    args = [sys.executable, "-m", "bench_compare.cli", "generate", "hi", "--model", str(tiny_model("llama", "Q8_0")),
            "--backend", "numba", "-n", "2"]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)

    first, second = run(), run()
    assert first.stderr.splitlines()[0] == NOTICE, first.stderr[-2000:]  # before the wait, not after it
    assert NOTICE not in second.stderr, second.stderr[-2000:]
