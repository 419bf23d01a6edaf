"""llama.cpp's own OpenAI-compatible server (llama-cpp-python's ``llama_cpp.server``), started and stopped by the
harness: ``--engine llamacpp-server`` (or as the reference side of an HTTP compare / validate).

The server runs in a child process on a free 127.0.0.1 port; :class:`LlamaCppServer` waits for ``GET /v1/models``
to answer and *always* stops it (context manager: on normal exit, on error and on Ctrl-C; SIGTERM, then SIGKILL
after :data:`STOP_GRACE_S`; the child runs in its own process group so nothing it started outlives it).

Settings, recorded with every result:

* the same llama.cpp build and settings the in-process reference uses (F16 K/V cache, flash attention on, extra
  buffer types off: see ``bench_compare.engines``). ``use_extra_bufts`` is not a server flag, so the child is started
  through this module's ``__main__``, which turns it off before llama-cpp-python creates the model;
* ``interrupt_requests False``: the server's default (True) aborts a running request when a new one arrives, which
  would cut streams short in a concurrency sweep; with it off, requests queue;
* the server holds one lock around its one model, so it serves **one request at a time**: a concurrency sweep
  against it measures queueing, and reports say so;
* ``logits_all`` only when log-probabilities are needed (fidelity): it makes llama.cpp compute logits for every
  prompt position, which slows prefill, so speed runs leave it off.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from inference_engine.errors import GGUFParityError

# Seconds to wait for /v1/models after start: importing llama_cpp and loading a small GGUF takes 2-10 s here; a
# large model from a cold disk can take a minute.
START_TIMEOUT_S = 120.0
# Seconds between SIGTERM and SIGKILL when stopping (uvicorn shuts down in well under a second when idle).
STOP_GRACE_S = 5.0
POLL_INTERVAL_S = 0.1
GGML_TYPE_F16 = 1  # ggml.h enum ggml_type
SERVER_MODEL_ALIAS = "gguf-parity-model"

ONE_REQUEST_AT_A_TIME_NOTE = ("llama-cpp-python's server serves one request at a time (one lock around its model): "
                              "concurrency above 1 measures queueing on that side")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_available() -> tuple[bool, str]:
    """Whether llama-cpp-python's server extra is installed (and why not)."""
    import importlib.util

    for module, package in (("llama_cpp", "llama-cpp-python"), ("uvicorn", "uvicorn"), ("fastapi", "fastapi"),
                            ("sse_starlette", "sse-starlette"), ("starlette_context", "starlette-context"),
                            ("pydantic_settings", "pydantic-settings")):
        if importlib.util.find_spec(module) is None:
            return False, f"{package} is not installed (pip install 'gguf-parity[server]')"
    return True, ""


