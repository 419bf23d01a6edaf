"""Where a decode step's (or a prefill's) time goes, op by op: ``python -m bench_compare.decode_profile MODEL``.

Wraps every op of the engine's backend with a timer, runs warm decode steps (or, with ``--prefill N``, one prefill
of N tokens after an untimed one) and prints per op: milliseconds per token, calls per token, microseconds per call,
and the rate it ran at, GB/s of bytes it read (weights, K/V, activations) and GFLOP/s; what is left over is the
Python of the forward pass, also given per layer. The step's time, and so what is left over, come from twin steps
run between the recorded ones without the recording (the bytes, FLOPs and timeline of every call cost tens of
microseconds a call). Where the backend runs a whole layer as one op (``decode_layer``), that op is what it times;
``--unfused`` turns that off, so the layer's ops are timed one by one (on MLX: each weight matrix its own product,
not a layer's Q/K/V and gate/up stacked into one each).

On the MLX backend, whose ops only build a graph, it profiles steps instead (:mod:`bench_compare.step_profile`: host
time building a step vs time waiting for the device, per step mode, and the graph's nodes per token); ``--ops``
keeps the op timers there.

``--trace FILE`` writes the timeline as Chrome trace JSON (open it in https://ui.perfetto.dev or chrome://tracing):
one complete event per op call, nested in one event per layer and one per decode step, each op's ``args`` holding its
layer, the weights it read, its bytes and FLOPs.

Bytes and FLOPs are estimates from shapes, not counters: a matmul reads its weight matrix's bytes (as stored in the
GGUF) plus its input and output, and does ``2 * tokens * rows * cols`` FLOPs; attention reads the cached K/V up to
the position (F16: 2 bytes an element) and does ``2 * tokens * heads * positions * (d_k + d_v)``; a fused layer is
the sum of its layer's matrices and its attention; element-wise ops read and write their arrays (the K/V cache is F16, as
in compare). ``--depth N`` fills the cache with N tokens first: where the time goes at long context. A diagnostic for
backend authors, not a benchmark: speed is measured against llama.cpp with
``bench-compare compare``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench_compare import step_profile
from inference_engine.backends import get_backend_class
from inference_engine.backends.base import Backend
from inference_engine.engine import load_engine
from inference_engine.errors import GGUFParityError
from inference_engine.generate import PREFILL_CHUNK, prefill_chunked
from inference_engine.store.atomic import atomic_write_text

# every op the forward pass calls per token: the abstract ones plus matmul_many (a fused run's one call),
# decode_attention (a token's RoPE through attention in one call) and decode_layer (a whole layer in one call), where
# the backend fuses them
PROFILED_OPS = sorted(
    (Backend.__abstractmethods__ | {"matmul_many", "decode_attention", "decode_layer"})
    - {"load_matrix", "load_vector", "load_embedding", "kv_alloc"}
)
LOADERS = ("load_matrix", "load_matrices", "load_vector", "load_embedding")
KV_ELEMENT_BYTES = 2  # the F16 K/V cache compare and llama.cpp use
LAYER_NAME = re.compile(r"^blk\.(\d+)\.")


@contextlib.contextmanager
def _switched_off(cls: type, attribute: str, when: bool) -> Iterator[None]:
    """``cls.attribute`` False inside the block where ``when`` (a class-level switch read at load time)."""
    with class_attribute(cls, attribute, False, when):
        yield


# The flags that set an MLX backend's choices (main refuses them with another backend)
MLX_FLAGS = ("--mlx-prefill-matmul", "--mlx-attention-kernel", "--mlx-rope-kernel", "--mlx-block-kernel-types",
             "--mlx-matvec", "--mlx-kv-write", "--mlx-norm-kernel")


@contextlib.contextmanager
def class_attribute(cls: type, attribute: str, value, when: bool) -> Iterator[None]:
    """``cls.attribute`` = ``value`` inside the block where ``when`` (a class-level setting read at load time)."""
    if not when:
        yield
        return
    before = getattr(cls, attribute)
    setattr(cls, attribute, value)
    try:
        yield
    finally:
        setattr(cls, attribute, before)


@dataclass
class WeightMap:
    """What each prepared weight is: the backend's handle (by identity) -> the GGUF tensor it was made from."""

    by_id: dict[int, Any] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)  # the handles, so that their ids stay theirs

    def add(self, handle: Any, info: Any) -> None:
        self.by_id[id(handle)] = info
        self.keep.append(handle)

    def find(self, value: Any) -> list[Any]:
        """The tensors among ``value`` (a handle, or a list / tuple of them)."""
        if isinstance(value, (list, tuple)):
            return [t for v in value for t in self.find(v)]
        info = self.by_id.get(id(value))
        return [info] if info is not None else []


