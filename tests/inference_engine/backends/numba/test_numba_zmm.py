"""The 4-row mat-vecs on 512-bit vectors (Q4_1, Q5_0, Q5_1, Q8_0; Q4_0 in test_numba_q4_0.py): libggml's values
bit for bit, every lowering exact.

On a CPU with AVX-512 VNNI the one-token mat-vecs of these types run :mod:`.zmm`' four-rows-a-step loop, on AVX2
those of Q4_0 and Q4_1 (their nibbles multiply exactly through ``vpmaddubsw``); elsewhere the row loops of
:mod:`.intdot` (covered by test_numba_intdot.py). Here: any row count (the last step overlaps the
one before it), the integer steps against plain integer arithmetic through the x86 intrinsics and through the
portable IR other targets get, and the choice by compile target.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_intdot import X86, assert_int_matvec_is_libggml
from test_numba_ktiles import use_lowering

from inference_engine.backends.numba_kernels.isa import zmm
from inference_engine.backends.numba_kernels.isa.simd import vstore
from inference_engine.backends.numba_kernels.types import q8_0
from inference_engine.cpu_features import cpu_features

N_IN = 576  # SmolLM2's width: 18 blocks a row
ZMM_VNNI = {"avx512f", "avx512bw", "avx512_vnni"} <= cpu_features().flags


@pytest.mark.parametrize("n_out", [1, 3, 4, 5, 7, 8, 13, 64])
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0], ids=lambda t: t.name)
def test_quad_matvec_is_libggml_bit_for_bit_for_any_row_count(qtype, n_out, rng, oracle):
    assert_int_matvec_is_libggml(qtype, n_out, N_IN, rng, oracle)


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


@pytest.mark.parametrize("lowering", ["target", "avx2", "portable"])
def test_quad_integer_steps_on_every_lowering(lowering, rng, monkeypatch):
    """nibble_dots / signed_dots give the exact integers through ``vpdpbusd`` (AVX-512 VNNI targets), through
    ``vpmaddubsw`` + ``vpmaddwd`` (AVX2 targets, forced by showing only AVX2's features: the nibbles only, Q8_0's ``w +
    128`` would saturate them and keeps the portable IR) and through the portable IR (forced here by hiding the
    target's features), weights -128 and 127 and activations +-127 included."""
    use_lowering(monkeypatch, lowering)
    dots = _compile_dots()
    for _ in range(5):
        rows = [rng.integers(0, 256, 32, dtype=np.uint8) for _ in range(4)]
        rows[0][:4] = [0x80, 0x7F, 0xFF, 0x00]
        y = rng.integers(-127, 128, 32).astype(np.int8).view(np.uint8)
        y[:2] = [0x81, 0x7F]
        corr = (-128 * y.view(np.int8).astype(np.int32).reshape(8, 4).sum(1)).astype(np.int32)
        np.testing.assert_array_equal(corr, q8_0.q8_corrections(y))
        out = np.empty(64, np.int32)
        dots(*rows, y, corr, out)
        np.testing.assert_array_equal(out, _reference_dots(rows, y))
    asm = dots.inspect_asm(dots.signatures[0])
    if lowering == "target" and ZMM_VNNI:
        assert "vpdpbusd" in asm and "zmm" in asm
    if lowering == "avx2" and X86:
        assert "vpmaddubsw" in asm and "vpdpbusd" not in asm
    if lowering == "portable":
        assert "vpdpbusd" not in asm


def _compile_five_bit_dots():
    """A fresh, uncached function over the Q5_0 step (so the test's lowering applies)."""

    @njit
    def dots(w0, w1, w2, w3, yq, starts, out):
        lo, hi = zmm.offset_five_bit_dots(w0, w1, w2, w3, 4, yq, 0, starts, 0)
        plo, phi = zmm.five_bit_dots(w0, w1, w2, w3, 4, yq, 0)
        for i, v in enumerate((lo, hi, plo, phi)):
            zmm.istore16(out, 16 * i, v)

    return dots


@pytest.mark.parametrize("lowering", ["target", "avx2", "portable"])
def test_five_bit_step_on_every_lowering(lowering, rng, monkeypatch):
    """offset_five_bit_dots: each row's lanes of ``(q - 16) . y`` for Q5_0's quants (the nibbles of ``qs`` plus bit
    ``j`` of the ``qh`` word before them), from the ``-16 sum4(y)`` start values; five_bit_dots (Q5_1) those of ``q .
    y``; through ``vpdpbusd``, AVX2's ``vpmaddubsw`` + ``vpmaddwd`` and the portable IR; quants 0 and 31, activations
    +-127."""
    use_lowering(monkeypatch, lowering)
    dots = _compile_five_bit_dots()
    for _ in range(5):
        rows = [rng.integers(0, 256, 20, dtype=np.uint8) for _ in range(4)]  # qh (4 bytes), qs (16)
        rows[0][:4] = [0xFF, 0xFF, 0x00, 0x00]
        rows[0][4:6] = [0xFF, 0x00]
        y = rng.integers(-127, 128, 32).astype(np.int8)
        y[:2] = [-127, 127]
        sum4 = y.astype(np.int32).reshape(8, 4).sum(1)
        out = np.empty(64, np.int32)
        dots(*rows, y.view(np.uint8), (-16 * sum4).astype(np.int32), out)
        for r, row in enumerate(rows):
            qh = int(row[:4].view("<u4")[0])
            nib = np.concatenate([row[4:] & 15, row[4:] >> 4]).astype(np.int32)
            q = nib | (((qh >> np.arange(32)) & 1) << 4).astype(np.int32)
            for start, offset in ((0, 16), (32, 0)):
                lanes = ((q - offset) * y.astype(np.int32)).reshape(8, 4).sum(1)
                np.testing.assert_array_equal(out[start + 4 * r : start + 4 * r + 4], lanes[:4])
                np.testing.assert_array_equal(out[start + 16 + 4 * r : start + 16 + 4 * r + 4], lanes[4:])
    asm = dots.inspect_asm(dots.signatures[0])
    if lowering == "target" and ZMM_VNNI:
        assert "vpdpbusd" in asm
    if lowering == "avx2" and X86:
        assert "vpmaddubsw" in asm and "vpdpbusd" not in asm


def test_zmm_steps_are_compiled_in_where_the_target_has_avx512_vnni(monkeypatch):
    """``has_zmm_vnni`` is the compile target's: true with AVX-512 F, BW and VNNI, false without (an AVX2 target:
    ``NUMBA_CPU_NAME=haswell`` with ``NUMBA_CPU_FEATURES`` to match; the name alone keeps the host's features)."""

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


def _compile_token_steps():
    """A fresh, uncached function over the two-token steps (so the test's lowering applies)."""

    @njit
    def steps(row, y, k_lo, k_hi, ya0, ya1, out):
        lo, hi = zmm.nibbles_both(row, 0)
        zmm.istore16(out, 0, zmm.scaled_dots(zmm.izero16(), lo, y, 0, k_lo))
        zmm.istore16(out, 16, zmm.scaled_dots2(zmm.izero16(), hi, y, 64, k_lo, k_hi))
        q0, q1, q2, q3 = zmm.q6_quants_both(row, 0, 1)
        acc = zmm.scaled_dots2(zmm.izero16(), q3, y, 0, k_lo, k_hi)
        zmm.istore16(out, 32, zmm.scaled_dots(acc, q0, y, 64, 1))
        zmm.istore16(out, 48, zmm.minus_bsums32(zmm.izero16(), ya0, ya1, 0, row, 192))
        zmm.istore16(out, 64, zmm.scaled_dots(zmm.scaled_dots(zmm.izero16(), q1, y, 0, 1), q2, y, 64, -1))

    return steps


def _reference_token_steps(row, y, k_lo, k_hi, ya0, ya1):
    ys = y.view(np.int8).astype(np.int64)

    def lanes(u, s):
        return (u.astype(np.int64) * s).reshape(16, 4).sum(1)

    scale2 = np.array(([k_lo] * 4 + [k_hi] * 4) * 2)
    nib_lo = np.tile(row[:32] & 15, 2)
    nib_hi = np.tile(row[:32] >> 4, 2)
    ql0, ql1, qh = row[64:96], row[96:128], row[160:192]  # half 1 of a Q6_K super-block at offset 0
    q0 = (ql0 & 15) | ((qh & 3) << 4)
    q1 = (ql1 & 15) | (((qh >> 2) & 3) << 4)
    q2 = (ql0 >> 4) | (((qh >> 4) & 3) << 4)
    q3 = (ql1 >> 4) | ((qh >> 6) << 4)
    sc = row[192:208].view(np.int8).astype(np.int64)
    bsums = np.concatenate([(ya0.astype(np.int64) * sc).reshape(8, 2).sum(1),
                            (ya1.astype(np.int64) * sc).reshape(8, 2).sum(1)])
    return np.concatenate([lanes(nib_lo, ys[:64]) * k_lo, lanes(nib_hi, ys[64:]) * scale2,
                           lanes(np.tile(q3, 2), ys[:64]) * scale2 + lanes(np.tile(q0, 2), ys[64:]),
                           -32 * bsums, lanes(np.tile(q1, 2), ys[:64]) - lanes(np.tile(q2, 2), ys[64:])]
                          ).astype(np.int32)


@pytest.mark.parametrize("lowering", ["target", "portable"])
def test_two_token_steps_on_every_lowering(lowering, rng, monkeypatch):
    """The Q4_K / Q6_K prefill steps (unpack into both halves, scaled dot products, Q6_K's block-sum offset) give
    plain integer arithmetic's values through AVX-512 BW / VNNI and through the portable IR other targets compile
    (the kernels that use them are compiled everywhere, run only where ``has_zmm_vnni``)."""
    if lowering == "portable":
        monkeypatch.setattr(zmm, "target_features", lambda context: frozenset())
    steps = _compile_token_steps()
    for _ in range(5):
        row = rng.integers(0, 256, 210, dtype=np.uint8)
        y = rng.integers(-127, 128, 128).astype(np.int8).view(np.uint8)
        ya0, ya1 = (rng.integers(-2032, 2033, 16).astype(np.int16) for _ in range(2))
        k_lo, k_hi = int(rng.integers(-128, 128)), int(rng.integers(0, 64))
        out = np.empty(80, np.int32)
        steps(row, y, k_lo, k_hi, ya0, ya1, out)
        np.testing.assert_array_equal(out, _reference_token_steps(row, y, k_lo, k_hi, ya0, ya1))
    asm = steps.inspect_asm(steps.signatures[0])
    if lowering == "target" and ZMM_VNNI:
        assert "vpdpwssd" in asm or "vpmaddwd" in asm
    if lowering == "portable":
        assert "vpmaddubsw" not in asm and "vpdpwssd" not in asm


@pytest.mark.skipif(not ZMM_VNNI or not X86, reason="an AVX2 build is checked in a child process on an AVX-512 x86 CPU "
                    "(on an AVX2 machine the tests above run it directly)")
def test_quad_matvecs_compiled_for_avx2_give_llamacpps_values(rng, oracle, tmp_path):
    """The one-token mat-vecs compiled for an AVX2 target (a fresh process, Numba's CPU set to Haswell): Q4_0 four
    rows a step in the repacked gemv's order (llama.cpp's mul_mat on the repacked weight, as a model holds it), Q4_1
    four rows a step in ``vec_dot``'s (its plain mul_mat), IQ4_NL a row at a time in the repacked gemv's order (its
    four-row step, AVX-512 VNNI's, compiled in but not taken), bit for bit, through ``dispatch.matmul`` as decode
    calls it."""
    from test_numba_kernels import random_activation, random_weight
    from test_numba_ktiles import compiled_for_haswell

    cases = {}
    for qtype, (n_out, n_in) in {T.Q4_0: (40, 7 * 256), T.Q4_1: (37, 3 * 256), T.IQ4_NL: (40, 7 * 32)}.items():
        _, rows = random_weight(qtype, n_out, n_in, rng)
        cases[qtype] = rows, np.concatenate([random_activation(rng, 1, n_in, scale) for scale in (1e-3, 1.0, 50.0)])
    for qtype, ours in compiled_for_haswell(tmp_path, "one_token_each", cases).items():
        rows, x = cases[qtype]
        for t in range(len(x)):
            reference = oracle.mul_mat(qtype, rows, x[t : t + 1], repacked=qtype in (T.Q4_0, T.IQ4_NL))[0]
            np.testing.assert_array_equal(ours[t], reference, err_msg=f"{qtype.name}, activation {t}")


def test_quad_scales_are_each_rows_half_times_dy(rng):
    """``quad_scales``: lanes 4r..4r+3 hold row r's f16 (as float32) times ``dy`` in one float32 product, bit for bit,
    over every kind of half: normal, subnormal, zero of either sign, infinite, NaN."""

    @njit
    def scales(w0, w1, w2, w3, o, dy, out):
        vstore(out, 0, zmm.quad_scales(w0, w1, w2, w3, o, dy))

    specials = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00, 0x7E01, 0x3C00], np.uint16)
    halves = np.concatenate([specials, rng.integers(0, 1 << 16, 64, dtype=np.uint16)])
    out = np.empty(16, np.float32)
    for i in range(0, len(halves) - 3, 3):
        rows = [np.zeros(8, np.uint8) for _ in range(4)]
        for r in range(4):
            rows[r][3:5] = halves[i + r : i + r + 1].view(np.uint8)
        dy = np.float32(rng.standard_normal())
        scales(*rows, 3, dy, out)
        expected = np.repeat(halves[i : i + 4].view(np.float16).astype(np.float32) * dy, 4)
        np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_prefetches_past_the_l1_budget_go_to_the_l2():
    """Eight Q4_0 rows of 8,960 values ahead (40 KB) go to the L2, eight of 1,536 (7 KB) to the L1."""
    from inference_engine.backends.numba_kernels.isa.simd import PREFETCH_L1_BYTES, far_ahead

    long_rows, short_rows = np.zeros((16, 8960 // 32 * 18), np.uint8), np.zeros((16, 1536 // 32 * 18), np.uint8)
    assert far_ahead(long_rows, 8) and not far_ahead(short_rows, 8)
    assert 8 * short_rows.shape[1] < PREFETCH_L1_BYTES < 8 * long_rows.shape[1]
