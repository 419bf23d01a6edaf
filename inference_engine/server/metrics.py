"""Prometheus metrics of the server (``GET /metrics``), on a registry of its own per server instance.

Counters: requests by endpoint and HTTP status, prompt and generated tokens, prefix-cache lookups and hits (in
tokens). Gauges: requests waiting and running, KV blocks in use / cached / total, the prefix-cache hit rate.
Histograms: time to first token (arrival to the first sampled token, queueing included), inter-token time, rows
per step. The process collector adds ``process_resident_memory_bytes`` (Linux), which the load test reads.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from inference_engine.server.scheduler import Request, Scheduler, SchedulerMetrics

PREFIX = "gguf_parity"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class ServerMetrics(SchedulerMetrics):
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generated_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.finished = Counter(f"{PREFIX}_requests_finished", "Generation requests ended, by reason", ["reason"],
                                registry=r)
        self.prefix_lookup = Counter(f"{PREFIX}_prefix_cache_lookup_tokens", "Prompt tokens looked up in the "
                                     "prefix cache", registry=r)
        self.prefix_hit = Counter(f"{PREFIX}_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache",
                                  registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Arrival to first token (queueing included)",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_seconds", "Time between two tokens of one request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.step_rows = Histogram(f"{PREFIX}_batch_rows", "Rows (tokens) per forward step", buckets=ROW_BUCKETS,
                                   registry=r)
        self.queue_depth = Gauge(f"{PREFIX}_queue_depth", "Requests waiting for a slot or KV blocks", registry=r)
        self.running = Gauge(f"{PREFIX}_running_requests", "Requests in the running batch", registry=r)
        self.kv_in_use = Gauge(f"{PREFIX}_kv_blocks_in_use", "KV blocks referenced by live requests", registry=r)
        self.kv_cached = Gauge(f"{PREFIX}_kv_blocks_cached", "Free KV blocks kept for prefix reuse", registry=r)
        self.kv_total = Gauge(f"{PREFIX}_kv_blocks_total", "KV blocks in the pool", registry=r)
        self.hit_rate = Gauge(f"{PREFIX}_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / "
                              "prompt tokens looked up", registry=r)

    def bind(self, scheduler: Scheduler) -> None:
        """Gauges read the scheduler's state when scraped."""
        pool = scheduler.runner.pool
        self.queue_depth.set_function(lambda: scheduler.n_waiting)
        self.running.set_function(lambda: scheduler.n_running)
        self.kv_in_use.set_function(lambda: pool.n_in_use)
        self.kv_cached.set_function(lambda: pool.n_cached)
        self.kv_total.set_function(lambda: pool.n_blocks)
        self.hit_rate.set_function(lambda: pool.hit_tokens / pool.lookup_tokens if pool.lookup_tokens else 0.0)

    # --- scheduler hooks (scheduler thread) ----------------------------------------------------------------
    def on_admitted(self, req: Request, cached_tokens: int) -> None:
        self.prompt_tokens.inc(len(req.prompt_ids))
        if not req.params.prompt_logprobs:
            self.prefix_lookup.inc(len(req.prompt_ids))
            self.prefix_hit.inc(cached_tokens)

    def on_token(self, req: Request, first: bool, since_last_s: float) -> None:
        self.generated_tokens.inc()
        if first:
            self.ttft.observe(time.monotonic() - req.arrival)
        else:
            self.itl.observe(since_last_s)

    def on_finished(self, req: Request, reason: str) -> None:
        self.finished.labels(reason).inc()

    def on_step(self, rows: int, prompt_rows: int) -> None:
        self.step_rows.observe(rows)

    def render(self) -> bytes:
        return generate_latest(self.registry)