@contextlib.contextmanager
def recording_weights(backend_cls: type[Backend]) -> Iterator[WeightMap]:
    """While the engine loads: every handle the backend's loaders return, mapped to its tensor."""
    weights = WeightMap()
    saved = {name: cls_attr for name in LOADERS if (cls_attr := backend_cls.__dict__.get(name)) is not None}
    originals = {name: getattr(backend_cls, name) for name in LOADERS}

    def wrap(name: str):
        inner = originals[name]

        def loader(self, t, *args, **kwargs):
            out = inner(self, t, *args, **kwargs)
            if name == "load_matrices":
                if isinstance(out, (list, tuple)) and len(out) == len(t):
                    for handle, info in zip(out, t):
                        weights.add(handle, info)
            else:
                weights.add(out, t)
            return out

        return loader

    for name in LOADERS:
        setattr(backend_cls, name, wrap(name))
    try:
        yield weights
    finally:
        for name in LOADERS:
            if name in saved:
                setattr(backend_cls, name, saved[name])
            else:
                delattr(backend_cls, name)


@dataclass
class Cost:
    bytes: int = 0
    flops: int = 0
    layer: int | str | None = None
    weights: list[str] = field(default_factory=list)


def _arrays(values) -> list[Any]:
    return [v for v in values if hasattr(v, "nbytes") and hasattr(v, "shape")]


def _tokens(x: Any) -> int:
    shape = getattr(x, "shape", ())
    return int(shape[0]) if len(shape) >= 2 else 1


