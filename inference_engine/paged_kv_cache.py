"""A paged KV cache for serving many sequences at once (vLLM's PagedAttention layout, SGLang-style prefix reuse).

* :class:`BlockPool`: per layer one K and one V buffer of ``n_blocks * block_size`` slots, cut into fixed-size
  blocks. Sequences of any length share the pool: each owns a *block table* (the list of its blocks, position
  ``p`` lives in slot ``p % block_size`` of block ``table[p // block_size]``). Blocks are reference-counted.
* Prefix reuse: a block that is full of computed K/V is keyed by the hash chain of the token ids up to its end
  (``hash(parent hash, its tokens)``), so a later sequence whose prompt starts with the same tokens takes the same
  blocks instead of recomputing them. A released block whose key is known is kept (evictable, least recently used
  first) until its slot is needed; a full shared block is never written again (writes land past it), so sharing
  needs no copy-on-write.
* :class:`PagedBatch`: the cache object a model's ``forward`` receives for one step of several sequences. Its rows
  are segments, one per sequence (a decode token, or a chunk of a prompt), each at its own positions. The models
  call ``self_attention(b, cache, il, q, k, v, positions, ...)`` (``models/base.py``), which hands the step to
  :meth:`PagedBatch.attend`: K/V rows are written to their sequences' slots, then each segment attends over its
  own sequence's blocks through the backend's ``attention`` op, so masks (causal, sliding window) and numerics are
  the single-sequence ones. On the numba backend one kernel call serves every segment and reads K/V where they
  lie in the pool (``backends/numba_kernels/paged_attention.py``, the same arithmetic as its ``attention``).

The buffers are the backend's (``kv_alloc``), written and gathered with NumPy indexing, so backends whose KV
buffers are NumPy arrays (numpy, numba) serve; others are refused with a clear error.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from inference_engine.backends.base import Array, Backend, check_kv_type
from inference_engine.backends.numerics import ggml_simd
from inference_engine.errors import GGUFParityError

DEFAULT_BLOCK_SIZE = 16  # tokens per block (vLLM's default): small enough to waste little, big enough to gather fast


def chain_hash(parent: bytes, tokens: list[int] | np.ndarray) -> bytes:
    """The key of a full block: its tokens and, through ``parent``, every token before them."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


ROOT_HASH = b""


class PoolExhausted(GGUFParityError):
    """Not enough free KV blocks right now (the caller waits or refuses the request)."""


