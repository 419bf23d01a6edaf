"""A bounded load test of our server on this machine: ``python -m bench_compare.server_load --url URL -n 200``.

Sends ``n`` requests (``concurrency`` at a time) to a server on 127.0.0.1 only: random prompt lengths and
``max_tokens``, streaming and not, completions and chat; a share of the streams is cancelled mid-way (the client
closes the connection after the first chunk) and a share of the requests is malformed (bad JSON, unknown fields,
absurd values, unknown model). Then it checks what a server must survive:

* zero 5xx answers, and every malformed request answered with a 4xx in OpenAI's error shape;
* the KV pool back to empty (``/health``: no block in use, nothing running or waiting) once the load is over;
* resident memory flat: ``process_resident_memory_bytes`` from ``/metrics`` after the run is within
  ``RSS_GROWTH_LIMIT`` of the value after a warm-up round.

Not a speed benchmark: the HTTP benchmark (``compare --engine openai:URL``) measures speed.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import click

from inference_engine.errors import GGUFParityError

# A leak of per-request state (KV buffers, decoder state, response bodies) grows with the request count; allocator
# noise and caches warmed by the first requests do not. After a warm-up round the RSS may still move by a few MB
# (Python's arenas, NumPy temporaries of a bigger batch): 64 MiB is far above that and far below what leaking every
# request's KV blocks would cost over 200 requests of a real model.
RSS_GROWTH_LIMIT = 64 * 2**20
POOL_DRAIN_TIMEOUT_S = 10.0
WORDS = ["the", "a", "of", "river", "mountain", "quietly", "seven", "blue", "answer", "because", "market", "light",
         "stone", "paper", "engine"]


@dataclass
class LoadReport:
    sent: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    cancelled: int = 0
    malformed: int = 0
    malformed_not_4xx: list[str] = field(default_factory=list)
    bad_error_shape: int = 0
    completed_streams: int = 0
    tokens: int = 0
    rss_before: float | None = None
    rss_after: float | None = None
    pool_after: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def n_5xx(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)

    @property
    def pool_empty(self) -> bool:
        p = self.pool_after
        return p.get("kv_blocks_in_use") == 0 and p.get("running") == 0 and p.get("waiting") == 0

    @property
    def rss_growth(self) -> float | None:
        if self.rss_before is None or self.rss_after is None:
            return None
        return self.rss_after - self.rss_before

    @property
    def ok(self) -> bool:
        growth = self.rss_growth
        return (self.n_5xx == 0 and not self.malformed_not_4xx and self.bad_error_shape == 0 and self.pool_empty
                and (growth is None or growth <= RSS_GROWTH_LIMIT))

    def summary(self) -> str:
        growth = self.rss_growth
        rss = "n/a (no process_resident_memory_bytes)" if growth is None else f"{growth / 2**20:+.1f} MiB"
        return (f"{self.sent} requests in {self.seconds:.1f} s: statuses {dict(sorted(self.statuses.items()))}, "
                f"{self.cancelled} cancelled mid-stream, {self.malformed} malformed "
                f"({len(self.malformed_not_4xx)} not answered 4xx, {self.bad_error_shape} without OpenAI's error "
                f"shape), {self.tokens} streamed chunks; 5xx: {self.n_5xx}; pool after: {self.pool_after}; "
                f"RSS growth after warm-up: {rss}; {'OK' if self.ok else 'FAILED'}")


def check_loopback(url: str) -> str:
    host = urlparse(url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise GGUFParityError(f"the load test only talks to a server on this machine (127.0.0.1), not '{host}'")
    return url.rstrip("/")


def _malformed(model: str, rng: random.Random) -> tuple[str, bytes | dict]:
    cases = [
        ("bad json", b'{"model": "x", "prompt": '),
        ("not an object", b"[1, 2, 3]"),
        ("unknown field", {"model": model, "prompt": "hi", "max_tokens": 4, "frobnicate": True}),
        ("unknown model", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}),
        ("negative max_tokens", {"model": model, "prompt": "hi", "max_tokens": -5}),
        ("absurd max_tokens", {"model": model, "prompt": "hi", "max_tokens": 10**12}),
        ("absurd temperature", {"model": model, "prompt": "hi", "temperature": 1e9}),
        ("bad top_p", {"model": model, "prompt": "hi", "top_p": 0}),
        ("bad token id", {"model": model, "prompt": [10**9], "max_tokens": 2}),
        ("long prompt", {"model": model, "prompt": " ".join(["stone"] * 5000), "max_tokens": 2}),
    ]
    return rng.choice(cases)


def _prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60)))


async def _one(client, base: str, model: str, rng: random.Random, report: LoadReport, cancel_p: float,
               malformed_p: float, max_new: int) -> None:
    report.sent += 1
    if rng.random() < malformed_p:
        report.malformed += 1
        what, body = _malformed(model, rng)
        kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        r = await client.post(f"{base}/v1/completions", **kwargs)
        report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
        if not 400 <= r.status_code < 500:
            report.malformed_not_4xx.append(f"{what}: {r.status_code}")
        else:
            try:
                err = r.json()["error"]
                assert isinstance(err["message"], str) and isinstance(err["type"], str)
            except Exception:  # noqa: BLE001
                report.bad_error_shape += 1
        return
    chat = rng.random() < 0.3
    body: dict = {"model": model, "max_tokens": rng.randint(1, max_new), "temperature": rng.choice([0.0, 0.8]),
                  "seed": rng.randint(0, 1000)}
    if chat:
        body["messages"] = [{"role": "user", "content": _prompt(rng)}]
        url = f"{base}/v1/chat/completions"
    else:
        body["prompt"] = _prompt(rng)
        url = f"{base}/v1/completions"
    stream = rng.random() < 0.7
    cancel = stream and rng.random() < cancel_p
    body["stream"] = stream
    if not stream:
        r = await client.post(url, json=body)
        report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
        return
    async with client.stream("POST", url, json=body) as r:
        report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
        if r.status_code != 200:
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                report.completed_streams += 1
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                report.statuses[500] = report.statuses.get(500, 0) + 1  # an error inside a 200 stream
                break
            report.tokens += 1
            if cancel:
                report.cancelled += 1
                break  # leaving the block closes the connection mid-stream


async def _rss(client, base: str) -> float | None:
    text = (await client.get(f"{base}/metrics")).text
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1])
    return None


async def _pool_when_idle(client, base: str) -> dict:
    deadline = time.monotonic() + POOL_DRAIN_TIMEOUT_S
    while True:
        health = (await client.get(f"{base}/health")).json()
        idle = health["kv_blocks_in_use"] == 0 and health["running"] == 0 and health["waiting"] == 0
        if idle or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.05)


async def run_load(url: str, n_requests: int = 200, concurrency: int = 16, cancel_fraction: float = 0.1,
                   malformed_fraction: float = 0.1, max_new_tokens: int = 32, seed: int = 0,
                   warmup: int = 16, timeout_s: float = 600.0) -> LoadReport:
    import httpx

    base = check_loopback(url)
    rng = random.Random(seed)
    report = LoadReport()
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        model = (await client.get(f"{base}/v1/models")).json()["data"][0]["id"]
        warm = LoadReport()
        await asyncio.gather(*(_one(client, base, model, rng, warm, cancel_fraction, 0.0, max_new_tokens)
                               for _ in range(warmup)))
        await _pool_when_idle(client, base)
        report.rss_before = await _rss(client, base)
        start = time.monotonic()
        sem = asyncio.Semaphore(concurrency)

        async def guarded():
            async with sem:
                await _one(client, base, model, rng, report, cancel_fraction, malformed_fraction, max_new_tokens)

        await asyncio.wait_for(asyncio.gather(*(guarded() for _ in range(n_requests))), timeout_s)
        report.seconds = time.monotonic() - start
        report.pool_after = await _pool_when_idle(client, base)
        report.rss_after = await _rss(client, base)
    return report


@click.command()
@click.option("--url", default="http://127.0.0.1:8080", show_default=True, help="The server (127.0.0.1 only).")
@click.option("-n", "n_requests", default=200, show_default=True, type=int, help="Requests to send.")
@click.option("--concurrency", "-c", default=16, show_default=True, type=int, help="Requests in flight at once.")
@click.option("--cancel", "cancel_fraction", default=0.1, show_default=True, type=float,
              help="Share of streams cancelled after their first chunk.")
@click.option("--malformed", "malformed_fraction", default=0.1, show_default=True, type=float,
              help="Share of malformed requests.")
@click.option("--max-tokens", default=32, show_default=True, type=int, help="max_tokens drawn from 1..this.")
@click.option("--seed", default=0, show_default=True, type=int)
def main(url, n_requests, concurrency, cancel_fraction, malformed_fraction, max_tokens, seed) -> None:
    """Load-test a server on 127.0.0.1; exit 1 when it answered 5xx, leaked KV blocks or grew in memory."""
    try:
        check_loopback(url)
    except GGUFParityError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    report = asyncio.run(run_load(url, n_requests, concurrency, cancel_fraction, malformed_fraction, max_tokens,
                                  seed))
    click.echo(report.summary())
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