class CostModel:
    """Estimates an op call's bytes, FLOPs and layer from its arguments (see the module docstring)."""

    def __init__(self, engine, weights: WeightMap):
        self.weights = weights
        self.hp = engine.model.hp
        self.last_layer: int | str | None = None
        self.layer_tensors: dict[int, list[Any]] = collections.defaultdict(list)
        for t in engine.gguf.tensors.values():
            m = LAYER_NAME.match(t.name)
            if m:
                self.layer_tensors[int(m.group(1))].append(t)

    def attention_cost(self, tokens: int, positions: int) -> tuple[int, int]:
        hp = self.hp
        kv_bytes = positions * hp.n_head_kv * (hp.head_dim_k + hp.head_dim_v) * KV_ELEMENT_BYTES
        flops = 2 * tokens * hp.n_head * positions * (hp.head_dim_k + hp.head_dim_v)
        return kv_bytes, flops

    def estimate(self, op: str, named: dict[str, Any], out: Any) -> Cost:
        """``named``: the call's arguments by parameter name (``il``, ``positions``, ``x``, ``q``, ``k``, ...)."""
        try:
            cost = self._estimate(op, named, out)
        except (IndexError, TypeError, ValueError, AttributeError):  # an op whose arguments changed shape: no cost
            cost = Cost()
        # an op that names no layer (an add, an attention over given arrays) is in the layer of the op before it
        if cost.layer is None:
            cost.layer = self.last_layer
        self.last_layer = cost.layer
        return cost

    def _estimate(self, op: str, named: dict[str, Any], out: Any) -> Cost:
        if out is None and op in ("decode_layer", "decode_attention"):
            return Cost(layer=named.get("il"))  # the backend declined to fuse: the ops that follow do the work
        values = list(named.values())
        found = [t for v in values for t in self.weights.find(v)]
        cost = Cost(weights=[t.name for t in found])
        layers = {int(m.group(1)) for t in found if (m := LAYER_NAME.match(t.name))}
        il = named.get("il")
        if isinstance(il, (int, np.integer)):
            cost.layer = int(il)
        elif len(layers) == 1:
            cost.layer = layers.pop()
        elif found and all(not LAYER_NAME.match(t.name) for t in found):
            cost.layer = "output" if any(t.name.startswith("output") for t in found) else "embd"
        activations = sum(int(a.nbytes) for a in _arrays(values) if id(a) not in self.weights.by_id)
        activations += sum(int(a.nbytes) for a in _arrays(out if isinstance(out, (list, tuple)) else [out]))
        if op == "decode_layer":
            positions = int(np.asarray(named["positions"]).reshape(-1)[0]) + 1
            matrices = [t for t in self.layer_tensors.get(cost.layer, []) if len(t.shape) >= 2]
            kv_bytes, attn_flops = self.attention_cost(1, positions)
            cost.weights = [t.name for t in self.layer_tensors.get(cost.layer, [])]
            cost.bytes = sum(t.n_bytes for t in self.layer_tensors.get(cost.layer, [])) + kv_bytes + activations
            cost.flops = 2 * sum(t.n_elements for t in matrices) + attn_flops
        elif op == "decode_attention":
            positions = int(np.asarray(named["positions"]).reshape(-1)[0]) + 1
            kv_bytes, cost.flops = self.attention_cost(1, positions)
            cost.bytes = kv_bytes + activations
        elif op == "attention":
            q, k = named["q"], named["k"]
            kv_bytes, cost.flops = self.attention_cost(_tokens(q), int(k.shape[0]))
            cost.bytes = activations  # the K/V views are among the arrays
        elif op in ("matmul", "matmul_many", "embed"):
            x = named["ids"] if op == "embed" else named["x"]
            n = _tokens(x) if op != "embed" else len(np.asarray(x).reshape(-1))
            if op == "embed":  # rows of the table, not the table
                cost.bytes = activations + sum(t.n_bytes // max(t.shape[0], 1) * n for t in found)
            else:
                cost.bytes = sum(t.n_bytes for t in found) + activations
                cost.flops = sum(2 * n * t.n_elements for t in found)
        else:
            size = sum(int(np.prod(a.shape)) for a in _arrays(values))
            cost.bytes, cost.flops = activations, size
        return cost


@dataclass
class Profile:
    """Per op totals, and every call as a timeline event (start and duration in seconds from the profile's start)."""

    totals: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    calls: collections.Counter = field(default_factory=collections.Counter)
    bytes: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    flops: dict[str, int] = field(default_factory=lambda: collections.defaultdict(int))
    events: list[dict[str, Any]] = field(default_factory=list)
    recording: bool = False

    def clear(self) -> None:
        self.totals.clear()
        self.calls.clear()
        self.bytes.clear()
        self.flops.clear()
        self.events.clear()


def instrument(backend, costs: CostModel, profile: Profile, origin: list[float]) -> None:
    """Wrap every op in :data:`PROFILED_OPS` on ``backend`` (an op called from inside another counts for the outer)."""
    depth = [0]
    for op in PROFILED_OPS:
        inner = getattr(backend, op)
        signature = inspect.signature(inner)

        def timed(*args, _inner=inner, _op=op, _signature=signature, **kwargs):
            if depth[0]:
                return _inner(*args, **kwargs)
            depth[0] += 1
            start = time.perf_counter()
            try:
                out = _inner(*args, **kwargs)
            finally:
                depth[0] -= 1
            seconds = time.perf_counter() - start
            if profile.recording:
                try:
                    named = _signature.bind(*args, **kwargs).arguments
                except TypeError:
                    named = {}
                cost = costs.estimate(_op, named, out)
                profile.totals[_op] += seconds
                profile.calls[_op] += 1
                profile.bytes[_op] += cost.bytes
                profile.flops[_op] += cost.flops
                profile.events.append({"op": _op, "start": start - origin[0], "seconds": seconds,
                                       "layer": cost.layer, "bytes": cost.bytes, "flops": cost.flops,
                                       "weights": cost.weights})
            return out

        setattr(backend, op, timed)


def profile_engine(engine, weights: WeightMap | None = None, prompt: str = "The capital of France is",
                   steps: int = 30, warmup: int = 3, fuse_layers: bool = True, prefill: int = 0,
                   depth: int = 0) -> dict:
    """Per-op timings of ``steps`` decode steps after ``warmup`` untimed ones, or with ``prefill`` > 0 of one prefill
    of that many tokens after an untimed one (the backend's ops are wrapped); ``fuse_layers=False`` runs each layer's
    ops one by one on a backend that would fuse them. ``weights`` (:func:`recording_weights` around the engine's
    load) names the weights each op reads; without it matmuls count only their activations. ``depth``: that many
    tokens in the cache (untimed) before the timed decode steps or prefill, for where the time goes at long context."""
    backend = engine.backend
    if not fuse_layers:
        backend.fuse_layers = False  # the numba backend's switch; a backend without fused layers has none to turn off
    ids = engine.tokenize(prompt)
    filler = [ids[i % len(ids)] for i in range(depth)]
    tokens = [ids[i % len(ids)] for i in range(prefill)]

    def fill() -> None:
        engine.reset()
        prefill_chunked(engine, filler, PREFILL_CHUNK)  # in llama-bench's n_ubatch chunks

    profile = Profile()
    origin = [0.0]
    instrument(backend, CostModel(engine, weights or WeightMap()), profile, origin)
    # Each timed step runs twice, alternately: as it runs (the op timers alone, about a microsecond a call), which
    # gives the step's time, and recording every op's bytes, FLOPs and timeline event, bookkeeping that costs tens of
    # microseconds a call outside the ops' own times; so what is left outside the ops comes from the first kind.
    # Alternating puts both kinds under the same machine noise.
    plain: list[float] = []
    steps_run: list[tuple[float, float]] = []

    def timed(step, record: bool) -> None:
        profile.recording = record
        s = time.perf_counter()
        step()
        took = time.perf_counter() - s
        profile.recording = False
        if record:
            steps_run.append((s - origin[0], took))
        else:
            plain.append(took)

    fill()
    if prefill:
        engine.prefill(tokens)  # untimed: first calls of a size compile or allocate
        origin[0] = time.perf_counter()
        for record in (False, True):
            fill()
            timed(lambda: engine.prefill(tokens), record)
        per, unit = prefill, "prefill"
    else:
        engine.prefill(ids)
        for _ in range(warmup):
            engine.decode(ids[-1])
        origin[0] = time.perf_counter()
        for _ in range(steps):
            for record in (False, True):
                timed(lambda: engine.decode(ids[-1]), record)
        per, unit = steps, "decode"
    plain_s = sum(plain) / per
    step_s = sum(d for _, d in steps_run) / per
    ops = {op: {"ms_per_token": profile.totals[op] / per * 1e3, "calls_per_token": profile.calls[op] / per,
                "us_per_call": profile.totals[op] / profile.calls[op] * 1e6,
                "gb_per_s": profile.bytes[op] / profile.totals[op] / 1e9 if profile.totals[op] else 0.0,
                "gflop_per_s": profile.flops[op] / profile.totals[op] / 1e9 if profile.totals[op] else 0.0}
           for op in profile.totals}
    glue_s = plain_s - sum(profile.totals.values()) / per
    n_layer = engine.model.hp.n_layer
    return {"mode": unit, "tokens": per, "step_ms": plain_s * 1e3, "tokens_per_s": 1.0 / plain_s,
            "profiled_step_ms": step_s * 1e3, "n_layer": n_layer, "ops": ops, "glue_ms_per_token": glue_s * 1e3,
            "glue_us_per_layer": glue_s / n_layer * 1e6, "events": profile.events, "steps": steps_run}


def profile_decode(engine, prompt: str = "The capital of France is", steps: int = 30, warmup: int = 3,
                   fuse_layers: bool = True) -> dict:
    """:func:`profile_engine` of decode steps (kept for callers of the decode-only profile)."""
    return profile_engine(engine, prompt=prompt, steps=steps, warmup=warmup, fuse_layers=fuse_layers)


def chrome_trace(p: dict, title: str) -> dict:
    """The profile as Chrome trace JSON (``traceEvents``, microseconds): per step (or the prefill) one event, in it
    one event per layer (from its first op to its last), in that one event per op call with its costs in ``args``."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": title}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "forward pass"}},
    ]
    for i, (start, seconds) in enumerate(p["steps"]):
        name = f"{p['mode']} step {i}" if p["mode"] == "decode" else f"prefill of {p['tokens']} tokens"
        events.append({"name": name, "cat": "step", "ph": "X", "pid": 1, "tid": 1, "ts": start * 1e6,
                       "dur": seconds * 1e6})
    spans: list[list[Any]] = []  # [layer, start, end] of consecutive ops of one layer
    for e in p["events"]:
        if spans and spans[-1][0] == e["layer"] and e["layer"] is not None:
            spans[-1][2] = e["start"] + e["seconds"]
        else:
            spans.append([e["layer"], e["start"], e["start"] + e["seconds"]])
    for layer, start, end in spans:
        if layer is None:
            continue
        label = f"layer {layer}" if isinstance(layer, int) else str(layer)
        events.append({"name": label, "cat": "layer", "ph": "X", "pid": 1, "tid": 1, "ts": start * 1e6,
                       "dur": (end - start) * 1e6})
    for e in p["events"]:
        events.append({"name": e["op"], "cat": "op", "ph": "X", "pid": 1, "tid": 1, "ts": e["start"] * 1e6,
                       "dur": e["seconds"] * 1e6,
                       "args": {"layer": e["layer"], "bytes": e["bytes"], "flops": e["flops"],
                                "weights": e["weights"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", default="numba")
    parser.add_argument("--numerics", default="f32")
    parser.add_argument("-t", "--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prefill", type=int, default=0, metavar="N",
                        help="profile one prefill of N tokens instead of decode steps")
    parser.add_argument("--depth", type=int, default=0, metavar="N",
                        help="tokens in the cache before the profiled steps (where the time goes at long context)")
    parser.add_argument("--unfused", action="store_true",
                        help="time a layer's ops one by one, not as one fused op (MLX: each weight matrix its own "
                             "product, no stacked Q/K/V or gate/up)")
    parser.add_argument("--trace", metavar="FILE", default=None, help="write Chrome trace JSON (Perfetto) here")
    parser.add_argument("--mlx-modes", default=",".join(step_profile.MODES),
                        help="MLX: the step modes to profile (bench_compare.step_profile), comma-separated")
    parser.add_argument("--mlx-prefill-matmul", default=None, metavar="HOW",
                        help="MLX: a prefill's quantized products as 'quantized' (the weight read as stored) or "
                             "'f32' (the weight dequantized, then a float32 matmul); default: f32 on CUDA, quantized "
                             "elsewhere (mlx_backend.PREFILL_MATMUL_DEFAULTS)")
    parser.add_argument("--mlx-attention-kernel", action=argparse.BooleanOptionalAction, default=None,
                        help="MLX on a GPU: a compiled decode step's attention over the F16 cache as our kernels "
                             "(backends/mlx/attention_kernel.py), or as MLX's ops; default: the kernels on CUDA, "
                             "MLX's ops elsewhere (mlx_backend.ATTENTION_KERNEL_DEFAULTS)")
    parser.add_argument("--mlx-block-kernel-types", default=None, metavar="TYPES",
                        help="MLX on a GPU: these affine types (Q4_K,Q5_K) read in their GGUF blocks by our kernels "
                             "instead of MLX's affine form (MLXBackend.block_kernel_types; off until measured)")
    parser.add_argument("--mlx-matvec", default=None, metavar="SCHEME",
                        help="MLX on a GPU: how our mat-vec shares a block matrix's row among threads, 'simd' (1-4 "
                             "SIMD groups a row) or 'group' (one threadgroup a row); default: MLXBackend.matvec_scheme")
    parser.add_argument("--mlx-rope-kernel", action=argparse.BooleanOptionalAction, default=None,
                        help="MLX on a GPU: beside the attention kernel, a compiled step's RoPE and F16 K/V rows as "
                             "one kernel of ours (backends/mlx/rope_kernel.py) instead of four element-wise ones; "
                             "default: mlx_backend.ROPE_KERNEL_DEFAULTS (off: not yet run on a GPU)")
    parser.add_argument("--mlx-norm-kernel", action=argparse.BooleanOptionalAction, default=None,
                        help="MLX on a GPU: each residual add and the RMSNorm after it (ffn_norm, the next "
                             "layer's attn_norm) as one kernel of ours (backends/mlx/norm_kernel.py) instead of "
                             "MLX's add and rms_norm; default: "
                             "mlx_backend.NORM_KERNEL_DEFAULTS (off: not yet run on a GPU)")
    parser.add_argument("--mlx-kv-write", default=None, metavar="HOW",
                        help="MLX: how a compiled step writes its K/V row, 'slice' (mx.slice_update) or 'scatter' "
                             "(mx.put_along_axis: one GPU kernel, not two); default: MLXBackend.kv_write")
    parser.add_argument("--ops", action="store_true",
                        help="MLX: time each op call as for the other backends (on MLX that is graph building only)")
    parser.add_argument("--json", metavar="FILE", default=None, help="MLX: write the step profile as JSON here")
    args = parser.parse_args(argv)
    unknown = set(args.mlx_modes.split(",")) - set(step_profile.MODES)
    if unknown:
        parser.error(f"--mlx-modes: unknown {', '.join(sorted(unknown))}; supported: {', '.join(step_profile.MODES)}")
    if args.steps < 1 or args.prefill < 0 or args.depth < 0:
        parser.error("--steps must be at least 1, --prefill and --depth at least 0")
    for flag in MLX_FLAGS:  # MLX's own switches, each one line where another backend is asked for
        if getattr(args, flag.lstrip("-").replace("-", "_")) is not None and args.backend != "mlx":
            parser.error(f"{flag} applies to --backend mlx")
    block_types = frozenset()
    if args.mlx_block_kernel_types is not None:
        from inference_engine.backends.mlx_backend import parse_block_kernel_types

        try:
            block_types = parse_block_kernel_types(args.mlx_block_kernel_types)
        except GGUFParityError as exc:
            parser.error(f"--mlx-block-kernel-types: {exc}")
    if args.backend == "mlx":
        from inference_engine.backends.mlx.block_kernels import MATVEC_SCHEMES
        from inference_engine.backends.mlx.steps import KV_WRITES

        for flag, value, supported in (("--mlx-kv-write", args.mlx_kv_write, KV_WRITES),
                                       ("--mlx-matvec", args.mlx_matvec, MATVEC_SCHEMES)):
            if value is not None and value not in supported:
                parser.error(f"{flag}: unknown '{value}'; supported: {', '.join(supported)}")
    n_ctx = max(2048, args.depth + max(args.prefill, 64 + 2 * args.steps + 8))  # each step runs twice
    backend_class = get_backend_class(args.backend)
    unstacked = args.backend == "mlx" and args.unfused  # MLX: every weight matrix loaded alone
    with (recording_weights(backend_class) as weights,
          _switched_off(backend_class, "fuse_matrices", unstacked),
          class_attribute(backend_class, "block_kernel_types", block_types, when=bool(block_types)),
          class_attribute(backend_class, "matvec_scheme", args.mlx_matvec, when=args.mlx_matvec is not None)):
        engine = load_engine(args.model, backend=args.backend, numerics=args.numerics, n_threads=args.threads,
                             n_ctx=n_ctx, kv_type="f16")
    if args.mlx_prefill_matmul is not None:
        try:
            engine.backend.prefill_matmul = args.mlx_prefill_matmul
        except GGUFParityError as exc:
            parser.error(f"--mlx-prefill-matmul: {exc}")
    if args.mlx_attention_kernel is not None:
        engine.backend.attention_kernel = args.mlx_attention_kernel
    if args.mlx_kv_write is not None:
        engine.backend.kv_write = args.mlx_kv_write
    if args.mlx_rope_kernel is not None:
        engine.backend.rope_kernel = args.mlx_rope_kernel
    if args.mlx_norm_kernel is not None:
        engine.backend.norm_kernel = args.mlx_norm_kernel
    if args.backend == "mlx" and not args.ops:  # a lazy backend: host build vs device wait per step, graph size
        step_profile.main(engine, args)
        return
    p = profile_engine(engine, weights, steps=args.steps, fuse_layers=not args.unfused, prefill=args.prefill,
                       depth=args.depth)
    what = f"prefill of {args.prefill} tokens" if args.prefill else "decode step"
    if args.depth:
        what += f" at depth {args.depth}"
    print(f"{what} {p['step_ms']:.3f} ms per token ({p['tokens_per_s']:.1f} tok/s), {p['n_layer']} layers, "
          f"backend {args.backend}, numerics {args.numerics}, threads {args.threads or 'default'}")
    print(f"  {'op':<16}{'ms/token':>10}{'calls':>8}{'us/call':>10}{'GB/s':>8}{'GFLOP/s':>9}")
    for op, row in sorted(p["ops"].items(), key=lambda kv: -kv[1]["ms_per_token"]):
        print(f"  {op:<16}{row['ms_per_token']:>10.3f}{row['calls_per_token']:>8.1f}{row['us_per_call']:>10.1f}"
              f"{row['gb_per_s']:>8.1f}{row['gflop_per_s']:>9.1f}")
    if p["glue_ms_per_token"] >= 0:
        outside = (f"{p['glue_ms_per_token']:>10.3f}   ({p['glue_us_per_layer']:.1f} us per layer: the forward "
                   "pass's Python")
    else:  # the untimed step ran faster than its ops did under the timers
        outside = f"{0.0:>10.3f}   (below the timers' noise: the forward pass's Python"
    print(f"  {'outside the ops':<16}{outside}, from the untimed step; the op timers made the step "
          f"{p['profiled_step_ms']:.3f} ms)")
    if args.trace:
        title = f"{engine.gguf.path.name} {what}, {args.backend} {args.numerics}"
        atomic_write_text(args.trace, json.dumps(chrome_trace(p, title)))
        print(f"trace: {args.trace} (open in https://ui.perfetto.dev)")


if __name__ == "__main__":
    main()
