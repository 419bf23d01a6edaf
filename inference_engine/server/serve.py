"""Build the server for a model and run it with uvicorn until SIGINT/SIGTERM.

On a signal uvicorn stops accepting connections and lets in-flight requests finish for at most ``drain_s``
seconds (streams included: the scheduler keeps stepping meanwhile); what is still running then is cancelled, the
scheduler stops, and :func:`serve` returns the signal it got. ``bench-compare serve`` turns SIGINT into exit 130
and SIGTERM into exit 0.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from dataclasses import dataclass

from inference_engine.defaults import REFERENCE
from inference_engine.errors import GGUFParityError

DEFAULT_DRAIN_S = 10.0


@dataclass
class ServerConfig:
    """The server's settings; backend, numerics and K/V type default to the reference (``defaults.REFERENCE``),
    ``bench-compare serve`` passes the commands' (``defaults.COMMANDS``)."""

    model: str
    backend: str = REFERENCE.backend
    numerics: str = REFERENCE.numerics
    threads: int | None = None
    ctx: int = 2048
    kv_blocks: int | None = None
    block_size: int = 16
    kv_type: str = REFERENCE.kv_type
    max_batch: int = 16
    max_queue: int = 64
    queue_timeout_s: float = 60.0
    prefill_chunk: int = 128
    prefix_caching: bool = True
    model_id: str | None = None  # the name clients send; default: the name given with --model


def build_app(config: ServerConfig, progress: bool = False):
    """The FastAPI app for ``config`` (model loaded, scheduler ready; it starts with the app's lifespan)."""
    from inference_engine.server.app import create_app
    from inference_engine.server.metrics import ServerMetrics
    from inference_engine.server.runner import BatchRunner
    from inference_engine.server.scheduler import Scheduler
    from inference_engine.server.served import ServedModel
    from inference_engine.store.named_models import resolve_model
    from inference_engine.tokenizer import GGUFTokenizer

    path = resolve_model(str(config.model), progress=progress)
    runner = BatchRunner(path, config.backend, config.numerics, config.threads, config.ctx, config.kv_blocks,
                         config.block_size, config.kv_type, config.prefix_caching)
    tokenizer = GGUFTokenizer.from_gguf(runner.gguf)
    metrics = ServerMetrics()
    scheduler = Scheduler(runner, tokenizer, config.max_batch, config.max_queue, config.queue_timeout_s,
                          config.prefill_chunk, metrics)
    metrics.bind(scheduler)
    model_id = config.model_id or str(config.model)
    aliases = frozenset({model_id, str(config.model), runner.gguf.path.name, runner.gguf.path.stem})
    served = ServedModel(model_id, aliases, scheduler, tokenizer, runner.gguf, runner.n_ctx, int(time.time()))
    return create_app(served, metrics)


def _uvicorn_server(app, host: str, port: int, drain_s: float, log_level: str):
    import uvicorn

    class _Server(uvicorn.Server):
        """uvicorn's server, but a signal ends :func:`serve` with the signal recorded instead of re-raised."""

        received: int | None = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def _on_signal(self, sig, frame) -> None:
            if self.received is None:
                self.received = sig
            self.handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=drain_s,
                            lifespan="on")
    return _Server(config)


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8080, drain_s: float = DEFAULT_DRAIN_S,
          log_level: str = "info", progress: bool = True) -> int | None:
    """Load the model, serve until a signal; returns the signal number that stopped it (None: stopped otherwise)."""
    if not 0 <= port <= 65535:
        raise GGUFParityError(f"--port must be in 0..65535, got {port}")
    if drain_s < 0:
        raise GGUFParityError(f"--drain must be 0 or more seconds, got {drain_s}")
    app = build_app(config, progress=progress)
    server = _uvicorn_server(app, host, port, drain_s, log_level)
    try:
        server.run()
    except SystemExit:  # uvicorn exits when it cannot bind
        if server.started:
            raise
        app.state.served.scheduler.stop()  # started by the app's lifespan, which uvicorn left without shutdown
        where = f"{host}:{port}"
        raise GGUFParityError(f"could not listen on {where} (in use, or not an address of this machine)") from None
    return server.received
