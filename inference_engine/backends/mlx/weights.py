"""Weight matrices as the MLX backend holds them, one class per storage form, each callable as ``w(x) = x @ W.T``.

Which form a GGUF tensor gets (:func:`prepare_matrix`), from cheapest to most expensive in memory:

* :class:`AffineMatrix`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K transcoded exactly to MLX's affine format
  (``transcode.py``) and multiplied by ``mx.quantized_matmul`` (on Metal, CUDA and the CPU); no float copy of the
  weight ever exists.
* :class:`BlockMatrix`: Q2_K, Q3_K, Q6_K, IQ4_XS, IQ4_NL on a GPU: the GGUF blocks as they are in the file, in GPU
  memory, read by our kernels (``block_kernels.py``: Metal on Apple silicon, CUDA in MLX's CUDA build); Q4_K and
  Q5_K too where ``MLXBackend.block_kernel_types`` names them (their file's 4.5 / 5.5 bits a weight, not the affine
  form's 6).
* :class:`DenseMatrix`: float32, for F32 / F16 / BF16 weights (converted exactly), and for Q2_K, Q3_K, Q6_K,
  IQ4_XS, IQ4_NL on the CPU, where custom kernels cannot run (dequantized exactly with gguf-py, as ggml's
  dequantize_row).

Every form computes with exactly ggml's weight values; they differ only in float32 summation order.

:class:`FusedAffine`: consecutive affine matrices that multiply the same input (a layer's Q and K, V too where it has
their type; gate and up) share one set of device arrays, each part a row slice of it, so a decode step multiplies
the run in one ``quantized_matmul`` (one kernel, where three products were three) and splits its output by columns.
:class:`FusedBlocks` does the same for block matrices of one type (their GGUF rows end to end, one kernel).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.backends.mlx import block_kernels
from inference_engine.backends.mlx.block_kernels import Dialect
from inference_engine.backends.mlx.transcode import AffineTensor, is_transcodable, transcode
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo


def _rows(t: TensorInfo) -> np.ndarray:
    from inference_engine.quants import QuantType

    if len(t.shape) != 2:
        raise GGUFParityError(f"tensor '{t.name}' has shape {t.shape}; a matmul weight must be 2-D (n_out, n_in)")
    return QuantType.as_byte_rows(np.asarray(t.raw))


class AffineMatrix:
    form = "mlx-affine"

    def __init__(self, t: TensorInfo, affine: AffineTensor | None = None):
        a = affine if affine is not None else transcode(_rows(t), t.qtype)
        self.qtype, self.bits, self.group_size = t.qtype, a.bits, a.group_size
        self.packed, self.scales, self.biases = mx.array(a.packed), mx.array(a.scales), mx.array(a.biases)
        self.n_out, self.n_in = (int(v) for v in t.shape)

    @property
    def nbytes(self) -> int:
        """Bytes on the device: what one product reads."""
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes

    def dequantized(self) -> mx.array:
        """The float32 weight ``(n_out, n_in)`` MLX computes with (tests compare it with gguf-py's values)."""
        return mx.dequantize(self.packed, self.scales, self.biases, group_size=self.group_size, bits=self.bits)

    def __call__(self, x: mx.array) -> mx.array:
        return mx.quantized_matmul(
            x, self.packed, self.scales, self.biases, transpose=True, group_size=self.group_size, bits=self.bits
        )

    def __repr__(self) -> str:
        return f"AffineMatrix({self.qtype.name}, bits={self.bits}, ({self.n_out}, {self.n_in}))"


class StackedRows:
    """Matrices that multiply one input, stacked by rows into one set of device arrays (``ARRAYS``, each concatenated
    over the parts) and multiplied by one product (:meth:`product`), its output split by columns.

    The parts keep working alone (``matrix_profile``, a prefill in float32): each part's arrays become row slices
    of the stacked ones, which are row-contiguous views, so no weight is held twice."""

    ARRAYS: tuple[str, ...] = ()

    def __init__(self, parts: list):
        self.parts = parts
        for name in self.ARRAYS:
            setattr(self, name, mx.concatenate([getattr(p, name) for p in parts]))
        mx.eval(*(getattr(self, name) for name in self.ARRAYS))
        self.bounds: list[tuple[int, int]] = []
        row = 0
        for p in parts:
            self.bounds.append((row, row + p.n_out))
            for name in self.ARRAYS:
                setattr(p, name, getattr(self, name)[row:row + p.n_out])
            mx.eval(*(getattr(p, name) for name in self.ARRAYS))  # views of the stacked arrays
            row += p.n_out
        self.n_out, self.n_in = row, parts[0].n_in

    def product(self, x: mx.array) -> mx.array:
        raise NotImplementedError

    def __call__(self, x: mx.array, bias: mx.array | None = None) -> list[mx.array]:
        """Each part's product ``x @ W_i.T``, ``(T, n_out_i)``: column slices of the one product, after adding
        ``bias`` (the parts' biases end to end) to it where given."""
        out = self.product(x)
        if bias is not None:
            out = out + bias
        return [out[..., lo:hi] for lo, hi in self.bounds]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.parts))})"


