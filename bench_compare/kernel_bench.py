"""Micro-benchmark of the Numba matmul kernels (not a test): ``python -m bench_compare.kernel_bench``.

Sections (``--only`` picks some):

- ``types``: GB/s of weight bytes per tensor type and shape, decode (one token), both numerics. The real models'
  own matrices when they are cached (``bench-compare models``), else random blocks of the same shapes, plus
  random matrices for the types the two models do not use. Each call reads a *different* matrix of the group
  (the layers, as a decoded token does), so the numbers are not from a warm L2 cache.
- ``decode``: every matmul of one decoded token of each real model, back to back (attention / norms excluded):
  the ceiling our engine's decode speed can reach with these kernels; ``--llamacpp`` also times llama.cpp's
  decode (llama-cpp-python, same thread count) for the ratio.
- ``prefill``: ``T`` tokens through one matrix four ways: one mat-vec per token, dequantized tiles times BLAS,
  the same tiles times the Numba GEMM, and the fused blocked kernel (Q4_1 only).
- ``int_prefill``: ``T`` tokens through one matrix in ggml numerics, the integer-dot paths against the float
  tiles: one int mat-vec per token, intdot's untiled mat-mat (a row pair in L1, weights unpacked per token), the
  register-tiled mat-mat (:mod:`~inference_engine.backends.numba_kernels.inttiles`) and dequantized tiles times the
  Numba GEMM; Qwen2.5-1.5B's shapes and types on random blocks, plus the other tiled types on 1536x1536.
- ``compile``: first-call compile time and cached load time of every kernel, in fresh processes with a private
  ``NUMBA_CACHE_DIR``.

Every run first prints the CPU, its SIMD label (:mod:`inference_engine.cpu_features`), the ggml-numerics mat-vec
family chosen for it (``int8`` / ``float``, :func:`~inference_engine.backends.numba_kernels.dispatch.matvec_family`)
and the machine's read bandwidth (:mod:`bench_compare.bandwidth`: a NumPy sum over a large array on 1 and on
``--threads`` threads, measured once per machine and kept in the cache), and
the ``types`` table gives each kernel's GB/s as a fraction of it (``of_bw``): how close each kernel gets to the
memory limit that bounds decode.

The machine may be shared: every figure is the best of ``--repeat`` runs; ``--threads 1 --cpu-time`` times
``int_prefill`` by the process's CPU time, which does not count the time the process spent descheduled.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from functools import partial

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from bench_compare import blocked_prefill, untiled_int
from bench_compare.bandwidth import BANDWIDTH_BYTES, best_of, read_bandwidth
from inference_engine.backends import numba_kernels
from inference_engine.backends.numba_kernels import dispatch as mm
from inference_engine.backends.numba_kernels import ktiles
from inference_engine.backends.numba_kernels.ops import activations
from inference_engine.cpu_features import cpu_features
from inference_engine.errors import GGUFParityError
from inference_engine.quants import quant_for
from inference_engine.store.atomic import atomic_write_json
from inference_engine.store.named_models import get_named_model

MODELS = ("smollm2-135m", "gemma3-270m")
SECTIONS = ("types", "decode", "prefill", "int_prefill", "compile")
# Types the two real models do not contain, benchmarked on random blocks: (type, shapes).
SYNTHETIC = (
    (T.F32, ((576, 576),)),
    (T.F16, ((1536, 576), (576, 1536))),
    (T.BF16, ((1536, 576), (576, 1536))),
    (T.Q4_0, ((1536, 576), (576, 1536))),
    (T.Q5_1, ((1536, 576), (576, 1536))),
    (T.Q2_K, ((2048, 1024), (640, 2048))),
    (T.Q3_K, ((2048, 1024), (640, 2048))),
    (T.Q5_K, ((2048, 1024), (640, 2048))),
    (T.IQ4_NL, ((2048, 1024), (640, 2048))),
    (T.IQ4_XS, ((2048, 1024), (640, 2048))),
)
SYNTHETIC_COPIES = 16  # distinct random matrices per shape, cycled through like layers
PREFILL_TOKENS = (2, 4, 8, 16, 64, 512)
# OpenBLAS worker threads keep spinning for a while after a call; measuring a Numba path right after a BLAS one
# would time the two pools fighting (which the tiles_blas figures on more than one thread show on their own).
BLAS_SETTLE_S = 0.3


# --- weights -----------------------------------------------------------------------------------------------------
def model_matrices(name: str) -> tuple[list[mm.QMatrix], bool]:
    """Every matmul weight of one decoded token, in forward order (the tied output last); real if cached.

    Copied out of the memory map, as the numba backend does (``NumbaBackend.copy_weights``).
    """
    from inference_engine.gguf.file import GGUFFile
    from inference_engine.store.named_models import cached_path, is_cached

    if not is_cached(name):
        return [], False
    f = GGUFFile(cached_path(name))
    order = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    mats = []
    n_layer = int(f.require_arch_value("block_count"))
    for il in range(n_layer):
        for base in order:
            t = f.tensors.get(f"blk.{il}.{base}.weight")
            if t is not None:
                mats.append(mm.pack_matrix(t.name, t.qtype, t.raw, t.shape, copy=True))
    out = f.tensors.get("output.weight") or f.tensor("token_embd.weight")
    mats.append(mm.pack_matrix(out.name, out.qtype, out.raw, out.shape, copy=True))
    return mats, True


def random_matrices(qtype: T, shape: tuple[int, int], copies: int, rng) -> list[mm.QMatrix]:
    return [
        mm.pack_matrix(f"random.{qtype.name}.{i}", qtype, quant_for(qtype).random_rows(*shape, rng), shape)
        for i in range(copies)
    ]


# --- sections ----------------------------------------------------------------------------------------------------
def bench_group(mats: list[mm.QMatrix], numerics: str, repeat: int, rng) -> dict:
    """Decode through each matrix of the group once; the best pass gives us/call and GB/s of weight bytes."""
    x = rng.standard_normal((1, mats[0].n_in)).astype(np.float32)

    def one_pass():
        for w in mats:
            mm.matmul(w, x, numerics)

    t = best_of(one_pass, repeat) / len(mats)
    nbytes = mats[0].nbytes
    return {"us_per_call": t * 1e6, "gb_per_s": nbytes / t / 1e9, "bytes": nbytes, "matrices": len(mats)}


def section_types(args, rng) -> list[dict]:
    groups: dict[tuple, list[mm.QMatrix]] = defaultdict(list)
    sources: dict[tuple, str] = {}
    for name in args.models:
        mats, _ = model_matrices(name)
        for w in mats:
            key = (w.qtype.name, w.n_out, w.n_in)
            groups[key].append(w)
            sources.setdefault(key, name)
    for qtype, shapes in SYNTHETIC:
        for shape in shapes:
            key = (qtype.name, *shape)
            if key not in groups:
                groups[key] = random_matrices(qtype, shape, SYNTHETIC_COPIES, rng)
                sources[key] = "random"
    rows = []
    for key in sorted(groups, key=lambda k: (list(mm.KERNELS).index(T[k[0]]), k[1], k[2])):
        mats = groups[key]
        for numerics in ("f32", "ggml"):
            r = bench_group(mats, numerics, args.repeat, rng)
            r["of_bw"] = r["gb_per_s"] / args.bandwidth if args.bandwidth else ""
            rows.append(
                {"type": key[0], "shape": f"{key[1]}x{key[2]}", "source": sources[key], "numerics": numerics, **r}
            )
    print_table(
        "decode mat-vec (T=1), each call a different matrix of the group",
        rows,
        [
            ("type", 5),
            ("shape", 12),
            ("source", 13),
            ("numerics", 8),
            ("matrices", 8),
            ("us_per_call", 11),
            ("gb_per_s", 8),
            ("of_bw", 5),
        ],
    )
    return rows


def section_decode(args, rng) -> list[dict]:
    rows = []
    for name in args.models:
        mats, real = model_matrices(name)
        if not real:
            print(f"[decode] {name} is not cached (bench-compare models --fetch {name}); skipped")
            continue
        nbytes = sum(w.nbytes for w in mats)
        xs = {n: rng.standard_normal((1, n)).astype(np.float32) for n in {w.n_in for w in mats}}
        llama_tps = measure_llamacpp_decode(name, args.threads) if args.llamacpp else None
        for numerics in ("f32", "ggml"):

            def token(mats=mats, xs=xs, numerics=numerics):
                for w in mats:
                    mm.matmul(w, xs[w.n_in], numerics)

            t = best_of(token, args.repeat)
            row = {
                "model": name,
                "numerics": numerics,
                "matmuls": len(mats),
                "mbytes": nbytes / 1e6,
                "ms_per_token": t * 1e3,
                "gb_per_s": nbytes / t / 1e9,
                "ceiling_tok_s": 1.0 / t,
            }
            if llama_tps:
                row["llamacpp_tok_s"] = llama_tps
                row["ceiling_vs_llamacpp"] = row["ceiling_tok_s"] / llama_tps
            rows.append(row)
    cols = [
        ("model", 13),
        ("numerics", 8),
        ("matmuls", 7),
        ("mbytes", 7),
        ("ms_per_token", 12),
        ("gb_per_s", 8),
        ("ceiling_tok_s", 13),
    ]
    if args.llamacpp:
        cols += [("llamacpp_tok_s", 14), ("ceiling_vs_llamacpp", 19)]
    print_table("decode ceiling: every matmul of one token (no attention, norms, Python model code)", rows, cols)
    return rows


def measure_llamacpp_decode(name: str, threads: int, n_tokens: int = 64) -> float | None:
    """llama.cpp's single-token decode speed with llama-bench's defaults (F16 KV cache, flash attention auto)
    through validation's LlamaCppEngine; best of 3 runs of ``n_tokens`` decodes.

    Extra buffer types (AMX / repacked weights) stay off: with them on, llama-cpp-python 0.3.36 crashed
    (SIGSEGV) in the first decode on this machine.
    """
    try:
        from inference_engine.store.named_models import cached_path
        from validation.llamacpp.engine import LlamaCppEngine
    except ImportError:
        return None
    engine = LlamaCppEngine(cached_path(name), n_ctx=512, n_threads=threads, kv_type="f16", flash_attn="auto")
    try:
        best = float("inf")
        for _ in range(3):
            engine.reset()
            tok = int(np.argmax(engine.prefill(engine.tokenize("The capital of France is"))))
            t0 = time.perf_counter()
            for _ in range(n_tokens):
                engine.decode(tok)
            best = min(best, time.perf_counter() - t0)
    finally:
        engine.close()
    return n_tokens / best


def section_prefill(args, rng) -> list[dict]:
    picks = {}
    for name in args.models:
        mats, _ = model_matrices(name)
        for w in mats:
            key = (w.qtype.name, w.n_out, w.n_in)
            if key not in picks and w.qtype in (T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_0):
                picks[key] = w
    if not picks:
        picks = {
            (q.name, *s): random_matrices(q, s, 1, rng)[0] for q, s in ((T.Q4_1, (1536, 576)), (T.Q4_K, (640, 1024)))
        }
    rows = []
    for key, w in picks.items():
        for n_tokens in PREFILL_TOKENS:
            if w.n_out * n_tokens > 49152 * 64:  # the big output matrices: skip T=512 (seconds per run)
                continue
            x = rng.standard_normal((n_tokens, w.n_in)).astype(np.float32)
            xv, xs = activations.prepare(x, "f32", w.kernels.vec_dot_type, w.kernels.sub)
            flop = 2.0 * w.n_out * w.n_in * n_tokens
            row = {"type": key[0], "shape": f"{key[1]}x{key[2]}", "tokens": n_tokens}
            reps = max(1, min(args.repeat, 3)) if n_tokens >= 64 else args.repeat
            paths = {
                "matvec": partial(mm.matmul_by_matvec, w, xv, xs),
                "tiles_numba": partial(mm.matmul_by_tiles, w, xv, xs, "f32", tile_gemm="numba"),
            }
            if w.qtype == T.Q4_1:
                paths["blocked"] = partial(blocked_prefill.matmul_blocked_q4_1, w.rows, w.block_mins(), xv, xs)
            paths["tiles_blas"] = partial(mm.matmul_by_tiles, w, xv, xs, "f32", tile_gemm="blas")
            for label, fn in paths.items():
                time.sleep(BLAS_SETTLE_S)  # let OpenBLAS's spinning threads go idle before timing Numba's
                t = best_of(fn, reps)
                row[f"{label}_ms"] = t * 1e3
                row[f"{label}_gflops"] = flop / t / 1e9
            rows.append(row)
    print_table(
        "prefill: T tokens through one matrix (f32 numerics), ms and GFLOP/s",
        rows,
        [
            ("type", 5),
            ("shape", 12),
            ("tokens", 6),
            ("matvec_ms", 9),
            ("tiles_blas_ms", 13),
            ("tiles_numba_ms", 14),
            ("blocked_ms", 10),
            ("matvec_gflops", 13),
            ("tiles_blas_gflops", 17),
            ("tiles_numba_gflops", 18),
            ("blocked_gflops", 14),
        ],
    )
    return rows


# (type, shape, token counts): Qwen2.5-Coder-1.5B Q4_K_M's matmul shapes (bench-compare inspect), then the other
# types with a tiled kernel. The 151936-row output matrix stops at 64 tokens (seconds per call beyond).
INT_PREFILL_CASES = (
    (T.Q4_K, (1536, 1536), (1, 2, 4, 16, 64, 256, 512)),
    (T.Q4_K, (256, 1536), (1, 2, 4, 16, 64, 256, 512)),
    (T.Q4_K, (8960, 1536), (1, 2, 4, 16, 64, 256, 512)),
    (T.Q4_K, (1536, 8960), (1, 2, 4, 16, 64, 256, 512)),
    (T.Q6_K, (1536, 8960), (1, 2, 4, 16, 64, 256, 512)),
    (T.Q6_K, (151936, 1536), (1, 4, 16, 64)),
    (T.Q4_0, (1536, 1536), (1, 2, 4, 16, 64, 256)),
    (T.Q4_1, (1536, 1536), (1, 2, 4, 16, 64, 256)),
    (T.Q8_0, (1536, 1536), (1, 2, 4, 16, 64, 256)),
    (T.Q5_K, (1536, 1536), (1, 2, 4, 16, 64, 256)),
    (T.Q5_0, (1536, 1536), (1, 2, 4, 16, 64, 256)),
    (T.Q5_1, (1536, 1536), (1, 2, 4, 16, 64, 256)),
)
INT_MATVEC_MAX_TOKENS = 64  # one mat-vec per token is timed up to here (it only grows linearly beyond)


def section_int_prefill(args, rng) -> list[dict]:
    rows = []
    for qtype, shape, counts in INT_PREFILL_CASES:
        if args.types and qtype.name not in args.types:
            continue
        w = random_matrices(qtype, shape, 1, rng)[0]
        k = w.kernels
        for n_tokens in counts:
            x = rng.standard_normal((n_tokens, w.n_in)).astype(np.float32)
            yq, yd, ya = activations.quantize_int(x, k.int_activation)
            xv, xs = activations.prepare(x, "ggml", k.vec_dot_type, k.sub)
            out = np.empty((n_tokens, w.n_out), np.float32)

            def per_token(k=k, w=w, yq=yq, yd=yd, ya=ya, out=out):
                for t in range(yq.shape[0]):
                    k.matvec_int(w.rows, yq[t], yd[t], ya[t], out[t])

            paths = {
                "matvec": per_token if n_tokens <= INT_MATVEC_MAX_TOKENS else None,
                "untiled": partial(untiled_int.MATMUL_INT[qtype], w.rows, yq, yd, ya, out),
                "tiled": partial(k.matmul_tiled, w.rows, yq, yd, ya, out),
                "ktiled": partial(k.matmul_ktiled, w.rows, yq, yd, ya, out)
                if n_tokens >= ktiles.MIN_TOKENS and qtype in mm.KTILED_MIN_TOKENS.get(ktiles.compiled_target(), {})
                else None,
                "float_tiles": partial(mm.matmul_by_tiles, w, xv, xs, "ggml", tile_gemm="numba") if n_tokens > 1
                else None,
            }
            row = {"type": qtype.name, "shape": f"{shape[0]}x{shape[1]}", "tokens": n_tokens}
            reps = args.repeat if n_tokens * w.nbytes < (64 << 20) else max(1, min(args.repeat, 3))
            for label, fn in paths.items():
                if fn is None:
                    continue
                t = best_of(fn, reps, time.process_time if args.cpu_time else time.perf_counter)
                row[f"{label}_ms"] = t * 1e3
                row[f"{label}_gbs"] = w.nbytes / t / 1e9
            best = min((lbl for lbl in paths if paths[lbl]), key=lambda lbl: row[f"{lbl}_ms"])
            row["fastest"] = best
            row["dispatch"] = mm.int_kernel_for(w, n_tokens) or "float_tiles"
            rows.append(row)
            print(" ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()), flush=True)
    print_table(
        "ggml-numerics mat-mat: T tokens through one matrix, integer paths vs float tiles, ms and GB/s of weights",
        rows,
        [("type", 5), ("shape", 11), ("tokens", 6), ("matvec_ms", 9), ("untiled_ms", 10), ("tiled_ms", 9),
         ("ktiled_ms", 9), ("float_tiles_ms", 14), ("matvec_gbs", 10), ("untiled_gbs", 11), ("tiled_gbs", 9),
         ("ktiled_gbs", 10), ("float_tiles_gbs", 15), ("fastest", 11), ("dispatch", 8)],
    )
    return rows


WARM_ALL = """
import time, numpy as np
t0 = time.perf_counter()
from gguf import GGMLQuantizationType as T
from inference_engine.quants import quant_for
from inference_engine.backends.numba_kernels import dispatch as mm
from inference_engine.backends.numba_kernels import ktiles
t1 = time.perf_counter()
rng = np.random.default_rng(0)
per_type = {}
for qtype in mm.KERNELS:
    w = mm.pack_matrix("w", qtype, quant_for(qtype).random_rows(2, 256, rng), (2, 256))
    a = time.perf_counter()
    for numerics in ("f32", "ggml"):
        mm.matmul(w, np.ones((1, 256), np.float32), numerics)
        mm.matmul(w, np.ones((mm.MATVEC_MAX_TOKENS + 1, 256), np.float32), numerics)
    per_type[qtype.name] = time.perf_counter() - a
