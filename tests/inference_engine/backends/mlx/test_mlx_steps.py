"""The MLX backend's launched steps (``backends/mlx/steps.py``): the compiled decode step and the pipelined generation
loop give the plain MLX path's logits and tokens, on tiny models of every architecture, and the NumPy reference's
within the MLX band; the KV cache is updated in place; a model whose forward pass meets the host says why it is not
compiled and still runs. On MLX's CPU build here; the same tests run on a GPU where MLX has one."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import ARCHITECTURES, MOE_ARCHITECTURES
from gguf import GGMLQuantizationType as T

from inference_engine.backends import get_backend_class
from inference_engine.backends import numerics as nx
from inference_engine.backends.base import Backend
from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.generate import ForcedTokens, StepTimings, generate, generate_step
from inference_engine.sampling import Sampler

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
from inference_engine.backends.mlx.steps import KEY_BLOCK, RopeTables, device_rows, rope_key  # noqa: E402

pytestmark = pytest.mark.mlx

# Compiled against the plain MLX path: the same ops on the same arrays; only the attention kernel reads L slots (the
# position's block of KEY_BLOCK, the rest masked) instead of n_past + 1. Measured 0.0 on MLX's CPU build for every
# architecture. 1e-5 of the largest logit allows a GPU kernel to sum those slots in another float32 order (one
# rounding of values ~1 is 6e-8; a wrong position, mask or cache slot moves logits by O(1)).
STEP_REL_TOL = 1e-5
# The same with an F16 K/V cache: where the two paths' float32 K/V differ by a rounding (a GPU's other summation
# order), a cached value can land on the neighbouring F16 value, one F16 ulp (4.9e-4 relative) instead of a float32
# one: a float32 difference of ~1e-6 relative flips ~0.2% of them.
# Measured on MLX's CPU build (tiny llama and gemma3, Q8_0): one F16 ulp on 0.1% of the prompt's cached values moves
# the logits by up to 5.7e-5 .. 6.9e-5 of the largest (1% of them: 1.1e-4 .. 2.1e-4; the F16 cache itself against a
# float32 one: 2.8e-4 .. 5.2e-4); an H200 read 1.7e-5 (gemma3, 2026-11-27); a wrong slot or mask moves them by O(1).
F16_STEP_REL_TOL = 1e-4
# Against the NumPy reference: the MLX backend's own band (test_mlx_engine.py: measured 0.5e-6 .. 2.5e-6).
LOGITS_REL_TOL = 1e-4

PROMPT = list(range(3, 15))  # past gemma3 fixtures' sliding window of 4: decode masks matter
DECODE = [20, 7, 33, 101]
DENSE = [a for a in ARCHITECTURES if a not in MOE_ARCHITECTURES]


def engine(path, mode: str, n_ctx: int = 64, kv_type: str = "f32", backend: str = "mlx") -> OurEngine:
    e = OurEngine(path, backend=backend, numerics="f32", n_ctx=n_ctx, kv_type=kv_type)
    if backend == "mlx":
        e.backend.step_mode = mode
    return e


def logits_rows(e: OurEngine, prompt=PROMPT, decode=DECODE) -> np.ndarray:
    return np.stack([e.prefill(prompt)] + [e.decode(t) for t in decode])


def rel(got: np.ndarray, expected: np.ndarray) -> float:
    assert got.shape == expected.shape and np.all(np.isfinite(got))
    return float(np.abs(got - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_compiled_steps_give_the_plain_paths_logits(tiny_model, arch):
    path = tiny_model(arch, "Q4_K")
    plain = logits_rows(engine(path, "sync"))
    for mode in ("compiled", "lazy"):
        e = engine(path, mode)
        assert rel(logits_rows(e), plain) <= STEP_REL_TOL, mode
    assert rel(plain, logits_rows(engine(path, "numpy", backend="numpy"))) <= LOGITS_REL_TOL
    steps = engine(path, "compiled").async_steps()
    steps.decode(5)  # one step, so that the trace ran
    if arch in MOE_ARCHITECTURES:  # the routing reads the router's logits on the host
        assert not steps.compiled and "cannot be traced" in steps.why_not_compiled
    else:
        assert steps.compiled and steps.traces == 1, steps.why_not_compiled


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "Q6_K"])
def test_token_rows_on_the_device_are_the_host_rows(tiny_model, qtype):
    """The embedding looked up on the device (tied output matrix or token_embd prepared alone) is exactly the
    host's dequantized row, for each storage form (F16 and Q6_K: float32 here, Q8_0: MLX affine)."""
    for untied in (False, True):
        e = engine(tiny_model("qwen2", qtype, untied=untied), "compiled")
        steps = e.async_steps()
        ids = np.array([0, 7, 250], dtype=np.int64)
        host = np.asarray(e.model.token_embd(ids))
        got = np.asarray(device_rows(steps.table, mx.array(ids.astype(np.int32))))
        np.testing.assert_array_equal(got, host)
        assert (steps.table is e.model.output) == (not untied)  # a tied output is not copied


