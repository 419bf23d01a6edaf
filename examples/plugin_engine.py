"""An example engine plugin: our NumPy engine behind a factory, as a user's own engine would be plugged in.

Run it as any engine::

    bench-compare validate --engine examples.plugin_engine:open_engine --model smollm2-135m
    bench-compare bench --engine examples.plugin_engine:open_engine -m smollm2-135m -p 64 -n 16
    bench-compare compare --engine examples.plugin_engine:open_engine --engine-opt backend=numba -m smollm2-135m

(from the repository root, or with this folder on ``PYTHONPATH``). The factory receives the GGUF path and the run's
options as keyword arguments, uses those it needs and ignores the rest, and returns an object with the Engine
protocol (``inference_engine/protocol.py``). Everything below ``open_engine`` is what your own engine provides.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np


def open_engine(target: str, model: str, *, n_threads: int | None = None, n_ctx: int = 2048,
                numerics: str = "f32", backend: str = "numpy", **options: Any) -> "PluginEngine":
    """Our engine wrapped as a plugin (example; --engine-opt backend=numba picks another backend)."""
    return PluginEngine(model, backend=backend, numerics=numerics, n_ctx=n_ctx, n_threads=n_threads)


class PluginEngine:
    """The Engine protocol, member by member. ``capture`` is optional: without it, validation still compares the
    logits at every position, the tokenizer and a greedy smoke test; with ``capture(ids, names=None, force=None)``
    it also compares every intermediate tensor, each computed from llama.cpp's own inputs (teacher forcing)."""

    def __init__(self, model: str, *, backend: str, numerics: str, n_ctx: int, n_threads: int | None):
        from inference_engine.engine import OurEngine

        self._inner = OurEngine(model, backend=backend, numerics=numerics, n_ctx=n_ctx, n_threads=n_threads)
        self.name = f"plugin:{backend}"
        self.n_vocab = self._inner.n_vocab  # plain attributes do: the harness only reads them
        self.n_ctx = self._inner.n_ctx

    @property
    def model_info(self) -> dict[str, Any]:  # what ran: recorded in every result
        return {**self._inner.model_info, "engine": self.name}

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self._inner.tokenize(text, add_bos)

    def detokenize(self, ids: Iterable[int]) -> str:
        return self._inner.detokenize(ids)

    def reset(self) -> None:  # empty the KV cache
        self._inner.reset()

    def prefill(self, ids: list[int]) -> np.ndarray:  # float32 (n_vocab,) logits of the last position
        return self._inner.prefill(ids)

    def decode(self, token_id: int) -> np.ndarray:  # float32 (n_vocab,) logits of the new position
        return self._inner.decode(token_id)

    def capture(self, ids: list[int], names: Iterable[str] | None = None,
                force: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """{llama.cpp graph name: float32 array}; with ``force``, continue from the forced values."""
        return self._inner.capture(ids, names, force=force)

    def close(self) -> None:
        self._inner.close()