from inference_engine.backends.numba_cpu import NumbaBackend
a = time.perf_counter()
for numerics in ("f32", "ggml"):
    b = NumbaBackend(numerics)
    x = np.ones((2, 4, 64), np.float32)
    b.rms_norm(x, np.ones(64, np.float32), 1e-6)
    b.rope(x, np.arange(2), 64, 1e4, False)
    for kv in (np.float32, np.float16):
        b.attention(x, x.astype(kv), x.astype(kv), np.arange(2), 2, 0.125)
    b.swiglu(x[0], x[0])
    b.geglu(x[0], x[0])
per_type["ops"] = time.perf_counter() - a
print({"import_s": t1 - t0, "kernels_s": time.perf_counter() - t1, "per_type_s": per_type})
"""


def section_compile(args, rng) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for label in ("first call (compile + write cache)", "new process (load from cache)"):
            out = subprocess.run(
                [sys.executable, "-c", WARM_ALL], env=env, capture_output=True, text=True, check=True
            ).stdout
            r = eval(out.strip().splitlines()[-1])
            rows.append(
                {
                    "run": label,
                    "import_s": r["import_s"],
                    "all_kernels_s": r["kernels_s"],
                    "slowest_type": max(r["per_type_s"], key=r["per_type_s"].get),
                    "slowest_type_s": max(r["per_type_s"].values()),
                }
            )
    print_table(
        "compile and cache load (13 types x 2 numerics x {mat-vec, tiles}, plus the ops; fresh processes)",
        rows,
        [("run", 36), ("import_s", 8), ("all_kernels_s", 13), ("slowest_type", 12), ("slowest_type_s", 14)],
    )
    return rows


# --- output ------------------------------------------------------------------------------------------------------
def print_table(title: str, rows: list[dict], cols: list[tuple[str, int]]) -> None:
    print(f"\n## {title}")
    print("  ".join(name.rjust(width) for name, width in cols))
    for row in rows:
        cells = []
        for name, width in cols:
            v = row.get(name, "")
            cells.append((f"{v:.2f}" if isinstance(v, float) else str(v)).rjust(width))
        print("  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench_compare.kernel_bench", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2, help="Numba threads (default 2)")
    p.add_argument("--repeat", type=int, default=5, help="runs per figure; the best is reported (default 5)")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS), help="sections to run")
    p.add_argument("--models", nargs="+", default=list(MODELS), help="named models whose matrices to use")
    p.add_argument("--llamacpp", action="store_true", help="also time llama.cpp's decode for the ratio")
    p.add_argument("--types", nargs="+", help="int_prefill: only these tensor types (e.g. Q4_K Q6_K)")
    p.add_argument("--cpu-time", action="store_true",
                   help="int_prefill: time by the process's CPU time, not the wall clock (with --threads 1 on a "
                   "shared machine: time the process spent descheduled does not count)")
    p.add_argument("--json", help="write all rows to this JSON file")
    args = p.parse_args(argv)
    if not 1 <= args.threads <= numba.config.NUMBA_NUM_THREADS:
        p.error(f"--threads must be 1..{numba.config.NUMBA_NUM_THREADS}")
    if args.cpu_time and args.threads != 1:
        p.error("--cpu-time needs --threads 1 (the CPU time of several threads adds up; it is not a duration)")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    for name in args.models:
        try:
            get_named_model(name)
        except GGUFParityError as exc:
            p.error(f"--models: {exc}")
    numba_kernels.prepare()  # as the backend does: kernels compiled from older sources are dropped, not timed
    numba.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    blas = os.environ.get("OPENBLAS_NUM_THREADS", "default (all cores)")
    print(
        f"numba {numba.__version__}, {args.threads} threads, best of {args.repeat}; OpenBLAS threads: {blas} "
        f"(set OPENBLAS_NUM_THREADS={args.threads} before starting to match)"
    )
    cpu = cpu_features()
    # measured once per machine and thread count, then kept in the cache (bench_compare.bandwidth)
    bw1 = read_bandwidth(1)["gb_per_s"]
    args.bandwidth = read_bandwidth(args.threads)["gb_per_s"] if args.threads > 1 else bw1
    print(
        f"CPU: {cpu.name} ({cpu.machine}), SIMD {cpu.label} [{' '.join(cpu.isa)}]; ggml-numerics mat-vec: "
        f"{mm.matvec_family()} kernels\nread bandwidth (NumPy sum of {BANDWIDTH_BYTES >> 20} MB): {bw1:.1f} GB/s on "
        f"1 thread, {args.bandwidth:.1f} GB/s on {args.threads}; of_bw = a kernel's GB/s / the {args.threads}-thread "
        f"figure"
    )
    results = {}
    for section in SECTIONS:
        if section in args.only:
            results[section] = globals()[f"section_{section}"](args, rng)
    if args.json:
        atomic_write_json(args.json, {"threads": args.threads, "repeat": args.repeat, "cpu": cpu.as_dict(),
                                      "read_gb_per_s": {"1": bw1, str(args.threads): args.bandwidth}, **results},
                          indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
