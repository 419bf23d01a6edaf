"""Our GPU kernels for the GGUF types MLX's affine format cannot hold (Q2_K, Q3_K, Q6_K: a scale every 16 values,
where MLX's groups are 32, 64 or 128; IQ4_XS and IQ4_NL: non-linear values from a code book, IQ4_NL's 32-value
blocks read eight at a time as one of 256, a row's last possibly partial), and for Q4_K / Q5_K where
``MLXBackend.block_kernel_types`` asks: the weights stay in their GGUF blocks, at their file size, in GPU memory, and
the kernels read them directly. One source, two dialects:

* ``gpu_kernels/gguf_blocks.h``: each block layout, once (value ``i`` of a block exactly as ggml's
  ``dequantize_row_<type>``); ``gguf_kernels.h``: each thread's work in the mat-vec, the tiled mat-mul and the
  dequantization; ``kernel_*.inc``: the kernel bodies. All written in the common subset of Metal, CUDA and C++.
* A dialect adds only what differs between GPUs: ``dialect_metal.h`` / ``dialect_cuda.cuh`` (address spaces,
  barrier, SIMD-group sum, float bit cast) and ``dialect_*_ids.inc`` (thread and threadgroup indices). Metal
  kernels go through ``mx.fast.metal_kernel``, CUDA kernels through ``mx.fast.cuda_kernel`` (NVRTC).

Kernels, each ``x @ W.T`` with ``W`` the GGUF rows (uint8 ``(n_out, row_bytes)``):

* :func:`matvec` (decode: at most ``GQ_MAX_TOK`` tokens), every token in one pass over the row, in one of
  :data:`MATVEC_SCHEMES`: ``simd``, 1, 2 or 4 SIMD groups per output row (by its length), each lane 8 values of a
  block at a time; ``group``, one threadgroup of ``GQ_GROUP_THREADS`` per row, each thread a 16-value sub-block at a
  time (llama.cpp's ``mmvq`` layout: a long row is a few steps of each thread, not a chain of blocks per SIMD group).
* :func:`matmul` (prefill): 64 rows x 64 tokens per threadgroup, the weight tile decoded into threadgroup memory 32
  columns at a time, float32 products (no float copy of W).
* :func:`dequantize`: W as float32, bit for bit ggml's (tests).

Tested here (no GPU): the shared files and kernel bodies compiled for the host with ``dialect_host.h`` and run
thread by thread against gguf-py (tests/inference_engine/backends/mlx/test_mlx_block_kernels.py), and their index
arithmetic's NumPy twin (:mod:`.block_index`). Not tested here: the two dialect files and the MLX calls below, which
run only on a GPU (the same tests, marked for the GPU, run them there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import mlx.core as mx
from gguf import GGMLQuantizationType as T

KERNEL_DIR = Path(__file__).resolve().parent.parent / "gpu_kernels"
SHARED_FILES = ("gguf_blocks.h", "gguf_kernels.h")

# type -> its name in gguf_blocks.h (gq_<name>_value, ...). Q4_K and Q5_K go to MLX's affine form unless
# MLXBackend.block_kernel_types names them (weights.matrix_form).
KERNEL_TYPES: dict[T, str] = {T.Q2_K: "q2_k", T.Q3_K: "q3_k", T.Q4_K: "q4_k", T.Q5_K: "q5_k", T.Q6_K: "q6_k",
                              T.IQ4_XS: "iq4_xs", T.IQ4_NL: "iq4_nl"}
KINDS = ("matvec", "matvec_group", "matmul", "dequantize")  # kernel_<kind>.inc


@dataclass(frozen=True)
class Dialect:
    """One GPU's kernel language: its header (macros), its index prelude (thread / group ids) and MLX's entry."""

    name: str  # "metal" | "cuda"
    header_file: str
    ids_file: str

    def factory(self):
        return mx.fast.metal_kernel if self.name == "metal" else mx.fast.cuda_kernel


METAL = Dialect("metal", "dialect_metal.h", "dialect_metal_ids.inc")
CUDA = Dialect("cuda", "dialect_cuda.cuh", "dialect_cuda_ids.inc")
DIALECTS = (METAL, CUDA)


def gpu_dialect() -> Dialect | None:
    """The dialect of the GPU MLX computes on by default: Metal on Apple silicon, CUDA in MLX's CUDA build, None when
    the default device is the CPU (MLX's CPU build, or ``--device cpu``): custom kernels run on a GPU only."""
    if mx.default_device() != mx.gpu:
        return None
    metal = getattr(mx, "metal", None)
    if metal is not None and metal.is_available():
        return METAL
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return CUDA
    return None


def read(name: str) -> str:
    return (KERNEL_DIR / name).read_text()


def constant(name: str, header: str = "gguf_kernels.h") -> int:
    """A ``#define NAME <int>`` of ``header`` (the launch geometry comes from the kernels' own text)."""
    found = re.search(rf"^#define {name} (\d+)\b", read(header), re.MULTILINE)
    if found is None:
        raise KeyError(name)
    return int(found.group(1))


MATVEC_MAX_TOKENS = constant("GQ_MAX_TOK")  # above this many tokens: the tiled mat-mul
MATVEC_WARPS = constant("GQ_MATVEC_WARPS")
# SIMD groups per row of the mat-vec (its SPLIT) by blocks per row: a row of n blocks is split so that each SIMD
# group walks ~2-9 of them. On an H200 (2026-11-27) the mat-vec of one SIMD group per row read like a chain of
# dependent loads: 25 us for 256 rows of 6 blocks (Q6_K attn_v), 43 us for 1,536 rows of 35 (ffn_down), ~260 GB/s.
# The values here are not measured yet (the next GPU session's matrix_profile is the A/B against those figures).
MATVEC_SPLITS = ((8, 4), (4, 2))  # (at least this many blocks, SPLIT), the first that applies; else 1
# How the mat-vec shares a row among threads (kernel_matvec.inc: "simd", the first version, measured on an H200 at
# ~260-410 GB/s; kernel_matvec_group.inc: "group", not yet run on a GPU: MLXBackend.matvec_scheme chooses).
MATVEC_SCHEMES = ("simd", "group")
GROUP_THREADS = constant("GQ_GROUP_THREADS")
TILE_THREADS, TILE_ROWS, TILE_TOKS = constant("GQ_TILE_THREADS"), constant("GQ_TILE_ROWS"), constant("GQ_TILE_TOKS")
DEQ_THREADS = constant("GQ_DEQ_THREADS")


def header(dialect: Dialect, qtype: T) -> str:
    """The kernel header for ``qtype``: the dialect's macros, the block layouts, the per-thread functions."""
    blocks, kernels = (read(f) for f in SHARED_FILES)
    return f"{read(dialect.header_file)}\n{blocks}\n#define GQ_TYPE {KERNEL_TYPES[qtype]}\n{kernels}\n"


def source(dialect: Dialect, kind: str) -> str:
    """The kernel body: the dialect's thread / group indices, then the shared body."""
    return f"{read(dialect.ids_file)}\n{read(f'kernel_{kind}.inc')}"


@cache
def _kernel(dialect: Dialect, kind: str, qtype: T):
    return dialect.factory()(
        name=f"gguf_{KERNEL_TYPES[qtype]}_{kind}",
        input_names=["w"] if kind == "dequantize" else ["w", "x"],
        output_names=["y"],
        source=source(dialect, kind),
        header=header(dialect, qtype),
        ensure_row_contiguous=True,
    )


def own_header(dialect: Dialect, *files: str) -> str:
    """The header of a kernel of ours beside the block kernels (decode attention, RoPE, norm): the dialect's macros,
    then ``files`` of gpu_kernels/."""
    return "".join(f"{text}\n" for text in (read(dialect.header_file), *map(read, files)))


@cache
def own_kernel(dialect: Dialect, name: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
               headers: tuple[str, ...], kind: str):
    """MLX's custom kernel of ours called ``name``: header :func:`own_header` of ``headers``, body :func:`source` of
    ``kind`` (``kernel_<kind>.inc``), inputs made row-contiguous."""
    return dialect.factory()(
        name=name,
        input_names=list(inputs),
        output_names=list(outputs),
        source=source(dialect, kind),
        header=own_header(dialect, *headers),
        ensure_row_contiguous=True,
    )


def _blocks(n: int, per: int) -> int:
    return -(-n // per)


def matvec_split(n_in: int) -> int:
    """SIMD groups per output row for rows of ``n_in`` values (:data:`MATVEC_SPLITS`): blocks of 256, a partial last
    one (IQ4_NL) counted."""
    n_blocks = _blocks(n_in, 256)
    return next((split for least, split in MATVEC_SPLITS if n_blocks >= least), 1)


def matvec(dialect: Dialect, qtype: T, w: mx.array, x: mx.array, scheme: str = MATVEC_SCHEMES[0]) -> mx.array:
    """``x (T, n_in) float32 @ W.T`` for ``T <= MATVEC_MAX_TOKENS``: ``(T, n_out)``, the row shared among threads as
    ``scheme`` (one of :data:`MATVEC_SCHEMES`) says."""
    n_tok, n_out = x.shape[0], w.shape[0]
    if scheme == "group":
        return _kernel(dialect, "matvec_group", qtype)(
            inputs=[w, x],
            template=[("N_TOK", n_tok)],
            grid=(GROUP_THREADS * n_out, 1, 1),
            threadgroup=(GROUP_THREADS, 1, 1),
            output_shapes=[(n_tok, n_out)],
            output_dtypes=[mx.float32],
            stream=mx.gpu,
        )[0]
    split = matvec_split(x.shape[1])
    rows_per_group = MATVEC_WARPS // split
    return _kernel(dialect, "matvec", qtype)(
        inputs=[w, x],
        template=[("N_TOK", n_tok), ("SPLIT", split)],
        grid=(32 * MATVEC_WARPS * _blocks(n_out, rows_per_group), 1, 1),
        threadgroup=(32 * MATVEC_WARPS, 1, 1),
        output_shapes=[(n_tok, n_out)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )[0]


def matmul(dialect: Dialect, qtype: T, w: mx.array, x: mx.array) -> mx.array:
    """``x (T, n_in) float32 @ W.T`` for any ``T``, tile by tile: ``(T, n_out)``."""
    n_tok, n_out = x.shape[0], w.shape[0]
    return _kernel(dialect, "matmul", qtype)(
        inputs=[w, x],
        grid=(TILE_THREADS * _blocks(n_out, TILE_ROWS), _blocks(n_tok, TILE_TOKS), 1),
        threadgroup=(TILE_THREADS, 1, 1),
        output_shapes=[(n_tok, n_out)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )[0]


def dequantize(dialect: Dialect, qtype: T, w: mx.array, n_in: int) -> mx.array:
    """The GGUF rows ``w`` as float32 ``(n_out, n_in)``, value for value as ggml's dequantize_row."""
    n_out = w.shape[0]
    return _kernel(dialect, "dequantize", qtype)(
        inputs=[w],
        grid=(DEQ_THREADS * _blocks(n_out * n_in // 8, DEQ_THREADS), 1, 1),
        threadgroup=(DEQ_THREADS, 1, 1),
        output_shapes=[(n_out, n_in)],
        output_dtypes=[mx.float32],
        stream=mx.gpu,
    )[0]
