"""Ctrl-C anywhere ends the run with exit 130, one line, and no report claiming a result (issue 16).

Each test runs the CLI in a child process that sends itself SIGINT at a controlled point: inside llama.cpp's
``cb_eval`` graph callback, inside a Numba compile, in the middle of a generation stream. The point is chosen by a
small wrapper script written here (no hook in the product code).

Started as a background job (SIGINT ignored: ``( trap '' INT; exec python -m pytest ) &``), these tests set the
dispositions themselves: each child starts with SIGINT's default (``fixtures.child_signals``), and the in-process
checks run with Python's own handler installed (``pythons_sigint_handler``), as in a terminal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from fixtures.child_signals import default_sigint

from bench_compare.interrupts import remember_interrupts
from inference_engine.compile_notice import NOTICE

REPO = Path(__file__).resolve().parents[2]
# A child that loads a tiny model and is interrupted early finishes in seconds; a minute means it hung.
CHILD_TIMEOUT_S = 120

PRELUDE = """
import functools, os, signal, sys
def interrupt_now():
    os.kill(os.getpid(), signal.SIGINT)
def interrupt_at_call(owner, name, n):
    # owner.<name>'s n-th call sends SIGINT first: Python raises KeyboardInterrupt at its next bytecode, in the call
    real = getattr(owner, name)
    calls = [0]
    @functools.wraps(real)
    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            interrupt_now()
        return real(*args, **kwargs)
    setattr(owner, name, wrapper)
"""
RUN_CLI = """
from bench_compare.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(autouse=True)
def pythons_sigint_handler():
    """Python's own SIGINT handler (KeyboardInterrupt) in this process during each test, whatever it inherited: a
    process started with SIGINT ignored installs none, and the in-process checks would see no interrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def run_child(tmp_path, setup: str, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(setup) + RUN_CLI)
    return subprocess.run([sys.executable, str(script), *map(str, args)], check=False, capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, cwd=REPO, env={**os.environ, **(env or {})},
                          preexec_fn=default_sigint)


def assert_interrupted(done: subprocess.CompletedProcess, compile_announced: bool | None = None) -> None:
    """Exit 130 and the one line "interrupted", after the compile notice where the child compiled kernels
    (``compile_announced``: it must have, True; it must not have, False; None: either, as a child running Numba
    kernels compiles them in a new environment)."""
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    notice = NOTICE + "\n"
    if compile_announced is not None:
        assert done.stderr.startswith(notice) is compile_announced, done.stderr[-2000:]
    assert done.stderr.removeprefix(notice) == "interrupted\n", done.stderr[-2000:]


def test_interrupt_inside_llama_cpp_graph_callback(tiny_model, tmp_path):
    """SIGINT while llama.cpp runs cb_eval: used to be swallowed by ctypes and end in a complete, wrong report."""
    pytest.importorskip("llama_cpp")
    setup = """
        from validation.llamacpp import capture
        interrupt_at_call(capture.GraphRecorder, "_record", 5)  # the KeyboardInterrupt is raised in the callback
    """
    report = tmp_path / "report"
    done = run_child(tmp_path, setup, "validate", "--model", tiny_model("llama", "Q8_0"), "--report", report,
                     "--json", tmp_path / "out.json", "--smoke-tokens", 0)
    assert_interrupted(done)
    assert not report.exists() and not (tmp_path / "out.json").exists()


def test_graph_callback_interrupt_leaves_the_engine_usable(tiny_model, monkeypatch):
    """In process: the callback stops the graph, capture raises KeyboardInterrupt after llama_decode returns, and
    the next capture on the same engine is complete."""
    pytest.importorskip("llama_cpp")
    from validation.llamacpp import LlamaCppEngine, capture

    real = capture.GraphRecorder._record
    calls = [0]

    def record(self, ptr):
        calls[0] += 1
        if calls[0] == 5:
            raise KeyboardInterrupt
        return real(self, ptr)

    with LlamaCppEngine(tiny_model("llama", "Q8_0"), n_ctx=32, n_threads=1) as engine:
        ids = engine.tokenize("Hello world", add_bos=False)
        monkeypatch.setattr(capture.GraphRecorder, "_record", record)
        with pytest.raises(KeyboardInterrupt):
            engine.capture(ids)
        monkeypatch.setattr(capture.GraphRecorder, "_record", real)
        tensors = engine.capture(ids)
        assert "result_output" in tensors and tensors["result_output"].shape[-1] == engine.n_vocab


@pytest.mark.slow  # compiles a Numba kernel from an empty cache: 10-20 s
def test_interrupt_during_numba_compile(tiny_model, tmp_path):
    """SIGINT in the middle of a kernel's compile: used to be swallowed (exit 0) or turn into RuntimeError."""
    pytest.importorskip("numba")
    setup = """
        # The interrupt lands where it did in the field: inside llvmlite's object-cache ctypes callback, where a
        # KeyboardInterrupt is printed as "Exception ignored" and lost.
        from llvmlite.binding import executionengine
        real_set = executionengine.ExecutionEngine.set_object_cache
        fired = [False]
        def set_object_cache(self, notify_func=None, getbuffer_func=None):
            def notify(module, buf):  # called from the C++ side through a ctypes callback
                if not fired[0]:
                    fired[0] = True
                    interrupt_now()
                return notify_func(module, buf)
            return real_set(self, notify if notify_func else None, getbuffer_func)
        executionengine.ExecutionEngine.set_object_cache = set_object_cache
    """
    # An empty cache directory: every kernel is compiled, none loaded.
    done = run_child(tmp_path, setup, "generate", "hi", "--model", tiny_model("llama", "Q8_0"), "--backend",
                     "numba", "-n", 2, env={"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")})
    assert_interrupted(done, compile_announced=True)
    assert done.stdout == ""


