"""``bench-compare serve -m MODEL``: serve our engine over an OpenAI-compatible HTTP API.

Only flags here; the server is :mod:`inference_engine.server`. SIGTERM drains in-flight requests (at most
``--drain`` seconds) and exits 0; Ctrl-C does the same and exits 130.
"""

from __future__ import annotations

import signal

import click

from bench_compare.options import device_option, require_at_least, table_default
from inference_engine import defaults
from inference_engine.errors import GGUFParityError


@click.command("serve")
@click.option("--model", "-m", default="smollm2-135m", show_default=True, help="Named model or path to a .gguf.")
@click.option("--backend", default=None,
              help=f"numba or numpy.{table_default(defaults.COMMANDS, 'backend')}")
@click.option("--numerics", default=None,
              help="ggml (llama.cpp's arithmetic, integer-dot kernels: as compare measures) or f32 (dequantized)."
                   f"{table_default(defaults.COMMANDS, 'numerics')}")
@device_option("Where the server computes (its backends, numpy and numba, use the CPU)")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, type=int, help="Port to listen on (0: any free one).")
@click.option("--threads", "-t", default=None, type=int,
              help=f"Threads.{table_default(defaults.COMMANDS, 'threads')}")
@click.option("--ctx", default=2048, show_default=True, type=int, help="Context of one request (prompt + output).")
@click.option("--max-batch", default=16, show_default=True, type=int, help="Requests generating at once.")
@click.option("--kv-blocks", default=None, type=int, help="KV blocks in the pool [default: 4 contexts' worth].")
@click.option("--block-size", default=16, show_default=True, type=int, help="Tokens per KV block.")
@click.option("--kv-type", default=None,
              help="KV cache storage: f16 (llama.cpp's default) or f32."
                   f"{table_default(defaults.COMMANDS, 'kv_type')}")
@click.option("--max-queue", default=64, show_default=True, type=int, help="Requests waiting at most (then 429).")
@click.option("--queue-timeout", default=60.0, show_default=True, type=float,
              help="Seconds a request may wait for room (then 503).")
@click.option("--prefill-chunk", default=128, show_default=True, type=int, help="Prompt tokens per step at most.")
@click.option("--no-prefix-cache", is_flag=True, help="Do not reuse KV blocks of earlier prompts.")
@click.option("--model-id", default=None, help="Model name clients send [default: the --model value].")
@click.option("--drain", default=10.0, show_default=True, type=float,
              help="Seconds in-flight requests get to finish on SIGINT/SIGTERM.")
@click.option("--log-level", default="info", show_default=True, help="uvicorn log level.")
def serve(model, backend, numerics, host, port, threads, ctx, max_batch, kv_blocks, block_size, kv_type, max_queue,
          queue_timeout, prefill_chunk, no_prefix_cache, model_id, drain, log_level, device) -> int:
    """Serve MODEL with an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics)."""
    from inference_engine.backends import BACKENDS, resolve_device
    from inference_engine.backends.base import check_kv_type
    from inference_engine.registries import check_numerics
    from inference_engine.server.serve import ServerConfig
    from inference_engine.server.serve import serve as run_server

    run = defaults.COMMANDS.resolve(backend=backend, numerics=numerics, kv_type=kv_type, threads=threads)
    backend, numerics, kv_type, threads = run.backend, run.numerics, run.kv_type, run.threads
    if backend not in BACKENDS or backend == "mlx":
        raise GGUFParityError(f"unknown or unsupported backend '{backend}' for serving; supported: numpy, numba")
    check_numerics(numerics)
    check_kv_type(kv_type)
    resolve_device(backend, device)  # --device gpu: one line naming what the backend can use
    require_at_least(1, ("--ctx", ctx), ("--max-batch", max_batch), ("--block-size", block_size),
                     ("--max-queue", max_queue), ("--prefill-chunk", prefill_chunk), ("--threads", threads),
                     ("--kv-blocks", kv_blocks))
    if queue_timeout <= 0:
        raise GGUFParityError(f"--queue-timeout must be positive, got {queue_timeout}")
    config = ServerConfig(model=model, backend=backend, numerics=numerics, threads=threads, ctx=ctx,
                          kv_blocks=kv_blocks, block_size=block_size, kv_type=kv_type, max_batch=max_batch,
                          max_queue=max_queue, queue_timeout_s=queue_timeout, prefill_chunk=prefill_chunk,
                          prefix_caching=not no_prefix_cache, model_id=model_id)
    received = run_server(config, host=host, port=port, drain_s=drain, log_level=log_level)
    if received == signal.SIGINT:
        click.echo("interrupted", err=True)
        return 130
    return 0
