"""What limits an MLX decode step: the host building it or the device computing it, and how big its graph is.

``python -m bench_compare.decode_profile MODEL --backend mlx`` (any MLX device: Metal, CUDA, the CPU build) runs
this instead of the op timers, which on a lazy backend would time graph building only. For each step mode of the MLX
backend (``compiled``: one compiled graph per decode step; ``lazy``: the same steps built op by op; ``sync``: each
step evaluated and read back before the next, the plain path) it measures, after warm-up steps:

* **host ms**: building the step's graph and handing it over (Python and MLX's graph construction; for
  ``compiled``, the replay of the traced graph), the device idle as far as this step is concerned;
* **wait ms**: from then until the step's logits and token are computed, nothing else queued: the device's time for
  the step plus MLX's own scheduling of its kernels (on a GPU, their launches); the median step's, and the 10th and
  90th percentiles of the steps' (their spread);
* **serial ms** = host + wait, what a token costs when the host waits for each step before building the next;
* **pipelined ms**: a token's time in the generation loop (``generate_step``, greedy), where ``compiled`` and
  ``lazy`` launch step n+1 before reading step n: close to max(host, wait) when the overlap works, so it names the
  limit (host: Python / graph building; device: kernels, their launches, memory);
* **forced ms**: the same loop decoding given tokens (``ForcedTokens``, as ``bench``'s tg and llama-bench's): the
  next step's token known on the host, not the pending step's pick on the device; on an H200 the greedy loop took
  8.4 ms a token where ``bench`` measured 6.4, which this separates from the rest of the two setups;
* **nodes**: the primitives in one token's graph (``mx.export_to_dot`` before evaluation); a compiled step fuses
  element-wise chains into ``Compiled...`` nodes; **compute** of them are not views (:data:`VIEW_PRIMITIVES`:
  reshapes, transposes, slices, which move no data where their input's layout allows, as in a decode step): on a
  GPU each compute node is one or more kernel launches. The graph is built for the device it runs on: on MLX's CPU
  build ``mx.fast``'s RMSNorm and attention appear as the several ops of their CPU fallbacks, on a GPU as one node;
* **idle ms** = pipelined - wait: per token, how long the device had nothing queued in the loop (the host building
  the step, or waiting on a read-back: the loop reads one value per token, the token, and the plain path its logits
  too before it builds the next step); near 0 where launching ahead hides the host.

``--prefill N`` measures one prefill of N tokens (host build, wait, nodes) instead, its quantized products as
``--mlx-prefill-matmul`` says (``quantized``, or ``f32``: each weight dequantized, then a float32 matmul). Each result
records the backend's ``switches`` it ran with (stacked matrices, our kernels, the K/V write, ...), so A/Bs are told
apart by what they ran, not by file names. A diagnostic for a lent GPU's one call; timings on a loaded CPU say
little.
"""

from __future__ import annotations

import collections
import io
import json
import re
import time

import numpy as np

from inference_engine.generate import PREFILL_CHUNK, ForcedTokens, generate_step, prefill_chunked
from inference_engine.store.atomic import atomic_write_text

MODES = ("compiled", "lazy", "sync")
# Primitives that make a view of their input (no kernel, no data moved) where its layout allows, as in a decode
# step's row-contiguous arrays; MLX copies instead where it does not (a reshape of a transposed array).
VIEW_PRIMITIVES = frozenset({"Reshape", "Transpose", "Slice", "ExpandDims", "Squeeze", "Broadcast", "Flatten",
                             "Unflatten", "AsStrided"})
_NODE = re.compile(r'\[label ="([^"]+)", shape=rectangle\]')


def compute_nodes(nodes: collections.Counter) -> int:
    """The nodes of a graph that are not :data:`VIEW_PRIMITIVES`."""
    return sum(n for kind, n in nodes.items() if kind not in VIEW_PRIMITIVES)


