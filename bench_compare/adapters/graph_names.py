"""The llama.cpp graph tensors an outside engine can hand us, by name and shape, for one model and one prompt.

A dump request lists these so an engine author knows exactly what to write, and the dump reader checks shapes and
name-map targets against them. The names are those llama.cpp 0.3.36's graph callbacks give (``src/models/llama.cpp``,
``qwen2.cpp``, ``qwen3.cpp``, ``gemma3.cpp``, ``qwen2moe.cpp``...; the same names our engine taps, ``inference_engine/models/*.py``), in
the order llama.cpp produces them. Internal nodes (``norm-N``, ``kq-N``, cache views) are left out: an engine need not
reproduce them, and the shared ``norm`` name holds whichever norm ran last.

Shapes follow ``inference_engine/protocol.py``: NumPy order (``reversed(ggml ne)``), token axis first, leading
size-1 axes dropped (so with one token ``attn_norm-0`` is ``(n_embd,)``). ``l_out`` of the last layer holds every
row: the harness asks llama.cpp for the logits of every position.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference_engine.errors import GGUFParityError

# Per-layer names in llama.cpp's production order, per architecture (mistral runs llama's graph).
_LAYER_NAMES: dict[str, tuple[str, ...]] = {
    "llama": ("attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_out", "ffn_inp", "ffn_norm", "ffn_up",
              "ffn_gate", "ffn_swiglu", "ffn_out", "l_out"),
    "qwen2": ("attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp", "ffn_norm", "ffn_up", "ffn_gate",
              "ffn_swiglu", "ffn_out", "l_out"),
    "qwen3": ("attn_norm", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp", "ffn_norm",
              "ffn_up", "ffn_gate", "ffn_swiglu", "ffn_out", "l_out"),
    "gemma3": ("attn_norm", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_post_norm",
               "sa_out", "ffn_norm", "ffn_up", "ffn_gate", "ffn_geglu", "ffn_out", "ffn_post_norm", "l_out"),
    "gemma2": ("attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_post_norm", "sa_out", "ffn_norm", "ffn_up",
               "ffn_gate", "ffn_geglu", "ffn_out", "l_out"),
    # fused Q/K/V (``wqkv``, split into views) and gate+up (``ffn_up`` holds both halves)
    "phi3": ("attn_norm", "wqkv", "Kcur", "Vcur", "Qcur", "kqv_out", "ffn_norm", "ffn_up", "ffn_swiglu", "ffn_out",
             "l_out"),
    # mixtures of experts (build_moe_ffn): router, top-k ids, weights, the chosen experts' rows (T, k, n)
    "qwen2moe": ("attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp", "ffn_norm", "ffn_moe_logits",
                 "ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_up", "ffn_moe_gate", "ffn_moe_swiglu",
                 "ffn_moe_down", "ffn_moe_weighted", "ffn_moe_out", "ffn_up", "ffn_gate", "ffn_swiglu", "ffn_shexp",
                 "ffn_shexp_gate_inp", "ffn_shexp_gate", "ffn_shexp_out", "ffn_out", "l_out"),
    "qwen3moe": ("attn_norm", "Qcur_normed", "Kcur_normed", "Qcur", "Kcur", "Vcur", "kqv_out", "ffn_inp",
                 "ffn_norm", "ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights",
                 "ffn_moe_weights_sum", "ffn_moe_weights_sum_clamped", "ffn_moe_weights_norm", "ffn_moe_up",
                 "ffn_moe_gate", "ffn_moe_swiglu", "ffn_moe_down", "ffn_moe_weighted", "ffn_moe_out", "l_out"),
}
_ALIASES = {"mistral": "llama", "smollm3": "llama"}  # smollm3: llama's names (NoPE layers tap Qcur unrotated)
# Before the first layer: the token embedding (this build: ``embd``; older builds ``inp_embd``), Gemma's scaled one.
_INPUT_NAMES: dict[str, tuple[str, ...]] = {"gemma3": ("embd", "inp_scaled"), "gemma2": ("embd", "inp_scaled")}


@dataclass(frozen=True)
class ModelDims:
    """The sizes that fix every tensor's shape (from the GGUF's hyperparameters)."""

    architecture: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_expert: int = 0  # mixtures of experts: experts per layer, used per token, expert and shared-expert widths
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0

    @classmethod
    def from_gguf(cls, gguf) -> ModelDims:
        from inference_engine.models.base import HParams

        arch = _ALIASES.get(gguf.architecture, gguf.architecture)
        if arch not in _LAYER_NAMES:
            raise GGUFParityError(f"{gguf.path}: no tensor-name catalogue for architecture '{gguf.architecture}'; "
                                  f"supported: {', '.join(sorted(_LAYER_NAMES))}")
        hp = HParams.common(gguf)
        experts = {}
        if gguf.arch_value("expert_count"):
            from inference_engine.models.moe import expert_hparams

            experts = expert_hparams(gguf)
            experts["n_ff_shexp"] = int(gguf.arch_value("expert_shared_feed_forward_length", 0) or hp["n_ff"])
        return cls(arch, hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim_k"],
                   hp["head_dim_v"], hp["n_ff"], hp["n_vocab"], **experts)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _row_shape(kind: str, d: ModelDims) -> tuple[int, ...]:
    """The shape of one token's row of tensor ``kind``."""
    if kind in ("Qcur", "Qcur_normed"):
        return (d.n_head, d.head_dim_k)
    if kind in ("Kcur", "Kcur_normed"):
        return (d.n_head_kv, d.head_dim_k)
    if kind == "Vcur":
        return (d.n_head_kv, d.head_dim_v)
    if kind == "kqv_out":
        return (d.n_head * d.head_dim_v,)
    if kind == "wqkv":
        return (d.n_head * d.head_dim_k + d.n_head_kv * (d.head_dim_k + d.head_dim_v),)
    if kind == "ffn_up" and d.architecture == "phi3":  # the fused gate+up
        return (2 * d.n_ff,)
    if kind in ("ffn_moe_logits", "ffn_moe_probs"):
        return (d.n_expert,)
    if kind in ("ffn_moe_topk", "ffn_moe_weights_norm"):
        return (d.n_expert_used,)
    if kind == "ffn_moe_weights":
        return (d.n_expert_used, 1)
    if kind in ("ffn_moe_weights_sum", "ffn_moe_weights_sum_clamped", "ffn_shexp_gate_inp", "ffn_shexp_gate"):
        return (1,)
    if kind in ("ffn_moe_up", "ffn_moe_gate", "ffn_moe_swiglu"):
        return (d.n_expert_used, d.n_ff_exp)
    if kind in ("ffn_moe_down", "ffn_moe_weighted"):
        return (d.n_expert_used, d.n_embd)
    if kind in ("ffn_up", "ffn_gate", "ffn_swiglu") and d.n_expert:  # an MoE's shared expert
        return (d.n_ff_shexp,)
    if kind in ("ffn_up", "ffn_gate", "ffn_swiglu", "ffn_geglu"):
        return (d.n_ff,)
    if kind == "result_output":
        return (d.n_vocab,)
    return (d.n_embd,)


def drop_leading_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The protocol's convention: ``(1, 1, 5, 64)`` -> ``(5, 64)``; a scalar-like ``(1,)`` stays ``(1,)``."""
    shape = tuple(int(n) for n in shape)
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def expected_tensors(dims: ModelDims, n_tokens: int) -> dict[str, tuple[int, ...]]:
    """``{llama.cpp graph name: NumPy shape}`` for a prefill of ``n_tokens``, in llama.cpp's production order."""
    out: dict[str, tuple[int, ...]] = {}
    for name in _INPUT_NAMES.get(dims.architecture, ("embd",)):
        out[name] = drop_leading_ones((n_tokens, *_row_shape(name, dims)))
    for il in range(dims.n_layer):
        for kind in _LAYER_NAMES[dims.architecture]:
            out[f"{kind}-{il}"] = drop_leading_ones((n_tokens, *_row_shape(kind, dims)))
    for name in ("result_norm", "result_output"):
        out[name] = drop_leading_ones((n_tokens, *_row_shape(name, dims)))
    return out
