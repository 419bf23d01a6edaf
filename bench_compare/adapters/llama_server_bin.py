"""A user's own llama.cpp ``llama-server`` binary as the reference side of an HTTP compare:
``compare --engine openai:URL --against llama-server:PATH``.

Started and always stopped here exactly as llama-cpp-python's server is (:class:`LlamaServerBinary` is a
:class:`~bench_compare.adapters.llamacpp_server.LlamaCppServer` with another command: a free 127.0.0.1 port, ready
when ``GET /v1/models`` answers, its own process group stopped on success, error and Ctrl-C). The command::

    llama-server -m MODEL --host 127.0.0.1 --port PORT -a gguf-parity-model -t T -tb T -c N_CTX*P -np P
                 -b 512 -ub 512 -ngl 99 --no-webui

``-np P`` gives one slot per concurrent client of the sweep's largest level (``-c`` is the context of one request
times P, so each slot gets the context the in-process reference has); every other setting is llama-server's
default (F16 K/V cache, flash attention ``auto``, continuous batching). Unlike llama-cpp-python's server it serves
its slots concurrently. ``-ngl 99`` puts every layer on the GPU of a GPU build; a CPU build ignores it.
The binary's ``--version`` (build number, commit, compiler) and sha256 are recorded with the result.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from bench_compare.adapters.llamacpp_server import SERVER_MODEL_ALIAS, LlamaCppServer, ServerBackedEngine
from bench_compare.yardstick import HELP_TIMEOUT_S, BinaryInfo, last_line
from inference_engine.errors import GGUFParityError

ENGINE_NAME = "llama-server"
N_GPU_LAYERS = 99
N_BATCH = 512  # as the in-process reference and llama-cpp-python's server here


class LlamaServerBinary(LlamaCppServer):
    """The user's llama-server on 127.0.0.1, alive only inside ``with`` (see the module docstring)."""

    def __init__(self, info: BinaryInfo, model_path: str | Path, *, n_threads: int | None = None,
                 n_ctx: int = 2048, n_parallel: int = 1, **options):
        self.info = info
        self.n_parallel = max(1, int(n_parallel))
        self.version = binary_version(info.path)
        super().__init__(model_path, n_threads=n_threads, n_ctx=n_ctx, n_batch=N_BATCH, **options)

    def check_available(self) -> None:
        """Nothing to check: this server is the user's binary (checked by ``yardstick.check_binary``), not
        llama-cpp-python's extra."""

    @property
    def settings(self) -> dict[str, Any]:
        return {
            "server": "llama.cpp llama-server (the user's binary)", "path": str(self.info.path),
            "sha256": self.info.sha256,
            "version": self.version, "n_threads": self.n_threads, "n_ctx_per_slot": self.n_ctx,
            "n_parallel": self.n_parallel, "n_batch": self.n_batch, "n_gpu_layers": N_GPU_LAYERS,
            "type_k": "llama-server default (f16)", "type_v": "llama-server default (f16)",
            "flash_attn": "llama-server default (auto)", "command": self.command(),
        }

    def command(self) -> list[str]:
        return [
            str(self.info.path), "-m", str(self.model_path), "--host", "127.0.0.1", "--port", str(self.port),
            "-a", SERVER_MODEL_ALIAS, "-t", str(self.n_threads), "-tb", str(self.n_threads),
            "-c", str(self.n_ctx * self.n_parallel), "-np", str(self.n_parallel),
            "-b", str(self.n_batch), "-ub", str(self.n_batch), "-ngl", str(N_GPU_LAYERS), "--no-webui",
        ]


def binary_version(path: Path) -> str:
    """``llama-server --version``'s first line (``version: 0.5.0-dev (build 1, commit 0c1e570)``), or ``unknown``."""
    try:
        done = subprocess.run([str(path), "--version"], check=False, capture_output=True, text=True, errors="replace",
                              timeout=HELP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = [line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip().startswith("version")]
    return lines[0] if lines else last_line(done.stdout + done.stderr) or "unknown"


def open_engine(info: BinaryInfo, model: str, *, n_threads: int | None = None, n_ctx: int = 2048,
                n_parallel: int = 1, label: str = ENGINE_NAME, flag: str = "--against") -> ServerBackedEngine:
    """The user's llama-server started on ``model`` and an HTTP engine on it, named ``label`` (closing it stops the
    server); ``flag``: where the user named it, for its errors."""
    from bench_compare.adapters.openai_http import OpenAIHTTPEngine
    from inference_engine.store.named_models import resolve_model

    path = resolve_model(str(model), progress=False)
    server = LlamaServerBinary(info, path, n_threads=n_threads, n_ctx=n_ctx, n_parallel=n_parallel)
    try:
        server.start()
    except GGUFParityError as exc:
        raise GGUFParityError(f"{flag} llama-server: {exc}") from None
    try:
        engine = OpenAIHTTPEngine(server.base_url, path, model_name=SERVER_MODEL_ALIAS, label=label)
    except BaseException:
        server.stop()
        raise
    return ServerBackedEngine(server, engine)


def open_engine_under_test(target: str, model: str, *, n_threads: int | None = None, n_ctx: int = 2048,
                           n_parallel: int | str = 1, **_options) -> ServerBackedEngine:
    """Your own llama.cpp build's llama-server (CPU, CUDA, Vulkan, Metal), started here and always stopped.

    Factory for ``--engine llama-server:PATH``: the server on ``model`` as the engine under test, named
    ``llama-server:PATH``; ``validate`` holds its top-k log-probabilities up to llama.cpp in-process, ``compare``
    times it against ``--against`` (another build too: ``--against llama-server:OTHER``). ``n_parallel``: its slots
    (compare passes the sweep's largest level)."""
    from bench_compare import yardstick

    if not str(target).strip():
        raise GGUFParityError("--engine llama-server: needs the binary's path, e.g. --engine "
                              "llama-server:/path/to/llama.cpp/build/bin/llama-server")
    slots = str(n_parallel).strip()
    if not slots.isdigit() or int(slots) < 1:
        raise GGUFParityError(f"--engine llama-server: n_parallel must be an integer >= 1, got '{n_parallel}'")
    info = yardstick.check_binary(yardstick.Yardstick(ENGINE_NAME, Path(target).expanduser()), flag="--engine",
                                  llama=True)
    return open_engine(info, model, n_threads=n_threads, n_ctx=int(n_ctx), n_parallel=int(slots),
                       label=f"{ENGINE_NAME}:{target}", flag="--engine")
