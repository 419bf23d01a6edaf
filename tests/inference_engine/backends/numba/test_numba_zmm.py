"""The 4-row mat-vecs on 512-bit vectors (Q4_1, Q8_0): libggml's values bit for bit, every lowering exact.

On a CPU with AVX-512 VNNI the one-token mat-vecs of these types run :mod:`.zmm`' four-rows-a-step loop; elsewhere
the row loops of :mod:`.intdot` (covered by test_numba_intdot.py). Here: any row count (the last step overlaps the
one before it), the integer steps against plain integer arithmetic through the x86 intrinsics and through the
portable IR other targets get, and the choice by compile target.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_intdot import X86, assert_matches_libggml
from test_numba_kernels import dequantized, random_activation, random_weight

from inference_engine.backends.numba_kernels import activations, intdot, zmm
from inference_engine.cpu_features import cpu_features

N_IN = 576  # SmolLM2's width: 18 blocks a row
ZMM_VNNI = {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_features().flags


@pytest.mark.parametrize("n_out", [1, 3, 4, 5, 7, 8, 13, 64])
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_quad_matvec_is_libggml_bit_for_bit_for_any_row_count(qtype, n_out, rng, oracle):
    w, rows = random_weight(qtype, n_out, N_IN, rng)
    k = w.kernels
    for scale in (1e-3, 1.0, 50.0):
        x = random_activation(rng, 1, N_IN, scale)
        yq, yd, ya = activations.quantize_int(x, k.int_activation)
        out = np.full(n_out, np.nan, np.float32)
        k.matvec_int(w.rows, yq[0], yd[0], ya[0], out)
        xv, _ = activations.prepare(x, "ggml", k.vec_dot_type, k.sub)
        assert_matches_libggml(out, oracle.matmul(qtype, rows, x)[0], dequantized(qtype, rows), xv)


def _compile_dots():
    """A fresh, uncached function, so that it is compiled under whatever lowering the test has set up."""

    @njit
    def dots(w0, w1, w2, w3, yq, corr, out):
        lo, hi = zmm.nibble_dots(w0, w1, w2, w3, 0, yq, 0)
        slo, shi = zmm.signed_dots(w0, w1, w2, w3, 0, yq, 0, corr, 0)
        for i, v in enumerate((lo, hi, slo, shi)):
            zmm.istore16(out, 16 * i, v)

    return dots


def _reference_dots(rows, y):
    """Per row r: lanes 4r..4r+3 of lo / hi as the 8 lanes of ``dot4`` split in halves, for the low and high
    nibbles of the first 16 bytes (Q4) and for the 32 bytes as signed weights (Q8_0)."""
    ys = y.view(np.int8).astype(np.int32)
    out = np.zeros((4, 16), np.int32)
    for r, row in enumerate(rows):
        nib = np.concatenate([row[:16] & 15, row[:16] >> 4]).astype(np.int32)
        q4 = (nib * ys).reshape(8, 4).sum(1)
        q8 = (row.view(np.int8).astype(np.int32) * ys).reshape(8, 4).sum(1)
        out[0, 4 * r : 4 * r + 4], out[1, 4 * r : 4 * r + 4] = q4[:4], q4[4:]
        out[2, 4 * r : 4 * r + 4], out[3, 4 * r : 4 * r + 4] = q8[:4], q8[4:]
    return out.reshape(-1)


@pytest.mark.parametrize("lowering", ["target", "portable"])
def test_quad_integer_steps_on_every_lowering(lowering, rng, monkeypatch):
    """nibble_dots / signed_dots give the exact integers through ``vpdpbusd`` (AVX-512 VNNI targets) and through the
    portable IR (forced here by hiding the target's features), weights -128 and 127 and activations +-127
    included."""
    if lowering == "portable":
        monkeypatch.setattr(zmm, "target_features", lambda context: frozenset())
    dots = _compile_dots()
    for _ in range(5):
        rows = [rng.integers(0, 256, 32, dtype=np.uint8) for _ in range(4)]
        rows[0][:4] = [0x80, 0x7F, 0xFF, 0x00]
        y = rng.integers(-127, 128, 32).astype(np.int8).view(np.uint8)
        y[:2] = [0x81, 0x7F]
        corr = (-128 * y.view(np.int8).astype(np.int32).reshape(8, 4).sum(1)).astype(np.int32)
        np.testing.assert_array_equal(corr, intdot.q8_corrections(y))
        out = np.empty(64, np.int32)
        dots(*rows, y, corr, out)
        np.testing.assert_array_equal(out, _reference_dots(rows, y))
    asm = dots.inspect_asm(dots.signatures[0])
    if lowering == "target" and ZMM_VNNI:
        assert "vpdpbusd" in asm and "zmm" in asm
    if lowering == "portable":
        assert "vpdpbusd" not in asm


def test_zmm_steps_are_compiled_in_where_the_target_has_avx512_vnni(monkeypatch):
    """``has_zmm_vnni`` is the compile target's: true with AVX-512 F, BW and VNNI, false without (as for an AVX2
    target such as ``NUMBA_CPU_NAME=haswell``)."""

    def compiled():
        @njit
        def flag():
            return zmm.has_zmm_vnni()

        return flag()

    assert compiled() == (ZMM_VNNI and X86)
    monkeypatch.setattr(zmm, "target_features", lambda context: frozenset({"+avx2", "+avx512f", "+avx512bw"}))
    assert compiled() is False
    monkeypatch.setattr(zmm, "target_features",
                        lambda context: frozenset({"+avx2", "+avx512f", "+avx512bw", "+avx512vnni"}))
    assert compiled() is True