def test_interrupt_during_a_generation_stream(tiny_model, tmp_path):
    """Text streamed before the interrupt stays on stdout; no timings line claims a finished run."""
    setup = """
        from inference_engine import engine
        interrupt_at_call(engine.OurEngine, "decode", 3)
    """
    done = run_child(tmp_path, setup, "generate", "Hello", "--model", tiny_model("llama"), "-n", 50)
    assert_interrupted(done)
    assert done.stdout != ""  # what was generated before Ctrl-C is kept


# --- bench_compare.interrupts: a Ctrl-C swallowed by a finalizer still stops the run at the next check ---------
class SignalsInItsFinalizer:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000):  # the handler runs here, inside the finalizer, and Python drops its exception
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowing is the point
def test_an_interrupt_a_finalizer_swallowed_is_raised_at_the_next_check():
    with remember_interrupts() as memory:
        memory.check()  # nothing yet
        SignalsInItsFinalizer()  # finalized at once: "Exception ignored in ... __del__"
        assert memory.received
        with pytest.raises(KeyboardInterrupt):
            memory.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's own handler is back


def test_an_interrupt_raises_at_once_as_pythons_own_handler_does():
    with remember_interrupts() as memory, pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10_000_000):
            pass
    assert memory.received


def test_another_handler_is_left_alone():
    def theirs(signum, frame):
        pass

    previous = signal.signal(signal.SIGINT, theirs)
    try:
        with remember_interrupts() as memory:
            assert signal.getsignal(signal.SIGINT) is theirs
            memory.check()  # a no-op: nothing is recorded without our handler
        assert signal.getsignal(signal.SIGINT) is theirs
    finally:
        signal.signal(signal.SIGINT, previous)


def test_off_the_main_thread_nothing_is_installed():
    seen = []

    def worker():
        with remember_interrupts() as memory:
            seen.append((signal.getsignal(signal.SIGINT), memory.received))

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [(signal.default_int_handler, False)]


def test_interrupt_during_corpus_kld_keeps_what_finished(tiny_model, tmp_path):
    """SIGINT in a minutes-long check: the report and the JSON are written with the windows every engine finished
    (here 4: each window is the reference's, then ours, then the NumPy reference's K/V F16 variant's), the verdict
    is not PASS, exit 130."""
    setup = """
        from validation import corpus_kld
        interrupt_at_call(corpus_kld, "window_logits", 13)  # window 5's reference
    """
    report, out = tmp_path / "report", tmp_path / "out.json"
    done = run_child(tmp_path, setup, "validate", "--model", tiny_model("llama", "Q8_0"), "--against", "numpy",
                     "--backend", "numpy", "--corpus-kld", "--ctx", 64, "--smoke-tokens", 0, "--report", report,
                     "--json", out)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == "interrupted during corpus_kld: the report holds the checks that finished"
    data = json.loads(out.read_text())
    assert data == json.loads((report / "validate.json").read_text())
    kld = data["corpus_kld"]
    assert data["interrupted"] == "corpus_kld" and data["passed"] is False and data["checks"]["tensors"] is True
    assert kld["interrupted"] is True and kld["windows"] == 4 and kld["windows_planned"] > 4
    assert kld["ours"]["scored_positions"] == 4 * 31 and kld["passed"] is None
    assert "interrupted by Ctrl-C" in (report / "report.md").read_text()
