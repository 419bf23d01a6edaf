"""Recording llama.cpp's compute graph through the ``cb_eval`` callback.

The scheduler (``ggml_backend_sched_compute_splits`` in ggml-backend.cpp) calls the callback twice per node: first
with ``ask=True`` ("do you want this node?"), then, for a yes, with ``ask=False`` once the node is computed. We say
yes to every node. That makes the scheduler compute each node as its own one-node graph, which has two effects that
matter for validation:

* every intermediate is materialised, so nothing is hidden inside a fused kernel (the CPU backend fuses
  ``RMS_NORM`` + ``MUL`` when both sit in one graph; ``ggml_cpu_try_fuse_ops`` in ggml-cpu.c);
* the values are the unfused ones. For the one fusion this build has, that changes nothing: the fused kernel
  computes ``x * scale * w`` in the same order as the two separate ops (``ops.cpp``), which the tests confirm by
  comparing the captured logits with a normal (fused) prefill bit for bit.

Only names of the form llama.cpp's graph callbacks give (``attn_norm-3``, ``Qcur-3``, ``result_output``,
``embd``) are kept; ggml's derived names (``Qcur-0 (reshaped)``, ``cache_k_l0 (view)``) and its placeholder names
for unnamed nodes (``node_1073``) are not. When a name is produced several times (``Qcur`` after the matmul, the
reshape and RoPE), the last value wins.

What the names hold in this build (seen on SmolLM2 and Gemma 3; diff with care):

* ``embd`` is the token embedding (older builds: ``inp_embd``); Gemma's scaled one is ``inp_scaled``.
* ``norm-<il>`` / ``norm`` are the bare RMS norms before each weight multiply; one name serves every norm of a layer
  (Gemma: q, k, post-attention, ffn norms; its ffn post-norm's even comes out as plain ``norm``), so the kept value
  is whichever ran last. Diff the weighted names (``attn_norm``, ``ffn_norm``, ``Qcur_normed``...) instead.
* ``kq-<il>`` / ``kq_soft_max-<il>`` are ``(n_head, n_tokens, n_kv)`` with ``n_kv`` the KV cells viewed (padded to
  256 here, not ``n_tokens``); ``kq`` holds raw scores (llama: unscaled, the scale and causal mask are applied inside
  the softmax; Gemma: Q is scaled first, by an unnamed node), ``kq_soft_max`` has exact zeros where masked.
  ``kqv-<il>`` is ``(n_head, n_tokens, head_dim)``. With flash attention none of the three exist.
* Gemma 3's attention output projection is unnamed (no ``attn_out``); ``attn_post_norm`` follows it.
* The last layer's ``GET_ROWS`` onto the requested outputs is unnamed; capture asks for every row, so
  ``l_out-<last>`` keeps all ``n_tokens`` rows.
* Mixture of experts (``build_moe_ffn``): ``ffn_moe_logits`` (router), ``ffn_moe_probs`` (softmax),
  ``ffn_moe_topk`` (the chosen experts: I32, a view of ``ffn_moe_argsort``; kept, as float32 ids, because which
  experts a token goes to is what an MoE engine must get right), ``ffn_moe_weights`` ``(T, k, 1)``, optionally
  ``ffn_moe_weights_sum`` / ``_sum_clamped`` / ``_norm`` (qwen3moe), then per chosen expert ``ffn_moe_gate`` /
  ``ffn_moe_up`` / ``ffn_moe_swiglu`` / ``ffn_moe_down`` / ``ffn_moe_weighted`` ``(T, k, n)`` and ``ffn_moe_out``.
  qwen2moe's shared expert reuses the dense names (``ffn_gate``, ``ffn_up``, ``ffn_swiglu``), then ``ffn_shexp``,
  ``ffn_shexp_gate_inp``, ``ffn_shexp_gate``, ``ffn_shexp_out`` and ``ffn_out``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from llama_cpp import llama_cpp as ll

from validation.ggml_ctypes import (
    GGML_TYPE_I32,
    drop_leading_ones,
    index_tensor_to_numpy,
    read_header,
    tensor_to_numpy,
)

# "name" or "name-<layer>", as llama_context::graph_get_cb formats them ("%s-%d" for il >= 0, the bare name else).
GRAPH_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(-[0-9]+)?$")
# ggml_build_forward_expand names every still-unnamed node "node_<index>" (and leaf "leaf_<index>"): positions in
# one particular graph, not names llama.cpp gave (the last layer's out_ids GET_ROWS are such nodes).
GGML_DEFAULT_NAME = re.compile(r"^(node|leaf)_[0-9]+$")


# Integer (I32) tensors worth comparing, by kind: the experts an MoE router picks. Other I32 nodes (token ids,
# positions, output ids, the full argsort) are inputs or scaffolding, not results.
INDEX_KINDS = ("ffn_moe_topk",)


def is_graph_name(name: str) -> bool:
    return bool(GRAPH_NAME.match(name)) and not GGML_DEFAULT_NAME.match(name)


def is_index_name(name: str) -> bool:
    return name.rsplit("-", 1)[0] in INDEX_KINDS


@dataclass(frozen=True)
class GraphNode:
    """One node of a llama.cpp compute graph, in evaluation order."""

    index: int
    name: str
    op: str  # ggml_op_desc: MUL_MAT, RMS_NORM, ROPE, VIEW, ...
    type_name: str  # f32, f16, ...
    shape: tuple[int, ...]  # NumPy convention: reversed(ne), leading size-1 axes dropped
    kept: bool  # a graph name with a float type (or an MoE's chosen experts): what capture() returns


class GraphRecorder:
    """The ``cb_eval`` callback object. Owns the ctypes function pointer; keep this object alive with the context."""

    def __init__(self) -> None:
        self.callback = ll.ggml_backend_sched_eval_callback(self._on_node)
        self.active = False
        self.wanted: set[str] | None = None
        self.tensors: dict[str, np.ndarray] = {}
        self.nodes: list[GraphNode] = []
        self.error: BaseException | None = None
        self.interrupted = False

    def start(self, names: Iterable[str] | None = None) -> None:
        self.active = True
        self.wanted = None if names is None else set(names)
        self.tensors = {}
        self.nodes = []
        self.error = None
        self.interrupted = False

    def stop(self) -> None:
        self.active = False
        if self.interrupted:
            self.interrupted = False
            raise KeyboardInterrupt
        if self.error is not None:
            error, self.error = self.error, None
            raise RuntimeError(f"reading llama.cpp's graph failed: {error!r}") from error

    def _on_node(self, ptr: int | None, ask: bool, user_data: int | None) -> bool:
        # Nothing may escape into C: ctypes would print "Exception ignored" and carry on. Ctrl-C arrives here as a
        # KeyboardInterrupt (Python runs its signal handler at the next bytecode, which is in this callback while
        # llama.cpp computes): note it, stop the graph, and stop() raises it once llama_decode has returned.
        try:
            if not self.active or self.interrupted:
                return False  # not recording (or interrupted): let the scheduler run the rest in one piece
            if ask:
                return True
            self._record(ptr)
            return True
        except KeyboardInterrupt:
            self.interrupted = True
            return False
        except BaseException as exc:  # an exception must not cross into C; stop the graph and re-raise later
            self.error = exc
            return False

    def _record(self, ptr: int) -> None:
        header = read_header(ptr)
        index = header.type == GGML_TYPE_I32 and is_index_name(header.name)
        kept = (header.is_float or index) and is_graph_name(header.name)
        self.nodes.append(
            GraphNode(len(self.nodes), header.name, header.op, header.type_name, header.numpy_shape, kept)
        )
        if not kept or (self.wanted is not None and header.name not in self.wanted):
            return
        array = index_tensor_to_numpy(ptr, header) if index else tensor_to_numpy(ptr, header)
        self.tensors[header.name] = array.reshape(drop_leading_ones(array.shape))