def graph_nodes(*arrays) -> collections.Counter:
    """Primitives in the unevaluated graph of ``arrays``, by name (MLX's DOT export)."""
    import mlx.core as mx

    dot = io.StringIO()
    mx.export_to_dot(dot, *arrays)
    return collections.Counter(_NODE.findall(dot.getvalue()))


def _sync_step(engine, token: int, count: bool) -> tuple[float, float, collections.Counter | None]:
    """The plain path's step (``OurEngine._run``'s work), timed in two parts: the forward pass built, then evaluated
    and read back."""
    cache, backend = engine.cache, engine.backend
    t0 = time.perf_counter()
    positions = np.array([cache.n_past], dtype=np.int64)
    logits = engine.model.forward(np.array([token], dtype=np.int64), positions, cache)
    t1 = time.perf_counter()
    nodes = graph_nodes(logits, *backend._pending.values()) if count else None
    t1b = time.perf_counter()
    int(np.argmax(backend.to_numpy(logits)[-1]))
    cache.advance(1)
    return t1 - t0, time.perf_counter() - t1b, nodes


def _launched_step(steps, token: int, count: bool) -> tuple[float, float, collections.Counter | None]:
    t0 = time.perf_counter()
    step = steps.decode(token, launch=False)
    t1 = time.perf_counter()
    nodes = graph_nodes(*step.outputs()) if count else None
    t1b = time.perf_counter()
    step.wait()
    step.token()
    return t1 - t0, time.perf_counter() - t1b, nodes


def profile_mode(engine, mode: str, prompt: list[int], steps: int = 30, warmup: int = 3, filler=()) -> dict:
    """One step mode's figures (see the module docstring), on a cache holding ``filler`` then ``prompt``."""
    engine.backend.step_mode = mode
    launched = engine.async_steps()

    def fill() -> None:
        engine.reset()
        prefill_chunked(engine, filler, PREFILL_CHUNK)
        engine.prefill(prompt)

    token = prompt[-1]
    fill()
    for _ in range(warmup):
        engine.decode(token)
    host, wait, nodes = [], [], None
    for i in range(steps):
        if launched is None:
            h, w, n = _sync_step(engine, token, i == 0)
        else:
            h, w, n = _launched_step(launched, token, i == 0)
        host.append(h)
        wait.append(w)
        nodes = nodes or n
    def loop_time(sampler=None) -> float:
        """Seconds per token of the generation loop (greedy, or ``sampler``), timed from the first token on."""
        engine.reset()
        prefill_chunked(engine, filler, PREFILL_CHUNK)
        loop = generate_step(engine, prompt, sampler, reset=False, n_past=engine.n_past)
        next(loop)  # the prefill and the first token
        t0, count = time.perf_counter(), 0
        for _ in loop:
            count += 1
            if count == steps:
                break
        seconds = (time.perf_counter() - t0) / max(count, 1)
        loop.close()
        return seconds

    pipelined = loop_time()
    forced = loop_time(ForcedTokens([token] * (steps + 1)))
    host_ms, wait_ms = float(np.median(host)) * 1e3, float(np.median(wait)) * 1e3
    wait_p10, wait_p90 = (float(q) * 1e3 for q in np.percentile(wait, [10, 90]))
    out = {
        "mode": mode,
        "host_ms": host_ms,
        "wait_ms": wait_ms,
        "wait_p10_ms": wait_p10,  # the spread of the steps' waits: how far apart two variants must be to differ
        "wait_p90_ms": wait_p90,
        "serial_ms": host_ms + wait_ms,
        "pipelined_ms": pipelined * 1e3,
        "forced_ms": forced * 1e3,
        "tokens_per_s": 1.0 / pipelined,
        "nodes": int(sum(nodes.values())),
        "compute_nodes": compute_nodes(nodes),
        "node_kinds": dict(nodes.most_common()),
        "idle_ms": max(0.0, pipelined * 1e3 - wait_ms),
        "limit": "host" if host_ms > wait_ms else "device",
    }
    if launched is not None:
        out.update(compiled=launched.compiled, why_not_compiled=launched.why_not_compiled, traces=launched.traces)
    return out


