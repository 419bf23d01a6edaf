"""The forward pass every architecture shares, written once: embed, the layer loop, the output norm and head.

An architecture subclasses :class:`DecoderModel` and says what differs: :meth:`~DecoderModel.load_layer` (a layer's
weights, into the blocks of :mod:`inference_engine.models.blocks` or a layer of its own with the same call),
:meth:`~DecoderModel.layer_settings` (RoPE, scales, window, activation, graph names per layer) and, where it has
them, the embeddings' scale (gemma) or a logits step (qwen2's bias, gemma2's soft cap). mlx-lm's one-file models are the anchor: each
architecture file still reads top to bottom, and this file is the loop they all run.

A decode step nobody taps asks the backend to run each layer it has a :class:`~inference_engine.backends.base.
FusedLayerPlan` for as one op (:meth:`~inference_engine.backends.base.Backend.decode_layer`); the plans are built
once per model (:meth:`DecoderModel.fused_plan`), from the model's own weights, and a backend that returns None for
a layer (or has no such op) gets the layer's ops one by one.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import numpy as np

from inference_engine.backends.base import Array, Backend, FusedLayerPlan
from inference_engine.gguf.file import GGUFFile
from inference_engine.kv_cache import KVCache
from inference_engine.models.base import HParams, Model, Tap, Weights, no_tap
from inference_engine.models.blocks import LayerSettings, PreNormLayer


class DecoderModel(Model):
    """A decoder-only transformer: ``token_embd``, ``layers`` (each called as :class:`~inference_engine.models.
    blocks.PreNormLayer` is), ``output_norm`` and ``output``, set by :meth:`load`."""

    output_tied: ClassVar[bool] = True  # a file without output.weight uses token_embd (False: llama.cpp requires it)
    scale_embeddings: ClassVar[bool] = False  # gemma: the embeddings times hp.embedding_scale (inp_scaled)

    def __init__(self, f: GGUFFile, backend: Backend):
        self._settings_of: HParams | None = None  # the hyperparameters self._settings were computed from
        self._settings: list[LayerSettings] = []
        self._fused_plan: list[FusedLayerPlan | None] | None = None
        super().__init__(f, backend)

    def load(self, w: Weights) -> None:
        self.token_embd = w.embedding()
        self.layers = [self.load_layer(w, il) for il in range(self.hp.n_layer)]
        self.output_norm = w.vector("output_norm")
        self.output = w.output() if self.output_tied else w.matrix("output")

    @abstractmethod
    def load_layer(self, w: Weights, il: int) -> Any:
        """Layer ``il``'s weights, as a layer called as :class:`~inference_engine.models.blocks.PreNormLayer` is."""

    @abstractmethod
    def layer_settings(self, il: int) -> LayerSettings:
        """What layer ``il``'s call takes besides its weights (computed once, after :meth:`load`)."""

    def rope(self) -> dict:
        """RoPE's keyword arguments as most architectures set them: NEOX pairs (llama overrides: NORM pairs)."""
        hp = self.hp
        return {"n_dims": hp.n_rot, "freq_base": hp.rope_freq_base, "neox": True, "freq_scale": hp.rope_freq_scale}

    def embed(self, ids: np.ndarray, tap: Tap) -> Array:
        """The token embeddings ``(T, n_embd)`` (``embd``), scaled where :attr:`scale_embeddings` (``inp_scaled``)."""
        x = self.backend.embed(self.token_embd, ids)  # (T, n_embd)
        x = tap("embd", x)
        if self.scale_embeddings:
            x = self.backend.scale(x, self.hp.embedding_scale)  # (T, n_embd)
            x = tap("inp_scaled", x)
        return x

    def logits(self, x: Array) -> Array:
        """The LM head on the normed rows: ``(rows, n_vocab)``; qwen2 adds a bias, gemma2 soft-caps."""
        return self.backend.matmul(self.output, x)

    @property
    def settings(self) -> list[LayerSettings]:
        """Per layer, its :meth:`layer_settings`: computed once, and again only when ``hp`` is replaced (a test that
        switches a feature off replaces it)."""
        if self._settings_of is not self.hp:
            self._settings = [self.layer_settings(il) for il in range(self.hp.n_layer)]
            self._settings_of, self._fused_plan = self.hp, None
        return self._settings

    def fused_plan(self) -> list[FusedLayerPlan | None]:
        """Per layer, the layer as a backend's fused decode op takes it, or None where it is not one (built once)."""
        settings = self.settings
        if self._fused_plan is None:
            self._fused_plan = [
                layer.fused_plan(self.hp, s) if hasattr(layer, "fused_plan") else None
                for layer, s in zip(self.layers, settings)
            ]
        return self._fused_plan

    def chained_norms(self) -> list[Array | None]:
        """Per layer, the norm its last residual add feeds where both sides are pre-norm layers (:class:`~inference_
        engine.models.blocks.PreNormLayer`: the next layer's ``attn_norm``, the last one's the output norm), else
        None: what :meth:`forward` hands a layer as ``next_norm`` for a backend that computes an add and a norm as
        one op (``Backend.fuses_add_rms_norm``)."""
        layers = self.layers
        nexts = [layer.attn_norm if isinstance(layer, PreNormLayer) else None for layer in layers[1:]]
        return [n if isinstance(layer, PreNormLayer) else None
                for layer, n in zip(layers, [*nexts, self.output_norm])]

    def forward(self, ids, positions, cache: KVCache, tap: Tap = no_tap, all_logits: bool = False):
        b, hp, settings = self.backend, self.hp, self.settings
        x = self.embed(ids, tap)  # (T, n_embd)
        plans = self.fused_plan() if tap is no_tap and x.shape[0] == 1 else None  # a decode step nobody taps
        chained = self.chained_norms() if tap is no_tap and b.fuses_add_rms_norm else None
        normed = None  # x normed by the next layer's attn_norm (or the output norm), where the layers chain them

        for il, layer in enumerate(self.layers):
            if plans is not None and plans[il] is not None:
                fused = b.decode_layer(plans[il], x, il, positions, cache)
                if fused is not None:  # the whole layer as one backend op
                    x, normed = fused, None  # (1, n_embd): l_out
                    continue
            last = il == hp.n_layer - 1 and not all_logits
            if chained is not None and chained[il] is not None:  # its last add and the next norm as one op
                x, normed = layer(b, hp, x, il, positions, cache, tap, settings[il], last, normed=normed,
                                  next_norm=chained[il])  # (T, n_embd) each: l_out, and it normed
                continue
            x = layer(b, hp, x, il, positions, cache, tap, settings[il], last)  # (T, n_embd): ..l_out
            normed = None

        x = normed if normed is not None else b.rms_norm(x, self.output_norm, hp.rms_eps)  # (rows, n_embd)
        x = tap("result_norm", x)
        logits = self.logits(x)  # (rows, n_vocab)
        return tap("result_output", logits)
