"""Where one decode step's time goes: ``python -m bench_compare.decode_profile MODEL [--backend numba] [-t 2]``.

Wraps every op of the engine's backend with a timer, runs warm decode steps and prints milliseconds per token per op,
calls per token and microseconds per call; what is left over is the Python glue of the forward pass, also given per
layer. Where the backend runs a whole layer as one op (``decode_layer``), that op is what it times; ``--unfused``
turns that off, so the layer's ops are timed one by one (their Python between them included). A diagnostic for backend authors (timers add ~1 us per call), not a benchmark: speed is measured against
llama.cpp with ``bench-compare compare``.
"""

from __future__ import annotations

import argparse
import collections
import time

from inference_engine.backends.base import Backend
from inference_engine.engine import load_engine

# every op the forward pass calls per token: the abstract ones plus matmul_many (a fused run's one call),
# decode_attention (a token's RoPE through attention in one call) and decode_layer (a whole layer in one call), where
# the backend fuses them
PROFILED_OPS = sorted(
    (Backend.__abstractmethods__ | {"matmul_many", "decode_attention", "decode_layer"})
    - {"load_matrix", "load_vector", "load_embedding", "kv_alloc"}
)


def profile_decode(engine, prompt: str = "The capital of France is", steps: int = 30, warmup: int = 3,
                   fuse_layers: bool = True) -> dict:
    """Per-op timings of ``steps`` decode steps after ``warmup`` untimed ones (the backend's ops are wrapped);
    ``fuse_layers=False`` runs each layer's ops one by one on a backend that would fuse them."""
    totals: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter = collections.Counter()
    backend = engine.backend
    if not fuse_layers:
        backend.fuse_layers = False  # the numba backend's switch; a backend without fused layers has none to turn off
    depth = [0]  # an op called from inside another (the base matmul_many calls matmul) counts for the outer one

    for op in PROFILED_OPS:
        inner = getattr(backend, op)

        def timed(*args, _inner=inner, _op=op, **kwargs):
            if depth[0]:
                return _inner(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                out = _inner(*args, **kwargs)
            finally:
                depth[0] -= 1
            totals[_op] += time.perf_counter() - start
            calls[_op] += 1
            return out

        setattr(backend, op, timed)
    ids = engine.tokenize(prompt)
    engine.reset()
    engine.prefill(ids)
    for _ in range(warmup):
        engine.decode(ids[-1])
    totals.clear()
    calls.clear()
    start = time.perf_counter()
    for _ in range(steps):
        engine.decode(ids[-1])
    step_s = (time.perf_counter() - start) / steps
    ops = {op: {"ms_per_token": totals[op] / steps * 1e3, "calls_per_token": calls[op] / steps,
                "us_per_call": totals[op] / calls[op] * 1e6} for op in totals}
    glue_s = step_s - sum(totals.values()) / steps
    n_layer = engine.model.hp.n_layer
    return {"step_ms": step_s * 1e3, "tokens_per_s": 1.0 / step_s, "n_layer": n_layer, "ops": ops,
            "glue_ms_per_token": glue_s * 1e3, "glue_us_per_layer": glue_s / n_layer * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--numerics", default="f32")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--unfused", action="store_true", help="time a layer's ops one by one, not as one fused op")
    args = parser.parse_args(argv)
    engine = load_engine(args.model, backend=args.backend, numerics=args.numerics, n_threads=args.threads)
    p = profile_decode(engine, steps=args.steps, fuse_layers=not args.unfused)
    print(f"decode step {p['step_ms']:.2f} ms ({p['tokens_per_s']:.1f} tok/s), {p['n_layer']} layers, "
          f"backend {args.backend}, numerics {args.numerics}, threads {args.threads or 'default'}")
    print(f"  {'op':<12}{'ms/token':>10}{'calls':>8}{'us/call':>10}")
    for op, row in sorted(p["ops"].items(), key=lambda kv: -kv[1]["ms_per_token"]):
        print(f"  {op:<12}{row['ms_per_token']:>10.3f}{row['calls_per_token']:>8.0f}{row['us_per_call']:>10.1f}")
    print(f"  {'python glue':<12}{p['glue_ms_per_token']:>10.3f}   ({p['glue_us_per_layer']:.1f} us per layer)")


if __name__ == "__main__":
    main()
