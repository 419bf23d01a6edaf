"""The op set every backend implements: the whole forward pass of every architecture is written with these.

A backend is an object with load-time methods (turn a GGUF tensor into whatever the backend computes with) and a
dozen ops. The model files (``inference_engine/models/*.py``) call only these ops, so one forward pass runs on
NumPy, Numba or MLX unchanged. The contract is kept small and array-type agnostic on purpose:

* Activations are whatever array type the backend uses (``np.ndarray``, ``mx.array``). Models only use, besides
  the ops below, what NumPy and MLX arrays share: ``.shape``, ``.reshape(...)`` and basic slicing (``x[-1:]``).
* Shapes follow NumPy order with the token axis first: activations ``(T, n_embd)``, per-head tensors
  ``(T, n_heads, head_dim)``. Weight matrices have GGUF's ``(n_out, n_in)`` and ``matmul(w, x) = x @ w.T``.
* Values are float32 everywhere, except what a backend keeps inside its prepared weights and its KV cache.
* ``numerics`` says which rounding policy the ops follow:

  - ``"f32"``: dequantize weights and multiply in float32; element-wise functions by their float formula.
  - ``"ggml"``: what llama.cpp's CPU backend computes: the activation row is quantized to the weight type's
    ``vec_dot_type`` before each dot product, GELU goes through ggml's F16 table, SiLU through ggml's vector
    ``expf``, and with an F16 KV cache the attention operands are rounded to F16 as ggml's F16 ``mul_mat`` does.

  Both modes share llama.cpp's RMSNorm (sum of squares in double), RoPE angle construction and softmax, see
  :mod:`inference_engine.backends.numerics`, which backends may use to get those numbers exactly.

KV cache: the cache owns per-layer buffers made by :meth:`Backend.kv_alloc` (preallocated for ``n_ctx`` positions,
F32 or F16 storage), written with :meth:`Backend.kv_store` and read back with :meth:`Backend.kv_view`. Slot ``j``
holds position ``j`` (one sequence). ``kv_store`` returns the buffer so that backends with immutable arrays (MLX)
can hand back a new one; mutable backends return the same object.

Subclasses set ``name`` (registry key), ``description`` (one line recorded in every result, e.g. the BLAS or
library version it uses) and implement every abstract method. ``versions()`` adds library versions to results.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from inference_engine.backends import numerics as nx
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import TensorInfo
from inference_engine.registries import check_numerics

KV_TYPES: tuple[str, ...] = ("f32", "f16")
DEVICES: tuple[str, ...] = ("gpu", "cpu")  # what --device accepts; each backend says which it can use here

Array = Any  # the backend's array type (np.ndarray, mx.array, ...)


def check_kv_type(kv_type: str) -> str:
    if kv_type not in KV_TYPES:
        raise GGUFParityError(f"unknown KV cache type '{kv_type}'; supported: {', '.join(KV_TYPES)}")
    return kv_type


class FusedLayerPlan(NamedTuple):
    """A pre-norm decoder layer as its model hands it to :meth:`Backend.decode_layer`: the layer's weights as this
    backend prepared them and every number its ops take, built once per model
    (:meth:`~inference_engine.models.decoder.DecoderModel.fused_plan`), so that a backend never reads a model's
    attributes. The ops, in order: RMSNorm by ``attn_norm``; Q, K, V (``qkv``) plus their biases; per-head RMSNorm
    of Q and K (``qk_norm``); RoPE (``rope``: :meth:`Backend.rope`'s keyword arguments; None: none), Q times
    ``q_scale``, attention with ``kq_scale`` within ``sliding_window`` (0: all) over the cache; the output
    projection plus its bias; RMSNorm by ``post_attention_norm``; the residual add; RMSNorm by ``ffn_norm``; gate
    and up (``ffn_gate_up``), ``activation`` (``swiglu`` | ``geglu``), the down projection; RMSNorm by
    ``post_ffw_norm``; the residual add. A ``None`` weight is one the layer does not have."""

    attn_norm: Array
    qkv: tuple[Any, Any, Any]  # Q, K, V projections, in the order they multiply the normed input
    qkv_bias: tuple[Array | None, Array | None, Array | None]
    qk_norm: tuple[Array | None, Array | None]  # per-head RMSNorm weights of Q and K (qwen3, gemma3)
    attn_output: Any
    attn_output_bias: Array | None
    post_attention_norm: Array | None  # gemma3's sandwich norms
    ffn_norm: Array
    ffn_gate_up: tuple[Any, Any]
    ffn_down: Any
    post_ffw_norm: Array | None
    activation: str
    rope: dict | None
    kq_scale: float
    q_scale: float | None
    sliding_window: int
    rms_eps: float
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int


def add_biases(b: Backend, products: list[Array], biases: Sequence[Array | None] | None) -> list[Array]:
    """Each product plus its bias where ``biases`` has one."""
    if biases is None:
        return products
    return [y if bias is None else b.add(y, bias) for y, bias in zip(products, biases, strict=True)]


def cpu_only_reason(name: str) -> str:
    return f"backend '{name}' computes on the CPU only (a GPU: --backend mlx, where MLX has one)"


def choose_device(device: str | None, available: tuple[str, ...], no_gpu_reason) -> str:
    """``device`` if it is one of ``available`` (None: the first), else one line naming what is available;
    ``no_gpu_reason()`` says why there is no GPU."""
    if device is None:
        return available[0]
    if device not in DEVICES:
        raise GGUFParityError(f"unknown device '{device}'; supported: {', '.join(DEVICES)}")
    if device not in available:
        raise GGUFParityError(f"--device {device}: {no_gpu_reason()}; available: {', '.join(available)}")
    return device


class Backend(ABC):
    """One implementation of the op set. Instances are cheap; weights live in what ``load_*`` return."""

    name: str = ""
    description: str = ""

    def __init__(self, numerics: str = "f32", n_threads: int | None = None, device: str | None = None):
        self.numerics = check_numerics(numerics)
        self.n_threads = n_threads
        self.device = self.check_device(device)  # "cpu" | "gpu": where this backend computes

    # --- device ---------------------------------------------------------------------------------------------
    @staticmethod
    def devices() -> tuple[str, ...]:
        """The devices (of :data:`DEVICES`) this backend can compute on in this process, its default first."""
        return ("cpu",)

    @classmethod
    def no_gpu_reason(cls) -> str:
        """Why ``--device gpu`` cannot run on this backend here (the refusal's words)."""
        return cpu_only_reason(cls.name)

    @classmethod
    def check_device(cls, device: str | None) -> str:
        """``device``, or this backend's default for None, if it can compute there; else one line naming what is
        available (:class:`GGUFParityError`, exit 2)."""
        return choose_device(device, cls.devices(), cls.no_gpu_reason)

    def device_info(self) -> dict[str, Any]:
        """Where this backend computes, for results (the MLX backend adds the GPU's name and memory)."""
        return {"device": self.device}

    def versions(self) -> dict[str, str]:
        """Library versions this backend computes with (recorded in results)."""
        return {"numpy": np.__version__}

    # --- load time ------------------------------------------------------------------------------------------
    @abstractmethod
    def load_matrix(self, t: TensorInfo) -> Any:
        """A weight matrix ``(n_out, n_in)`` prepared for :meth:`matmul` under this backend's numerics."""

    def load_matrices(self, tensors: Sequence[TensorInfo]) -> list[Any]:
        """Weights that always multiply the same input (a layer's Q/K/V, its FFN gate and up), prepared together, in
        order: a backend may lay them out as one matrix so that :meth:`matmul_many` makes one pass over them.
        Default: each prepared alone."""
        return [self.load_matrix(t) for t in tensors]

    @abstractmethod
    def load_vector(self, t: TensorInfo) -> Array:
        """A 1-D float32 tensor (norm weights, biases)."""

    @abstractmethod
    def load_embedding(self, t: TensorInfo) -> Any:
        """The token embedding table ``(n_vocab, n_embd)``, in whatever form :meth:`embed` reads rows from."""

    # --- ops ------------------------------------------------------------------------------------------------
    @abstractmethod
    def embed(self, table: Any, ids: np.ndarray) -> Array:
        """Rows ``ids`` (int array ``(T,)``) of the embedding table, dequantized: ``(T, n_embd)`` float32."""

    @abstractmethod
    def matmul(self, w: Any, x: Array) -> Array:
        """``x @ W.T``: ``x (T, n_in)`` -> ``(T, n_out)``, with this backend's numerics."""

    def matmul_many(self, ws: Sequence[Any], x: Array, biases: Sequence[Array | None] | None = None) -> list[Array]:
        """``[matmul(w, x) for w in ws]`` for weights loaded together by :meth:`load_matrices`, each plus its bias
        where ``biases`` has one (:meth:`add`, as llama.cpp's ``build_qkv``): the same values, possibly in one pass
        (the default makes one per weight)."""
        return add_biases(self, [self.matmul(w, x) for w in ws], biases)

    @abstractmethod
    def rms_norm(self, x: Array, weight: Array | None, eps: float) -> Array:
        """RMSNorm over the last axis, then times ``weight`` (broadcast over leading axes) if given.

        llama.cpp: ``sum += (double)(x*x)``; ``mean = (float)(sum/n)``; ``y = x * (1.0f/sqrtf(mean + eps))``;
        then ``y * w`` (float32).
        """

    # Whether add_rms_norm is one op here (not the default's two): then a decoder chains its layers' norms, each
    # layer's last residual add computed with the next layer's attn_norm (DecoderModel.forward); the MLX backend's
    # norm kernel. False: each layer norms its own input, as llama.cpp's graph reads.
    fuses_add_rms_norm: bool = False

    def add_rms_norm(self, a: Array, b: Array, weight: Array | None, eps: float) -> tuple[Array, Array]:
        """``(a + b, rms_norm(a + b, weight, eps))``: a residual add and the norm after it, which a backend may
        compute as one op (the MLX backend's GPU kernel, ``norm_kernel``); the default is :meth:`add` then
        :meth:`rms_norm`, the same values. Asked for where nothing taps the sum between them (a pre-norm layer's
        ``ffn_inp`` and ``ffn_norm``)."""
        total = self.add(a, b)
        return total, self.rms_norm(total, weight, eps)

    @abstractmethod
    def rope(
        self,
        x: Array,
        positions: np.ndarray,
        n_dims: int,
        freq_base: float,
        neox: bool,
        freq_scale: float = 1.0,
        freq_factors: np.ndarray | None = None,
    ) -> Array:
        """Rotary embedding of ``x (T, n_heads, head_dim)``; the first ``n_dims`` of each head rotate.

        ``neox=False`` (llama's GGML_ROPE_TYPE_NORM) rotates adjacent pairs ``(2i, 2i+1)``; ``neox=True``
        rotates ``(i, i + n_dims/2)``. ``positions`` is an int NumPy array ``(T,)``; ``freq_scale`` is linear
        RoPE scaling (1 / rope.scaling.factor) and ``freq_factors`` (float32 ``(n_dims/2,)``, Llama 3's
        ``rope_freqs``) divide each pair's angle. Angles as
        :func:`~inference_engine.backends.numerics.rope_cos_sin`.
        """

    @abstractmethod
    def attention(
        self,
        q: Array,
        k: Array,
        v: Array,
        q_positions: np.ndarray,
        kv_len: int,
        scale: float,
        sliding_window: int = 0,
        softcap: float = 0.0,
    ) -> Array:
        """Causal (optionally sliding-window) multi-head attention with grouped KV heads.

        ``q (T, n_head, d_k)``; ``k (S, n_head_kv, d_k)`` and ``v (S, n_head_kv, d_v)`` are cache views whose
        first ``kv_len`` slots are valid (slot j = position j). Query head h reads KV head
        ``h // (n_head // n_head_kv)``. Scores ``scale * q.k`` are masked as
        :func:`~inference_engine.backends.numerics.visible_keys` (key j visible to a query at position p iff
        ``j <= p`` and, when ``sliding_window > 0``, ``p - j < sliding_window``), softmaxed in float32 with the row
        max subtracted (sum in double) and applied to v. Returns ``(T, n_head * d_v)`` (llama.cpp's ``kqv_out``).
        ``softcap > 0`` (Gemma 2): the scores become ``softcap * tanh(scores * (1/softcap))`` in float32 before the
        mask and softmax, as llama.cpp's ``build_attn_mha`` (scale, tanh, scale).
        """

    def decode_attention(
        self,
        cache: Any,
        il: int,
        q: Array,
        k: Array,
        v: Array,
        positions: np.ndarray,
        rope: dict | None,
        scale: float,
        q_scale: float | None = None,
        sliding_window: int = 0,
    ) -> Array | None:
        """A decoded token's attention as one op, where the backend has one: :meth:`rope` on ``q`` and ``k``
        (``rope``: its keyword arguments; None: no RoPE, a NoPE layer), ``q`` times ``q_scale`` (:meth:`scale`),
        ``k, v`` written into layer ``il`` of ``cache`` at ``positions[0]`` and :meth:`attention` over the cache:
        ``(1, n_head * d_v)``, the same values as those ops one by one. The model's attention block asks this for a
        single token that nothing taps; ``None`` (the default, and whenever a backend cannot fuse these inputs)
        makes it run the ops one by one. For a small model's decode step the per-call costs of those five ops are a
        measurable part of the token."""
        return None

    def decode_layer(self, plan: FusedLayerPlan, x: Array, il: int, positions: np.ndarray, cache: Any) -> Array | None:
        """A decoded token through a whole pre-norm decoder layer as one op, where the backend has one: ``plan`` the
        layer as its model describes it (:class:`FusedLayerPlan`), ``x (1, n_embd)`` the residual stream before it,
        ``il`` its index in ``cache``; returns the stream after it, the same values as the model's ops one by one
        (those :class:`FusedLayerPlan` lists, attention through :meth:`decode_attention`). A decoder model asks this
        for a single token that nothing taps, for each layer it has a plan for (dense pre-norm layers: llama, qwen2,
        qwen3, gemma3); ``None`` (the default, and whenever a backend cannot fuse this layer) makes it run the ops.
        For a small model's decode step the calls between those ops cost more than the arithmetic in them."""
        return None

    @abstractmethod
    def swiglu(self, gate: Array, up: Array) -> Array:
        """``silu(gate) * up`` (llama.cpp ``ggml_swiglu_split``)."""

    @abstractmethod
    def geglu(self, gate: Array, up: Array) -> Array:
        """``gelu_tanh(gate) * up`` (llama.cpp ``ggml_geglu_split``)."""

    @abstractmethod
    def add(self, a: Array, b: Array) -> Array:
        """Element-wise ``a + b`` (``b`` may broadcast, e.g. a bias ``(n,)`` onto ``(T, n)``)."""

    @abstractmethod
    def scale(self, x: Array, s: float) -> Array:
        """``x * s`` in float32 (``ggml_scale``)."""

    @abstractmethod
    def to_numpy(self, x: Array) -> np.ndarray:
        """A float32 NumPy copy (or view) of ``x``; forces any pending computation."""

    @abstractmethod
    def from_numpy(self, a: np.ndarray) -> Array:
        """A backend array holding ``a``."""

    def softcap(self, x: Array, cap: float) -> Array:
        """``cap * tanh(x * (1/cap))`` in float32, llama.cpp's logit soft-capping (``ggml_scale``, ``ggml_tanh``,
        ``ggml_scale``). Default: on the host with the C library's ``tanhf``, as ggml's tanh
        (:func:`~inference_engine.backends.numerics.softcap_f32`; once per forward pass, on the logits)."""
        return self.from_numpy(nx.softcap_f32(self.to_numpy(x), cap))

    def synchronize(self, x: Array) -> Array:
        """Wait until ``x`` is computed (lazy backends evaluate here); returns ``x``. For honest timings."""
        return x

    def async_steps(self, model: Any, cache: Any) -> Any | None:
        """Generation steps of ``model`` over ``cache`` that are launched without waiting for the device, where the
        backend computes asynchronously (MLX: :class:`~inference_engine.backends.mlx.steps.MLXSteps`):
        ``prefill(ids)`` and ``decode(token)`` return a pending step (``token()``: its greedy pick, ``logits()``, ``wait()``),
        ``decode`` also takes a pending step, whose pick it decodes on the device without reading it, and
        ``rewind(n_past)`` forgets a step launched for nothing. None (the default: the CPU backends compute as they
        are called) makes the engine run each step to completion."""
        return None

    # --- KV cache -------------------------------------------------------------------------------------------
    @abstractmethod
    def kv_alloc(self, n_ctx: int, n_heads: int, head_dim: int, kv_type: str) -> Any:
        """A buffer for ``n_ctx`` positions of ``(n_heads, head_dim)`` in ``kv_type`` (``"f32"`` / ``"f16"``)."""

    @abstractmethod
    def kv_store(self, buf: Any, start: int, x: Array) -> Any:
        """Write ``x (T, n_heads, head_dim)`` into slots ``start .. start+T-1`` (rounded to the storage type as
        ggml's ``cpy`` does: F16 by round-to-nearest-even). Returns the buffer (a new one on immutable backends)."""

    @abstractmethod
    def kv_view(self, buf: Any, length: int) -> Array:
        """The first ``length`` slots, ``(length, n_heads, head_dim)``, in the storage type (attention reads them)."""


def describe_ops() -> Sequence[str]:
    """Names of the ops a backend implements (documentation and tests)."""
    return sorted(name for name in Backend.__abstractmethods__)
