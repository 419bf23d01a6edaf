"""Logit lens: read every layer's residual stream (``l_out-N``) as next-token logits, on both engines, and compare.

The lens is ``output(final_norm(l_out-N))``, the model's own head applied early. It is computed here from the GGUF
file (``output_norm.weight``, ``output.weight`` or the tied ``token_embd.weight``, the RMS epsilon, a final logit
soft-cap when the file declares one), never by either engine, and the same lens is applied to both sides' ``l_out-N``:
whatever the lens does, it does to both, so a per-layer KLD between the two lens outputs measures only the engines'
difference at that layer, in the currency that matters (the next-token distribution).

The head matches llama.cpp's graph tail for every architecture we run (llama, qwen2, qwen3 and gemma3 all end with
``build_norm(LLM_NORM_RMS)`` then ``build_lora_mm(model.output)``; gemma3 GGUFs already store the norm weight as
``1 + w``, and gemma3 applies ``f_final_logit_softcapping`` when the key is present). So at the last layer the lens of
the reference's ``l_out`` reproduces the reference's own ``result_output``.

The lens is diagnostic, not a gate: the per-tensor NMSE of ``l_out-N`` already judges the same numbers.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from inference_engine.gguf.file import GGUFFile, TensorInfo
from validation.diff import split_name
from validation.metrics import logit_metrics

# Rows of the output matrix dequantized per step: 8192 x n_embd float32 is ~20 MB for n_embd 640, small next to the
# final f32 matrix, so peak memory is the dequantized head (V x n_embd x 4 bytes) plus one block.
DEQUANT_ROWS_PER_STEP = 8192


def _dequantize_rows(info: TensorInfo, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of a 2-D weight as float32 ``(rows, n_cols)`` (exact, as libggml's dequantize_row)."""
    from inference_engine.quants import quant_for

    return quant_for(info.qtype).dequantize(info.raw[start:stop]).reshape(stop - start, info.shape[-1])


class LogitLens:
    """The model's final RMS norm and output head, read from the GGUF, applied to any hidden states."""

    def __init__(self, gguf: GGUFFile):
        from inference_engine.quants import dequantize_tensor

        self.norm_weight = dequantize_tensor(gguf.tensor("output_norm.weight")).reshape(-1)
        head = gguf.tensors.get("output.weight") or gguf.tensor("token_embd.weight")
        self.head_name = head.name
        self.eps = float(gguf.require_arch_value("attention.layer_norm_rms_epsilon"))
        self.softcap = float(gguf.arch_value("final_logit_softcapping", 0.0) or 0.0)
        n_vocab, n_embd = head.shape
        self.head = np.empty((n_vocab, n_embd), dtype=np.float32)
        for start in range(0, n_vocab, DEQUANT_ROWS_PER_STEP):
            stop = min(start + DEQUANT_ROWS_PER_STEP, n_vocab)
            self.head[start:stop] = _dequantize_rows(head, start, stop)

    @property
    def n_vocab(self) -> int:
        return self.head.shape[0]

    def norm(self, hidden: np.ndarray) -> np.ndarray:
        """ggml_rms_norm (mean of squares in double) times the norm weight, as float32."""
        h = np.asarray(hidden, dtype=np.float64).reshape(-1, self.head.shape[1])
        scale = 1.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + self.eps)
        return (h * scale * self.norm_weight).astype(np.float32)

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        """Hidden states ``(n_tokens, n_embd)`` -> logits ``(n_tokens, n_vocab)`` float32."""
        logits = self.norm(hidden) @ self.head.T
        if self.softcap:
            logits = np.tanh(logits / self.softcap) * self.softcap
        return logits.astype(np.float32, copy=False)


def lens_layers(ours: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[int]:
    """Layers whose ``l_out-N`` both captures hold, ascending."""
    layers = []
    for name in reference:
        kind, layer = split_name(name)
        if kind == "l_out" and layer is not None and name in ours:
            layers.append(layer)
    return sorted(layers)


def logit_lens(lens: LogitLens, ours: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> list[dict]:
    """Per layer: KLD mean/max, top-1 agreement and top-5 overlap of the two lens outputs, plus the last position's
    top-1 token on each side (what the model 'would say' after that layer)."""
    rows = []
    for layer in lens_layers(ours, reference):
        name = f"l_out-{layer}"
        if np.shape(ours[name]) != np.shape(reference[name]):
            rows.append({"layer": layer, "error": f"shape mismatch: ours {np.shape(ours[name])} vs reference "
                                                  f"{np.shape(reference[name])}"})
            continue
        lens_ref = lens(reference[name])
        lens_ours = lens(ours[name])
        summary = logit_metrics(lens_ours, lens_ref)
        rows.append({
            "layer": layer,
            "kld_mean": summary["kld_mean"],
            "kld_max": summary["kld_max"],
            "top1_agreement": summary["top1_agreement"],
            "top5_overlap": summary["top5_overlap"],
            "reference_top1_last": int(np.argmax(lens_ref[-1])),
            "ours_top1_last": int(np.argmax(lens_ours[-1])),
        })
    return rows