def test_rope_tables_hold_ggmls_angles_row_by_row():
    """The device table a prefill slices and a compiled step indexes: row p is ggml's angles of position p alone,
    whenever the table grew to hold it."""
    key = rope_key(n_dims=64, freq_base=1e6, neox=True)
    tables = RopeTables()
    tables.rows(key, 5)  # one block of KEY_BLOCK rows
    cos, sin = tables.rows(key, KEY_BLOCK + 44)  # grown by another block: rows KEY_BLOCK.. computed apart
    assert cos.shape == sin.shape == (KEY_BLOCK + 44, 32)
    for p in (0, 4, 5, KEY_BLOCK - 1, KEY_BLOCK, KEY_BLOCK + 43):
        c, s = nx.rope_cos_sin(np.array([p]), 64, 1e6)
        np.testing.assert_array_equal(np.asarray(cos[p]), c[0])
        np.testing.assert_array_equal(np.asarray(sin[p]), s[0])


def test_prefill_rope_is_the_tables_rows_and_other_positions_are_computed(tiny_model):
    backend = engine(tiny_model("qwen2", "Q8_0"), "compiled").backend
    args = {"n_dims": 64, "freq_base": 1e6, "freq_scale": 1.0, "freq_factors": None}
    for positions in (np.arange(3, 20), np.array([7, 2, 9])):  # a run of one sequence; rows of several (a batch)
        cos, sin = backend._rope_angles(positions, **args)
        c, s = nx.rope_cos_sin(positions, 64, 1e6)
        np.testing.assert_array_equal(np.asarray(cos)[:, 0], c)
        np.testing.assert_array_equal(np.asarray(sin)[:, 0], s)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_steps_across_key_blocks(tiny_model, arch):
    """Positions on both sides of a block of KEY_BLOCK slots: one trace per block, the plain path's logits."""
    path = tiny_model(arch, "Q8_0")
    prompt = [3 + i % 200 for i in range(KEY_BLOCK - 3)]
    decode = [20, 7, 33, 101, 9, 4]  # positions KEY_BLOCK - 3 .. KEY_BLOCK + 2
    plain = logits_rows(engine(path, "sync", n_ctx=KEY_BLOCK + 8), prompt, decode)
    e = engine(path, "compiled", n_ctx=KEY_BLOCK + 8)
    assert rel(logits_rows(e, prompt, decode), plain) <= STEP_REL_TOL
    assert e.async_steps().traces == 2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_f16_kv_cache(tiny_model, arch):
    path = tiny_model(arch, "Q8_0")
    plain = logits_rows(engine(path, "sync", kv_type="f16"))
    assert rel(logits_rows(engine(path, "compiled", kv_type="f16")), plain) <= F16_STEP_REL_TOL


@pytest.mark.parametrize("kv_write", ["slice", "scatter"])
def test_kv_cache_is_updated_in_place(tiny_model, kv_write):
    """A compiled step writes its K/V row into the cache's buffers (either way of writing it): it allocates far less
    than one buffer (a copy of the cache per token would allocate all of them)."""
    e = engine(tiny_model("qwen2", "Q8_0"), "compiled", n_ctx=8192)
    e.backend.kv_write = kv_write
    buffer_bytes = e.cache.k[0].nbytes  # (n_head_kv, n_ctx, head_dim) float32
    e.prefill(PROMPT)
    for t in DECODE:
        e.decode(t)
    mx.eval(e.cache.k, e.cache.v)
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    e.decode(5)
    assert mx.get_peak_memory() - before < buffer_bytes / 4
    assert e.async_steps().compiled


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_kv_rows_scattered_are_the_rows_sliced_in(tiny_model, kv_type):
    """kv_write "scatter" (mx.put_along_axis) moves the same values as "slice" (mx.slice_update): the same logits bit
    for bit and the same cache; its graph has a ScatterAxis where the other has a DynamicSliceUpdate."""
    from bench_compare.step_profile import graph_nodes

    path = tiny_model("qwen2", "Q8_0")
    sliced = engine(path, "compiled", kv_type=kv_type)
    scattered = engine(path, "compiled", kv_type=kv_type)
    scattered.backend.kv_write = "scatter"
    np.testing.assert_array_equal(logits_rows(scattered), logits_rows(sliced))
    for a, b in zip(scattered.cache.k + scattered.cache.v, sliced.cache.k + sliced.cache.v, strict=True):
        np.testing.assert_array_equal(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)))
    assert "K/V rows written by scatter" in scattered.backend.description
    kinds = [graph_nodes(*e.async_steps().decode(5, launch=False).outputs()) for e in (scattered, sliced)]
    n_layer = len(sliced.cache.k)
    assert (kinds[0]["ScatterAxis"], kinds[0]["DynamicSliceUpdate"]) == (2 * n_layer, 0)
    assert (kinds[1]["ScatterAxis"], kinds[1]["DynamicSliceUpdate"]) == (0, 2 * n_layer)


