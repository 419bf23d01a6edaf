"""One forward pass over rows of several sequences: the model, the backend and the paged KV pool together.

:meth:`BatchRunner.step` takes segments ``(sequence, n_rows, all_rows)``: a decode token is a segment of one row, a
chunk of a prompt a segment of several. All rows go through the model in one ``forward`` (so the backends'
matrix-matrix kernels see several rows), each at its own position; the paged batch does per-sequence attention.
Only the rows whose logits are needed go through the LM head: the last row of each segment, or every row of a
segment with ``all_rows`` (prompt log-probabilities). The selection is made at ``result_norm`` through the model's
tap (what a tap returns is what flows on, see ``models/base.py``), llama.cpp's ``inp_out_ids`` for several
sequences.
"""

from __future__ import annotations

import numpy as np

from inference_engine.backends import get_backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import GGUFFile, open_gguf
from inference_engine.models import build_model
from inference_engine.paged_kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, PagedBatch, PagedSequence

Segment = tuple[PagedSequence, int, bool]  # (sequence, rows to compute now, logits of every row?)


class BatchRunner:
    """A model over a paged KV pool of ``n_blocks`` blocks; ``n_ctx`` bounds one sequence's positions."""

    def __init__(
        self,
        model_path,
        backend: str = "numpy",
        numerics: str = "f32",
        n_threads: int | None = None,
        n_ctx: int = 2048,
        n_blocks: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        kv_type: str = "f32",
        prefix_caching: bool = True,
    ):
        if n_ctx < 1:
            raise GGUFParityError(f"--ctx must be at least 1, got {n_ctx}")
        self.gguf: GGUFFile = model_path if isinstance(model_path, GGUFFile) else open_gguf(model_path)
        self.backend = get_backend(backend, numerics, n_threads)
        self.model = build_model(self.gguf, self.backend)
        self.n_ctx = int(n_ctx)
        if n_blocks is None:
            n_blocks = 4 * -(-self.n_ctx // block_size)  # room for four full-context sequences
        if n_blocks * block_size < self.n_ctx:
            raise GGUFParityError(
                f"--kv-blocks {n_blocks} x {block_size} tokens cannot hold one sequence of --ctx {self.n_ctx}; "
                f"give at least {-(-self.n_ctx // block_size)} blocks"
            )
        self.pool = BlockPool(self.backend, self.model.kv_layout(), n_blocks, block_size, kv_type, prefix_caching)

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    def step(self, segments: list[Segment]) -> list[np.ndarray]:
        """Run one forward over ``segments``; per segment its logits ``(rows, n_vocab)``: every row of the segment
        when it asked for all rows, else its last row only."""
        batch = PagedBatch(self.pool, [(seq, n) for seq, n, _ in segments])
        wanted: list[np.ndarray] = []
        for (r0, r1), (_, _, all_rows) in zip(batch.bounds, segments):
            wanted.append(np.arange(r0, r1) if all_rows else np.array([r1 - 1]))
        rows = np.concatenate(wanted)
        every_row = len(rows) == batch.n_rows

        def select_output_rows(name: str, x):
            return x[rows] if name == "result_norm" and not every_row else x

        logits = self.model.forward(batch.ids, batch.positions, batch, tap=select_output_rows, all_logits=True)
        batch.commit()
        logits = self.backend.to_numpy(logits)
        out, start = [], 0
        for w in wanted:
            out.append(logits[start : start + len(w)])
            start += len(w)
        return out
