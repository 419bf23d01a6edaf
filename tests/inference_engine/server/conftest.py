"""The module-wide server over the tiny llama fixture (numpy backend), started once and always stopped."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
pytest.importorskip("httpx", reason="the server tests need httpx (pip install -e '.[test]')")

from fixtures.servers import start_server


@pytest.fixture(scope="module")
def tiny_server(tiny_model):
    with start_server(tiny_model("llama"), ctx=128, block_size=4, kv_blocks=256, max_batch=8) as s:
        s.model_path = tiny_model("llama")
        yield s
