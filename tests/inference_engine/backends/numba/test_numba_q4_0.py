"""Q4_0 as llama.cpp multiplies a model's Q4_0: repacked at load where its rows are a multiple of 8, then its gemv /
gemm at every token count (per block ``fma(float((q - 8) . y), d_w * d_y, acc)``, one accumulator an output), and
``vec_dot`` elsewhere. On AVX-512 VNNI and AVX2 the one-token mat-vec takes the gemv's order for those weights (four
rows a step); on AVX-512 VNNI a batch below ktiles' threshold takes one mat-vec per token too: llama.cpp's values at
every token count (on AVX2 the 4-token tiles, faster there, keep ``vec_dot``'s order from 4 to 11 tokens). Other
CPUs keep ``vec_dot``'s order (test_numba_intdot.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_intdot import X86
from test_numba_kernels import random_activation, random_weight
from test_numba_ktiles import use_lowering

from inference_engine.backends.numba_kernels import dispatch, ktiles
from inference_engine.backends.numba_kernels.isa import simd, zmm
from inference_engine.backends.numba_kernels.ops import activations
from inference_engine.backends.numba_kernels.types import q4_0

VNNI = ktiles.compiled_target() == "avx512_vnni"
GEMV_ORDER = ktiles.compiled_target() in ("avx512_vnni", "avx2")  # where the one-token mat-vec takes it
needs_x86 = pytest.mark.skipif(not X86, reason="the integer kernels are llama.cpp's x86 values bit for bit")


def one_token(w, x):
    yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
    out = np.full(w.n_out, np.nan, np.float32)  # a row left unwritten stays NaN
    w.kernels.matvec_int(w.rows, yq[0], yd[0], ya[0], out)
    return out


@needs_x86
@pytest.mark.parametrize("shape", [(8, 32), (40, 7 * 256), (64, 1536), (37, 256), (12, 512)])
def test_one_token_is_llamacpps_value(shape, rng, oracle):
    """Rows a multiple of 8 on AVX-512 VNNI and AVX2: the repacked gemv (ggml's mul_mat, weight in the CPU_REPACK
    buffer); other row counts, and other CPUs: vec_dot."""
    n_out, n_in = shape
    w, rows = random_weight(T.Q4_0, n_out, n_in, rng)
    repacked = GEMV_ORDER and n_out % q4_0.REPACKED_ROWS == 0
    assert dispatch.repacked_order(w) == (VNNI and n_out % q4_0.REPACKED_ROWS == 0)  # batches: see the docstring
    for scale in (1e-3, 1.0, 50.0):
        x = random_activation(rng, 1, n_in, scale)
        reference = (
            oracle.mul_mat(T.Q4_0, rows, x, repacked=True)[0] if repacked else oracle.matmul(T.Q4_0, rows, x)[0]
        )
        np.testing.assert_array_equal(one_token(w, x), reference, err_msg=f"{shape}, scale {scale}")


@pytest.mark.skipif(not VNNI, reason="the repacked gemv's order is taken on AVX-512 VNNI only")
def test_every_token_count_is_llamacpps_repacked_value(rng, oracle):
    """dispatch.matmul, ggml numerics: one mat-vec per token below ktiles' threshold, ktiles from it; both the
    repacked gemv / gemm's values, at every count (the 4-token tiles, vec_dot's values, are not used)."""
    w, rows = random_weight(T.Q4_0, 40, 3 * 256, rng)
    first = dispatch.KTILED_MIN_TOKENS["avx512_vnni"][T.Q4_0]
    for n_tokens in (1, 2, 3, 4, first, first + 1, 17):
        assert dispatch.int_kernel_for(w, n_tokens) == ("matvec" if n_tokens < first else "ktiled")
        x = random_activation(rng, n_tokens, w.n_in, 10.0)
        np.testing.assert_array_equal(
            dispatch.matmul(w, x, "ggml"), oracle.mul_mat(T.Q4_0, rows, x, repacked=True), err_msg=f"T={n_tokens}"
        )


def _fused(rng, *row_counts):
    tensors = [(f"w{i}", T.Q4_0, random_weight(T.Q4_0, n, 256, rng)[1], (n, 256)) for i, n in enumerate(row_counts)]
    (fused,) = dispatch.pack_matrices(tensors)
    return fused


def test_a_fused_q4_0_run_is_exact_only_where_its_parts_are_repacked_alike(rng, monkeypatch):
    """A fused matrix of rows 12 + 12 would be a multiple of 8 where neither part is: its one pass would take the
    repacked order for rows llama.cpp multiplies by vec_dot, so the parts go one by one."""
    monkeypatch.setattr(dispatch, "matvec_family", lambda features=None: "int8")
    assert dispatch.fused_is_exact(_fused(rng, 8, 16), "ggml")
    assert dispatch.fused_is_exact(_fused(rng, 12, 13), "ggml")
    assert not dispatch.fused_is_exact(_fused(rng, 12, 12), "ggml")
    assert not dispatch.fused_is_exact(_fused(rng, 8, 16), "f32")


def _compile_block_steps():
    """A fresh, uncached function over the repacked order's steps (so the test's lowering applies)."""

    @njit
    def steps(w0, w1, w2, w3, yq, starts, out_int, out_first):
        lo, hi = zmm.offset_nibble_dots(w0, w1, w2, w3, 0, yq, 0, starts, 0)
        sums = zmm.block_sums(lo, hi)
        zmm.istore16(out_int, 0, lo)
        zmm.istore16(out_int, 16, hi)
        zmm.istore16(out_int, 32, sums)
        zmm.store_first_lanes(out_first, 0, zmm.fma_lanes(simd.vsplat(np.float32(1.0)), sums, simd.vzero()))

    return steps


@pytest.mark.parametrize("lowering", ["target", "avx2", "portable"])
def test_repacked_order_steps_on_every_lowering(lowering, rng, monkeypatch):
    """offset_nibble_dots gives each row's lanes of ``(q - 8) . y`` from their ``-8 sum4(y)`` start values,
    block_sums each row's whole-block sum in its four lanes, store_first_lanes one value a row: through
    ``vpdpbusd`` (AVX-512 VNNI targets) and the portable IR (the target's features hidden); nibbles 0 / 15,
    activations +-127."""
    use_lowering(monkeypatch, lowering)  # avx2: vpmaddubsw + vpmaddwd, as on an AVX2 CPU
    steps = _compile_block_steps()
    for _ in range(5):
        rows = [rng.integers(0, 256, 16, dtype=np.uint8) for _ in range(4)]
        rows[0][:2] = [0x00, 0xFF]
        y = rng.integers(-127, 128, 32).astype(np.int8)
        y[:2] = [-127, 127]
        sum4 = y.astype(np.int32).reshape(8, 4).sum(1)
        out_int, out_first = np.empty(48, np.int32), np.empty(4, np.float32)
        steps(*rows, y.view(np.uint8), (-8 * sum4).astype(np.int32), out_int, out_first)
        for r, row in enumerate(rows):
            q = np.concatenate([row & 15, row >> 4]).astype(np.int32) - 8  # the block's 32 signed nibbles
            lanes = (q * y.astype(np.int32)).reshape(8, 4).sum(1)
            np.testing.assert_array_equal(out_int[4 * r : 4 * r + 4], lanes[:4])
            np.testing.assert_array_equal(out_int[16 + 4 * r : 16 + 4 * r + 4], lanes[4:])
            np.testing.assert_array_equal(out_int[32 + 4 * r : 32 + 4 * r + 4], [lanes.sum()] * 4)
            assert out_first[r] == np.float32(lanes.sum())
    if lowering == "target" and VNNI:
        assert "vpdpbusd" in steps.inspect_asm(steps.signatures[0])
    if lowering == "avx2" and X86:
        assert "vpmaddubsw" in steps.inspect_asm(steps.signatures[0])