@dataclass
class PagedSequence:
    """One sequence's view of the pool: its tokens, its block table, how many positions hold computed K/V."""

    tokens: list[int]
    block_table: list[int] = field(default_factory=list)
    n_computed: int = 0  # positions whose K/V are in the pool
    n_cached: int = 0  # of those, how many came from the prefix cache (not computed for this sequence)
    block_hashes: list[bytes] = field(default_factory=list)  # keys of the full blocks registered so far

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class BlockPool:
    """Fixed-size KV blocks for every layer, a free list, reference counts and the prefix-cache index."""

    def __init__(
        self,
        backend: Backend,
        layout: list[tuple[int, int, int]],
        n_blocks: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        kv_type: str = "f32",
        prefix_caching: bool = True,
    ):
        if n_blocks < 1 or block_size < 1:
            raise GGUFParityError(f"the KV pool needs at least one block of one slot, got {n_blocks} x {block_size}")
        self.backend = backend
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.kv_type = check_kv_type(kv_type)
        self.prefix_caching = prefix_caching
        n_slots = n_blocks * block_size
        self.k = [backend.kv_alloc(n_slots, h, dk, kv_type) for h, dk, _ in layout]
        self.v = [backend.kv_alloc(n_slots, h, dv, kv_type) for h, _, dv in layout]
        if not all(isinstance(buf, np.ndarray) for buf in self.k + self.v):
            raise GGUFParityError(
                f"the paged KV cache needs a backend whose KV buffers are NumPy arrays; backend "
                f"'{backend.name}' is not one; supported: numpy, numba"
            )
        for buf in self.k + self.v:
            buf.fill(0)  # commit the pages now: the pool's memory is taken at start (RSS stays flat while serving)
        # (n_blocks, block_size, heads, d) views of the same memory: gathering whole blocks is one fancy index
        self.k_blocks = [buf.reshape(n_blocks, block_size, *buf.shape[1:]) for buf in self.k]
        self.v_blocks = [buf.reshape(n_blocks, block_size, *buf.shape[1:]) for buf in self.v]
        self.ref_count = np.zeros(n_blocks, dtype=np.int64)
        self.free: list[int] = list(range(n_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self.cached: OrderedDict[int, bytes] = OrderedDict()  # unreferenced blocks kept for reuse, LRU first
        self.by_hash: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        # prefix-cache statistics: prompt tokens looked up, and how many of them were found computed
        self.lookup_tokens = 0
        self.hit_tokens = 0

    # --- accounting -----------------------------------------------------------------------------------------
    @property
    def n_free(self) -> int:
        """Blocks a new sequence can get: never used, or cached but not referenced (evicted on demand)."""
        return len(self.free) + len(self.cached)

    @property
    def n_in_use(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self.n_blocks - self.n_free

    @property
    def n_cached(self) -> int:
        return len(self.cached)

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    # --- sequences ------------------------------------------------------------------------------------------
    def allocate(self, tokens: list[int], n_positions: int, reuse: bool = True) -> PagedSequence:
        """A sequence for prompt ``tokens`` with blocks for ``n_positions`` positions (prompt + what it may
        generate), reusing cached blocks of the longest matching prefix unless ``reuse`` is off (a caller that
        needs every prompt row computed). Raises :class:`PoolExhausted` when the pool cannot hold it now (nothing
        is taken then)."""
        seq = PagedSequence(tokens=list(tokens))
        reused = self._match_prefix(seq.tokens) if self.prefix_caching and reuse else []
        needed = self.blocks_for(n_positions) - len(reused)
        free_after_reuse = self.n_free - sum(1 for b, _ in reused if b in self.cached)
        if needed > free_after_reuse:
            raise PoolExhausted(f"{needed} KV blocks needed, {free_after_reuse} free")
        for block, key in reused:
            self._take(block)
            seq.block_table.append(block)
            seq.block_hashes.append(key)
        seq.n_computed = seq.n_cached = len(reused) * self.block_size
        for _ in range(needed):
            seq.block_table.append(self._take(self._pop_free()))
        if self.prefix_caching:
            self.lookup_tokens += len(seq.tokens)
            self.hit_tokens += seq.n_cached
        return seq

    def release(self, seq: PagedSequence) -> None:
        """Give back every block of ``seq`` (idempotent). Full blocks with a key stay cached for reuse."""
        self.register_full_blocks(seq)
        for block in reversed(seq.block_table):  # the prefix's first blocks end up most recently used
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                if block in self.hash_of:
                    self.cached[block] = self.hash_of[block]
                    self.cached.move_to_end(block)
                else:
                    self.free.append(block)
        seq.block_table = []

    def register_full_blocks(self, seq: PagedSequence) -> None:
        """Key every block of ``seq`` that is now full of computed K/V, so later sequences can reuse it."""
        if not self.prefix_caching:
            return
        n_full = min(seq.n_computed, seq.n_tokens) // self.block_size
        while len(seq.block_hashes) < n_full:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
            key = chain_hash(parent, seq.tokens[i * self.block_size : (i + 1) * self.block_size])
            seq.block_hashes.append(key)
            block = seq.block_table[i]
            if key not in self.by_hash and block not in self.hash_of:
                self.by_hash[key] = block
                self.hash_of[block] = key

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (live sequences keep theirs)."""
        for block in list(self.cached):
            self._forget(block)
            self.free.append(block)
        self.cached.clear()

    # --- internals ------------------------------------------------------------------------------------------
    def _match_prefix(self, tokens: list[int]) -> list[tuple[int, bytes]]:
        """Cached blocks for the longest prefix of full blocks, leaving at least one token to compute (its logits
        are what the sequence samples from)."""
        out: list[tuple[int, bytes]] = []
        parent = ROOT_HASH
        for i in range((len(tokens) - 1) // self.block_size):
            key = chain_hash(parent, tokens[i * self.block_size : (i + 1) * self.block_size])
            block = self.by_hash.get(key)
            if block is None:
                break
            out.append((block, key))
            parent = key
        return out

    def _pop_free(self) -> int:
        if self.free:
            return self.free.pop()
        if self.cached:
            block, _ = self.cached.popitem(last=False)  # evict the least recently used cached block
            self._forget(block)
            return block
        raise PoolExhausted("no free KV block")

    def _take(self, block: int) -> int:
        if self.ref_count[block] == 0:
            self.cached.pop(block, None)
        self.ref_count[block] += 1
        return block

    def _forget(self, block: int) -> None:
        key = self.hash_of.pop(block, None)
        if key is not None and self.by_hash.get(key) == block:
            del self.by_hash[key]


class PagedBatch:
    """One forward step over several sequences: the ``cache`` a model's ``forward`` gets.

    ``segments``: ``(sequence, n_rows)`` in row order; segment ``i`` feeds the next ``n_rows`` tokens of its
    sequence, at positions ``n_computed .. n_computed + n_rows - 1``. :attr:`ids` and :attr:`positions` are the
    forward's inputs; :meth:`commit` marks the rows computed once the forward pass is done.
    """

    def __init__(self, pool: BlockPool, segments: list[tuple[PagedSequence, int]]):
        self.pool = pool
        self.segments = segments
        ids, positions, bounds = [], [], []
        row = 0
        for seq, n in segments:
            start = seq.n_computed
            if n < 1 or start + n > seq.n_tokens:
                raise GGUFParityError(f"segment of {n} rows at {start} is outside a sequence of {seq.n_tokens}")
            if pool.blocks_for(start + n) > len(seq.block_table):
                raise GGUFParityError(f"positions up to {start + n} exceed the sequence's {len(seq.block_table)} blocks")
            ids.extend(seq.tokens[start : start + n])
            positions.append(np.arange(start, start + n, dtype=np.int64))
            bounds.append((row, row + n))
            row += n
        self.ids = np.asarray(ids, dtype=np.int64)
        self.positions = np.concatenate(positions)
        self.bounds = bounds
        bs = pool.block_size
        tables = [np.asarray(seq.block_table, dtype=np.int64) for seq, _ in segments]
        self.tables = tables
        self.slots = np.concatenate(
            [table[pos // bs] * bs + pos % bs for table, pos in zip(tables, positions)]
        )  # (T,): pool slot of each row
        self._seq_slots = None  # the fused Numba path's slot lists, built on first use and shared by the layers

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    def attend(
        self, b: Backend, il: int, q: Array, k: Array, v: Array, positions: np.ndarray, scale: float, window: int,
        softcap: float = 0.0,
    ) -> Array:
        """Write this step's ``k, v (T, n_head_kv, d)`` of layer ``il`` into the pool, then attend each segment's
        query rows over its own sequence: ``(T, n_head * d_v)``. ``softcap``: Gemma 2's score soft-capping."""
        pool = self.pool
        pool.k[il][self.slots] = k  # NumPy rounds to the buffer's dtype (F16: nearest even, as ggml's cpy)
        pool.v[il][self.slots] = v
        if b.name == "numba" and pool.k[il].dtype in (np.float32, np.float16) and not softcap:
            return self._attend_numba(b, il, q, positions, scale, window)
        k_blocks, v_blocks = pool.k_blocks[il], pool.v_blocks[il]
        outs = []
        for (r0, r1), table in zip(self.bounds, self.tables):
            kv_len = int(positions[r1 - 1]) + 1
            n_blk = pool.blocks_for(kv_len)
            ks = k_blocks[table[:n_blk]].reshape(-1, *k_blocks.shape[2:])  # (n_blk * bs, n_head_kv, d_k)
            vs = v_blocks[table[:n_blk]].reshape(-1, *v_blocks.shape[2:])
            args = (q[r0:r1], ks, vs, positions[r0:r1], kv_len, scale, window)
            outs.append(b.attention(*args, softcap) if softcap else b.attention(*args))
        return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=0)

    def _attend_numba(self, b: Backend, il: int, q: Array, positions: np.ndarray, scale: float, window: int):
        """Every segment in one Numba call that reads K/V in the pool where they are (no gathered copies)."""
        from inference_engine.backends.numba_kernels.ops.paged_attention import paged_attention

        if self._seq_slots is None:
            bs = self.pool.block_size
            lists = []
            for (r0, r1), table in zip(self.bounds, self.tables):
                kv = np.arange(int(positions[r1 - 1]) + 1)
                lists.append(table[kv // bs] * bs + kv % bs)  # pool row of each position of the sequence
            starts = np.cumsum([0] + [len(x) for x in lists[:-1]]).astype(np.int64)
            rows = np.repeat(np.arange(len(lists)), [r1 - r0 for r0, r1 in self.bounds]).astype(np.int64)
            self._seq_slots = (np.concatenate(lists).astype(np.int64), starts, rows)
        slots, starts, rows = self._seq_slots
        k_pool, v_pool = self.pool.k[il], self.pool.v[il]
        q = np.ascontiguousarray(q, dtype=np.float32)
        out = np.empty((q.shape[0], q.shape[1] * v_pool.shape[2]), np.float32)
        paged_attention(q, k_pool.view(np.uint8).reshape(k_pool.shape[0], -1),
                        v_pool.view(np.uint8).reshape(v_pool.shape[0], -1), slots, starts, rows,
                        np.asarray(positions, dtype=np.int64), np.float32(scale), int(window), b.numerics == "ggml",
                        ggml_simd() == "avx512", k_pool.dtype == np.float16, out)
        return out

    def commit(self) -> None:
        """The forward pass wrote every row: advance each sequence and key its newly full blocks."""
        for seq, n in self.segments:
            seq.n_computed += n
            self.pool.register_full_blocks(seq)
