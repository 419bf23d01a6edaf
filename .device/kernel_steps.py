"""Compiled MLX decode steps inside a CUDA profiler range, for Nsight Compute (the lent machine's `kernels` step).

``python3 .device/kernel_steps.py MODEL [--steps N] [--depth D] [--[no-]attention-kernel]`` loads MODEL on MLX's GPU
(f32 numerics, F16 cache), prefills a short prompt (after D filler tokens), runs warm-up decode steps, then calls
``cudaProfilerStart``, runs N compiled decode steps (each waited for) and ``cudaProfilerStop``: run under
``ncu --profile-from-start off`` only those steps' kernels are profiled, not the loading, compiling and warm-up
before them. Without a CUDA runtime to call (MLX's CPU build) it runs the steps and says the range was not marked.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inference_engine.engine import load_engine  # noqa: E402
from inference_engine.generate import PREFILL_CHUNK, prefill_chunked  # noqa: E402

CUDART = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def cuda_runtime():
    """The CUDA runtime MLX's CUDA build loaded (ctypes finds the process's copy by its soname), else one from
    NVIDIA's pip wheels (``nvidia/*/lib``), or None."""
    import importlib.util

    candidates = list(CUDART)
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        candidates += sorted(str(p) for p in Path(root).glob("*/lib/libcudart.so*"))
    for name in candidates:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--attention-kernel", action=argparse.BooleanOptionalAction, default=None,
                        help="our decode attention kernel, or MLX's ops; default: the backend's (the kernel on CUDA)")
    args = parser.parse_args(argv)
    engine = load_engine(args.model, backend="mlx", numerics="f32", n_ctx=max(256, args.depth + 64),
                         kv_type="f16")
    if args.attention_kernel is not None:
        engine.backend.attention_kernel = args.attention_kernel
    prompt = engine.tokenizer.encode("The capital of France is")
    prefill_chunked(engine, [prompt[-1]] * args.depth, PREFILL_CHUNK)
    engine.prefill(prompt)
    steps = engine.async_steps()
    if steps is None:
        print("kernel_steps: the MLX backend gave no launched steps", file=sys.stderr)
        return 2
    token = prompt[-1]
    for _ in range(args.warmup):
        step = steps.decode(token, launch=False)
        step.wait()
        step.token()
    cudart = cuda_runtime()
    started = cudart.cudaProfilerStart() if cudart is not None else None  # cudaError_t: 0 is success
    for _ in range(args.steps):
        step = steps.decode(token, launch=False)
        step.wait()
        step.token()
    if cudart is not None:
        cudart.cudaProfilerStop()
    marked = ("inside cudaProfilerStart/Stop" if started == 0 else "(no CUDA runtime: range not marked)"
              if started is None else f"(cudaProfilerStart failed, error {started}: range not marked)")
    print(f"kernel_steps: {args.steps} compiled decode steps at depth {args.depth} {marked}; "
          f"{engine.backend.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
