"""llama.cpp's first load of a file, behind a process boundary: an abort there must not take the harness down.

llama.cpp answers some malformed files with ``GGML_ASSERT`` (``abort()``, the whole process gone with exit 134)
rather than an error return. :func:`ensure_loadable` therefore (1) runs our own validation first
(:mod:`inference_engine.gguf.validate`: structure at open, hyperparameters and shapes in ``check_model``), which
refuses every case known to abort, and (2) has a child process load the file with llama.cpp and decode one token.
A child that dies becomes one line, ``llama.cpp aborted on this file: <its GGML_ASSERT line>``, exit 2, unless
llama.cpp also dies on a tiny known-good model (:mod:`validation.llamacpp.canary`, run in a second child only
then): a build that crashes on every model is not the file's fault, and the line says to rebuild it.

A file that passed is remembered by (real path, size, mtime) in a small JSON file per file under the cache
directory, so only its first use pays for the child (about a second: Python, llama-cpp-python and the mmap'ed
load; no weights are read beyond what one token's decode touches).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from inference_engine.errors import GGUFParityError
from inference_engine.store.identity import file_identity
from validation.llamacpp import canary

PROBE_CACHE_ENV = "GGUF_PARITY_PROBE_CACHE"
# "off" skips the child (validation still runs): the test suite sets it, because its tiny fixtures come from our own
# writer and hundreds of them would each pay a second; tests/validation/test_llamacpp_probe.py turns it back on.
PROBE_SWITCH_ENV = "GGUF_PARITY_PROBE"
# Loading a 1.5B model and decoding one token takes a few seconds here; ten times that means something is wrong.
PROBE_TIMEOUT_S = 300.0
# Exit codes of the child beside 0 (loaded and decoded one token).
EXIT_LOAD_FAILED = 3
EXIT_CONTEXT_FAILED = 4
EXIT_DECODE_FAILED = 5

# The child: llama-cpp-python's low-level API only, so it does not depend on this package being importable.
# Error-level log lines go to stderr, where the parent looks for the reason; ggml's aborts print there themselves.
PROBE_SCRIPT = r"""
import ctypes, os, sys
from llama_cpp import llama_cpp as ll

@ll.llama_log_callback
def _log(level, text, user_data):
    if level == 4 and text:
        sys.stderr.write("llama.cpp error: " + text.decode("utf-8", "replace"))
        sys.stderr.flush()

ll.llama_log_set(_log, ctypes.c_void_p(0))
ll.llama_backend_init()
params = ll.llama_model_default_params()
params.use_extra_bufts = False
model = ll.llama_model_load_from_file(sys.argv[1].encode(), params)
if not model:
    os._exit(3)
cp = ll.llama_context_default_params()
cp.n_ctx = 16
cp.n_batch = 1
cp.n_ubatch = 1
cp.n_threads = 1
cp.n_threads_batch = 1
ctx = ll.llama_init_from_model(model, cp)
if not ctx:
    os._exit(4)
tokens = (ll.llama_token * 1)(0)
rc = ll.llama_decode(ctx, ll.llama_batch_get_one(tokens, 1))
os._exit(0 if rc == 0 else 5)
"""


def probe_cache_dir() -> Path:
    env = os.environ.get(PROBE_CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gguf-parity" / "llamacpp-probe"


def _cache_file(identity: dict) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    return probe_cache_dir() / f"{key}.json"


def is_known_good(path: str | os.PathLike) -> bool:
    identity = file_identity(path)
    try:
        return json.loads(_cache_file(identity).read_text()).get("identity") == identity
    except (OSError, ValueError, AttributeError):
        return False


def _remember_good(identity: dict) -> None:
    from inference_engine.store.atomic import atomic_write_json

    try:
        cache = probe_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        atomic_write_json(_cache_file(identity), {"identity": identity, "result": "ok"})
    except OSError:
        pass  # a read-only cache only costs the next run another probe


def ensure_loadable(path: str | os.PathLike) -> None:
    """Validate ``path`` and have a child process load it with llama.cpp, unless it passed before (cached)."""
    path = Path(path)
    if is_known_good(path):
        return
    from inference_engine.gguf.file import check_reference_file

    check_reference_file(path)  # one line, exit 2, for everything we know llama.cpp would abort on
    if os.environ.get(PROBE_SWITCH_ENV, "on").lower() == "off":
        return
    identity = file_identity(path)
    run_probe(path)
    _remember_good(identity)


def _run_child(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE_SCRIPT, str(path)], check=False, capture_output=True,
                          text=True, errors="replace", timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                          env={**os.environ, "GGML_NO_BACKTRACE": "1"})  # ggml's backtrace costs seconds


def run_probe(path: Path) -> None:
    """Load ``path`` and decode one token in a child process; raise one line on anything but success. A child that
    dies is run again on a tiny known-good model (:mod:`validation.llamacpp.canary`) before the file is blamed."""
    try:
        done = _run_child(path)
    except subprocess.TimeoutExpired:
        raise GGUFParityError(f"{path}: llama.cpp did not load this file within {PROBE_TIMEOUT_S:.0f} s") from None
    if done.returncode == 0:
        return
    reason = abort_reason(done.stderr)
    if done.returncode < 0 or done.returncode == canary.ABORT_EXIT:
        build_crash = _build_crash(path, reason or canary.crash_label(done))
        if build_crash:
            raise GGUFParityError(build_crash)
        raise GGUFParityError(f"{path}: llama.cpp aborted on this file: {reason or canary.crash_label(done)}")
    what = {EXIT_LOAD_FAILED: "could not load this model", EXIT_CONTEXT_FAILED: "could not create a context",
            EXIT_DECODE_FAILED: "could not decode a token"}.get(done.returncode,
                                                                f"failed (exit {done.returncode})")
    raise GGUFParityError(f"{path}: llama.cpp {what}" + (f" ({reason})" if reason else ""))


def _build_crash(path: Path, reason: str) -> str | None:
    """The message when this llama.cpp build dies on the canary too (not the file's fault), else None."""
    try:
        canary_crash = canary.build_crash_reason(_run_child)
    except subprocess.TimeoutExpired:
        return None  # no verdict on the build: the file's own crash stands
    if canary_crash is None:
        return None
    version = package_version("llama-cpp-python")
    return (f"this llama.cpp build (llama-cpp-python {version}) crashes on every model, even a 1-layer F32 llama "
            f"({canary_crash}), so its crash on {path.name} ({reason}) is not the file's fault: rebuild it for this "
            f"machine (pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python "
            f"llama-cpp-python=={version}) and try again")


def package_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def abort_reason(stderr: str) -> str | None:
    """The most telling line of the child's stderr: the GGML_ASSERT / GGML_ABORT line, else llama.cpp's error."""
    lines = [" ".join(line.split()) for line in stderr.splitlines() if line.strip()]
    for marker in ("GGML_ASSERT", "GGML_ABORT", "terminate called", "error loading model:"):
        for line in lines:
            if marker in line:
                line = line.split("llama.cpp error: ", 1)[-1]
                return re.sub(r"^\S*/", "", line)[:300]  # "/long/build/path/src/llama-model.cpp:1328: ..." -> file
    errors = [line.removeprefix("llama.cpp error: ") for line in lines if line.startswith("llama.cpp error: ")]
    if errors:
        return errors[-1][:300]
    return lines[-1][:300] if lines else None
