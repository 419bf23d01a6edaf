"""The paged KV cache and the batch runner: several sequences per forward give each sequence's own logits.

The reference is :class:`OurEngine` (one sequence, a contiguous cache) on the same tiny fixture model: every
sequence of a batch, at its own length, must get the logits it gets alone, after a prefill split into chunks that
share forward passes with other sequences' decode rows, and when its prompt's first blocks come from the prefix
cache. Tiny models of every architecture, gemma3's sliding-window layers included (window 4 over prompts longer
than 4).
"""

from __future__ import annotations

import numpy as np
import pytest

from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.paged_kv_cache import BlockPool, PoolExhausted
from inference_engine.server.runner import BatchRunner

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")

# Same derivation as test_engine.PREFILL_DECODE_RTOL: a batch of several sequences runs the same math per row, and
# the only thing allowed to differ from the one-sequence engine is float32 summation order between BLAS's
# matrix-matrix (many rows) and matrix-vector (one row) products, ~1e-7 relative per op, a few 1e-6 of the logit
# scale after the tiny models' layers. A row attending to the wrong sequence, a misplaced block or a wrong position
# moves logits by O(1) of their scale.
BATCHED_RTOL = 1e-5
THREADS = 1  # the tiny models' matrices are too small to share; BLAS's spinning threads only slow a busy machine
BLOCK_SIZE = 4  # small blocks so that the tiny prompts span several blocks, partial last blocks included


def random_ids(n_vocab: int, n: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).integers(3, n_vocab, n)]


def alone(path, prompt: list[int], next_token: int, backend: str = "numpy") -> tuple[np.ndarray, np.ndarray]:
    """(last prompt logits, logits after one decode of ``next_token``) from the one-sequence engine."""
    engine = OurEngine(path, backend=backend, numerics="f32", n_ctx=64, kv_type="f32", n_threads=THREADS)
    return engine.prefill(prompt), engine.decode(next_token)


