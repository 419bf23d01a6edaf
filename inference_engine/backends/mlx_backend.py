"""The MLX backend: the op set on Apple silicon's GPU (Metal), or on MLX's CPU build elsewhere (Linux CI).

f32 numerics only: weights hold exactly ggml's dequantized values and every op computes in float32; the ``ggml``
numerics (activations quantized to Q8 before each matmul, ggml's GELU table and expf) are the NumPy and Numba
backends' job and are refused here with a one-line error.

How each op maps to MLX, and why:

* matmul: weights prepared by :mod:`inference_engine.backends.mlx.weights`: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K
  transcoded exactly to MLX affine groups of 32 (float32 scales and biases) for ``mx.quantized_matmul``; Q2_K/Q3_K/
  Q6_K kept as their GGUF blocks and read by our kernels on a GPU (:mod:`~inference_engine.backends.mlx.
  block_kernels`: Metal on Apple silicon, CUDA in MLX's CUDA build), as dequantized float32 on the CPU; F32/F16/BF16
  as float32. ``description`` lists what each loaded tensor became. Matrices loaded together (a layer's Q/K/V,
  gate/up) that share an affine format are stacked (``FusedAffine``): one product for the run, then column slices.
* rms_norm: ``mx.fast.rms_norm`` (llama.cpp's semantics: ``x / sqrt(mean(x^2) + eps) * w``, eps inside the root;
  it sums in float32 where ggml sums in double, a few 1e-7 relative).
* rope: ggml's cos/sin tables exactly (:func:`~inference_engine.backends.numerics.rope_cos_sin`, built on the host and
  cached), rotated with MLX element-wise ops (ggml contracts ``x0*cos - x1*sin`` into an FMA, MLX rounds each product:
  at most one rounding apart); where every dimension rotates, as one expression ``x*C + partner*S`` over a reversed
  view of each pair, which a compiled step makes one kernel (three with the halves concatenated). ``mx.fast.rope`` has
  the same pairing (``traditional=True`` is llama's NORM style, ``False`` NEOX) but builds its angles as ``p *
  base**(-2i/d)`` in one rounding, not by ggml's repeated float32 product; at position 1000 that moved values by ~1e-4
  (one float32 ulp of the angle), so it is not used.
* attention: ``mx.fast.scaled_dot_product_attention`` (grouped KV heads natively; boolean mask from
  :func:`~inference_engine.backends.numerics.visible_keys` for causal and sliding-window layers; softmax in float32).
* KV cache: MLX arrays stored head-major ``(n_heads, n_ctx, head_dim)`` (what the attention kernels read without
  a copy), written with slice assignment, which MLX turns into an in-place update.

Lazy evaluation: ops only build a graph. ``to_numpy`` / ``synchronize`` evaluate it together with every KV buffer
written since the last evaluation, so one forward pass (prefill or decode) is one ``mx.eval``.

Device and float32 (:mod:`inference_engine.backends.mlx.device`): ``device="gpu" | "cpu"`` (default: the GPU where
MLX has one: Metal, or CUDA with MLX's CUDA build) becomes MLX's default device. MLX computes float32 matmuls at
TF32 precision on NVIDIA GPUs (cuBLASLt ``CUBLAS_COMPUTE_32F_FAST_TF32``) and on Apple GPUs with neural
accelerators unless ``MLX_ENABLE_TF32=0``, which MLX reads at its first float32 matmul on the GPU: that module sets
it when this one is imported, refuses the GPU where it is not 0, and checks one float32 product on the chosen device
(a process that ran MLX on the GPU earlier keeps TF32: refused; recorded in ``device_info()``).
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import numpy as np

from inference_engine.backends import backend_numerics
from inference_engine.backends import numerics as nx
from inference_engine.backends.base import Backend, add_biases, check_kv_type
from inference_engine.backends.mlx import block_kernels, norm_kernel
from inference_engine.backends.mlx import device as mlx_device  # sets MLX_ENABLE_TF32=0 before MLX's first matmul
from inference_engine.backends.mlx.block_kernels import KERNEL_TYPES
from inference_engine.backends.mlx.steps import (
    KV_WRITES,
    MLXSteps,
    RopeTables,
    StepCache,
    StepPositions,
    StepTokens,
    embedding_table,
    has_device_rows,
    rope_key,
)
from inference_engine.backends.mlx.transcode import AFFINE_32
from inference_engine.backends.mlx.weights import (
    AffineMatrix,
    HostEmbeddingRows,
    StackedRows,
    fuse_runs,
    matrix_form,
    prepare_matrix,
)
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo
from inference_engine.platform.mapped_pages import tensor_out_of_map

SUPPORTED_NUMERICS = backend_numerics("mlx")  # ("f32",): the registry's row, which the defaults table reads too
_KV_DTYPES = {"f32": mx.float32, "f16": mx.float16}
# How generation steps run (async_steps): "compiled" (one compiled graph per decode step, launched without waiting),
# "lazy" (each decode step built op by op, launched the same way), "sync" (each step evaluated and read back).
STEP_MODES = ("compiled", "lazy", "sync")
# How a prefill's products with quantized weights run (MLXBackend.prefill_matmul): "quantized" (mx.quantized_matmul,
# our tiled kernel: the weight read as stored) or "f32" (the weight dequantized to float32 on the device, then a
# float32 matmul: cuBLAS's float32 GEMM on CUDA, where MLX 0.32 sends a quantized mat-mul's float32 activations to its
# generic qmm_naive kernel). The same float32 products either way, in another summation order.
PREFILL_MATMULS = ("quantized", "f32")
# The default per GPU backend (the CPU and any other: "quantized"). CUDA: "f32", measured on an H200 (2026-11-27,
# MLX 0.32.4, decode_profile --prefill 512, one run each): a random-weight model of Qwen2.5-1.5B's shape and Q4_K_M
# types 79.8 ms of device time as "quantized" against 44.5 ms as "f32" (1.8x); SmolLM2-135M's shape (Q4_1) 16.7
# against 17.0 ms, the same; matrix_profile had every large matrix faster through float32 (ffn_down Q6_K 543 against
# 911 us) and the small attention ones about even. Metal and MLX's CPU build: not measured, so their kernels stay.
PREFILL_MATMUL_DEFAULTS = {"cuda": "f32"}
# Rows from which "f32" applies: a guess the H200 did not test (its prefills were 512 rows). The float32 copy costs
# ~8 bytes of traffic a weight (written, read) against the affine form's 0.75 read: it can pay only where a product
# reuses each weight over many rows; a decode step (one row) never takes it.
PREFILL_F32_MIN_ROWS = 64
# Whether a compiled decode step's attention over an F16 cache runs as our kernels (attention_kernel.py) instead of
# MLX's masked attention (two F16 -> float32 copies of the key block, two matmuls, the mask, the softmax), per GPU
# backend (the CPU has no kernels of ours). CUDA: on, measured on an H200 (2026-11-27, MLX 0.32.4, decode_profile
# --mlx-modes compiled --steps 50, one run each, MLX's ops -> the kernel): the launched generation loop's tokens a
# second rose in all six runs (a random-weight model of Qwen2.5-1.5B's shape and Q4_K_M types 167 -> 188 at depth 0
# and 127 -> 165 at depth 512; SmolLM2-135M's shape 123 -> 237 and 159 -> 181; the real SmolLM2-135M 172 -> 202 and
# 161 -> 171); forced tokens (bench's tg) faster in four, the same in one, slower in one (the real SmolLM2 at depth
# 0: 7.24 against 5.80 ms); graph compute nodes 714 -> 601; its GPU tests passed there. Metal: never run, so off.
ATTENTION_KERNEL_DEFAULTS = {"cuda": True}
# Whether a compiled decode step's RoPE and F16 K/V rows run as one kernel of ours (rope_kernel.py) beside that
# attention kernel, instead of four element-wise kernels a layer, per GPU backend: nowhere yet (never run on a GPU).
ROPE_KERNEL_DEFAULTS: dict[str, bool] = {}
# Whether a residual add and the RMSNorm after it (ffn_inp and ffn_norm; l_out and the next attn_norm) run as one
# kernel of ours (norm_kernel.py) instead of MLX's add and mx.fast.rms_norm, per GPU backend: nowhere yet (never run
# on a GPU).
NORM_KERNEL_DEFAULTS: dict[str, bool] = {}
_CACHE_SIZE = 16  # rope tables / masks kept (one per distinct positions and settings in flight)

# gelu_tanh's constants as nx defines them (float32)
_GELU_A = float(nx.GELU_COEF_A)
_SQRT_2_OVER_PI = float(nx.SQRT_2_OVER_PI)


def parse_block_kernel_types(text: str) -> frozenset:
    """``Q4_K,Q5_K`` -> the types for :attr:`MLXBackend.block_kernel_types`; a type our kernels do not read, or one
    they read anyway (Q6_K), is one line naming those it may hold."""
    allowed = {t.name: t for t in KERNEL_TYPES if t in AFFINE_32}
    names = [n.strip().upper() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise GGUFParityError(
            f"block kernel types: {', '.join(unknown) or 'none given'} not supported; supported: {', '.join(allowed)}"
            " (the others read in their blocks already or have no kernel of ours)"
        )
    return frozenset(allowed[n] for n in names)


class MLXBackend(Backend):
    name = "mlx"
    step_mode = "compiled"  # generation steps: one of STEP_MODES (async_steps)
    fuse_matrices = True  # load_matrices stacks runs of affine matrices (False: each alone; decode_profile --unfused)
    # Types MLX's affine form holds (Q4_K, Q5_K) read instead in their GGUF blocks by our kernels, on a GPU: the
    # file's bytes in GPU memory and our mat-vec for decode. Empty until a GPU measures it against MLX's qmv
    # (decode_profile --mlx-block-kernel-types, matrix_profile --block-kernel-types: parse_block_kernel_types).
    block_kernel_types: frozenset = frozenset()
    # How our mat-vec shares a block matrix's row among GPU threads (block_kernels.MATVEC_SCHEMES), read at load
    # time: "simd" (1-4 SIMD groups a row: ~260-410 GB/s on an H200, 2026-11-27) until a GPU measures "group" (one
    # threadgroup a row, llama.cpp's mmvq layout; its host-compiled tests pass, it has not run on a GPU):
    # decode_profile --mlx-matvec, matrix_profile --matvec (.device/run_checks.sh's matrices and speed A/B them).
    matvec_scheme: str = block_kernels.MATVEC_SCHEMES[0]
    devices = staticmethod(mlx_device.available)  # the GPU (default) where MLX has one, and the CPU
    no_gpu_reason = staticmethod(mlx_device.no_gpu_reason)

    # How a compiled decode step writes its K/V row into the cache (steps.KV_WRITES): "slice" (two kernels a write on
    # MLX's GPU backends) until a GPU times "scatter" (one): decode_profile --mlx-kv-write, run_checks.sh's speed.
    kv_write: str = KV_WRITES[0]

    def __init__(self, numerics: str = "f32", n_threads: int | None = None, device: str | None = None):
        super().__init__(numerics, n_threads, device)
        if numerics not in SUPPORTED_NUMERICS:
            raise GGUFParityError(
                f"backend 'mlx' does not support numerics '{numerics}'; supported: {', '.join(SUPPORTED_NUMERICS)}"
                " (ggml numerics: use --backend numpy or numba)"
            )
        # The load-time settings as this backend loads with them, kept on the instance: a tool may set them on the
        # class around a load (decode_profile), and switches must still say what was loaded.
        self.fuse_matrices, self.block_kernel_types = self.fuse_matrices, self.block_kernel_types
        self.matvec_scheme = self.matvec_scheme
        if self.matvec_scheme not in block_kernels.MATVEC_SCHEMES:  # read when the matrices load
            raise GGUFParityError(f"unknown MLX mat-vec scheme '{self.matvec_scheme}'; supported: "
                                  f"{', '.join(block_kernels.MATVEC_SCHEMES)}")
        self.placement = mlx_device.select(self.device)  # MLX's default device now; float32 checked there
        # Our kernels for Q2_K/Q3_K/Q6_K/IQ4_XS/IQ4_NL run on a GPU only: Metal or CUDA, whichever MLX computes on
        # (None: the CPU).
        self.kernels = block_kernels.gpu_dialect()
        self.weight_forms: Counter[str] = Counter()  # "Q4_K->mlx-affine" -> number of matrices
        self._pending: dict[int, mx.array] = {}  # KV buffers written since the last evaluation
        self._rope_cache: dict[tuple, tuple[mx.array, mx.array]] = {}
        self.rope_tables = RopeTables()  # ggml's angles of positions 0..n on the device (steps.py)
        self._mask_cache: dict[tuple, mx.array] = {}
        self.prepared_matrices: dict[str, object] = {}  # GGUF name -> its matrix (a step's token rows come from one)
        self._runs: dict[tuple[int, ...], list] = {}  # ids of a load_matrices group -> its runs (matmul_many)
        self._stacked_biases: dict[tuple[int, ...], tuple] = {}  # ids of a run's biases -> (stacked, the biases)
        self._prefill_matmul = PREFILL_MATMUL_DEFAULTS.get(self.placement.gpu_backend or "", PREFILL_MATMULS[0])
        # A compiled decode step's attention over an F16 cache as our GPU kernels: ATTENTION_KERNEL_DEFAULTS
        self.attention_kernel = ATTENTION_KERNEL_DEFAULTS.get(self.placement.gpu_backend or "", False)
        # ... and its RoPE and F16 K/V rows as one kernel of ours before it: ROPE_KERNEL_DEFAULTS (decode_attention)
        self.rope_kernel = ROPE_KERNEL_DEFAULTS.get(self.placement.gpu_backend or "", False)
        # A residual add and the norm after it as one kernel of ours: NORM_KERNEL_DEFAULTS (add_rms_norm)
        self.norm_kernel = NORM_KERNEL_DEFAULTS.get(self.placement.gpu_backend or "", False)

    @property
    def prefill_matmul(self) -> str:
        """How a prefill's products with quantized weights run: one of :data:`PREFILL_MATMULS`."""
        return self._prefill_matmul

    @prefill_matmul.setter
    def prefill_matmul(self, value: str) -> None:
        if value not in PREFILL_MATMULS:
            raise GGUFParityError(f"unknown MLX prefill matmul '{value}'; supported: {', '.join(PREFILL_MATMULS)}")
        self._prefill_matmul = value

    # --- identity -------------------------------------------------------------------------------------------
    @property
    def switches(self) -> dict:
        """The choices a step's speed depends on, as decode_profile records them beside its timings (the A/Bs of
        ``.device/run_checks.sh``'s ``speed`` step are told apart by these, not by file names)."""
        return {
            "stacked_matrices": self.fuse_matrices,
            "block_kernel_types": sorted(t.name for t in self.block_kernel_types),
            "matvec_scheme": self.matvec_scheme,
            "attention_kernel": bool(self.attention_kernel and self.kernels),
            "rope_kernel": bool(self.rope_kernel and self.attention_kernel and self.kernels),
            "kv_write": self.kv_write,
            "norm_kernel": self.fuses_add_rms_norm,
            "prefill_matmul": self._prefill_matmul,
        }

    @property
    def description(self) -> str:  # type: ignore[override]
        where = self.placement.label()
        fallback = (
            f"GGUF blocks read by our {self.kernels.name} kernels" if self.kernels else "dequantized float32 (CPU)"
        )
        form_of = {t: matrix_form(t, self.kernels, self.block_kernel_types) for t in (*AFFINE_32, *KERNEL_TYPES)}
        affine = "/".join(t.name for t, form in form_of.items() if form is AffineMatrix)
        blocks = "/".join(t.name for t, form in form_of.items() if form is not AffineMatrix)
        forms = ", ".join(f"{n}x {form}" for form, n in sorted(self.weight_forms.items())) or "none loaded yet"
        stacked = sum(isinstance(r, StackedRows) for runs in self._runs.values() for r in runs)
        if stacked:
            forms += f" ({stacked} stacked runs of matrices, one product each)"
        threads = "" if self.n_threads is None else f"; --threads {self.n_threads} not applied (MLX sets its own)"
        if self.kv_write != KV_WRITES[0]:
            threads += f"; a compiled step's K/V rows written by {self.kv_write}"
        if self.kernels and self.matvec_scheme != block_kernels.MATVEC_SCHEMES[0]:
            threads += f"; block mat-vec: {self.matvec_scheme} scheme"
        if self.attention_kernel:
            threads += ("; decode attention over an F16 cache: our kernel" if self.kernels
                        else "; decode attention kernel asked for, not run (no GPU kernels on this device)")
            if self.rope_kernel and self.kernels:
                threads += ", its RoPE and F16 rows one kernel of ours"
        if self.fuses_add_rms_norm:
            threads += "; a residual add and the RMSNorm after it one kernel of ours"
        return (
            f"MLX {mx.__version__} on {self.device} ({where}), f32 numerics only; {affine} "
            f"exactly as MLX affine 32-groups (float32 scales), {blocks} as {fallback}, "
            f"floats as float32; "
            f"matrices: {forms}{threads}"
        )

    def device_info(self) -> dict:
        return self.placement.as_dict()

    def versions(self) -> dict[str, str]:
        return {
            "numpy": np.__version__,
            "mlx": mx.__version__,
            "mlx_device": self.device,
            "gguf_block_kernels": self.kernels.name if self.kernels else "none",
        }

    # --- load time ------------------------------------------------------------------------------------------
    def load_matrix(self, t: TensorInfo):
        w = prepare_matrix(t, self.kernels, self.block_kernel_types, self.matvec_scheme)
        self.weight_forms[f"{t.qtype.name}->{w.form}"] += 1
        self.prepared_matrices[t.name] = w
        return w

    def load_matrices(self, tensors) -> list:
        """Each prepared alone, then runs of affine matrices of one bits / group size / width, or of block matrices of
        one type and width, stacked into one :class:`~inference_engine.backends.mlx.weights.FusedAffine` /
        :class:`~inference_engine.backends.mlx.weights.FusedBlocks` that :meth:`matmul_many` multiplies at once."""
        parts = [self.load_matrix(t) for t in tensors]
        if self.fuse_matrices:
            self._runs[tuple(map(id, parts))] = fuse_runs(parts)  # the key's parts are held by the runs
        return parts

    def load_vector(self, t: TensorInfo) -> mx.array:
        from inference_engine.quants import dequantize_tensor

        return mx.array(np.ascontiguousarray(dequantize_tensor(tensor_out_of_map(t)), dtype=np.float32).reshape(-1))

    def load_embedding(self, t: TensorInfo) -> HostEmbeddingRows:
        return HostEmbeddingRows(t)

    # --- ops ------------------------------------------------------------------------------------------------
    def embed(self, table: HostEmbeddingRows, ids: np.ndarray | StepTokens) -> mx.array:
        if isinstance(ids, StepTokens):  # a generation step's token on the device (steps.py)
            return ids.rows()
        return table(ids)

    def matmul(self, w, x: mx.array) -> mx.array:
        if (self._prefill_matmul == "f32" and x.shape[0] >= PREFILL_F32_MIN_ROWS
                and getattr(w, "form", "float32") != "float32"):  # a prepared quantized matrix (weights.py)
            return x @ w.dequantized().T
        return w(x)

    def matmul_many(self, ws, x: mx.array, biases=None) -> list[mx.array]:
        """One product per run :meth:`load_matrices` stacked (its output split by columns), plus the run's biases
        stacked where every part has one (one add, not one per part): the same values as a product and an add per
        weight; each weight alone where it was loaded alone or a float32 prefill dequantizes them."""
        runs = self._runs.get(tuple(map(id, ws)))
        if runs is None or (self._prefill_matmul == "f32" and x.shape[0] >= PREFILL_F32_MIN_ROWS):
            return super().matmul_many(ws, x, biases)
        out: list[mx.array] = []
        for run in runs:
            fused = isinstance(run, StackedRows)
            n = len(run.parts) if fused else 1
            run_biases, biases = (None, None) if biases is None else (biases[:n], biases[n:])
            if fused and run_biases is not None and all(b is not None for b in run_biases):
                out.extend(run(x, self._stacked_bias(run_biases)))
            elif fused:
                out.extend(add_biases(self, run(x), run_biases))
            else:
                out.extend(add_biases(self, [self.matmul(run, x)], run_biases))
        return out

    def _stacked_bias(self, biases) -> mx.array:
        """``biases`` end to end, made once per tuple of bias arrays (held with it, so their ids stay theirs)."""
        key = tuple(map(id, biases))
        held = self._stacked_biases.get(key)
        if held is None:
            stacked = mx.concatenate(list(biases))
            mx.eval(stacked)
            held = self._stacked_biases[key] = (stacked, tuple(biases))
        return held[0]

    def rms_norm(self, x: mx.array, weight: mx.array | None, eps: float) -> mx.array:
        return mx.fast.rms_norm(x, weight, eps)

    @property
    def fuses_add_rms_norm(self) -> bool:  # type: ignore[override]
        """:attr:`norm_kernel` on, and GPU kernels here to run it."""
        return bool(self.norm_kernel and self.kernels is not None)

    def add_rms_norm(self, a: mx.array, b: mx.array, weight: mx.array | None, eps: float) -> tuple[mx.array, mx.array]:
        """One kernel of ours (:mod:`~inference_engine.backends.mlx.norm_kernel`) where :attr:`fuses_add_rms_norm`;
        else MLX's add and ``mx.fast.rms_norm`` (two kernels on a GPU)."""
        if self.fuses_add_rms_norm and norm_kernel.supports(a, b, weight):
            return norm_kernel.add_rms_norm(self.kernels, a, b, weight, eps)
        return super().add_rms_norm(a, b, weight, eps)

    def rope(self, x, positions, n_dims, freq_base, neox, freq_scale=1.0, freq_factors=None) -> mx.array:
        if isinstance(positions, StepPositions):  # a compiled step's position on the device (steps.py)
            cos, sin = positions.rope_angles(rope_key(n_dims, freq_base, freq_scale, freq_factors))  # (1, 1, d/2)
        else:
            cos, sin = self._rope_angles(positions, n_dims, freq_base, freq_scale, freq_factors)  # (T, 1, n_dims/2)
        n_tokens, n_heads, head_dim = x.shape
        half = n_dims // 2
        if n_dims == head_dim:  # every dimension rotates: one element-wise expression (one kernel in a compiled step)
            # x0*cos - x1*sin and x1*cos + x0*sin as x*C + partner*S, the partner of each element the other of its
            # pair (a reversed view), C = (cos, cos), S = (-sin, sin): the same products and sums
            pair_axis = -2 if neox else -1  # NEOX: (i, i + n_dims/2); NORM: (2i, 2i+1)
            shape = (n_tokens, n_heads, 2, half) if neox else (n_tokens, n_heads, half, 2)
            xr = x.reshape(shape)
            partner = xr[:, :, ::-1, :] if neox else xr[..., ::-1]
            c, s = mx.stack([cos, cos], axis=pair_axis), mx.stack([-sin, sin], axis=pair_axis)
            return (xr * c + partner * s).reshape(n_tokens, n_heads, head_dim)
        if neox:  # GGML_ROPE_TYPE_NEOX: pairs (i, i + n_dims/2)
            x0, x1 = x[..., :half], x[..., half:n_dims]
            parts = [x0 * cos - x1 * sin, x0 * sin + x1 * cos]
        else:  # GGML_ROPE_TYPE_NORMAL: adjacent pairs (2i, 2i+1)
            x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
            pairs = mx.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)  # (T, H, n_dims/2, 2)
            parts = [pairs.reshape(n_tokens, n_heads, n_dims)]
        if n_dims < head_dim:
            parts.append(x[..., n_dims:])
        return mx.concatenate(parts, axis=-1)

    def attention(self, q, k, v, q_positions, kv_len, scale, sliding_window=0, softcap=0.0) -> mx.array:
        if softcap:
            visible = mx.array(nx.visible_keys(np.asarray(q_positions), kv_len, sliding_window))  # (T, S)
        else:
            visible = self._mask(q_positions, kv_len, sliding_window)
        return self.masked_attention(q, k[:kv_len], v[:kv_len], visible, scale, softcap)

    def masked_attention(self, q, k, v, visible, scale, softcap=0.0) -> mx.array:
        """:meth:`attention` over the slots ``k (S, n_head_kv, d_k)``, ``v (S, n_head_kv, d_v)`` with the queries'
        visibility given: ``visible`` ``(T, S)`` bool, or None where every query sees every slot. A compiled step
        builds ``visible`` on the device (:class:`~inference_engine.backends.mlx.steps.StepCache`)."""
        n_tokens, n_head, _ = q.shape
        k = k.transpose(1, 0, 2)[None]  # (1, n_head_kv, S, d_k): a view of the head-major cache
        v = v.transpose(1, 0, 2)[None]  # (1, n_head_kv, S, d_v)
        if k.dtype != mx.float32:
            k, v = k.astype(mx.float32), v.astype(mx.float32)  # F16 cache: exact widening, f32 numerics
        if softcap:
            return self._softcapped_attention(q, k, v, visible, scale, softcap)
        out = mx.fast.scaled_dot_product_attention(
            q.transpose(1, 0, 2)[None], k, v, scale=float(scale), mask=visible
        )  # (1, n_head, T, d_v)
        return out[0].transpose(1, 0, 2).reshape(n_tokens, n_head * v.shape[-1])

    def _softcapped_attention(self, q, k, v, visible, scale, softcap) -> mx.array:
        """Attention with Gemma 2's score soft-capping (``mx.fast`` has none): explicit scores, cap, mask, softmax.
        ``k``, ``v``: ``(1, n_head_kv, S, d)``; ``visible``: ``(T, S)`` bool."""
        n_tokens, n_head, _ = q.shape
        group = n_head // k.shape[1]
        kh = mx.repeat(k[0], group, axis=0) if group > 1 else k[0]  # (n_head, S, d_k)
        vh = mx.repeat(v[0], group, axis=0) if group > 1 else v[0]  # (n_head, S, d_v)
        scores = (q.transpose(1, 0, 2) @ kh.transpose(0, 2, 1)) * float(np.float32(scale))  # (n_head, T, S)
        cap = float(np.float32(softcap))
        scores = mx.tanh(scores * float(np.float32(1.0) / np.float32(softcap))) * cap
        scores = mx.where(visible[None], scores, mx.array(-np.inf, dtype=mx.float32))
        probs = mx.softmax(scores, axis=-1)
        out = probs @ vh  # (n_head, T, d_v)
        return out.transpose(1, 0, 2).reshape(n_tokens, n_head * vh.shape[-1])

    def decode_attention(self, cache, il, q, k, v, positions, rope, scale, q_scale=None, sliding_window=0):
        """A compiled decode step's RoPE, F16 K/V rows, cache write and attention on our GPU kernels where
        :attr:`rope_kernel` and :attr:`attention_kernel` are on (:meth:`~inference_engine.backends.mlx.steps.
        StepCache.attend_rotated`: three element-wise kernels fewer a layer than the ops one by one); None
        elsewhere, and for inputs the kernels do not take (the ops then run one by one)."""
        if not (self.rope_kernel and self.attention_kernel and self.kernels is not None
                and isinstance(cache, StepCache)):
            return None
        return cache.attend_rotated(self, il, q, k, v, rope, scale, q_scale, sliding_window)

    def swiglu(self, gate: mx.array, up: mx.array) -> mx.array:
        return gate / (1.0 + mx.exp(-gate)) * up

    def geglu(self, gate: mx.array, up: mx.array) -> mx.array:
        inner = (_SQRT_2_OVER_PI * gate) * (1.0 + (_GELU_A * gate) * gate)
        return 0.5 * gate * (1.0 + mx.tanh(inner)) * up

    def add(self, a: mx.array, b: mx.array) -> mx.array:
        return a + b

    def scale(self, x: mx.array, s: float) -> mx.array:
        return x * float(np.float32(s))

    def softcap(self, x: mx.array, cap: float) -> mx.array:
        """``cap * tanh(x * (1/cap))`` on the device (the base op goes through the host, which a compiled step
        cannot), in float32 as :meth:`_softcapped_attention`'s scores."""
        return mx.tanh(x * float(np.float32(1.0) / np.float32(cap))) * float(np.float32(cap))

    def to_numpy(self, x: mx.array) -> np.ndarray:
        self._evaluate(x)
        return np.asarray(x, dtype=np.float32)

    def from_numpy(self, a: np.ndarray) -> mx.array:
        return mx.array(a)

    def synchronize(self, x: mx.array) -> mx.array:
        self._evaluate(x)
        return x

    # --- KV cache -------------------------------------------------------------------------------------------
    def kv_alloc(self, n_ctx: int, n_heads: int, head_dim: int, kv_type: str) -> mx.array:
        buf = mx.zeros((n_heads, n_ctx, head_dim), dtype=_KV_DTYPES[check_kv_type(kv_type)])
        mx.eval(buf)
        return buf

    def kv_store(self, buf: mx.array, start: int, x: mx.array) -> mx.array:
        # Slice assignment rebinds ``buf`` to a SliceUpdate of itself; once nothing else holds the old array MLX
        # donates its memory, so the write costs the new rows, not a copy of the cache. astype(float16) rounds to
        # nearest even, as ggml's fp32 -> fp16.
        buf[:, start : start + x.shape[0], :] = x.transpose(1, 0, 2).astype(buf.dtype)
        self._pending[id(buf)] = buf
        return buf

    def kv_view(self, buf: mx.array, length: int) -> mx.array:
        return buf[:, :length, :].transpose(1, 0, 2)  # (length, n_heads, head_dim)

    # --- generation steps (steps.py) -------------------------------------------------------------------------
    def async_steps(self, model, cache) -> MLXSteps | None:
        """Steps launched without waiting, each decode step one compiled graph (:mod:`~inference_engine.backends.mlx.
        steps`); :attr:`step_mode` ``"lazy"`` builds each decode step op by op instead, ``"sync"`` returns None (the
        engine then evaluates and reads back each step before the next, as before)."""
        if self.step_mode not in STEP_MODES:
            raise GGUFParityError(f"unknown MLX step mode '{self.step_mode}'; supported: {', '.join(STEP_MODES)}")
        if self.kv_write not in KV_WRITES:
            raise GGUFParityError(f"unknown MLX K/V write '{self.kv_write}'; supported: {', '.join(KV_WRITES)}")
        if self.step_mode == "sync" or not has_device_rows(embedding_table(self, model)):
            return None  # (no device lookup of the token's row: each step's token is read on the host first)
        return MLXSteps(self, model, cache, compiled=self.step_mode == "compiled")

    def take_pending(self) -> list[mx.array]:
        """The KV buffers written since the last evaluation (a launched step evaluates them), forgotten here."""
        pending = list(self._pending.values())
        self._pending.clear()
        return pending

    # --- helpers --------------------------------------------------------------------------------------------
    def _evaluate(self, x: mx.array) -> None:
        mx.eval(x, *self._pending.values())
        self._pending.clear()

    def _rope_angles(self, positions, n_dims, freq_base, freq_scale, freq_factors):
        positions = np.asarray(positions, dtype=np.int64)
        start = int(positions[0]) if len(positions) else 0
        if start >= 0 and np.array_equal(positions, np.arange(start, start + len(positions))):  # one sequence's run
            key = rope_key(n_dims, freq_base, freq_scale, freq_factors)
            cos, sin = self.rope_tables.rows(key, start + len(positions))
            return cos[start:, None, :], sin[start:, None, :]  # (T, 1, n_dims/2): a view of the device table
        factors_key = None if freq_factors is None else np.asarray(freq_factors, dtype=np.float32).tobytes()
        key = (positions.tobytes(), n_dims, float(freq_base), float(freq_scale), factors_key)
        angles = self._rope_cache.get(key)
        if angles is None:
            if len(self._rope_cache) >= _CACHE_SIZE:
                self._rope_cache.clear()
            cos, sin = nx.rope_cos_sin(positions, n_dims, freq_base, freq_scale, freq_factors)
            angles = (mx.array(cos[:, None, :]), mx.array(sin[:, None, :]))  # (T, 1, n_dims/2)
            self._rope_cache[key] = angles
        return angles

    def _mask(self, q_positions: np.ndarray, kv_len: int, sliding_window: int) -> mx.array | None:
        """None when every query sees every key (a decode step inside the window), else a boolean (T, S) mask."""
        positions = np.asarray(q_positions, dtype=np.int64)
        if len(positions) == 1 and positions[0] == kv_len - 1 and (sliding_window <= 0 or kv_len <= sliding_window):
            return None
        key = (positions.tobytes(), kv_len, sliding_window)
        mask = self._mask_cache.get(key)
        if mask is None:
            if len(self._mask_cache) >= _CACHE_SIZE:
                self._mask_cache.clear()
            mask = mx.array(nx.visible_keys(positions, kv_len, sliding_window))
            self._mask_cache[key] = mask
        return mask