def test_an_unknown_kv_write_is_one_line(tiny_model):
    e = engine(tiny_model("llama", "Q8_0"), "compiled")
    e.backend.kv_write = "memcpy"
    with pytest.raises(GGUFParityError, match="unknown MLX K/V write 'memcpy'; supported: slice, scatter"):
        e.async_steps()


@pytest.mark.parametrize("mode", ["compiled", "lazy"])
def test_generation_loop_matches_the_plain_loop(tiny_model, mode):
    """generate_step over launched steps: the same greedy tokens and logits, the same cache position when the caller
    stops, the same step counts, and the same stop at a full context."""
    path = tiny_model("gemma3", "Q4_K")
    plain, launched = engine(path, "sync", n_ctx=40), engine(path, mode, n_ctx=40)
    for stop in (1, 2, 9):
        runs = []
        for e in (plain, launched):
            timings = StepTimings()
            got = []
            for token, logits in generate_step(e, PROMPT, timings=timings):
                got.append((token, logits.copy()))
                if len(got) == stop:
                    break
            runs.append((got, e.n_past, timings.decode_steps))
        (want, want_past, want_steps), (got, got_past, got_steps) = runs
        assert [t for t, _ in got] == [t for t, _ in want]
        assert max(rel(g, w) for (_, g), (_, w) in zip(got, want)) <= STEP_REL_TOL
        assert (got_past, got_steps) == (want_past, want_steps) == (len(PROMPT) + stop - 1, stop - 1)
    full = [[t for t, _ in generate_step(e, PROMPT, Sampler())] for e in (plain, launched)]
    assert full[0] == full[1] and len(full[0]) == 40 - len(PROMPT)  # every position of the context, then it stops
    assert launched.n_past == plain.n_past == 40


def test_forced_tokens_are_all_decoded(tiny_model):
    path = tiny_model("qwen2", "Q4_K")
    counts = []
    for e in (engine(path, "sync"), engine(path, "compiled")):
        e.prefill(PROMPT)
        timings = StepTimings()
        out = [
            t for t, _ in generate_step(e, [], ForcedTokens(DECODE), reset=False, n_past=len(PROMPT), timings=timings)
        ]
        assert out == DECODE
        counts.append((e.n_past, timings.decode_steps, e.decode(5)))
    assert counts[0][:2] == counts[1][:2] == (len(PROMPT) + len(DECODE), len(DECODE))
    assert rel(counts[1][2], counts[0][2]) <= STEP_REL_TOL  # the cache holds the same K/V


def test_generate_text_matches_the_numpy_backend(tiny_model):
    path = tiny_model("llama", "Q8_0")
    results = [generate(engine(path, "compiled", backend=b), PROMPT, max_tokens=12) for b in ("mlx", "numpy")]
    assert results[0].token_ids == results[1].token_ids
    assert results[0].decode_steps == results[1].decode_steps == 11


def test_cpu_backends_run_each_step_to_completion(tiny_model):
    """The NumPy and Numba backends have no launched steps (the base op's None): generate_step keeps its plain loop
    for them."""
    assert engine(tiny_model("qwen2", "Q8_0"), "", backend="numpy").async_steps() is None
    pytest.importorskip("numba")
    assert get_backend_class("numba").async_steps is Backend.async_steps


def test_unknown_step_mode_is_one_line(tiny_model):
    e = engine(tiny_model("qwen2", "Q8_0"), "fast")
    with pytest.raises(GGUFParityError, match="unknown MLX step mode 'fast'; supported: compiled, lazy, sync"):
        e.decode(5)


