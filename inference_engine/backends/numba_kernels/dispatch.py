"""``y = x @ W.T`` for a GGUF weight with the Numba kernels: one fused mat-vec per token, or tiles + a GEMM.

- **Decode (few tokens)**: one ``matvec_float_<type>`` call per token. It reads each weight byte once, from the GGUF
  blocks as they are in the file, and multiplies as it unpacks: no dequantized copy of the weight ever exists.
  In ``ggml`` numerics, where :func:`matvec_family` says ``int8``, the integer-dot kernels of :mod:`.intdot` run
  instead (the activation quantized once per token; llama.cpp's x86 result bit for bit), faster than the float
  kernels on every type measured.
- **Several tokens, ggml numerics on the int8 family** (prefill, the server's batched decode): from
  ``TILED_MIN_TOKENS[type]`` (2 to 4) tokens on, the register-tiled integer kernels of :mod:`.inttiles` (2 rows
  x 4 tokens per tile, the mat-vec's outputs bit for bit) for every type that has one; measured below.
- **Every quantized type with integer kernels, from ``KTILED_MIN_TOKENS[target][type]`` tokens, ggml numerics,
  AVX-512 VNNI (5 to 16 tokens) or AVX2 (12 to 32; not Q4_1, Q5_1, Q8_0)**: 16 tokens a vector (:mod:`.ktiles`)
  with the float steps of what llama.cpp runs there: its tiled K-quant mat-mul (8 tokens or more), its repacked
  Q4_0 gemm, ``vec_dot``'s order for Q4_1, Q5_0, Q5_1, Q8_0 (as its llamafile sgemm); their outputs bit for bit
  (tested against ggml's ``mul_mat``); on 64+ tokens 1.4-4x the 4-token tiles' speed on AVX-512 VNNI, 1.1-1.9x on
  AVX2 (docs/PERFORMANCE.md).
- **Prefill (more than ``MATVEC_MAX_TOKENS``), otherwise**: the weight is dequantized a tile of rows at a time
  (``dequant_<type>``, exactly ggml's values) into a reused float32 buffer, and each tile is multiplied with all
  the tokens by BLAS ``sgemm`` on one thread, by the Numba GEMM (:mod:`.gemm`) on more (``TILE_GEMM``); the
  measurements behind these choices are in docs/PERFORMANCE.md, "kernel choices".
  Below 4 to 8 tokens the mat-vec path wins (it pays no dequantization pass).

The float paths compute the same sum and agree to float rounding. ``numerics`` picks the activation side
(:mod:`.activations`); ``ggml`` through a GEMM multiplies the dequantized weight with the fake-quantized
activation, which is ggml's integer dot product exactly except for Q4_1 / Q5_1, whose block constant ``m`` ggml
multiplies by the activation's *f16-rounded* block sum ``s``: that difference, ``(s - sum(xv)) @ m.T``, is added
back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels import gemm, inttiles, ktiles
from inference_engine.backends.numba_kernels.kernel_entry import Kernels
from inference_engine.backends.numba_kernels.kernel_table import KERNELS
from inference_engine.backends.numba_kernels.ops import activations
from inference_engine.backends.numba_kernels.types import iq4_nl, q4_0
from inference_engine.cpu_features import CPUFeatures, cpu_features
from inference_engine.errors import GGUFParityError
from inference_engine.platform.mapped_pages import copy_out_of_map, drop_file_pages, weight_buffer
from inference_engine.registries import NUMERICS

# Up to this many tokens, T mat-vec calls (each reading the weight once) beat dequantize-a-tile + GEMM, which pays
# one full dequantization pass however few tokens there are: they cross between 4 and 8 tokens on SmolLM2's and
# Gemma 3's matrices, on one thread and on two (kernel_bench --only prefill).
MATVEC_MAX_TOKENS = 4
# Who multiplies the dequantized tiles: "blas" (NumPy's OpenBLAS, its own thread pool), "numba" (gemm.matmul_t
# on Numba's threads) or "auto": BLAS on one Numba thread, Numba beyond. Measured here, 512-token prefill of the
# whole model: on 1 thread BLAS is faster (SmolLM2 310 vs 236 tok/s, Gemma 3 362 vs 263); on 2 threads Numba's
# and OpenBLAS's thread pools alternating on the same cores stall each other (BLAS 161-199 tok/s) while the Numba
# GEMM, one pool throughout, gives 401-419.
TILE_GEMMS: tuple[str, ...] = ("auto", "blas", "numba")
TILE_GEMM = "auto"
# Rows dequantized per BLAS call: big enough to keep sgemm efficient, small enough that the float32 tile stays
# within a few MB (the Gemma 3 output matrix is 262144 rows; dequantized at once it would be 671 MB).
TILE_BYTES = 8 << 20


# Byte offset of the block min ``m`` (f16) and block size in bytes, for the ggml correction of Q4_1 / Q5_1.
_BLOCK_MIN = {T.Q4_1: (2, 20), T.Q5_1: (2, 24)}


def supported_types() -> tuple[T, ...]:
    return KERNELS.names()


# How the ggml-numerics mat-vec multiplies, chosen per CPU at run time (:func:`matvec_family`):
# "int8": the integer-dot kernels (:mod:`.intdot`), llama.cpp's own method and bit for bit its x86 result;
# "float": the float kernels on the fake-quantized activation (same sums to float rounding).
MATVEC_FAMILIES: tuple[str, ...] = ("int8", "float")
# SIMD flavours whose integer dot LLVM emits as vector code: x86 AVX2 / AVX-512 through vpmaddubsw (or vpdpbusd),
# Arm NEON through widening multiplies (correct; its speed against "float" is not measured yet). Elsewhere
# (SSE-only x86, other architectures) the float kernels, whose 16-lane float code every LLVM target vectorizes.
INT8_FLAVOURS = ("avx2", "avx512", "neon")
# ggml numerics on the int8 family, several tokens (int_kernel_for): the register-tiled kernel (inttiles) is the
# fastest path from a few tokens on for every type measured; below TILED_MIN_TOKENS[type] one mat-vec per token is
# (a tile of 4 costs the same for 2, 3 or 4 tokens: it repeats the last one). Measured: docs/PERFORMANCE.md,
# "kernel choices" (intdot's untiled mat-mat, never faster than the tiled kernel, is kept for measuring in
# bench_compare.untiled_int).
TILED_MIN_TOKENS: dict[T, int] = {T.Q6_K: 2, T.Q4_K: 3, T.Q5_K: 3, T.Q5_0: 3, T.Q5_1: 3, T.Q4_0: 4, T.Q4_1: 4,
                                  T.Q8_0: 4, T.IQ4_XS: 3, T.Q2_K: 3, T.Q3_K: 4}
# Q2_K, Q3_K (vec_dot's values below ktiles, where llama.cpp multiplies by vec_dot), 2 threads, 8960x1536, ms
# per-token mat-vecs / tiles / dequantized float tiles: Q3_K 2 tokens 0.49 / 0.83 / 2.16, 3 0.80-0.98 / 0.97-1.04 /
# 2.0, 4 1.19-1.30 / 0.88-1.03 / 2.0, 7 2.24 / 2.08 / 2.32; Q2_K 2 0.46 / 0.48 / 1.91, 3 0.55 / 0.47 / 1.92, 4 0.73
# / 0.47 / 1.93, 11 1.99 / 1.40 / 3.32 (two runs where two figures are given).
# IQ4_XS (no ktiles: llama.cpp multiplies it by vec_dot at every count, which its tiles equal bit for bit), 1 thread,
# 8960x1536, ms per-token mat-vecs / tiles / dequantized tiles: 2 tokens 1.04 / 1.19 / 2.94, 3 1.56 / 1.20 / 2.95,
# 16 8.49 / 5.25 / 6.53, 64 35.2 / 20.0 / 23.4, 512 - / 175 / 217.
# The same rule decides the last tile of a longer run: a remainder of fewer than the type's TILED_MIN_TOKENS goes
# through the mat-vec (matmul_by_int_tiles).
# From how many tokens a type takes ktiles (16 tokens a vector), per compile target (ktiles.compiled_target).
# AVX-512 VNNI: Q5_K and Q6_K: from ggml's
# own floor (ktiles.MIN_TOKENS), where llama.cpp switches to it: its values bit for bit, and faster than the 4-token
# tiles from there on. Q4_K: llama.cpp repacks Q4_K weights in a model (its own gemm), so ktiles buys only speed,
# which it does from 16 tokens (1 thread, Qwen2.5-1.5B's shapes, ms tiled / ktiled: 8 tokens 0.74 / 1.37, 16 1.36 /
# 1.37, 24 2.04 / 2.01, 32 2.72 / 2.02 on 8960x1536: unpacking the weight once costs as much as a group of 16).
# Q4_0: llama.cpp repacks a model's Q4_0 weights at load (rows a multiple of 8, x86 with AVX2) and multiplies them
# by its gemm / gemv at every token count, whose float steps ktiles.ktiled_blocks takes; from 5 tokens on it is the
# faster kernel here (1 thread, ms tiled / ktiled, 8960x1536: 4 tokens 0.99 / 1.01, 6 1.99 / 1.03, 16 4.14 / 0.99).
# Rows not a multiple of 8 stay unrepacked in llama.cpp (llamafile's sgemm: vec_dot's values): the 4-token tiles.
# Q2_K, Q3_K (fewer tokens: the integer mat-vec or the 4-token tiles, vec_dot's values; above): from ggml's floor,
# where llama.cpp's mul_mat takes its tiled kernel for both (checked against libggml, 2026-11-27: ktiles equals it
# from 8 tokens, vec_dot below), though the 4-token tiles are faster there (2 threads, 8960x1536, ms tiles / ktiles:
# Q3_K 8 tokens 1.75 / 4.46, 12 3.73 / 3.58, 64 17.3 / 6.2; Q2_K 8 0.94 / 3.65, 16 1.90 / 2.64, 64 7.8 / 5.3); the
# float tiles ktiles replaced: Q3_K 8 tokens 1.45 / 1.74, 512 68.4 / 14.5, Q2_K 512 56.2 / 15.5.
# Q4_1, Q5_0, Q5_1, Q8_0 (ktiles.ktiled_lanes: vec_dot's float order, so the same values as the 4-token tiles and
# llamafile's sgemm): from where they are faster, 1 thread, ms tiles / ktiles, 8960x1536: Q4_1 8 tokens 2.36 / 1.91,
# 16 4.77 / 2.04, 128 38.0 / 11.3; Q5_1 8 2.50 / 2.05; Q5_0 8 2.29 / 1.84, 16 4.60 / 1.79; Q8_0 8 1.91 / 1.91, 12
# 2.91 / 2.23, 16 4.27 / 2.31 (at 4 to 6 tokens the tiles, or the tiles plus a mat-vec, are faster for each).
# IQ4_NL: llama.cpp repacks it as Q4_0 (rows a multiple of 8) and its gemm's float steps are ktiled_blocks'; faster
# from 3 tokens (1 thread, 8960x1536, ms per-token mat-vecs / ktiles / dequantized tiles: 4 tokens 3.24 / 1.77 / 3.11,
# 8 6.44 / 1.70 / 3.70, 16 12.95 / 1.71 / 6.36, 64 51.7 / 5.75 / 22.7; one token 0.81 by the mat-vec).
_KTILED_MIN_TOKENS_VNNI: dict[T, int] = {
    T.IQ4_NL: 3,
    T.Q4_0: 5,
    T.Q4_1: 8,
    T.Q5_0: 8,
    T.Q5_1: 8,
    T.Q8_0: 9,
    T.Q2_K: ktiles.MIN_TOKENS,
    T.Q3_K: ktiles.MIN_TOKENS,
    T.Q4_K: 16,
    T.Q5_K: ktiles.MIN_TOKENS,
    T.Q6_K: ktiles.MIN_TOKENS,
}
# AVX2 (two 8-token halves a step, 16 registers; measured on AVX2 code, a Zen 4 compiled for Haswell, 1 thread,
# 8960x1536, ms without ktiles (the 4-token tiles; Q2_K, Q3_K: the float tiles) / with): Q4_0 8 tokens 2.14 / 2.37,
# 12 3.21 / 2.38, 64 17.4 / 9.4; Q5_0 16 5.14 / 4.21, 24 7.93 / 8.16, 32 10.5 / 7.8; Q2_K 8 4.26 / 4.87, 12 7.15 / 4.91;
# Q3_K 8 4.61 / 4.70 (the same), 12 7.62 / 4.76; Q4_K 24 3.99 / 4.95, 32 5.32 / 5.11, 64 10.6 / 9.6; Q5_K 8 1.92 / 2.64,
# 12 2.65 / 2.58, 16 3.43 / 2.62; Q6_K 12 2.23 / 2.54, 16 2.84 / 2.54, 24 4.24 / 4.79, 32 5.62 / 4.89. Q4_1 and Q5_1
# never faster (64: 19.4 / 21.6, 22.9 / 22.2), Q8_0 not exact there (dpbusd_row's AVX2 bound): the 4-token tiles,
# which are vec_dot's values as ktiled_lanes' are. Q2_K: from ggml's floor since it has integer tiles below (its
# values, as on AVX-512; from 12 when the float tiles were all it had).
_KTILED_MIN_TOKENS_AVX2: dict[T, int] = {
    T.Q4_0: 12,
    T.Q5_0: 32,
    T.Q2_K: ktiles.MIN_TOKENS,
    T.Q3_K: ktiles.MIN_TOKENS,
    T.Q4_K: 32,
    T.Q5_K: 12,
    T.Q6_K: 16,
}
KTILED_MIN_TOKENS: dict[str, dict[T, int]] = {"avx512_vnni": _KTILED_MIN_TOKENS_VNNI, "avx2": _KTILED_MIN_TOKENS_AVX2}
# Where llama.cpp repacks a type at load (x86 with AVX2: rows a multiple of this) and multiplies it at every token
# count by its own gemv / gemm: a type's ktiles only there; and on AVX-512 VNNI its one-token mat-vec takes the gemv's
# order there, which also takes fewer tokens than ktiles (:func:`repacked_order`).
REPACKED_ROWS = {T.Q4_0: q4_0.REPACKED_ROWS, T.IQ4_NL: iq4_nl.REPACKED_ROWS}


def matvec_family(features: CPUFeatures | None = None) -> str:
    """The ggml-numerics mat-vec family for this CPU (``features``: default, this machine's)."""
    f = features or cpu_features()
    x86_without_avx2 = f.simd_flavour == "avx2" and not f.has("avx2")
    return "int8" if f.simd_flavour in INT8_FLAVOURS and not x86_without_avx2 else "float"


@dataclass
class QMatrix:
    """A weight matrix ``(n_out, n_in)`` as the kernels read it: the GGUF bytes, one row per output.

    ``rows`` is the backend's own copy of the tensor's bytes (``NumbaBackend.copy_weights``, the default: read from
    the file, the mapped pages given back), or a view of the memory-mapped file when it computes on the map.
    """

    name: str
    qtype: T
    rows: np.ndarray  # uint8 (n_out, row_bytes), C-contiguous
    n_out: int
    n_in: int
    kernels: Kernels = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def block_mins(self) -> np.ndarray:
        """Q4_1 / Q5_1 per-block ``m`` as float32 ``(n_out, n_in/32)``, for ggml prefill. Made on each call, not
        kept: kept for every matrix, these float32 copies were 13 MB of SmolLM2's resident memory, while making
        one costs 1/32 of the dequantization pass the prefill makes over the same matrix anyway."""
        off, size = _BLOCK_MIN[self.qtype]
        blocks = self.rows.reshape(self.n_out, -1, size)
        return blocks[:, :, off : off + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def pack_matrix(name: str, qtype, raw: np.ndarray, shape: tuple[int, int], copy: bool = False) -> QMatrix:
    """Wrap a GGUF tensor (``TensorInfo.raw`` and its NumPy-order ``shape``) for the kernels.

    ``copy=False`` reads the bytes where they are (the file's memory map); ``copy=True`` copies them once into
    ordinary process memory, which the kernels stream faster: measured here on the 178 MB Gemma 3 output matrix,
    7 -> 10 GB/s on one thread and 13 -> 20 GB/s on two (page-cache pages of the mapped file read slower than
    anonymous memory on this VM; huge pages made no further difference).
    """
    qtype = T(int(qtype))
    if qtype not in KERNELS:
        raise GGUFParityError(
            f"tensor '{name}': the numba backend has no kernel for {qtype.name}; supported: {KERNELS.listing()}"
        )
    kernels = KERNELS.get(qtype)
    if len(shape) != 2:
        raise GGUFParityError(f"tensor '{name}' has shape {tuple(shape)}; a matmul weight must be 2-D (n_out, n_in)")
    n_out, n_in = int(shape[0]), int(shape[1])
    # a plain ndarray view (gguf-py hands out np.memmap slices) of the bytes, one row per output
    rows = np.ascontiguousarray(raw).view(np.uint8).view(np.ndarray).reshape(n_out, -1)
    if copy:
        rows = copy_out_of_map(rows)  # read from the file: the mapped pages never join the copy in RSS
        drop_file_pages(raw)  # pages an earlier reader touched: one resident copy of the weight, not two
    return QMatrix(name, qtype, rows, n_out, n_in, kernels)


@dataclass(frozen=True)
class FusedMatrices:
    """Weights that multiply the same input (a layer's Q and K, its FFN gate and up), of one tensor type and width,
    whose rows lie one after another in one buffer: ``matrix`` is all of them as one matrix, ``parts`` each of them
    (views into the same rows, usable alone), so one pass over ``matrix`` gives every part's output."""

    matrix: QMatrix
    parts: tuple[QMatrix, ...]

    def split(self, y: np.ndarray) -> list[np.ndarray]:
        """``y (..., matrix.n_out)`` -> each part's columns ``(..., part.n_out)`` (views)."""
        out, start = [], 0
        for part in self.parts:
            out.append(y[..., start : start + part.n_out])
            start += part.n_out
        return out


def pack_matrices(tensors, copy: bool = True) -> list[QMatrix | FusedMatrices]:
    """Pack ``tensors`` (each ``(name, qtype, raw, shape)``) in order, fusing each run of consecutive tensors of the
    same type and width into one :class:`FusedMatrices` (copied out of the map into one buffer: each byte is still
    resident once). With ``copy=False`` (compute on the map) nothing is fused: the rows would have to be copied."""
    packed: list[QMatrix | FusedMatrices] = []
    run: list = []

    def flush() -> None:
        if len(run) == 1 or (run and not copy):
            packed.extend(pack_matrix(*t, copy=copy) for t in run)
        elif run:
            packed.append(_fuse(run))
        run.clear()

    for t in tensors:
        name, qtype, raw, shape = t
        if run and (T(int(qtype)) != T(int(run[0][1])) or tuple(shape[1:]) != tuple(run[0][3][1:])):
            flush()
        run.append((name, qtype, raw, tuple(int(n) for n in shape)))
    flush()
    return packed


def _fuse(run: list) -> FusedMatrices:
    first = [pack_matrix(name, qtype, raw, shape, copy=False) for name, qtype, raw, shape in run]  # views, checked
    rows = weight_buffer((sum(w.n_out for w in first), first[0].rows.shape[1]), np.uint8)
    parts, start = [], 0
    for w, (_, _, raw, _) in zip(first, run):
        part_rows = rows[start : start + w.n_out]
        copy_out_of_map(w.rows, out=part_rows)
        drop_file_pages(raw)
        parts.append(QMatrix(w.name, w.qtype, part_rows, w.n_out, w.n_in, w.kernels))
        start += w.n_out
    name = "+".join(w.name for w in parts)
    return FusedMatrices(QMatrix(name, parts[0].qtype, rows, rows.shape[0], parts[0].n_in, parts[0].kernels),
                         tuple(parts))


def fused_is_exact(fused: FusedMatrices, numerics: str) -> bool:
    """Whether one pass over a fused matrix gives each part's output bit for bit as the part alone would: true where
    the integer-dot kernels run (every output row is its own dot product, whatever rows surround it) and, for a type
    llama.cpp repacks, the whole and each part are alike repacked or not (:data:`REPACKED_ROWS`: the float order of
    their kernels follows); the float paths (BLAS tiles) may block rows differently, so there the parts are
    multiplied one by one."""
    w = fused.matrix
    if numerics != "ggml" or w.kernels.matvec_int is None or matvec_family() != "int8":
        return False
    multiple = REPACKED_ROWS.get(w.qtype)
    return multiple is None or all((p.n_out % multiple == 0) == (w.n_out % multiple == 0) for p in fused.parts)


def matmul(w: QMatrix, x: np.ndarray, numerics: str = "f32", quantized: dict | None = None) -> np.ndarray:
    """``x (T, n_in) @ W.T -> (T, n_out)`` float32 (a 1-D ``x`` gives a 1-D result).

    ``quantized``: a dict shared by calls with the same ``x`` (a layer's Q, K and V): the integer kernels' quantized
    activation is made once per activation type and kept there for the next weight."""
    if numerics == "ggml" and _one_token_int8(w, x):
        y = matvec_int_one_token(w, x)
        return y if x.ndim == 1 else y.reshape(*x.shape[:-1], w.n_out)
    if numerics not in NUMERICS:
        raise NUMERICS.error(numerics)
    x = np.asarray(x, dtype=np.float32)
    squeeze = x.ndim == 1
    x2 = np.ascontiguousarray(x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1))
    if x2.shape[1] != w.n_in:
        raise GGUFParityError(f"matmul with '{w.name}' expects activations (..., {w.n_in}), got shape {x.shape}")
    int_kernel = int_kernel_for(w, x2.shape[0]) if numerics == "ggml" and matvec_family() == "int8" else ""
    if int_kernel:
        by_kernel = {"ktiled": matmul_by_ktiles, "tiled": matmul_by_int_tiles, "matvec": matmul_by_int_matvec}
        y = by_kernel[int_kernel](w, x2, quantized)
        return y[0] if squeeze else y.reshape(*x.shape[:-1], w.n_out)
    xv, xs = activations.prepare(x2, numerics, w.kernels.vec_dot_type, w.kernels.sub)
    if x2.shape[0] <= MATVEC_MAX_TOKENS:
        y = matmul_by_matvec(w, xv, xs)
    else:
        y = matmul_by_tiles(w, xv, xs, numerics)
    if squeeze:
        return y[0]
    return y.reshape(*x.shape[:-1], w.n_out)


def _one_token_int8(w: QMatrix, x) -> bool:
    """A decode step's matmul: one contiguous float32 token, an integer kernel for the type, an int8 CPU."""
    return (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.size == w.n_in and x.flags.c_contiguous
            and w.kernels.matvec_token is not None and matvec_family() == "int8")


def matvec_int_one_token(w: QMatrix, x: np.ndarray) -> np.ndarray:
    """The decode fast path of :func:`matmul` (ggml numerics, one token): what :func:`matmul_by_int_matvec` does
    for ``T = 1`` (the same kernels, so the same bits), without the shape handling around it. A small model's
    decode step makes ~120 of these calls (SmolLM2, fused projections), so the Python work per call is a measurable
    share of its time."""
    y = np.empty(w.n_out, np.float32)
    w.kernels.matvec_token(w.rows, x.reshape(-1), y)  # activations.quantize_int_row + matvec_int, one call
    return y


def matmul_by_matvec(w: QMatrix, xv: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """One fused mat-vec per token: ``(T, n_out)``."""
    y = np.empty((xv.shape[0], w.n_out), np.float32)
    for t in range(xv.shape[0]):
        w.kernels.matvec(w.rows, xv[t], xs[t], y[t])
    return y


def quantize_once(x: np.ndarray, kind: str, quantized: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``activations.quantize_int(x, kind)``, taken from / kept in ``quantized`` when given."""
    if quantized is None:
        return activations.quantize_int(x, kind)
    got = quantized.get(kind)
    if got is None:
        got = quantized[kind] = activations.quantize_int(x, kind)
    return got


def matmul_by_int_matvec(w: QMatrix, x: np.ndarray, quantized: dict | None = None) -> np.ndarray:
    """ggml numerics through the integer-dot kernels (the activation quantized once, as ggml does): one mat-vec
    per token."""
    yq, yd, ya = quantize_once(x, w.kernels.int_activation, quantized)
    y = np.empty((x.shape[0], w.n_out), np.float32)
    for t in range(x.shape[0]):
        w.kernels.matvec_int(w.rows, yq[t], yd[t], ya[t], y[t])
    return y


def int_kernel_for(w: QMatrix, n_tokens: int) -> str:
    """Which integer-dot kernel multiplies ``n_tokens`` tokens with ``w`` (ggml numerics, int8 family): "ktiled"
    (:mod:`.ktiles`, 16 tokens a vector), "tiled" (:mod:`.inttiles`), "matvec" (one mat-vec per token), or ""
    (no integer kernel for this type and count: the float paths)."""
    k = w.kernels
    if k.matmul_ktiled is not None and ktiled_applies(w, n_tokens):
        return "ktiled"
    if k.matvec_int is None:
        return ""
    if repacked_order(w):  # below ktiles' threshold, one mat-vec per token: the repacked gemm's values, and faster
        return "matvec"
    if k.matmul_tiled is not None and n_tokens >= TILED_MIN_TOKENS[w.qtype]:
        return "tiled"
    if n_tokens <= MATVEC_MAX_TOKENS:
        return "matvec"
    return ""


def matmul_by_int_tiles(w: QMatrix, x: np.ndarray, quantized: dict | None = None) -> np.ndarray:
    """ggml numerics through the register-tiled integer kernel (2 rows x 4 tokens per tile; the mat-vec's outputs
    bit for bit)."""
    k = w.kernels
    yq, yd, ya = quantize_once(x, k.int_activation, quantized)
    y = np.empty((x.shape[0], w.n_out), np.float32)
    n_tiled, rest = x.shape[0], x.shape[0] % inttiles.TILE_TOKENS
    if n_tiled > inttiles.TILE_TOKENS and rest < TILED_MIN_TOKENS[w.qtype]:
        n_tiled -= rest
        for t in range(n_tiled, x.shape[0]):
            k.matvec_int(w.rows, yq[t], yd[t], ya[t], y[t])
    k.matmul_tiled(w.rows, yq[:n_tiled], yd[:n_tiled], ya[:n_tiled], y[:n_tiled])
    return y


def repacked_order(w: QMatrix) -> bool:
    """Whether a batch through ``w`` below ktiles' threshold takes one mat-vec per token in llama.cpp's repacked
    gemv order (:mod:`.types.q4_0`: a Q4_0 weight with rows a multiple of 8, kernels compiled for AVX-512 VNNI),
    which gives its gemm's values at every token count (the 4-token tiles give ``vec_dot``'s). Measured, 1 thread,
    8960x1536, ms per-token mat-vecs / 4-token tiles: 2 tokens 0.46 / 0.99, 4 0.91 / 1.02. Not on AVX2, whose
    one-token mat-vec takes that order too but the tiles are faster from 4 tokens (AVX2 code on the AMD EPYC VM: 4
    tokens 1.49 / 1.09, 8 2.98 / 2.17, 11 4.09 / 3.29; 2 tokens 0.74 either way)."""
    multiple = REPACKED_ROWS.get(w.qtype)
    return multiple is not None and w.n_out % multiple == 0 and ktiles.compiled_target() == "avx512_vnni"


def ktiled_applies(w: QMatrix, n_tokens: int) -> bool:
    """Whether ``n_tokens`` tokens through ``w`` take :mod:`.ktiles`: a type from its ``KTILED_MIN_TOKENS`` for the
    kernels' compile target (AVX-512 VNNI or AVX2), at least one band of rows (and for Q4_0 rows llama.cpp
    repacks)."""
    first = KTILED_MIN_TOKENS.get(ktiles.compiled_target(), {}).get(w.qtype)
    return not (first is None or n_tokens < first or w.n_out < ktiles.BAND or w.n_out % REPACKED_ROWS.get(w.qtype, 1))


def matmul_by_ktiles(w: QMatrix, x: np.ndarray, quantized: dict | None = None) -> np.ndarray:
    """ggml numerics through :mod:`.ktiles` (16 tokens a vector, llama.cpp's float steps): every token in one call,
    as ggml's batched kernels take them."""
    yq, yd, ya = quantize_once(x, w.kernels.int_activation, quantized)
    y = np.empty((x.shape[0], w.n_out), np.float32)
    w.kernels.matmul_ktiled(w.rows, yq, yd, ya, y)
    return y


def matmul_by_tiles(
    w: QMatrix, xv: np.ndarray, xs: np.ndarray, numerics: str, tile_rows: int = 0, tile_gemm: str = ""
) -> np.ndarray:
    """Dequantize ``tile_rows`` rows at a time (ggml's exact values) and multiply each tile with BLAS (or the
    Numba GEMM, ``tile_gemm="numba"``)."""
    tile_gemm = tile_gemm or TILE_GEMM
    if tile_gemm == "auto":
        tile_gemm = "numba" if numba.get_num_threads() > 1 else "blas"
    n_tokens = xv.shape[0]
    if tile_rows <= 0:
        tile_rows = max(16, min(w.n_out, TILE_BYTES // (4 * w.n_in)))
    tile = np.empty((min(tile_rows, w.n_out), w.n_in), np.float32)
    y = np.empty((n_tokens, w.n_out), np.float32)
    for r0 in range(0, w.n_out, tile_rows):
        rows = min(tile_rows, w.n_out - r0)
        w.kernels.dequant(w.rows, r0, tile[:rows])
        if tile_gemm == "numba":
            gemm.matmul_t(xv, tile[:rows], y, r0)
        elif rows == w.n_out:
            np.matmul(xv, tile.T, out=y)  # sgemm with a transposed operand: no copy
        else:
            y[:, r0 : r0 + rows] = xv @ tile[:rows].T
    if numerics == "ggml" and w.qtype in _BLOCK_MIN:
        # ggml's Q4_1 / Q5_1 dot adds m * s with s = f16(d_a * sum(q_a)); the tile product added m * sum(xv).
        sums = np.empty_like(xs)
        activations.block_sums(xv, 32, sums)
        correction = np.empty_like(y)
        gemm.matmul_t(np.ascontiguousarray(xs - sums), w.block_mins(), correction, 0)  # not BLAS: see gemm.py
        y += correction
    return y


def dequantize_rows(w: QMatrix, ids: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the matrix as float32 ``(len(ids), n_in)``, ggml's exact values (embedding look-ups)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= w.n_out):
        raise GGUFParityError(f"token id out of range for '{w.name}': ids must be in 0..{w.n_out - 1}")
    out = np.empty((ids.size, w.n_in), np.float32)
    start = 0
    while start < ids.size:  # one kernel call per run of consecutive ids
        stop = start + 1
        while stop < ids.size and ids[stop] == ids[stop - 1] + 1:
            stop += 1
        w.kernels.dequant(w.rows, int(ids[start]), out[start:stop])
        start = stop
    return out
