"""The KV cache: per layer, K and V for up to ``n_ctx`` positions, preallocated once, in F32 or F16.

One sequence, filled from position 0: slot ``j`` holds position ``j``, as in a fresh llama.cpp context with one
sequence. Storage goes through the backend (``kv_alloc`` / ``kv_store`` / ``kv_view``), so the buffers live where
the backend computes (NumPy memory, MLX arrays). An F16 cache rounds K and V on the way in, as llama.cpp's
``cpy_k`` / ``cpy_v`` into an F16 cache do.
"""

from __future__ import annotations

from typing import Any

from inference_engine.backends.base import Array, Backend, check_kv_type
from inference_engine.errors import GGUFParityError


class KVCache:
    def __init__(self, backend: Backend, layout: list[tuple[int, int, int]], n_ctx: int, kv_type: str = "f32"):
        """``layout``: per layer ``(n_head_kv, head_dim_k, head_dim_v)`` (``Model.kv_layout()``)."""
        if n_ctx < 1:
            raise GGUFParityError(f"context size must be at least 1, got {n_ctx}")
        self.backend = backend
        self.n_ctx = n_ctx
        self.kv_type = check_kv_type(kv_type)
        self.k: list[Any] = [backend.kv_alloc(n_ctx, h, dk, kv_type) for h, dk, _ in layout]
        self.v: list[Any] = [backend.kv_alloc(n_ctx, h, dv, kv_type) for h, _, dv in layout]
        self.n_past = 0  # positions filled (committed by advance())

    def check_room(self, n_tokens: int) -> None:
        """Refuse ``n_tokens`` more tokens that would not fit the context."""
        if self.n_past + n_tokens > self.n_ctx:
            if self.n_past == 0:
                raise GGUFParityError(f"prompt of {n_tokens} tokens does not fit the context of {self.n_ctx}")
            raise GGUFParityError(
                f"{n_tokens} more token(s) after {self.n_past} do not fit the context of {self.n_ctx}; "
                "reset() or use a larger context"
            )

    def update(self, il: int, start: int, k: Array, v: Array) -> tuple[Array, Array]:
        """Write ``k, v (T, n_head_kv, d)`` at positions ``start..start+T-1`` of layer ``il``; return the views of
        all ``start + T`` cached positions (what attention reads)."""
        end = start + k.shape[0]
        self.k[il] = self.backend.kv_store(self.k[il], start, k)
        self.v[il] = self.backend.kv_store(self.v[il], start, v)
        return self.backend.kv_view(self.k[il], end), self.backend.kv_view(self.v[il], end)

    def advance(self, n_tokens: int) -> None:
        """Mark ``n_tokens`` more positions as filled (after a forward pass wrote them in every layer)."""
        self.n_past += n_tokens

    def reset(self) -> None:
        """Forget every position; the buffers are reused (stale slots are never read: attention stops at kv_len)."""
        self.n_past = 0

    def truncate(self, n_past: int) -> bool:
        """Keep the first ``n_past`` positions and forget the rest (exact: slot ``j`` holds position ``j``, and
        nothing is evicted); False, changing nothing, when fewer than ``n_past`` are filled."""
        if not 0 <= n_past <= self.n_past:
            return False
        self.n_past = n_past
        return True
