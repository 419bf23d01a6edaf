"""Servers for the tests: uvicorn in a thread on a free 127.0.0.1 port, always stopped.

``start_server(model_path, **config)`` is a context manager yielding the base URL; ``tiny_server`` is one server
for the module over the tiny llama fixture (numpy backend), with its app at ``tiny_server.app``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
pytest.importorskip("httpx", reason="the server tests need httpx (pip install -e '.[test]')")

START_TIMEOUT_S = 30.0


@contextlib.contextmanager
def start_server(model_path, **config):
    import uvicorn

    from inference_engine.server.serve import ServerConfig, build_app

    app = build_app(ServerConfig(model=str(model_path), **config))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", app=app, port=port)
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture(scope="module")
def tiny_server(tiny_model):
    with start_server(tiny_model("llama"), ctx=128, block_size=4, kv_blocks=256, max_batch=8) as s:
        s.model_path = tiny_model("llama")
        yield s
