"""The Numba CPU backend: the NumPy reference with its hot ops replaced by Numba kernels.

Registered as ``numba`` in :data:`inference_engine.backends.BACKENDS` (``get_backend("numba", numerics,
n_threads)`` imports this module and instantiates :class:`NumbaBackend`).

- ``matmul`` runs the fused quantized kernels of :mod:`inference_engine.backends.numba_kernels` on the GGUF
  blocks as they are in the file (one mat-vec per token when decoding; when prefilling, dequantized tiles times
  a GEMM: BLAS on one thread, Numba's own on more, so that one thread pool runs throughout), in both numerics;
  ``ggml`` numerics decode through the integer-dot kernels (``numba_kernels.intdot``, llama.cpp's method and
  result) on CPUs where :func:`~.numba_kernels.dispatch.matvec_family` picks them. ``load_matrix`` copies each
  weight's bytes once out of the memory map into process memory (``copy_weights``; the kernels stream it ~1.4x
  faster, see ``pack_matrix``) and gives the mapped pages back (:mod:`inference_engine.platform.mapped_pages`), so
  one copy of the weights is resident; a tied output matrix shares the embedding's copy.
- ``embed`` dequantizes only the looked-up rows with the same kernels (ggml's exact values).
- ``rms_norm``, ``rope``, ``attention``, ``swiglu`` and ``geglu`` run the Numba kernels of
  :mod:`inference_engine.backends.numba_kernels.ops`: same numerics as the NumPy reference (bit for bit, except
  float summation order inside attention and RMSNorm's double sum, see that module), at a few microseconds a call
  instead of tens: for a decoded token of a small model those per-call costs, not arithmetic, dominate. From
  ``PARALLEL_ROWS`` tokens on (prefill) the element-wise ops split rows over threads.
- ``decode_attention`` (one untapped token): RoPE on q and k, the query scale, the cache write and attention in one
  compiled call (``ops.rope_attention``), the same bits as those ops one by one.
- ``decode_layer`` (one untapped token through a llama / qwen2 / qwen3 / gemma3 layer, as the model's
  :class:`~inference_engine.backends.base.FusedLayerPlan` describes it): the whole layer, the same kernels called
  from one compiled function (``numba_kernels.decode_layer.prenorm_layer``), the same bits as the ops.
- ``add``, ``scale``, the RoPE angle cache and the KV cache are inherited from the NumPy reference.

``n_threads`` sets Numba's thread count (``numba.set_num_threads``) for every kernel; it cannot exceed the number
Numba started with (``NUMBA_NUM_THREADS``, by default the number of cores).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numba
import numpy as np

from inference_engine import platform
from inference_engine.backends import numba_kernels
from inference_engine.backends import numerics as nx
from inference_engine.backends.base import FusedLayerPlan, add_biases
from inference_engine.backends.numba_kernels import decode_layer, ops
from inference_engine.backends.numba_kernels import dispatch as kernels
from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo
from inference_engine.kv_cache import KVCache


class NumbaBackend(NumpyBackend):
    name = "numba"
    copy_weights = True  # False: compute on the memory-mapped file (no extra memory, slower streaming)
    fuse_matrices = True  # False: every weight its own buffer and its own matmul (load_matrices)
    fuse_layers = True  # False: a decoded token runs each layer's ops one by one (decode_layer)

    def __init__(self, numerics: str = "f32", n_threads: int | None = None):
        # Chosen: the process-wide tricks this backend's speed and memory were measured with (once per process,
        # GGUF_PARITY_PLATFORM_TRICKS=off leaves them out), then the kernels' own guards (stale cache, Ctrl-C).
        self.platform = platform.configure()
        numba_kernels.prepare()
        super().__init__(numerics, n_threads)
        self.n_threads = set_threads(n_threads)
        self._matrices: dict[str, kernels.QMatrix] = {}
        self._fused: dict[int, kernels.FusedMatrices] = {}  # id of a fused run's first part -> the run
        self._runs: dict[tuple[int, ...], tuple] = {}  # ids of matmul_many's weights -> its runs (_fused_runs)
        self._layer_plans: dict[int, tuple] = {}  # id of a FusedLayerPlan -> (the plan, its _LayerArguments or None)
        self.description = (
            f"Numba {numba.__version__} fused quantized kernels on {self.n_threads} threads, "
            f"NumPy {np.__version__} elsewhere, {numerics} numerics"
        )

    def versions(self) -> dict[str, str]:
        return {**super().versions(), "numba": numba.__version__}

    # --- load time ------------------------------------------------------------------------------------------
    def load_matrix(self, t: TensorInfo) -> kernels.QMatrix:
        w = self._matrices.get(t.name)
        if w is None:
            w = self._matrices[t.name] = kernels.pack_matrix(t.name, t.qtype, t.raw, t.shape, self.copy_weights)
        return w

    def load_matrices(self, tensors) -> list[kernels.QMatrix]:
        """Runs of the same type and width (Q and K, gate and up; V too where it shares their type) are copied into
        one buffer (:func:`~.numba_kernels.dispatch.pack_matrices`), so :meth:`matmul_many` quantizes the input once
        and makes one kernel call for the run: a small model's decode step makes ~200 matmul calls, and each costs
        microseconds of its own besides its weight bytes."""
        if not self.fuse_matrices or any(t.name in self._matrices for t in tensors):
            return [self.load_matrix(t) for t in tensors]
        parts = []
        for packed in kernels.pack_matrices([(t.name, t.qtype, t.raw, t.shape) for t in tensors], self.copy_weights):
            if isinstance(packed, kernels.FusedMatrices):
                self._fused[id(packed.parts[0])] = packed
                parts.extend(packed.parts)
            else:
                parts.append(packed)
        for t, w in zip(tensors, parts):
            self._matrices[t.name] = w
        return parts

    def load_embedding(self, t: TensorInfo) -> kernels.QMatrix:
        return self.load_matrix(t)

    # --- ops ------------------------------------------------------------------------------------------------
    def embed(self, table: kernels.QMatrix, ids: np.ndarray) -> np.ndarray:
        return kernels.dequantize_rows(table, np.asarray(ids, dtype=np.int64))

    def matmul(self, w: kernels.QMatrix, x: np.ndarray) -> np.ndarray:
        return kernels.matmul(w, x, self.numerics)

    def matmul_many(self, ws, x: np.ndarray, biases=None) -> list[np.ndarray]:
        """Each run of ``ws`` that :meth:`load_matrices` fused goes through one matmul over the fused rows where
        that gives every part's values bit for bit (:func:`~.numba_kernels.dispatch.fused_is_exact`); then the
        biases, one :meth:`add` each."""
        return add_biases(self, self._products(ws, x), biases)

    def _products(self, ws, x: np.ndarray) -> list[np.ndarray]:
        key = tuple(map(id, ws))
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = self._fused_runs(ws)
        if _n_rows(x) > FUSED_MAX_TOKENS:
            quantized: dict = {}  # the integer kernels' quantized x, made once for all of ws
            return [kernels.matmul(w, x, self.numerics, quantized) for w in ws]
        out: list[np.ndarray] = []
        for run in runs:
            if isinstance(run, kernels.FusedMatrices):
                out.extend(run.split(kernels.matmul(run.matrix, x, self.numerics)))
            else:
                out.append(kernels.matmul(run, x, self.numerics))
        return out

    def _fused_runs(self, ws) -> tuple:
        """``ws`` as the runs :meth:`matmul_many` multiplies: each a fused run of consecutive parts (where that is
        exact) or one weight. Worked out once per tuple of weights (the plan holds them, so their ids stay theirs):
        a decode step asks for the same few tuples ~60 times."""
        runs: list = []
        i = 0
        while i < len(ws):
            fused = self._fused.get(id(ws[i]))
            n = len(fused.parts) if fused is not None else 1
            if (fused is not None and len(ws) - i >= n and all(a is b for a, b in zip(ws[i : i + n], fused.parts))
                    and kernels.fused_is_exact(fused, self.numerics)):
                runs.append(fused)
            else:
                n = 1
                runs.append(ws[i])
            i += n
        return tuple(runs)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        x = _f32(x)
        rows = x.reshape(-1, x.shape[-1])
        out = np.empty_like(rows)
        kernel = ops.rms_norm_parallel if rows.shape[0] >= PARALLEL_ROWS else ops.rms_norm
        kernel(rows, _NO_WEIGHT if weight is None else _f32(weight), _F32(eps), out)
        return out.reshape(x.shape)

    def rope(self, x, positions, n_dims, freq_base, neox, freq_scale=1.0, freq_factors=None) -> np.ndarray:
        cos, sin = self._rope_angles(positions, n_dims, freq_base, freq_scale, freq_factors)
        x = _f32(x)
        out = np.empty_like(x)
        ops.rope(x, cos, sin, n_dims, bool(neox), out)
        return out

    def attention(self, q, k, v, q_positions, kv_len, scale, sliding_window=0, softcap=0.0) -> np.ndarray:
        flags = self._attention_flags(k.dtype, v.dtype)
        if softcap or flags is None:
            # soft-capped scores (Gemma 2) have no attention kernel here yet: the NumPy reference's attention
            # computes them (its soft-capping through this backend's softcap kernel)
            return super().attention(q, k, v, q_positions, kv_len, scale, sliding_window, softcap)
        q = _f32(q)
        k_rows = np.ascontiguousarray(k[:kv_len]).view(np.uint8).reshape(kv_len, -1)
        v_rows = np.ascontiguousarray(v[:kv_len]).view(np.uint8).reshape(kv_len, -1)
        out = np.empty((q.shape[0], q.shape[1] * v.shape[2]), np.float32)
        kernel = ops.attention_blocked if q.shape[0] >= BLOCKED_ATTENTION_TOKENS else ops.attention
        kernel(
            q,
            k_rows,
            v_rows,
            np.asarray(q_positions, dtype=np.int64),
            int(kv_len),
            _F32(scale),
            int(sliding_window),
            *flags,
            out,
        )
        return out

    def _attention_flags(self, k_dtype, v_dtype) -> tuple[bool, bool, bool] | None:
        """The attention kernels' numerics arguments for K / V stored as these types: ggml numerics, AVX-512's
        exponential (the flavour llama.cpp runs), F16 storage; None where no kernel reads that storage."""
        if k_dtype != v_dtype or k_dtype not in (np.float32, np.float16):
            return None
        return self.numerics == "ggml", nx.ggml_simd() == "avx512", k_dtype == np.float16

    def decode_attention(self, cache, il, q, k, v, positions, rope, scale, q_scale=None, sliding_window=0):
        """:func:`~.numba_kernels.ops.rope_attention`: RoPE, the query scale, the cache write and attention in one
        compiled call, for a :class:`~inference_engine.kv_cache.KVCache` of this backend's arrays."""
        if type(cache) is not KVCache or q.shape[0] != 1:
            return None
        k_buf, v_buf = cache.k[il], cache.v[il]
        flags = self._attention_flags(k_buf.dtype, v_buf.dtype)
        if flags is None or not 0 <= int(positions[0]) < k_buf.shape[0]:
            return None  # the ops one by one (and their errors)
        out = np.empty((1, q.shape[1] * v_buf.shape[2]), np.float32)
        ops.rope_attention(
            _f32(q),
            _f32(k),
            _f32(v),
            *self._decode_rope(positions, rope),
            _F32(1.0 if q_scale is None else q_scale),
            k_buf.view(np.uint8).reshape(k_buf.shape[0], -1),
            v_buf.view(np.uint8).reshape(v_buf.shape[0], -1),
            int(positions[0]),
            _F32(scale),
            int(sliding_window),
            *flags,
            out,
        )
        return out

    def decode_layer(self, plan: FusedLayerPlan, x, il, positions, cache):
        """:func:`~.numba_kernels.decode_layer.prenorm_layer`: the whole layer in one compiled call, for a
        :class:`~inference_engine.kv_cache.KVCache` of this backend's arrays, where every projection has a one-token
        integer kernel (ggml numerics on an int8 CPU) and the layer is one that kernel computes
        (:meth:`_kernel_arguments`, packed once per plan)."""
        if not self.fuse_layers or type(cache) is not KVCache or x.shape[0] != 1:
            return None
        entry = self._layer_plans.get(id(plan))
        if entry is None or entry[0] is not plan:
            entry = self._layer_plans[id(plan)] = (plan, self._kernel_arguments(plan))  # holding plan keeps its id
        args = entry[1]
        k_buf, v_buf = cache.k[il], cache.v[il]
        flags = self._attention_flags(k_buf.dtype, v_buf.dtype)
        if args is None or flags is None or not 0 <= int(positions[0]) < k_buf.shape[0]:
            return None  # the ops one by one (and their errors)
        return decode_layer.prenorm_layer(
            _f32(x), *args.attention, *self._decode_rope(positions, plan.rope),
            k_buf.view(np.uint8).reshape(k_buf.shape[0], -1), v_buf.view(np.uint8).reshape(v_buf.shape[0], -1),
            int(positions[0]), *args.scales, *flags,
            *args.ffn_in, args.geglu, nx.gelu_f16_table(), nx.SIMD_WIDTH[nx.ggml_simd()], *args.ffn_out)

    def _decode_rope(self, positions, rope: dict | None) -> tuple[np.ndarray, np.ndarray, int, bool]:
        """A decode step's RoPE as the fused kernels take it: cos, sin, ``n_dims``, NEOX pairs; ``rope`` None (a NoPE
        layer) rotates no dimension, so the kernels copy Q and K as they are."""
        if rope is None:
            return _NO_ANGLES, _NO_ANGLES, 0, False
        cos, sin = self._rope_angles(positions, rope["n_dims"], rope["freq_base"], rope.get("freq_scale", 1.0),
                                     rope.get("freq_factors"))
        return cos, sin, int(rope["n_dims"]), bool(rope["neox"])

    def _kernel_arguments(self, plan: FusedLayerPlan) -> _LayerArguments | None:
        """``plan`` as :func:`~.numba_kernels.decode_layer.prenorm_layer` takes it, or None where it does not compute
        that layer as the ops do: f32 numerics or a CPU without the integer kernels, an activation it has no kernel
        for, a weight type without a one-token kernel, Q/K/V or gate/up in more than two runs, only some of the Q/K/V
        biases or only one of the Q/K norms, shapes the model's own reshapes would refuse."""
        if self.numerics != "ggml" or kernels.matvec_family() != "int8" or plan.activation not in _ACTIVATIONS:
            return None
        (q, k, v), (gate, up) = plan.qkv, plan.ffn_gate_up
        shapes = (plan.n_head * plan.head_dim_k, plan.n_head_kv * plan.head_dim_k, plan.n_head_kv * plan.head_dim_v)
        if (q.n_out, k.n_out, v.n_out) != shapes or gate.n_out != up.n_out:
            return None  # shapes the model's own reshapes refuse: let them
        qkv, o, gate_up, down = (self._token_runs(plan.qkv), self._token_runs((plan.attn_output,)),
                                 self._token_runs(plan.ffn_gate_up), self._token_runs((plan.ffn_down,)))
        if None in (qkv, o, gate_up, down) or len({b is None for b in plan.qkv_bias}) > 1:
            return None
        if len({n is None for n in plan.qk_norm}) > 1:
            return None
        biases, (q_norm, k_norm) = plan.qkv_bias, plan.qk_norm
        qkv_bias = _NO_WEIGHT if biases[0] is None else np.concatenate([_f32(b).reshape(-1) for b in biases])
        q_norm, k_norm = (_NO_WEIGHT, _NO_WEIGHT) if q_norm is None else (_f32(q_norm), _f32(k_norm))
        o_bias = _optional_vector(plan.attn_output_bias)
        o_types, o_rows, _ = o
        down_types, down_rows, _ = down
        return _LayerArguments(
            attention=(_F32(plan.rms_eps), _f32(plan.attn_norm), *qkv, qkv_bias, q_norm, k_norm, plan.n_head,
                       plan.n_head_kv, plan.head_dim_k, plan.head_dim_v),
            scales=(_F32(plan.kq_scale), _F32(1.0 if plan.q_scale is None else plan.q_scale),
                    int(plan.sliding_window)),
            ffn_in=(int(o_types[0]), o_rows, o_bias, _optional_vector(plan.post_attention_norm),
                    _f32(plan.ffn_norm), *gate_up),
            geglu=plan.activation == "geglu",
            ffn_out=(int(down_types[0]), down_rows, _optional_vector(plan.post_ffw_norm)),
        )

    def _token_runs(self, ws) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``ws`` (weights that multiply one input) as ``prenorm_layer`` takes them: the GGML type ids of their
        runs (:meth:`matmul_many`'s fused runs; at most two) and each run's rows (a second run with no rows where
        there is one run); None where a run has no one-token kernel or there are more runs."""
        runs = [run.matrix if isinstance(run, kernels.FusedMatrices) else run for run in self._fused_runs(ws)]
        if len(runs) > 2 or any(w.qtype not in decode_layer.TOKEN_TYPES for w in runs):
            return None
        types = np.array([int(w.qtype) for w in runs] + [0] * (2 - len(runs)), np.int64)
        return types, runs[0].rows, runs[1].rows if len(runs) == 2 else runs[0].rows[:0]

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        gate, up = _f32(gate), _f32(up)
        out = np.empty_like(gate)
        rows = gate.reshape(-1, gate.shape[-1])
        kernel = ops.swiglu_parallel if rows.shape[0] >= PARALLEL_ROWS else ops.swiglu
        # ggml numerics: the SIMD flavour llama.cpp runs decides the vector width and the exp's last step
        flavour = nx.ggml_simd()
        vec_width = nx.SIMD_WIDTH[flavour] if self.numerics == "ggml" else 0
        kernel(rows, up.reshape(rows.shape), vec_width, flavour == "avx512", out.reshape(rows.shape))
        return out

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        x = _f32(x)
        out = np.empty_like(x)
        rows = x.reshape(-1, x.shape[-1])
        kernel = ops.softcap_parallel if rows.shape[0] >= PARALLEL_ROWS else ops.softcap
        kernel(rows, np.float32(1.0) / np.float32(cap), np.float32(cap), out.reshape(rows.shape))
        return out

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        if self.numerics == "f32" and np.size(gate) > GEGLU_NUMPY_ABOVE:
            return super().geglu(gate, up)  # the same numbers (tested), NumPy's vectorized tanh is faster here
        gate, up = _f32(gate), _f32(up)
        out = np.empty_like(gate)
        rows = gate.reshape(-1, gate.shape[-1])
        kernel = ops.geglu_parallel if rows.shape[0] >= PARALLEL_ROWS else ops.geglu
        kernel(rows, up.reshape(rows.shape), self.numerics == "ggml", nx.gelu_f16_table(), out.reshape(rows.shape))
        return out


class _LayerArguments(NamedTuple):
    """A layer's own arguments to ``decode_layer.prenorm_layer``, in the runs between the per-call ones."""

    attention: tuple  # before the RoPE angles and the cache
    scales: tuple  # after the cache's position: the attention's scale, the query scale, the sliding window
    ffn_in: tuple  # after the attention flags: the output projection and post-attention norm, the FFN norm, gate, up
    geglu: bool  # the activation: ggml's GEGLU, else SwiGLU
    ffn_out: tuple  # after the activation's numbers: the down projection and the post-FFN norm


def _optional_vector(weight) -> np.ndarray:
    """A norm weight as the kernels take it: float32, or empty where the layer has none."""
    return _NO_WEIGHT if weight is None else _f32(weight).reshape(-1)


# the gated activations decode_layer.prenorm_layer computes
_ACTIVATIONS = ("swiglu", "geglu")


_F32 = np.float32
# From this many rows (tokens) on, the element-wise ops split rows over threads; below, a thread launch costs
# more than it saves (a decoded token is one row).
PARALLEL_ROWS = 8
# From this many query tokens on (prefill), attention runs ops.attention_blocked (the same numbers, arranged for the
# cache); below (a decoded token), ops.attention spreads the query heads over threads, which suits one token.
BLOCKED_ATTENTION_TOKENS = 8
# f32-numerics GEGLU needs a float64 tanh per value: NumPy's vectorized tanh beats the Numba loop on big arrays
# (prefill, 512 x 2048: 11.5 ms against 23 ms) while the Numba call wins on a decoded token's few thousand values.
GEGLU_NUMPY_ABOVE = 1 << 16
_NO_WEIGHT = np.zeros(0, np.float32)
_NO_ANGLES = np.zeros((1, 0), np.float32)  # a NoPE layer's cos / sin: one position, no rotated pair
# Up to this many tokens (a decode step, the server's batched decode) matmul_many multiplies a fused run in one call:
# there the calls' own cost is what fusing saves (SmolLM2 decode, 1 thread, CPU time: 16.4 -> 15.0 ms per token).
# A prefill's calls are few and long; an A/B on Gemma 3's 512-token prefill (2 threads, best of 4, noisy) gave 353
# t/s separate and 273 fused, so prefill keeps one call per weight until that is measured on a quiet machine.
FUSED_MAX_TOKENS = 16


def _n_rows(x: np.ndarray) -> int:
    return 1 if x.ndim < 2 else math.prod(x.shape[:-1])  # not np.prod: ~5 us a call, on every fused matmul


def _f32(a) -> np.ndarray:
    """A C-contiguous float32 array (the kernels index raw memory)."""
    return np.ascontiguousarray(a, dtype=np.float32)


def set_threads(n_threads: int | None) -> int:
    """Apply ``n_threads`` to Numba (None: leave Numba's default); returns the count in effect."""
    if n_threads is not None:
        limit = numba.config.NUMBA_NUM_THREADS
        if not 1 <= n_threads <= limit:
            raise GGUFParityError(
                f"--threads {n_threads}: the numba backend can use 1 to {limit} threads on this machine "
                f"(NUMBA_NUM_THREADS={limit})"
            )
        numba.set_num_threads(n_threads)
    return numba.get_num_threads()