def profile_prefill(engine, tokens: list[int]) -> dict:
    """One prefill of ``tokens`` (after an untimed one of the same size): host build, wait, nodes."""
    cache, backend = engine.cache, engine.backend
    for timed in (False, True):
        engine.reset()
        t0 = time.perf_counter()
        logits = engine.model.forward(np.asarray(tokens, dtype=np.int64), np.arange(len(tokens)), cache)
        t1 = time.perf_counter()
        nodes = graph_nodes(logits, *backend._pending.values()) if timed else None
        t1b = time.perf_counter()
        backend.to_numpy(logits)
        t2 = time.perf_counter()
        cache.advance(len(tokens))
    host_ms, wait_ms = (t1 - t0) * 1e3, (t2 - t1b) * 1e3
    return {
        "mode": "prefill",
        "tokens": len(tokens),
        "prefill_matmul": backend.prefill_matmul,
        "host_ms": host_ms,
        "wait_ms": wait_ms,
        "tokens_per_s": len(tokens) / ((host_ms + wait_ms) / 1e3),
        "nodes": int(sum(nodes.values())),
        "compute_nodes": compute_nodes(nodes),
        "node_kinds": dict(nodes.most_common()),
    }


def run(
    engine, modes=MODES, steps: int = 30, prefill: int = 0, depth: int = 0, prompt: str = "The capital of France is"
) -> dict:
    ids = engine.tokenize(prompt)
    filler = [ids[i % len(ids)] for i in range(depth)]
    if prefill:
        engine.reset()
        prefill_chunked(engine, filler, PREFILL_CHUNK)
        return {
            "prefill": profile_prefill(engine, [ids[i % len(ids)] for i in range(prefill)]),
            "device": engine.backend.description,
            "switches": engine.backend.switches,
        }
    return {
        "modes": [profile_mode(engine, m, ids, steps, filler=filler) for m in modes],
        "depth": depth,
        "n_layer": engine.model.hp.n_layer,
        "device": engine.backend.description,
        "switches": engine.backend.switches,
    }


def print_report(p: dict) -> None:
    print(p["device"])
    if "prefill" in p:
        r = p["prefill"]
        print(
            f"prefill of {r['tokens']} tokens ({r['prefill_matmul']} products): host {r['host_ms']:.2f} ms, "
            f"wait {r['wait_ms']:.2f} ms ({r['tokens_per_s']:.0f} tok/s), {r['nodes']} graph nodes "
            f"({r['compute_nodes']} compute)"
        )
        return
    print(f"decode step at depth {p['depth']}, {p['n_layer']} layers")
    print(
        f"  {'mode':<10}{'host ms':>9}{'wait ms':>9}{'serial':>9}{'pipelined':>11}{'forced':>8}{'idle':>8}"
        f"{'tok/s':>9}{'nodes':>7}{'compute':>9}  limit"
    )
    for r in p["modes"]:
        print(
            f"  {r['mode']:<10}{r['host_ms']:>9.3f}{r['wait_ms']:>9.3f}{r['serial_ms']:>9.3f}"
            f"{r['pipelined_ms']:>11.3f}{r['forced_ms']:>8.3f}{r['idle_ms']:>8.3f}{r['tokens_per_s']:>9.1f}"
            f"{r['nodes']:>7}{r['compute_nodes']:>9}  {r['limit']}"
        )
    for r in p["modes"]:
        kinds = ", ".join(f"{k} {n}" for k, n in list(r["node_kinds"].items())[:8])
        note = ""
        if "compiled" in r:
            note = f" (traced {r['traces']}x)" if r["compiled"] else f" (not compiled: {r['why_not_compiled']})"
        print(f"  {r['mode']} nodes{note}: {kinds}")


def main(engine, args) -> None:
    modes = tuple(m for m in args.mlx_modes.split(",") if m)
    p = run(engine, modes, steps=args.steps, prefill=args.prefill, depth=args.depth)
    print_report(p)
    if args.json:
        atomic_write_text(args.json, json.dumps(p, indent=1))
        print(f"json: {args.json}")