class FusedAffine(StackedRows):
    """Affine matrices of one bits / group size / input width stacked by rows: one ``quantized_matmul``."""

    ARRAYS = ("packed", "scales", "biases")

    def __init__(self, parts: list[AffineMatrix]):
        super().__init__(parts)
        self.bits, self.group_size = parts[0].bits, parts[0].group_size

    @staticmethod
    def fusable(a, b) -> bool:
        """Whether ``b`` can join a run that ends with ``a``: both affine, same bits, group size and input width."""
        return (isinstance(a, AffineMatrix) and isinstance(b, AffineMatrix)
                and (a.bits, a.group_size, a.n_in) == (b.bits, b.group_size, b.n_in))

    def product(self, x: mx.array) -> mx.array:
        return mx.quantized_matmul(
            x, self.packed, self.scales, self.biases, transpose=True, group_size=self.group_size, bits=self.bits
        )


def fuse_runs(matrices: list) -> list:
    """``matrices`` (multiplying one input, in order) as runs: a :class:`FusedAffine` or :class:`FusedBlocks`
    (each a :class:`StackedRows`) of each stretch of two or more consecutive matrices that can share one product,
    the others as they are."""
    runs: list = []
    i = 0
    while i < len(matrices):
        kind = next((k for k in (FusedAffine, FusedBlocks)
                     if i + 1 < len(matrices) and k.fusable(matrices[i], matrices[i + 1])), None)
        j = i + 1
        while kind is not None and j < len(matrices) and kind.fusable(matrices[j - 1], matrices[j]):
            j += 1
        runs.append(kind(matrices[i:j]) if kind is not None else matrices[i])
        i = j
    return runs


def block_product(dialect: Dialect, qtype: T, blocks: mx.array, x: mx.array, matvec: str) -> mx.array:
    """``x @ W.T`` with ``W`` the GGUF rows ``blocks``: our mat-vec (its scheme ``matvec``) for a few tokens, the
    tiled mat-mul above."""
    if x.shape[0] <= block_kernels.MATVEC_MAX_TOKENS:
        return block_kernels.matvec(dialect, qtype, blocks, x, matvec)
    return block_kernels.matmul(dialect, qtype, blocks, x)


