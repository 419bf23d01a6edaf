"""What every architecture shares: the common hyperparameters, weight loading by GGUF name, the KV-cache
attention step, and the :class:`Model` interface the engine calls.

Hyperparameters are read the way ``llama_model::load_hparams`` (src/llama-model.cpp) reads them, defaults
included, so that our numbers are llama.cpp's numbers. Architecture-specific keys live in each model's file.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from inference_engine.backends.base import Array, Backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile, TensorInfo
from inference_engine.kv_cache import KVCache

# ``x = tap(name, x)``: every named intermediate passes through the tap, and what the tap returns is what flows on.
# Capturing records ``x`` and returns it; teacher forcing (``OurEngine.capture(..., force=...)``) records ``x`` and
# returns the reference engine's tensor of that name instead, so everything downstream is computed from the
# reference's values.
Tap = Callable[[str, Array], Array]


def no_tap(name: str, x: Array) -> Array:
    """The tap when nothing is captured: one call that hands ``x`` straight back."""
    return x


def _int(f: GGUFFile, key: str, default: int | None = None) -> int:
    value = f.arch_value(key, default) if default is not None else f.require_arch_value(key)
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise GGUFParityError(f"{f.path}: per-layer values of {f.raw_architecture}.{key} are not supported")
        value = value[0]
    return int(value)


def _float32(value: float) -> float:
    """A GGUF float as llama.cpp holds it (a C float), returned as a Python float of that exact value."""
    return float(np.float32(value))


@dataclass(frozen=True)
class HParams:
    """Hyperparameters every architecture has (llama.cpp's ``llama_hparams`` names in comments)."""

    n_vocab: int  # rows of token_embd
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int  # n_embd_head_k: attention.key_length, else n_embd / n_head
    head_dim_v: int  # n_embd_head_v: attention.value_length, else n_embd / n_head
    n_ff: int
    n_rot: int  # rope.dimension_count, else head_dim_k
    rms_eps: float  # f_norm_rms_eps (a C float)
    rope_freq_base: float  # rope.freq_base, default 10000
    rope_freq_scale: float  # 1 / rope.scaling.factor (linear scaling), default 1
    n_ctx_train: int

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> HParams:
        """The hyperparameters of ``f``: the common ones (an architecture with keys of its own overrides this)."""
        return cls(**cls.common(f))

    @staticmethod
    def common(f: GGUFFile) -> dict[str, Any]:
        """The common fields from a GGUF file, as keyword arguments for an architecture's dataclass."""
        n_embd = _int(f, "embedding_length")
        n_head = _int(f, "attention.head_count")
        head_dim_k = _int(f, "attention.key_length", n_embd // n_head)
        scaling_type = str(f.arch_value("rope.scaling.type", "linear") or "linear")
        if scaling_type not in ("linear", "none"):
            raise GGUFParityError(f"{f.path}: rope scaling '{scaling_type}' is not supported; supported: linear")
        factor = float(f.arch_value("rope.scaling.factor", 0.0) or f.arch_value("rope.scale_linear", 0.0) or 0.0)
        return {
            "n_vocab": int(f.tensor("token_embd.weight").shape[0]),
            "n_embd": n_embd,
            "n_layer": _int(f, "block_count"),
            "n_head": n_head,
            "n_head_kv": _int(f, "attention.head_count_kv", n_head),
            "head_dim_k": head_dim_k,
            "head_dim_v": _int(f, "attention.value_length", n_embd // n_head),
            "n_ff": _int(f, "feed_forward_length"),
            "n_rot": _int(f, "rope.dimension_count", head_dim_k),
            "rms_eps": _float32(f.require_arch_value("attention.layer_norm_rms_epsilon")),
            "rope_freq_base": _float32(f.arch_value("rope.freq_base", 10000.0)),
            # llama_context: "never scale if scaling type is none"
            "rope_freq_scale": _float32(1.0 / factor) if factor and scaling_type == "linear" else 1.0,
            "n_ctx_train": _int(f, "context_length", 0),
        }


def sliding_window_layers(f: GGUFFile, n_layer: int, default_pattern: int) -> tuple[bool, ...]:
    """Per layer, whether it uses sliding-window attention: llama.cpp's ``load_swa_pattern``. A period ``n``
    (``attention.sliding_window_pattern``, else ``default_pattern``) makes layer ``il`` local iff ``il % n < n - 1``
    (``n == 0``: every layer); an array gives each layer's flag, and the layers past a shorter array use full
    attention (llama.cpp's table starts as zeros; ``gguf_validate`` has refused a longer one)."""
    pattern = f.arch_value("attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, (list, tuple)):
        flags = [bool(v) for v in pattern[:n_layer]]
        return tuple(flags + [False] * (n_layer - len(flags)))
    n = int(pattern)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


def default_attention_scale(head_dim: int) -> float:
    """``1.0f/sqrtf(float(n_embd_head))`` as llama.cpp computes it (in float32)."""
    return float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))


class Weights:
    """Loads GGUF tensors by their file names through a backend (``blk.3.attn_q.weight`` -> a prepared matrix)."""

    def __init__(self, f: GGUFFile, backend: Backend):
        self.f = f
        self.backend = backend

    @staticmethod
    def name(base: str, il: int | None = None, suffix: str = "weight") -> str:
        return f"blk.{il}.{base}.{suffix}" if il is not None else f"{base}.{suffix}"

    def has(self, base: str, il: int | None = None, suffix: str = "weight") -> bool:
        return self.name(base, il, suffix) in self.f.tensors

    def matrix(self, base: str, il: int | None = None) -> Any:
        return self.backend.load_matrix(self.f.tensor(self.name(base, il)))

    def matrices(self, bases: tuple[str, ...], il: int) -> list[Any]:
        """Layer ``il``'s weights that multiply the same input (``("attn_q", "attn_k", "attn_v")``), loaded together
        (:meth:`~inference_engine.backends.base.Backend.load_matrices`), in the order given."""
        return self.backend.load_matrices([self.f.tensor(self.name(base, il)) for base in bases])

    def experts(self, base: str, il: int) -> list[Any]:
        """A stacked expert tensor (GGUF ``ne = [n_in, n_out, n_expert]``, NumPy ``(n_expert, n_out, n_in)``) as one
        prepared matrix per expert, each loaded from a 2-D view of that expert's rows of the memory map (nothing is
        copied here; the backend prepares each expert as it prepares any matrix)."""
        t = self.f.tensor(self.name(base, il))
        if len(t.shape) != 3:
            raise GGUFParityError(f"{self.f.path}: tensor '{t.name}' has shape {list(t.shape)}; expert weights "
                                  f"must be 3-D (n_expert, n_out, n_in)")
        n_expert, n_out, n_in = t.shape
        rows = np.asarray(t.raw).reshape(n_expert, n_out, -1)  # a view: (n_expert, n_out, values or bytes per row)
        return [
            self.backend.load_matrix(TensorInfo(f"{t.name}[{e}]", t.qtype, (n_out, n_in), t.n_bytes // n_expert,
                                                rows[e]))
            for e in range(n_expert)
        ]

    def row_matrix(self, base: str, il: int) -> Any:
        """A 1-D weight used as a one-row projection (qwen2moe's ``ffn_gate_inp_shexp``: ``w . x`` per token, a
        ``ggml_mul_mat`` with a vector), prepared as the matrix ``(1, n)``."""
        t = self.f.tensor(self.name(base, il))
        if len(t.shape) != 1:
            raise GGUFParityError(f"{self.f.path}: tensor '{t.name}' has shape {list(t.shape)}; expected 1-D")
        row = np.asarray(t.raw).reshape(1, -1)
        return self.backend.load_matrix(TensorInfo(t.name, t.qtype, (1, t.shape[0]), t.n_bytes, row))

    def vector(self, base: str, il: int | None = None, suffix: str = "weight") -> Array:
        return self.backend.load_vector(self.f.tensor(self.name(base, il, suffix)))

    def optional_vector(self, base: str, il: int | None = None, suffix: str = "weight") -> Array | None:
        return self.vector(base, il, suffix) if self.has(base, il, suffix) else None

    def embedding(self) -> Any:
        return self.backend.load_embedding(self.f.tensor("token_embd.weight"))

    def output(self) -> Any:
        """The LM head: ``output.weight``, or the tied ``token_embd.weight`` when the file has none."""
        return self.matrix("output" if self.has("output") else "token_embd")

    def host_vector(self, base: str) -> np.ndarray | None:
        """A small float32 tensor kept as NumPy on the host (e.g. ``rope_freqs``), or None when absent."""
        if not self.has(base):
            return None
        from inference_engine.platform.mapped_pages import tensor_out_of_map
        from inference_engine.quants import dequantize_tensor

        values = dequantize_tensor(tensor_out_of_map(self.f.tensor(self.name(base))))  # not a view of the map
        return np.asarray(values, dtype=np.float32).reshape(-1)


class Model(ABC):
    """One architecture's forward pass over a backend.

    ``forward(ids, positions, cache, tap, all_logits)`` appends the tokens' K/V to ``cache`` at ``positions`` and
    returns logits ``(rows, n_vocab)`` as a backend array: every row when ``all_logits`` (capture), else only the
    last row (llama.cpp's ``inp_out_ids``: the last layer keeps only output rows before its residual add, and only
    those go through the LM head).

    Every tensor llama.cpp names is passed through ``tap`` at the point where llama.cpp's graph names it, written
    ``x = tap(name, x)``: the returned value is the one that flows on (after RoPE for ``Qcur``/``Kcur``, before the
    KV cache stores ``Kcur``/``Vcur``; the residual stream itself for ``ffn_inp``/``sa_out``/``l_out``), so a tap
    that substitutes a value substitutes it for everything downstream.
    """

    hparams_class: ClassVar[type]

    def __init__(self, f: GGUFFile, backend: Backend):
        self.hp = self.hparams_class.from_gguf(f)
        if self.hp.n_head_kv < 1 or self.hp.n_head % self.hp.n_head_kv:
            raise GGUFParityError(
                f"{f.path}: {self.hp.n_head} attention heads cannot share {self.hp.n_head_kv} KV heads evenly"
            )
        self.backend = backend
        self.load(Weights(f, backend))

    @abstractmethod
    def load(self, w: Weights) -> None:
        """Load every weight through ``w`` (names as in the GGUF)."""

    @abstractmethod
    def forward(
        self, ids: np.ndarray, positions: np.ndarray, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False
    ) -> Array: ...

    def kv_layout(self) -> list[tuple[int, int, int]]:
        """Per layer ``(n_head_kv, head_dim_k, head_dim_v)``: what the KV cache allocates."""
        hp = self.hp
        return [(hp.n_head_kv, hp.head_dim_k, hp.head_dim_v)] * hp.n_layer

    @property
    def n_vocab(self) -> int:
        return self.hp.n_vocab


@dataclass
class QKVWeights:
    """The Q/K/V projections of one layer (``build_qkv``): separate matrices, each with an optional bias."""

    attn_q: Any
    attn_k: Any
    attn_v: Any
    attn_q_bias: Array | None
    attn_k_bias: Array | None
    attn_v_bias: Array | None

    @classmethod
    def load(cls, w: Weights, il: int) -> QKVWeights:
        if w.has("attn_qkv", il):
            raise GGUFParityError(f"{w.f.path}: fused attn_qkv weights are not supported; supported: attn_q/k/v")
        attn_q, attn_k, attn_v = w.matrices(("attn_q", "attn_k", "attn_v"), il)
        return cls(
            attn_q=attn_q,
            attn_k=attn_k,
            attn_v=attn_v,
            attn_q_bias=w.optional_vector("attn_q", il, "bias"),
            attn_k_bias=w.optional_vector("attn_k", il, "bias"),
            attn_v_bias=w.optional_vector("attn_v", il, "bias"),
        )


def project_qkv(b: Backend, a: QKVWeights, h: Array, hp: HParams) -> tuple[Array, Array, Array]:
    """``h (T, n_embd)`` -> ``q (T, n_head, d_k)``, ``k (T, n_head_kv, d_k)``, ``v (T, n_head_kv, d_v)``:
    matmul, then the bias when the file has one, then the per-head reshape (llama.cpp ``build_qkv``)."""
    T = h.shape[0]
    q, k, v = b.matmul_many((a.attn_q, a.attn_k, a.attn_v), h, (a.attn_q_bias, a.attn_k_bias, a.attn_v_bias))
    return (
        q.reshape(T, hp.n_head, hp.head_dim_k),
        k.reshape(T, hp.n_head_kv, hp.head_dim_k),
        v.reshape(T, hp.n_head_kv, hp.head_dim_v),
    )


def self_attention(
    b: Backend,
    cache: KVCache,
    il: int,
    q: Array,
    k: Array,
    v: Array,
    positions: np.ndarray,
    scale: float,
    sliding_window: int = 0,
    softcap: float = 0.0,
) -> Array:
    """Store this step's ``k, v`` (T, n_head_kv, d) in layer ``il`` of the cache, attend over everything cached
    so far: ``(T, n_head * d_v)``. As ``build_attn`` with a KV cache: the new K/V are written first, then read.
    ``softcap``: Gemma 2's attention-score soft-capping (0: none). A cache with its own ``attend``
    (``paged_kv_cache.PagedBatch``: rows of several sequences) does this itself."""
    if hasattr(cache, "attend"):
        return cache.attend(b, il, q, k, v, positions, scale, sliding_window, softcap)
    start = int(positions[0])
    k_all, v_all = cache.update(il, start, k, v)
    if softcap:
        return b.attention(q, k_all, v_all, positions, start + q.shape[0], scale, sliding_window, softcap)
    return b.attention(q, k_all, v_all, positions, start + q.shape[0], scale, sliding_window)
