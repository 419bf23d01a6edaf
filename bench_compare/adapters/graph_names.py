"""The llama.cpp graph tensors an outside engine can hand us, by name and shape, for one model and one prompt.

A dump request lists these so an engine author knows exactly what to write, and the dump reader checks shapes and
name-map targets against them. The names are those llama.cpp 0.3.36's graph callbacks give (``src/models/llama.cpp``,
``qwen2.cpp``, ``qwen3.cpp``, ``gemma3.cpp``; the same names our engine taps, ``inference_engine/models/*.py``), in
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
}
_ALIASES = {"mistral": "llama"}
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

    @classmethod
    def from_gguf(cls, gguf) -> ModelDims:
        from inference_engine.models.base import HParams

        arch = _ALIASES.get(gguf.architecture, gguf.architecture)
        if arch not in _LAYER_NAMES:
            raise GGUFParityError(f"{gguf.path}: no tensor-name catalogue for architecture '{gguf.architecture}'; "
                                  f"supported: {', '.join(sorted(_LAYER_NAMES))}")
        hp = HParams.common(gguf)
        return cls(arch, hp["n_layer"], hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim_k"],
                   hp["head_dim_v"], hp["n_ff"], hp["n_vocab"])

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