def close(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(a, b, rtol=0, atol=BATCHED_RTOL * float(np.abs(b).max()))


@pytest.mark.parametrize(
    "arch,qtype,backend",
    [(a, "F32", "numpy") for a in ARCHS]
    # whole tiny models on numba: JIT-compiling its matmul kernels takes tens of seconds on a cold cache
    + [pytest.param("llama", "Q8_0", "numba", marks=pytest.mark.slow),
       pytest.param("gemma3", "F32", "numba", marks=pytest.mark.slow)],
)
def test_batched_steps_give_each_sequence_its_own_logits(tiny_model, arch, qtype, backend):
    path = tiny_model(arch, qtype)
    runner = BatchRunner(path, backend=backend, n_ctx=64, n_blocks=32, block_size=BLOCK_SIZE, n_threads=THREADS)
    prompts = [random_ids(runner.n_vocab, n, seed) for n, seed in ((5, 1), (9, 2), (14, 3))]
    nexts = [7, 11, 13]
    seqs = [runner.pool.allocate(p, len(p) + 1) for p in prompts]
    # step 1: sequence 0 whole, sequence 1 its first chunk of 6; step 2: sequence 1's rest with sequence 2's
    # first 8; step 3: sequence 2's rest. Then one decode step with all three rows.
    prefill_logits = {}
    (l0, _) = runner.step([(seqs[0], 5, False), (seqs[1], 6, False)])
    prefill_logits[0] = l0[-1]
    (l1, _) = runner.step([(seqs[1], 3, False), (seqs[2], 8, False)])
    prefill_logits[1] = l1[-1]
    (l2,) = runner.step([(seqs[2], 6, False)])
    prefill_logits[2] = l2[-1]
    for seq, t in zip(seqs, nexts):
        seq.tokens.append(t)
    decoded = runner.step([(seq, 1, False) for seq in seqs])
    for i, (prompt, t) in enumerate(zip(prompts, nexts)):
        ref_prefill, ref_decode = alone(path, prompt, t, backend)
        close(prefill_logits[i], ref_prefill)
        close(decoded[i][0], ref_decode)
    for seq in seqs:
        runner.pool.release(seq)
    assert runner.pool.n_in_use == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_rows_logits_equal_a_capture(tiny_model, arch):
    path = tiny_model(arch)
    runner = BatchRunner(path, n_ctx=64, n_blocks=16, block_size=BLOCK_SIZE, n_threads=THREADS)
    prompt = random_ids(runner.n_vocab, 11, 4)
    seq = runner.pool.allocate(prompt, len(prompt))
    first, = runner.step([(seq, 6, True)])
    rest, = runner.step([(seq, 5, True)])
    ref = OurEngine(path, n_ctx=64, n_threads=THREADS).capture(prompt, names=["result_output"])["result_output"]
    close(np.concatenate([first, rest]), ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_prefix_reuse_gives_the_logits_of_no_reuse(tiny_model, arch):
    path = tiny_model(arch)
    runner = BatchRunner(path, n_ctx=64, n_blocks=32, block_size=BLOCK_SIZE, n_threads=THREADS)
    shared = random_ids(runner.n_vocab, 13, 5)
    first = shared + random_ids(runner.n_vocab, 3, 6)
    second = shared + random_ids(runner.n_vocab, 4, 7)
    seq = runner.pool.allocate(first, len(first))
    runner.step([(seq, len(first), False)])
    runner.pool.release(seq)
    assert runner.pool.n_in_use == 0 and runner.pool.n_cached == 4  # 16 tokens = 4 full blocks, kept for reuse

    reused = runner.pool.allocate(second, len(second) + 1)
    assert reused.n_cached == reused.n_computed == 12  # the 3 full blocks of the shared 13 tokens
    (logits,) = runner.step([(reused, len(second) - reused.n_computed, False)])
    reused.tokens.append(9)
    (after,) = runner.step([(reused, 1, False)])
    ref_prefill, ref_decode = alone(path, second, 9)
    close(logits[0], ref_prefill)
    close(after[0], ref_decode)
    assert runner.pool.hit_tokens == 12


def test_pool_refuses_what_it_cannot_hold_and_evicts_cached_blocks(tiny_model):
    runner = BatchRunner(tiny_model("llama"), n_ctx=16, n_blocks=4, block_size=BLOCK_SIZE, n_threads=THREADS)
    pool = runner.pool
    a = pool.allocate(list(range(3, 11)), 12)  # 3 blocks
    with pytest.raises(PoolExhausted):
        pool.allocate([3, 4], 8)  # 2 blocks, 1 free
    assert pool.n_in_use == 3  # a refusal takes nothing
    runner.step([(a, 8, False)])
    pool.release(a)
    assert (pool.n_in_use, pool.n_cached) == (0, 2)  # the two full blocks stay cached
    b = pool.allocate(list(range(20, 36)), 16)  # needs all 4 blocks: the cached ones are evicted
    assert pool.n_in_use == 4 and pool.n_cached == 0 and b.n_cached == 0
    pool.release(b)
    assert pool.n_in_use == 0


def test_pool_needs_numpy_buffers(tiny_model):
    class NotNumpy:
        name = "fake"

        def kv_alloc(self, n, h, d, kv_type):
            return [[0.0]]

    with pytest.raises(GGUFParityError, match="supported: numpy, numba"):
        BlockPool(NotNumpy(), [(1, 4, 4)], 4, 4)


def test_runner_refuses_a_pool_smaller_than_one_context(tiny_model):
    with pytest.raises(GGUFParityError, match="cannot hold one sequence"):
        BatchRunner(tiny_model("llama"), n_ctx=64, n_blocks=2, block_size=BLOCK_SIZE, n_threads=THREADS)


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
@pytest.mark.parametrize("numerics", ["f32", "ggml"])
def test_numba_paged_kernel_equals_its_one_sequence_attention_bit_for_bit(tiny_model, numerics, kv_type):
    """The fused kernel against the numba backend's own attention op over each sequence's gathered blocks."""
    from inference_engine.paged_kv_cache import PagedBatch

    runner = BatchRunner(tiny_model("gemma3"), backend="numba", numerics=numerics, n_ctx=64, n_blocks=32,
                         block_size=BLOCK_SIZE, kv_type=kv_type, n_threads=THREADS)
    pool, b = runner.pool, runner.backend
    rng = np.random.default_rng(0)
    seqs = [pool.allocate(random_ids(runner.n_vocab, n, n), n) for n in (3, 9, 14)]
    batch = PagedBatch(pool, [(seqs[0], 3), (seqs[1], 9), (seqs[2], 14)])
    hp = runner.model.hp
    T = batch.n_rows
    q = rng.standard_normal((T, hp.n_head, hp.head_dim_k)).astype(np.float32)
    k = rng.standard_normal((T, hp.n_head_kv, hp.head_dim_k)).astype(np.float32)
    v = rng.standard_normal((T, hp.n_head_kv, hp.head_dim_v)).astype(np.float32)
    for window in (0, 4):
        fused = batch.attend(b, 0, q, k, v, batch.positions, 0.125, window)
        for (r0, r1), table in zip(batch.bounds, batch.tables):
            kv_len = int(batch.positions[r1 - 1]) + 1
            ks = pool.k_blocks[0][table].reshape(-1, *pool.k_blocks[0].shape[2:])
            vs = pool.v_blocks[0][table].reshape(-1, *pool.v_blocks[0].shape[2:])
            alone_out = b.attention(q[r0:r1], ks, vs, batch.positions[r0:r1], kv_len, 0.125, window)
            np.testing.assert_array_equal(fused[r0:r1], alone_out)