class LlamaCppServer:
    """A llama-cpp-python OpenAI server on 127.0.0.1, alive only inside ``with``."""

    def __init__(self, model_path: str | Path, *, n_threads: int | None = None, n_ctx: int = 2048,
                 logits_all: bool = False, n_batch: int = 512, start_timeout: float = START_TIMEOUT_S):
        self.check_available()
        self.model_path = Path(model_path)
        self.n_threads = n_threads or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                          else (os.cpu_count() or 1))
        self.n_ctx = int(n_ctx)
        self.n_batch = int(n_batch)
        self.logits_all = bool(logits_all)
        self.start_timeout = float(start_timeout)
        self.port: int | None = None
        self.process: subprocess.Popen | None = None
        self._log = None

    def check_available(self) -> None:
        """llama-cpp-python's server extra must be installed (a subclass that starts another program says so)."""
        ok, why = server_available()
        if not ok:
            raise GGUFParityError(f"llama.cpp's server cannot start: {why}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def settings(self) -> dict[str, Any]:
        return {
            "server": "llama-cpp-python llama_cpp.server", "n_threads": self.n_threads, "n_ctx": self.n_ctx,
            "n_batch": self.n_batch, "type_k": "f16", "type_v": "f16", "flash_attn": True, "extra_bufts": False,
            "logits_all": self.logits_all, "interrupt_requests": False,
            "concurrency_note": ONE_REQUEST_AT_A_TIME_NOTE,
        }

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "bench_compare.adapters.llamacpp_server",
            "--model", str(self.model_path), "--model_alias", SERVER_MODEL_ALIAS,
            "--host", "127.0.0.1", "--port", str(self.port),
            "--n_threads", str(self.n_threads), "--n_threads_batch", str(self.n_threads),
            "--n_ctx", str(self.n_ctx), "--n_batch", str(self.n_batch), "--n_ubatch", str(self.n_batch),
            "--type_k", str(GGML_TYPE_F16), "--type_v", str(GGML_TYPE_F16), "--flash_attn", "True",
            "--logits_all", str(self.logits_all), "--interrupt_requests", "False", "--verbose", "False",
        ]

    def start(self) -> LlamaCppServer:
        self.port = free_port()
        self._log = tempfile.TemporaryFile(mode="w+b")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # this checkout's code, whatever the child's cwd
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=self._log,
                                        stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self, n: int = 300) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        text = self._log.read().decode("utf-8", errors="replace")
        lines = [line for line in text.strip().splitlines() if line.strip()]
        return " ".join(lines[-1].split())[-n:] if lines else ""

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.start_timeout
        url = f"{self.base_url}/models"
        while True:
            code = self.process.poll()
            if code is not None:
                raise GGUFParityError(f"llama.cpp's server exited with code {code} before answering {url}: "
                                      f"{self._log_tail() or 'no output'}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise GGUFParityError(f"llama.cpp's server did not answer {url} within {self.start_timeout:g} s")
            time.sleep(POLL_INTERVAL_S)

    def stop(self) -> None:
        """Stop the server and everything in its process group; safe to call twice."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            _signal_group(process, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait(timeout=STOP_GRACE_S)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LlamaCppServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # start_new_session: the group id is the child's pid
    except ProcessLookupError:
        pass


class ServerBackedEngine:
    """An :class:`~bench_compare.adapters.openai_http.OpenAIHTTPEngine` on a server this object started; closing
    it stops the server."""

    def __init__(self, server: LlamaCppServer, engine):
        self.server = server
        self.engine = engine
        engine.server_info = {"server_settings": server.settings}

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def close(self) -> None:
        try:
            self.engine.close()
        finally:
            self.server.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_engine(target: str, model: str, **options) -> ServerBackedEngine:
    """llama.cpp's own OpenAI server (llama-cpp-python), started here on a free 127.0.0.1 port and always stopped.

    Factory for ``--engine llamacpp-server``: start llama.cpp's server on ``model`` and return an HTTP engine on
    it (close it to stop the server). Options: n_threads, n_ctx, n_batch, logits_all."""
    from bench_compare.adapters.openai_http import OpenAIHTTPEngine
    from inference_engine.store.named_models import resolve_model

    path = resolve_model(str(model), progress=False)
    server = LlamaCppServer(path, n_threads=options.get("n_threads"), n_ctx=int(options.get("n_ctx") or 2048),
                            n_batch=int(options.get("n_batch") or 512),
                            logits_all=str(options.get("logits_all", "false")).lower() in ("1", "true", "yes"))
    server.start()
    try:
        engine = OpenAIHTTPEngine(server.base_url, path, model_name=SERVER_MODEL_ALIAS, label="llamacpp-server")
    except BaseException:
        server.stop()
        raise
    return ServerBackedEngine(server, engine)


open_engine.unavailable = lambda: server_available()[1] or None  # type: ignore[attr-defined]  # engines list


def _serve() -> None:
    """The child process: llama-cpp-python's server with ``use_extra_bufts`` off (see the module docstring)."""
    import llama_cpp.llama_cpp as low_level

    default_params = low_level.llama_model_default_params

    def model_params_without_extra_bufts():
        params = default_params()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = model_params_without_extra_bufts
    from llama_cpp.server.__main__ import main

    main()


if __name__ == "__main__":
    _serve()
