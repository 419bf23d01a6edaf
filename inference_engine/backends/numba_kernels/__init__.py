"""Numba kernels for the CPU backend: fused quantized mat-vec / mat-mul on the GGUF blocks, and the hot ops.

Modules:

- :mod:`.isa`: the vector vocabulary every kernel is written in (Numba intrinsics emitting LLVM vector IR):
  :mod:`.isa.simd` (16 float lanes; why auto-vectorization was not enough is measured in its docstring),
  :mod:`.isa.int8` (32-byte integer vectors, ``dot4`` = ``vpmaddubsw`` + ``vpmaddwd`` / ``vpdpbusd`` / portable
  IR), :mod:`.isa.zmm` (the AVX-512 VNNI steps).
- :mod:`.types`: one module per tensor type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K) with all of
  its kernels: a ``matvec_float_<type>(w, xv, xs, out)`` (one token, weights read once, rows split over threads)
  and a ``dequant_<type>(w, row0, out)`` (ggml's exact dequantization of rows); for the types ggml's x86 code
  multiplies in integers (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) the ``ggml``-numerics integer-dot
  mat-vec ``matvec_int_<type>(w, yq, yd, ya, out)`` bit-exact with libggml's ``vec_dot``, the one-token
  ``token_<type>`` and the register-tiled ``tiled_<type>``; and its entry in the kernel table
  (:data:`.types.KERNELS`, entries of :class:`.kernel_entry.Kernels`). Helpers several types share:
  :mod:`.float_blocks`, :mod:`.intdot`, :mod:`.inttiles`.
- :mod:`.decode_layer`: a decoded token through a whole pre-norm layer in one compiled call (the kernels above and
  :mod:`.ops`, called from compiled code).
- :mod:`.dispatch`: the dispatcher: :func:`pack_matrix` wraps a GGUF tensor, :func:`matmul` runs ``x @ W.T``
  (mat-vec per token for a few tokens, dequantized tiles times a GEMM beyond), :func:`dequantize_rows` serves
  embedding look-ups.
- :mod:`.gemm`: a Numba float32 GEMM for the tiles (the prefill alternatives kept for measuring only live in
  ``bench_compare``: ``blocked_prefill``, ``untiled_int``).
- :mod:`.ops`: RMSNorm, RoPE, SwiGLU, GEGLU (:mod:`.ops.elementwise`), attention (per row for decode, blocked for
  prefill: :mod:`.ops.attention`; over a paged cache: :mod:`.ops.paged_attention`) with the NumPy reference's
  numerics; :mod:`.ops.vexp`: ggml's vector ``expf`` on 16 lanes for SwiGLU and softmax; :mod:`.ops.activations`:
  the activation side of both numerics (``f32``; ``ggml``: Q8_0 / Q8_1 / Q8_K / F16 / BF16 quantizers bit-exact
  with libggml).
- :mod:`.cache_stamp`: drops the package's cached machine code when any of its sources changed (below).

Every kernel is ``@njit(cache=True)``: a second process loads the machine code from Numba's cache instead of
compiling (``python -m bench_compare.kernel_bench --only compile`` measures both). Numba's cache tracks the
modification time of the file defining each kernel only, while kernels inline helpers from :mod:`.isa.simd` and
:mod:`.isa.int8`: :mod:`.cache_stamp` drops the package's cached code whenever any of its sources changed.
"""

from inference_engine import compile_notice
from inference_engine.backends.numba_kernels.cache_stamp import drop_stale_cache
from inference_engine.backends.numba_kernels.dispatch import (
    KERNELS,
    MATVEC_MAX_TOKENS,
    NUMERICS,
    QMatrix,
    dequantize_rows,
    matmul,
    pack_matrix,
    supported_types,
)
from inference_engine.platform import numba_interrupts

__all__ = [
    "KERNELS",
    "MATVEC_MAX_TOKENS",
    "NUMERICS",
    "QMatrix",
    "dequantize_rows",
    "matmul",
    "pack_matrix",
    "prepare",
    "supported_types",
]

_prepared = False


def prepare() -> None:
    """The kernels' guards, once per process, before any kernel runs: called by the Numba backend when it is built
    (and by anything that calls the kernels without it), never at import. Unlike the platform's tricks they are not
    switchable: they keep results and exit statuses right.

    - :func:`.cache_stamp.drop_stale_cache`: a cache compiled from other sources than these is dropped (kernels
      load from the cache on their first call, so this runs first).
    - :func:`inference_engine.platform.numba_interrupts.install`: Ctrl-C during a kernel's compile ends the run
      (exit 130), see that module.
    - :func:`inference_engine.compile_notice.install_listener`: a first run's compile is announced (the CLI prints
      it), see that module.
    """
    global _prepared
    if _prepared:
        return
    drop_stale_cache()
    numba_interrupts.install()
    compile_notice.install_listener()
    _prepared = True