class BlockMatrix:
    """A weight of one of ``block_kernels.KERNEL_TYPES`` as its GGUF rows on the GPU, multiplied by our kernels in
    ``dialect``; ``matvec``: the mat-vec's scheme (``block_kernels.MATVEC_SCHEMES``)."""

    def __init__(self, t: TensorInfo, dialect: Dialect, matvec: str = block_kernels.MATVEC_SCHEMES[0]):
        self.qtype, self.dialect, self.matvec = t.qtype, dialect, matvec
        self.form = f"{dialect.name}-kernel"
        self.blocks = mx.array(_rows(t))  # uint8 (n_out, row_bytes): the file's bytes
        self.n_out, self.n_in = (int(v) for v in t.shape)

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def dequantized(self) -> mx.array:
        return block_kernels.dequantize(self.dialect, self.qtype, self.blocks, self.n_in)

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``ids`` as float32 ``(len(ids), n_in)``, exactly ggml's values (a step's token embedding)."""
        return block_kernels.dequantize(self.dialect, self.qtype, self.blocks[ids], self.n_in)

    def __call__(self, x: mx.array) -> mx.array:
        return block_product(self.dialect, self.qtype, self.blocks, x, self.matvec)

    def __repr__(self) -> str:
        return f"BlockMatrix({self.qtype.name}, {self.dialect.name}, ({self.n_out}, {self.n_in}))"


class FusedBlocks(StackedRows):
    """Block matrices of one type and input width stacked by rows (their GGUF rows end to end): one kernel."""

    ARRAYS = ("blocks",)

    def __init__(self, parts: list[BlockMatrix]):
        super().__init__(parts)
        self.qtype, self.dialect, self.matvec = parts[0].qtype, parts[0].dialect, parts[0].matvec

    @staticmethod
    def fusable(a, b) -> bool:
        """Whether ``b`` can join a run that ends with ``a``: both GGUF blocks of one type and input width."""
        return (isinstance(a, BlockMatrix) and isinstance(b, BlockMatrix)
                and (a.qtype, a.dialect, a.n_in, a.matvec) == (b.qtype, b.dialect, b.n_in, b.matvec))

    def product(self, x: mx.array) -> mx.array:
        return block_product(self.dialect, self.qtype, self.blocks, x, self.matvec)


class DenseMatrix:
    form = "float32"

    def __init__(self, t: TensorInfo):
        from inference_engine.quants import quant_for

        _rows(t)  # shape check
        self.qtype = t.qtype
        w = quant_for(t.qtype).dequantize(np.asarray(t.raw)).reshape(t.shape)
        # Stored transposed, (n_in, n_out): MLX's CPU matmul reads a contiguous right operand faster.
        self.weight_t = mx.array(np.ascontiguousarray(w.T, dtype=np.float32))
        self.n_out, self.n_in = (int(v) for v in t.shape)

    @property
    def nbytes(self) -> int:
        return self.weight_t.nbytes

    def dequantized(self) -> mx.array:
        return self.weight_t.T

    def __call__(self, x: mx.array) -> mx.array:
        return x @ self.weight_t

    def __repr__(self) -> str:
        return f"DenseMatrix({self.qtype.name}, ({self.n_out}, {self.n_in}))"


def matrix_form(qtype: T, dialect: Dialect | None, block_types: frozenset = frozenset()) -> type:
    """The storage class a tensor of ``qtype`` gets where our GPU kernels run in ``dialect`` (None: the CPU);
    ``block_types``: transcodable types our kernels read in their GGUF blocks instead (Q4_K, Q5_K; on a GPU)."""
    if dialect is not None and qtype in block_types and qtype in block_kernels.KERNEL_TYPES:
        return BlockMatrix
    if is_transcodable(qtype):
        return AffineMatrix
    if dialect is not None and qtype in block_kernels.KERNEL_TYPES:
        return BlockMatrix
    return DenseMatrix


def prepare_matrix(t: TensorInfo, dialect: Dialect | None, block_types: frozenset = frozenset(),
                   matvec: str = block_kernels.MATVEC_SCHEMES[0]):
    """``t`` in the storage form :func:`matrix_form` gives it; ``matvec``: a block matrix's mat-vec scheme."""
    form = matrix_form(t.qtype, dialect, block_types)
    return form(t, dialect, matvec) if form is BlockMatrix else form(t)


class HostEmbeddingRows:
    """Token embedding rows, dequantized on the host from the memory-mapped file when looked up.

    ``get_rows`` touches a handful of rows per step; dequantizing them with gguf-py (exact, every type) costs
    microseconds and keeps no second copy of the table on the device (tied models already hold it as the output
    matrix).
    """

    def __init__(self, t: TensorInfo):
        from inference_engine.quants import quant_for

        self.tensor = t
        self.quant = quant_for(t.qtype)
        self.n_embd = int(t.shape[-1])

    def __call__(self, ids: np.ndarray) -> mx.array:
        rows = self.quant.dequantize(np.asarray(self.tensor.raw)[np.asarray(ids, dtype=np.int64)])
        return mx.array(rows.reshape(len(ids), self.n_embd))
