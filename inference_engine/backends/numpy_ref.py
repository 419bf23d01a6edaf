"""The reference backend: readable NumPy with llama.cpp's CPU numerics. Every other backend is checked against it.

Correct and readable before fast. Each op says which llama.cpp kernel (``ggml/src/ggml-cpu/ops.cpp``, ``vec.h``)
it follows; the exact numerics helpers live in :mod:`inference_engine.backends.numerics`. Matrix products go
through :func:`inference_engine.quants.prepare_matmul`, which owns the weight formats and the ``ggml`` activation
quantization.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from inference_engine.backends import numerics as nx
from inference_engine.backends.base import Backend, check_kv_type
from inference_engine.gguf.file import TensorInfo
from inference_engine.platform.mapped_pages import tensor_out_of_map
from inference_engine.quants import dequantize_tensor, prepare_matmul, quant_for

_F32 = np.float32
_KV_DTYPES = {"f32": np.float32, "f16": np.float16}
_ROPE_CACHE_SIZE = 8  # angle tables kept (one per distinct (positions, n_dims, base, scale) in flight)


def _blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except (TypeError, KeyError, AttributeError):  # older NumPy: no dict mode
        return "BLAS"


class MappedEmbeddingRows:
    """The memory-mapped embedding tensor; rows are dequantized only when looked up (no full f32 copy)."""

    def __init__(self, t: TensorInfo):
        self.tensor = t
        self.quant = quant_for(t.qtype)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.quant.dequantize(np.asarray(self.tensor.raw)[ids]).reshape(len(ids), self.tensor.shape[-1])


class NumpyBackend(Backend):
    name = "numpy"

    def __init__(self, numerics: str = "f32", n_threads: int | None = None):
        super().__init__(numerics, n_threads)
        self.blas_threads = _limit_blas_threads(n_threads)
        self.description = (
            f"NumPy {np.__version__} reference, {_blas_name()} ({self.blas_threads}), {numerics} numerics"
        )
        self._rope_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def versions(self) -> dict[str, str]:
        return {"numpy": np.__version__, "blas": _blas_name()}

    # --- load time ------------------------------------------------------------------------------------------
    def load_matrix(self, t: TensorInfo) -> Callable[[np.ndarray], np.ndarray]:
        return prepare_matmul(t, self.numerics)

    def load_vector(self, t: TensorInfo) -> np.ndarray:
        # a copy read from the file: kept as a view of the map, its page would map its neighbours' pages too
        return np.ascontiguousarray(dequantize_tensor(tensor_out_of_map(t)), dtype=_F32).reshape(-1)

    def load_embedding(self, t: TensorInfo) -> MappedEmbeddingRows:
        return MappedEmbeddingRows(t)

    # --- ops ------------------------------------------------------------------------------------------------
    def embed(self, table: MappedEmbeddingRows, ids: np.ndarray) -> np.ndarray:
        # ggml_get_rows: dequantize_row_<type> of each requested row.
        return table.rows(np.asarray(ids, dtype=np.int64))

    def matmul(self, w: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
        return w(np.ascontiguousarray(x, dtype=_F32))

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        # ggml_compute_forward_rms_norm_f32: float products summed in double; mean and scale in float32.
        x = np.asarray(x, dtype=_F32)
        sum_sq = (x * x).sum(axis=-1, dtype=np.float64, keepdims=True)
        mean = (sum_sq / x.shape[-1]).astype(_F32)
        scale = _F32(1.0) / np.sqrt(mean + _F32(eps))
        y = x * scale
        return y * weight if weight is not None else y

    def rope(self, x, positions, n_dims, freq_base, neox, freq_scale=1.0, freq_factors=None) -> np.ndarray:
        # ggml_compute_forward_rope_flt: rotate_pairs with the cos/sin cache of ggml_rope_cache_init.
        cos, sin = self._rope_angles(positions, n_dims, freq_base, freq_scale, freq_factors)
        cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, n_dims/2) against (T, H, n_dims/2)
        x = np.asarray(x, dtype=_F32)
        out = x.copy()
        if neox:  # GGML_ROPE_TYPE_NEOX: pairs (i, i + n_dims/2)
            first, second = slice(0, n_dims // 2), slice(n_dims // 2, n_dims)
        else:  # GGML_ROPE_TYPE_NORMAL: adjacent pairs (2i, 2i+1)
            first, second = slice(0, n_dims, 2), slice(1, n_dims, 2)
        x0, x1 = x[..., first], x[..., second]
        # rotate_pairs: x0*cos - x1*sin and x0*sin + x1*cos, each contracted to one FMA by the compiler.
        out[..., first] = nx.fma_f32(x0, cos, -(x1 * sin))
        out[..., second] = nx.fma_f32(x0, sin, x1 * cos)
        return out

    def attention(self, q, k, v, q_positions, kv_len, scale, sliding_window=0, softcap=0.0) -> np.ndarray:
        n_tokens, n_head, d_k = q.shape
        k, v = k[:kv_len], v[:kv_len]
        n_head_kv, d_v = k.shape[1], v.shape[2]
        group = n_head // n_head_kv
        ggml = self.numerics == "ggml"
        q = np.asarray(q, dtype=_F32)
        if ggml and k.dtype == np.float16:
            q = q.astype(np.float16).astype(_F32)  # ggml mul_mat(K f16, Q f32) converts Q to F16 first
        # Query head h reads KV head h // group (ggml's mul_mat broadcast): group the query heads per KV head.
        qg = q.reshape(n_tokens, n_head_kv, group, d_k).transpose(1, 2, 0, 3)  # (Hkv, G, T, d_k)
        kt = k.astype(_F32).transpose(1, 2, 0)[:, None]  # (Hkv, 1, d_k, S)
        vt = v.astype(_F32).transpose(1, 0, 2)[:, None]  # (Hkv, 1, S, d_v)
        scores = (qg @ kt) * _F32(scale)  # (Hkv, G, T, S)
        if softcap:
            scores = self.softcap(scores, softcap)
        visible = nx.visible_keys(q_positions, kv_len, sliding_window)  # (T, S)
        probs = self._softmax(np.where(visible, scores, _F32(-np.inf)), ggml)
        if ggml and v.dtype == np.float16:
            probs = probs.astype(np.float16).astype(_F32)  # ggml mul_mat(V f16, KQ f32) converts KQ to F16
        out = probs @ vt  # (Hkv, G, T, d_v)
        return np.ascontiguousarray(out.transpose(2, 0, 1, 3)).reshape(n_tokens, n_head * d_v)

    @staticmethod
    def _softmax(scores: np.ndarray, ggml: bool) -> np.ndarray:
        # ggml_compute_forward_soft_max_f32: subtract the row max, exp in float32, sum in double, scale by 1/sum.
        shifted = scores - scores.max(axis=-1, keepdims=True)
        with np.errstate(invalid="ignore", over="ignore"):
            if ggml:
                e = nx.expf_ggml(shifted)  # ggml_vec_soft_max_f32 uses ggml_v_expf
            else:
                e = np.exp(shifted.astype(np.float64)).astype(_F32)
        e = np.where(np.isneginf(shifted), _F32(0.0), e)
        total = e.sum(axis=-1, dtype=np.float64, keepdims=True)
        return e * (1.0 / total).astype(_F32)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        silu = nx.silu_ggml if self.numerics == "ggml" else nx.silu_f32
        return silu(gate) * np.asarray(up, dtype=_F32)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        gelu = nx.gelu_ggml if self.numerics == "ggml" else nx.gelu_tanh
        return gelu(gate) * np.asarray(up, dtype=_F32)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=_F32)

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return np.asarray(x, dtype=_F32) * _F32(s)

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=_F32)

    def from_numpy(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a)

    # --- KV cache -------------------------------------------------------------------------------------------
    def kv_alloc(self, n_ctx: int, n_heads: int, head_dim: int, kv_type: str) -> np.ndarray:
        return np.zeros((n_ctx, n_heads, head_dim), dtype=_KV_DTYPES[check_kv_type(kv_type)])

    def kv_store(self, buf: np.ndarray, start: int, x: np.ndarray) -> np.ndarray:
        buf[start : start + x.shape[0]] = x  # astype float16 rounds to nearest even, as ggml's fp32->fp16
        return buf

    def kv_view(self, buf: np.ndarray, length: int) -> np.ndarray:
        return buf[:length]

    # --- helpers --------------------------------------------------------------------------------------------
    def _rope_angles(self, positions, n_dims, freq_base, freq_scale, freq_factors):
        positions = np.asarray(positions, dtype=np.int64)
        factors_key = None if freq_factors is None else np.asarray(freq_factors, dtype=_F32).tobytes()
        key = (positions.tobytes(), n_dims, float(freq_base), float(freq_scale), factors_key)
        angles = self._rope_cache.get(key)
        if angles is None:
            if len(self._rope_cache) >= _ROPE_CACHE_SIZE:
                self._rope_cache.clear()
            angles = nx.rope_cos_sin(positions, n_dims, freq_base, freq_scale, freq_factors)
            self._rope_cache[key] = angles
        return angles


def _limit_blas_threads(n_threads: int | None) -> str:
    """Limit BLAS to ``n_threads`` for the whole process (threadpoolctl, when installed); say what happened.

    BLAS reads its thread count once at start-up (OPENBLAS_NUM_THREADS); changing it later needs threadpoolctl.
    Without it the count stays as the environment set it, and results record that.
    """
    if n_threads is None:
        return "BLAS default"
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return "BLAS default (threadpoolctl not installed, --threads not applied to NumPy)"
    threadpool_limits(limits=n_threads, user_api="blas")
    return f"BLAS limited to {n_threads}"
