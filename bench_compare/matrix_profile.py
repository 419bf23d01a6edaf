"""What each weight matrix's product costs on the MLX device: ``python -m bench_compare.matrix_profile MODEL``.

``decode_profile --backend mlx`` says whether a decode step waits on the host or on the device; this says, of the
device's time, what the weight matrices take, kind by kind, and what a float32 path would take instead. For every
kind of matrix the model holds (its role, GGUF type, storage form and shape: e.g. 28 ``ffn_down`` Q6_K
``(1536, 8960)`` read by our CUDA kernel) it times, on MLX's device (``--device``, default MLX's):

* **decode**: one token's product ``x (1, n_in) @ W.T``, as the backend computes it (``mx.quantized_matmul`` for
  MLX's affine form, our mat-vec kernel for GGUF blocks, a float32 matmul for float weights), with the rate it
  read the weight at (GB/s of the weight's bytes as stored on the device);
* **prefill**: ``--prefill N`` tokens' product (default 512) as the backend computes it (MLX's quantized mat-mul,
  our tiled kernel), in TFLOP/s;
* **via float32**: the same N-token product with the weight dequantized on the device to float32 first
  (``mx.dequantize`` or our dequantize kernel) and multiplied by MLX's float32 matmul (cuBLAS's float32 GEMM on CUDA
  with ``MLX_ENABLE_TF32=0``, as the backend sets it): the dequantization and the matmul timed apart, and the largest
  difference from the backend's product relative to its largest value (float32 rounding: ~1e-6).

Each time is per call, of ``--repeats`` calls with distinct inputs built first and then evaluated together: the
device's time for the kernels plus MLX's launching of them, not Python's building of the graph. Totals weigh each
kind by its calls: every matrix once per decode token; in a prefill every layer's matrices at N tokens and the output
matrix at one (only the last token's logits are computed, as llama.cpp does). What a decode step's device time
(``decode_profile``'s wait ms) holds beyond the decode total is attention, the element-wise ops and the gaps between
kernels. Each matrix is timed alone, where a step multiplies a layer's Q/K/V (and gate/up) of one affine format as
one stacked product (``FusedAffine``): one kernel's time and launch where this counts two or three. A diagnostic for
a GPU's one call, not a benchmark: speed against llama.cpp is ``bench-compare compare``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import asdict, dataclass

from inference_engine.errors import GGUFParityError
from inference_engine.store.atomic import atomic_write_text

# Matrices computed for one token only in a prefill: the logits of the last token (llama.cpp's inp_out_ids).
OUTPUT_ROLES = ("output", "token_embd")
_LAYER = re.compile(r"^blk\.\d+\.")


@dataclass
class MatrixKind:
    """One kind of weight matrix and what its products cost (microseconds per call; None: not measured)."""

    role: str  # the tensor's name without ``blk.N.`` and ``.weight``: ``ffn_down``, ``attn_q``, ``output``
    qtype: str
    form: str  # the backend's storage: ``mlx-affine``, ``cuda-kernel``, ``metal-kernel``, ``float32``
    n_out: int
    n_in: int
    count: int  # matrices of this kind (one per layer for a layer's role)
    stored_bytes: int  # one matrix's bytes on the device
    decode_us: float
    prefill_us: float | None = None
    dequantize_us: float | None = None
    f32_matmul_us: float | None = None
    f32_rel_diff: float | None = None  # max |backend - via float32| / max |backend| at N tokens

    @property
    def via_f32_us(self) -> float | None:
        """The prefill product via a float32 weight: dequantization plus matmul (float weights: as run)."""
        if self.form == "float32":
            return self.prefill_us
        if self.dequantize_us is None or self.f32_matmul_us is None:
            return None
        return self.dequantize_us + self.f32_matmul_us

    def rates(self, n_tok: int) -> dict[str, float | None]:
        """GB/s of the weight read by the decode product; TFLOP/s of the prefill as run and via float32."""
        flops = 2.0 * n_tok * self.n_out * self.n_in
        f32_us = self.via_f32_us
        return {
            "decode_gb_per_s": self.stored_bytes / (self.decode_us * 1e-6) / 1e9,
            "prefill_tflop_per_s": None if self.prefill_us is None else flops / (self.prefill_us * 1e-6) / 1e12,
            "f32_tflop_per_s": None if f32_us is None else flops / (f32_us * 1e-6) / 1e12,
        }


def role_of(name: str) -> str:
    return _LAYER.sub("", name).removesuffix(".weight")


def time_per_call(fn, inputs: list) -> float:
    """Microseconds per call of ``fn`` over ``inputs``: the calls built first, then evaluated together (after one
    untimed call: kernel compilation, first-use allocation)."""
    import mlx.core as mx

    mx.eval(fn(inputs[0]))
    mx.synchronize()
    outs = [fn(x) for x in inputs]
    t0 = time.perf_counter()
    mx.eval(outs)
    mx.synchronize()
    return (time.perf_counter() - t0) / len(inputs) * 1e6


def _inputs(n: int, n_tok: int, n_in: int, seed: int) -> list:
    import mlx.core as mx

    key = mx.random.key(seed)
    xs = [mx.random.normal((n_tok, n_in), dtype=mx.float32, key=k) for k in mx.random.split(key, n)]
    mx.eval(xs)
    return xs


def profile_kind(w, role: str, count: int, prefill: int, repeats: int, seed: int = 0) -> MatrixKind:
    """One matrix ``w`` (a prepared weight of the MLX backend) standing for ``count`` of its kind, timed."""
    import mlx.core as mx

    n_out, n_in = int(w.n_out), int(w.n_in)
    kind = MatrixKind(role=role, qtype=w.qtype.name, form=w.form, n_out=n_out, n_in=n_in, count=count,
                      stored_bytes=int(w.nbytes), decode_us=time_per_call(w, _inputs(repeats, 1, n_in, seed)))
    if prefill <= 1 or role in OUTPUT_ROLES:
        return kind
    xs = _inputs(max(2, repeats // 4), prefill, n_in, seed + 1)
    kind.prefill_us = time_per_call(w, xs)
    if w.form == "float32":  # already the float32 path
        return kind
    kind.dequantize_us = time_per_call(lambda _x: w.dequantized(), xs)
    dense = w.dequantized()
    mx.eval(dense)
    kind.f32_matmul_us = time_per_call(lambda x: x @ dense.T, xs)
    ours, f32 = w(xs[0]), xs[0] @ dense.T
    scale = float(mx.max(mx.abs(ours)).item())
    kind.f32_rel_diff = float(mx.max(mx.abs(ours - f32)).item()) / scale if scale > 0 else 0.0
    return kind


def run(engine, prefill: int = 512, repeats: int = 16) -> dict:
    """Every kind of prepared weight matrix of ``engine`` (on the MLX backend), profiled; and the totals."""
    backend = engine.backend
    prepared = getattr(backend, "prepared_matrices", None)
    if prepared is None:
        raise GGUFParityError(f"matrix_profile needs the MLX backend, not '{backend.name}'")
    groups: dict[tuple, list] = {}
    for name, w in prepared.items():
        key = (role_of(name), w.qtype.name, w.form, int(w.n_out), int(w.n_in))
        groups.setdefault(key, []).append(w)
    kinds = [profile_kind(ws[0], key[0], len(ws), prefill, repeats) for key, ws in groups.items()]
    kinds.sort(key=lambda k: -k.count * k.decode_us)
    decode_ms = sum(k.count * k.decode_us for k in kinds) / 1e3

    def prefill_ms(cost) -> float | None:
        """A prefill's matrices at ``cost(kind)`` microseconds a call (the output matrix: one token's product)."""
        if prefill <= 1:
            return None
        total = 0.0
        for k in kinds:
            us = k.decode_us if k.role in OUTPUT_ROLES else cost(k)
            if us is None:
                return None
            total += k.count * us
        return total / 1e3

    def faster(k: MatrixKind) -> float | None:
        return min((v for v in (k.prefill_us, k.via_f32_us) if v is not None), default=None)

    return {
        "device": backend.description,
        "prefill_tokens": prefill,
        "repeats": repeats,
        "kinds": [{**asdict(k), **k.rates(prefill)} for k in kinds],
        "decode_ms_per_token": decode_ms,
        "prefill_ms": prefill_ms(lambda k: k.prefill_us),
        "prefill_ms_via_f32": prefill_ms(lambda k: k.via_f32_us),
        "prefill_ms_best_per_kind": prefill_ms(faster),
    }


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_report(p: dict) -> None:
    n = p["prefill_tokens"]
    print(p["device"])
    print(f"weight matrices, microseconds per call ({p['repeats']} calls with distinct inputs evaluated together); "
          f"prefill: {n} tokens")
    print(f"  {'kind':<34}{'form':<13}{'count':>6}{'decode us':>11}{'GB/s':>8}{'prefill us':>12}{'TFLOP/s':>9}"
          f"{'dequant us':>12}{'f32 mm us':>11}{'TFLOP/s':>9}{'rel diff':>10}")
    for k in p["kinds"]:
        label = f"{k['role']} {k['qtype']} ({k['n_out']}, {k['n_in']})"
        print(f"  {label:<34}{k['form']:<13}{k['count']:>6}{k['decode_us']:>11.1f}{k['decode_gb_per_s']:>8.0f}"
              f"{_fmt(k['prefill_us'], '.1f'):>12}{_fmt(k['prefill_tflop_per_s'], '.2f'):>9}"
              f"{_fmt(k['dequantize_us'], '.1f'):>12}{_fmt(k['f32_matmul_us'], '.1f'):>11}"
              f"{_fmt(k['f32_tflop_per_s'], '.2f'):>9}{_fmt(k['f32_rel_diff'], '.1e'):>10}")
    print(f"per decode token: {p['decode_ms_per_token']:.3f} ms in the weight matrices (the rest of a step's device "
          "time: attention, element-wise ops, gaps between kernels)")
    if p["prefill_ms"] is not None:
        print(f"per prefill of {n} tokens: {p['prefill_ms']:.2f} ms in the weight matrices as run "
              f"({n / p['prefill_ms'] * 1e3:.0f} tok/s if nothing else took time); via float32 "
              f"{_fmt(p['prefill_ms_via_f32'], '.2f')} ms; the faster of the two per kind "
              f"{_fmt(p['prefill_ms_best_per_kind'], '.2f')} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench_compare.matrix_profile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a .gguf path or a named model")
    parser.add_argument("--device", choices=("gpu", "cpu"), default=None, help="MLX's device (default: MLX's own)")
    parser.add_argument("--prefill", type=int, default=512, metavar="N", help="tokens of the prefill products")
    parser.add_argument("--repeats", type=int, default=16, metavar="R", help="calls per timing (decode; prefill R/4)")
    parser.add_argument("--block-kernel-types", default=None, metavar="TYPES",
                        help="these affine types (Q4_K,Q5_K) read in their GGUF blocks by our GPU kernels instead of "
                             "MLX's affine form (MLXBackend.block_kernel_types)")
    parser.add_argument("--matvec", default=None, metavar="SCHEME",
                        help="how our GPU mat-vec shares a block matrix's row among threads: 'simd' (1-4 SIMD "
                             "groups a row) or 'group' (one threadgroup a row); default: MLXBackend.matvec_scheme")
    parser.add_argument("--json", metavar="FILE", default=None, help="write the profile as JSON here")
    args = parser.parse_args(argv)
    if args.prefill < 0 or args.repeats < 1:
        parser.error("--prefill must be at least 0 and --repeats at least 1")
    from inference_engine.backends.mlx.block_kernels import MATVEC_SCHEMES

    if args.matvec is not None and args.matvec not in MATVEC_SCHEMES:
        parser.error(f"--matvec: unknown '{args.matvec}'; supported: {', '.join(MATVEC_SCHEMES)}")
    from bench_compare.decode_profile import class_attribute
    from inference_engine.backends.mlx_backend import MLXBackend, parse_block_kernel_types
    from inference_engine.engine import OurEngine
    from inference_engine.store.named_models import resolve_model

    try:
        block_types = frozenset()
        if args.block_kernel_types is not None:
            block_types = parse_block_kernel_types(args.block_kernel_types)
        with (class_attribute(MLXBackend, "block_kernel_types", block_types, when=bool(block_types)),
              class_attribute(MLXBackend, "matvec_scheme", args.matvec, when=args.matvec is not None)):
            engine = OurEngine(resolve_model(args.model), backend="mlx", numerics="f32", n_ctx=64,
                               device=args.device)
        p = run(engine, prefill=args.prefill, repeats=args.repeats)
    except GGUFParityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(p)
    if args.json:
        atomic_write_text(args.json, json.dumps(p, indent=1))
        print(f"json: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
