"""The load test (``bench_compare/server_load.py``) against our server on the tiny llama fixture: random lengths,
streams cancelled mid-way, malformed requests; zero 5xx, the KV pool empty afterwards, memory flat."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
pytest.importorskip("httpx", reason="the load test needs httpx (pip install -e '.[test]')")

from fixtures.servers import start_server

from bench_compare.server_load import check_loopback, run_load
from inference_engine.errors import GGUFParityError


def load(tiny_model, n: int, concurrency: int):
    with start_server(tiny_model("llama"), ctx=256, block_size=8, kv_blocks=128, max_batch=8, max_queue=256) as s:
        return asyncio.run(run_load(s.url, n_requests=n, concurrency=concurrency, cancel_fraction=0.1,
                                    malformed_fraction=0.1, max_new_tokens=24, seed=1, warmup=8))


def check(report) -> None:
    assert report.n_5xx == 0, report.summary()
    assert not report.malformed_not_4xx and report.bad_error_shape == 0, report.summary()
    assert report.pool_empty, report.summary()
    assert report.cancelled > 0 and report.malformed > 0 and report.completed_streams > 0, report.summary()
    assert report.ok, report.summary()


def test_small_load(tiny_model):
    check(load(tiny_model, n=24, concurrency=8))


@pytest.mark.slow
def test_load_of_200_requests(tiny_model):
    check(load(tiny_model, n=200, concurrency=16))


def test_load_test_refuses_other_hosts():
    with pytest.raises(GGUFParityError, match="127.0.0.1"):
        check_loopback("http://example.com:8080")
