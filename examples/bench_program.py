#!/usr/bin/env python3
"""An example benchmark program that ``bench-compare compare --engine llama-bench:PATH`` runs as the engine under
test: what an engine in any language (Rust, C++, CUDA) implements to get its speed ratios to llama.cpp.

    bench-compare compare -m smollm2-135m --engine llama-bench:examples/bench_program.py

The contract (docs/PLUGGING_IN.md, "Benchmark programs") is llama-bench's command line and JSON: ``--help`` names
the long flags below; one run is one test, ``-m MODEL -p P -n N [-d D] -r R -t T -ngl 99 -o json``; a pp test passes
``-n 0`` (time a prompt of P tokens), a tg test ``-p 0`` (time N single-token decodes); D tokens sit in the cache
before each timed run, prefilled untimed. After one untimed warm-up, R repetitions; stdout holds one JSON array
with the test's ``n_prompt``, ``n_gen``, ``n_depth`` and ``samples_ns`` (one duration per repetition, nanoseconds).

The engine timed here is ours (``--engine-spec``, default ``ours:numba``), reached through Python only because this
example is Python; yours would be your own code, behind the same flags and the same JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="llama-bench's command line, one test per run (-o json)")
    p.add_argument("-m", "--model", required=True, help="the GGUF file")
    p.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens of a pp test (0: a tg test)")
    p.add_argument("-n", "--n-gen", type=int, default=128, help="decoded tokens of a tg test (0: a pp test)")
    p.add_argument("-d", "--n-depth", type=int, default=0, help="tokens in the cache before each timed run")
    p.add_argument("-r", "--repetitions", type=int, default=5, help="timed runs, after one warm-up")
    p.add_argument("-t", "--threads", type=int, default=None, help="CPU threads")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0, help="layers on the GPU (ignored here)")
    p.add_argument("-o", "--output", default="json", choices=("json",), help="output format")
    p.add_argument("--engine-spec", default="ours:numba", help="which of bench-compare's engines to time")
    args = p.parse_args(argv)
    if (args.n_prompt > 0) == (args.n_gen > 0):
        p.error("give one test: -p P -n 0 (prompt) or -p 0 -n N (generation)")
    return args


def timed_run(engine, args: argparse.Namespace, rng: np.random.Generator) -> int:
    """One run of the test: the depth prefilled untimed, then the prompt or the decodes timed (nanoseconds)."""
    draw = lambda n: [int(t) for t in rng.integers(0, engine.n_vocab, n)]  # noqa: E731
    engine.reset()
    if args.n_depth:
        engine.prefill(draw(args.n_depth))
    if args.n_prompt:
        prompt = draw(args.n_prompt)
        start = time.perf_counter_ns()
        engine.prefill(prompt)
        return time.perf_counter_ns() - start
    tokens = draw(args.n_gen)
    start = time.perf_counter_ns()
    for token in tokens:
        engine.decode(token)
    return time.perf_counter_ns() - start


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from bench_compare import engines

    spec = engines.with_llama_bench_kv(engines.parse_engine_spec(args.engine_spec))  # F16 K/V, as llama-bench
    n_ctx = args.n_depth + args.n_prompt + args.n_gen + 16
    engine = engines.make_engine(spec, args.model, n_threads=args.threads, n_ctx=n_ctx, numerics="ggml",
                                 n_batch=512)
    rng = np.random.default_rng(1234)
    timed_run(engine, args, rng)  # the warm-up: first calls load kernels and allocate
    samples = [timed_run(engine, args, rng) for _ in range(args.repetitions)]
    engine.close()
    tokens = args.n_prompt or args.n_gen
    rates = [tokens * 1e9 / ns for ns in samples]
    record = {
        "n_prompt": args.n_prompt, "n_gen": args.n_gen, "n_depth": args.n_depth,
        "samples_ns": samples, "samples_ts": rates,
        "avg_ts": statistics.fmean(rates), "stddev_ts": statistics.stdev(rates) if len(rates) > 1 else 0.0,
        "n_threads": args.threads, "n_gpu_layers": args.n_gpu_layers, "type_k": "f16", "type_v": "f16",
        "backends": spec.name, "cpu_info": platform.processor() or platform.machine(), "gpu_info": "",
    }
    print(json.dumps([record], indent=2))  # stdout holds the JSON only: anything else goes to stderr
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