def test_a_prefill_through_float32_weights_gives_the_same_logits(tiny_model, monkeypatch):
    """prefill_matmul "f32": from PREFILL_F32_MIN_ROWS rows each quantized weight is dequantized and multiplied in
    float32 (the same products in another summation order: STEP_REL_TOL); a decode step keeps the quantized path."""
    from inference_engine.backends import mlx_backend
    from inference_engine.backends.mlx.weights import AffineMatrix

    n = mlx_backend.PREFILL_F32_MIN_ROWS + 6
    prompt = [3 + i % 90 for i in range(n)]
    path = tiny_model("qwen2", "Q4_K")
    quantized = engine(path, "sync", n_ctx=n + 8)
    expected = np.asarray(quantized.prefill(prompt))
    via_f32 = engine(path, "sync", n_ctx=n + 8)
    via_f32.backend.prefill_matmul = "f32"
    calls = []
    dequantized = AffineMatrix.dequantized
    monkeypatch.setattr(AffineMatrix, "dequantized", lambda self: calls.append(self) or dequantized(self))
    got = np.asarray(via_f32.prefill(prompt))
    names = {name for name, w in via_f32.backend.prepared_matrices.items() if any(w is c for c in calls)}
    first_layer = {name for name in via_f32.backend.prepared_matrices if name.startswith("blk.0.")}
    assert first_layer <= names  # every product of all the prompt's rows went through float32 weights
    assert not any(name.startswith(("output", "token_embd")) for name in names)  # the logits: one row
    assert rel(got, expected) <= STEP_REL_TOL
    calls.clear()
    via_f32.decode(5)
    assert calls == []


@pytest.mark.gpu
def test_k_quants_in_their_blocks_give_the_affine_paths_logits(tiny_model, monkeypatch):
    """MLXBackend.block_kernel_types (Q4_K, Q5_K read by our kernels in their GGUF blocks, a layer's Q/K/V and
    gate/up stacked as FusedBlocks): the same weights as MLX's affine form, other float32 summation orders."""
    from inference_engine.backends import mlx_backend

    path = tiny_model("qwen2", "Q4_K")
    affine = logits_rows(engine(path, "compiled"))
    monkeypatch.setattr(mlx_backend.MLXBackend, "block_kernel_types", frozenset({T.Q4_K, T.Q5_K}))
    e = engine(path, "compiled")
    assert any(form.startswith("Q4_K->") and form.endswith("-kernel") for form in e.backend.weight_forms)
    assert "stacked runs" in e.backend.description
    assert rel(logits_rows(e), affine) <= LOGITS_REL_TOL


@pytest.mark.gpu
def test_the_one_threadgroup_a_row_matvec_gives_the_same_logits(tiny_model, monkeypatch):
    """MLXBackend.matvec_scheme "group" (one threadgroup a row) against "simd" on the block matrices (Q6_K's, and
    Q4_K / Q5_K read in their blocks): the same weights, other float32 summation orders."""
    from inference_engine.backends import mlx_backend

    path = tiny_model("qwen2", "Q6_K")
    monkeypatch.setattr(mlx_backend.MLXBackend, "block_kernel_types", frozenset({T.Q4_K, T.Q5_K}))
    simd = logits_rows(engine(path, "compiled"))
    monkeypatch.setattr(mlx_backend.MLXBackend, "matvec_scheme", "group")
    e = engine(path, "compiled")
    assert "block mat-vec: group scheme" in e.backend.description
    assert rel(logits_rows(e), simd) <= LOGITS_REL_TOL


def test_an_unknown_matvec_scheme_is_one_line(tiny_model, monkeypatch):
    from inference_engine.backends import mlx_backend

    monkeypatch.setattr(mlx_backend.MLXBackend, "matvec_scheme", "warp")
    with pytest.raises(GGUFParityError, match="unknown MLX mat-vec scheme 'warp'; supported: simd, group"):
        engine(tiny_model("llama", "Q8_0"), "sync")


@pytest.mark.parametrize("gpu_backend, expected, kernel", [("cuda", "f32", True), ("metal", "quantized", False),
                                                            (None, "quantized", False)])
def test_the_defaults_are_the_ones_measured_faster_there(monkeypatch, gpu_backend, expected, kernel):
    """CUDA prefills through float32 weights (1.8x on an H200: PREFILL_MATMUL_DEFAULTS) and decodes with our attention
    kernel (ATTENTION_KERNEL_DEFAULTS); Metal and the CPU keep MLX's quantized kernels and attention, unmeasured."""
    import dataclasses

    from inference_engine.backends import mlx_backend
    from inference_engine.backends.mlx import device as mlx_device

    select = mlx_device.select
    monkeypatch.setattr(mlx_device, "select", lambda d: dataclasses.replace(select("cpu"), gpu_backend=gpu_backend))
    backend = mlx_backend.MLXBackend()
    assert (backend.prefill_matmul, backend.attention_kernel) == (expected, kernel)


def test_an_unknown_prefill_matmul_is_one_line(tiny_model):
    e = engine(tiny_model("llama", "Q8_0"), "sync")
    with pytest.raises(GGUFParityError, match="unknown MLX prefill matmul 'fast'; supported: quantized, f32"):
        e.backend.prefill_matmul = "fast"
