"""The integer-dot mat-vec kernels (ggml numerics): bit-exact with libggml, the choice by ISA, every lowering.

libggml's x86 build runs the AVX2 ``ggml_vec_dot_*`` code for these types on AVX2 and AVX-512 CPUs alike (the
AVX-512 build only swaps ``vpmaddubsw + vpmaddwd`` for ``vpdpbusd``: the same integers), and our kernels follow its
lanes and float order, so on x86 the outputs are equal bit for bit. On other ISAs libggml sums in another order:
there the comparison is to float summation noise (``SUM_TOL``, as the float kernels).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_kernels import SUM_TOL, dequantized, random_activation, random_weight, summation_error

from bench_compare import untiled_int
from inference_engine.backends.numba_kernels import dispatch
from inference_engine.backends.numba_kernels.isa import int8, simd, zmm
from inference_engine.backends.numba_kernels.ops import activations
from inference_engine.backends.numba_kernels.types import iq4_nl
from inference_engine.cpu_features import CPUFeatures, cpu_features

INT_TYPES = [t for t, k in dispatch.KERNELS.items() if k.matvec_int is not None]
N_OUT, N_IN = 33, 512  # odd: the two-rows-per-iteration kernels must handle a lone last row
X86 = cpu_features().simd_flavour in ("avx2", "avx512")

AVX512_VNNI = CPUFeatures("Test Xeon", "x86_64", frozenset({"avx", "avx2", "fma", "f16c", "avx512f", "avx512dq",
                                                             "avx512bw", "avx512vl", "avx512_vnni"}))
AVX2 = CPUFeatures("Test EPYC", "x86_64", frozenset({"avx", "avx2", "fma", "f16c"}))
NEON = CPUFeatures("Test Arm", "aarch64", frozenset({"asimd", "asimddp"}))
SSE_ONLY = CPUFeatures("Test Core 2", "x86_64", frozenset({"sse4_1"}))
NO_SIMD = CPUFeatures("Test RISC-V", "riscv64", frozenset())


def assert_matches_libggml(y, reference, w_dequantized, xv):
    if X86:
        np.testing.assert_array_equal(y, reference)
    else:  # libggml's NEON / generic code adds the same integer block sums in another float order
        assert summation_error(y, reference, w_dequantized, xv) <= SUM_TOL


def assert_int_matvec_is_libggml(qtype, n_out, n_in, rng, oracle):
    """The type's integer mat-vec on a random ``(n_out, n_in)`` weight, at three activation scales, against
    libggml."""
    w, rows = random_weight(qtype, n_out, n_in, rng)
    k = w.kernels
    for scale in (1e-3, 1.0, 50.0):
        x = random_activation(rng, 1, n_in, scale)
        yq, yd, ya = activations.quantize_int(x, k.int_activation)
        out = np.full(n_out, np.nan, np.float32)
        k.matvec_int(w.rows, yq[0], yd[0], ya[0], out)
        xv, _ = activations.prepare(x, "ggml", k.vec_dot_type, k.sub)
        assert_matches_libggml(out, oracle.matmul(qtype, rows, x)[0], dequantized(qtype, rows), xv)


@pytest.mark.parametrize("qtype", INT_TYPES, ids=lambda t: t.name)
def test_int_matvec_is_libggml_bit_for_bit(qtype, rng, oracle):
    assert_int_matvec_is_libggml(qtype, N_OUT, N_IN, rng, oracle)


@pytest.mark.parametrize("n_tokens", [1, dispatch.MATVEC_MAX_TOKENS])
@pytest.mark.parametrize("qtype", INT_TYPES, ids=lambda t: t.name)
def test_ggml_matmul_takes_the_int_path(qtype, n_tokens, rng, oracle, monkeypatch):
    monkeypatch.setattr(dispatch, "cpu_features", lambda: AVX2)
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, n_tokens, N_IN)
    xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
    assert_matches_libggml(dispatch.matmul(w, x, "ggml"), oracle.matmul(qtype, rows, x), dequantized(qtype, rows), xv)


def test_int_activation_is_ggml_quantization(rng, oracle):
    """yq / yd / the sums are what libggml's quantizers give (the kernels' exactness rests on it)."""
    x = random_activation(rng, 2, N_IN, 3.0)
    yq, yd, ya = activations.quantize_int(x, "q8_0_sum4")
    q = yq.view(np.int8).astype(np.int32)
    np.testing.assert_array_equal(ya, q.reshape(2, -1, 4).sum(-1))
    xv, _ = activations.prepare(x, "ggml", "q8_0", 32)
    np.testing.assert_array_equal(xv, q.astype(np.float32) * np.repeat(yd, 32, axis=1))
    yq, yd, bsums = activations.quantize_int(x, "q8_K")
    np.testing.assert_array_equal(bsums, yq.view(np.int8).astype(np.int32).reshape(2, -1, 16).sum(-1))
    with pytest.raises(ValueError, match="unknown integer activation"):
        activations.quantize_int(x, "q4_0")


@pytest.mark.parametrize(
    "features, family",
    [(AVX512_VNNI, "int8"), (AVX2, "int8"), (NEON, "int8"), (SSE_ONLY, "float"), (NO_SIMD, "float")],
    ids=["avx512-vnni", "avx2", "neon", "sse-only", "no-simd"],
)
def test_family_is_chosen_by_isa_and_each_is_correct(features, family, rng, oracle, monkeypatch):
    """The ISA picks the family; whichever is picked, the result is libggml's (the code it runs here is legal for
    this CPU: lowering follows Numba's compile target, the family only picks which kernels run)."""
    assert dispatch.matvec_family(features) == family
    monkeypatch.setattr(dispatch, "cpu_features", lambda: features)
    for qtype in (T.Q4_K, T.Q8_0):
        w, rows = random_weight(qtype, N_OUT, N_IN, rng)
        x = random_activation(rng, 1, N_IN)
        y = dispatch.matmul(w, x, "ggml")
        reference = oracle.matmul(qtype, rows, x)
        xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
        if family == "int8":
            assert_matches_libggml(y, reference, dequantized(qtype, rows), xv)
        else:
            assert summation_error(y, reference, dequantized(qtype, rows), xv) <= SUM_TOL


# --- the lowerings of the integer steps: x86 intrinsics (this CPU's target) and the portable IR (NEON, others) ----
def _compile_steps():
    """A fresh, uncached function, so that it is compiled under whatever lowering the test has set up."""

    @njit
    def steps(u, a, s, k_lo, k_hi, a16, book, codes, out):
        int8.istore(out, 0, int8.dot4(int8.load32(u, 0), int8.load32(s, 0)))
        int8.istore(out, 8, int8.dot4_signed(int8.load32(a, 0), int8.load32(s, 0)))
        int8.istore(out, 16, int8.dot4_scaled(int8.load32(u, 0), int8.load32(s, 0), k_lo, k_hi))
        int8.istore(out, 24, int8.madd16(a16, 0, s, 0))
        int8.istore(out, 32, int8.dot4_signed_scaled(int8.load32(a, 0), int8.load32(s, 0), k_lo))
        int8.istore(out, 40, int8.dot4_signed(int8.lookup32(book, codes, 0), int8.load32(s, 0)))

    return steps


def _reference_steps(u, a, s, k_lo, k_hi, a16, book, codes):
    ss = s.view(np.int8).astype(np.int32)
    dot = (u.astype(np.int32) * ss).reshape(8, 4).sum(1)
    signed = (a.view(np.int8).astype(np.int32) * ss).reshape(8, 4).sum(1)
    scaled = dot * np.array([k_lo] * 4 + [k_hi] * 4)
    madd = (a16.astype(np.int32) * ss[:16]).reshape(8, 2).sum(1)
    looked_up = book.view(np.int8).astype(np.int32)[np.concatenate([codes & 15, codes >> 4])]
    book_dot = (looked_up * ss).reshape(8, 4).sum(1)
    return np.concatenate([dot, signed, scaled, madd, signed * k_lo, book_dot]).astype(np.int32)


@pytest.mark.parametrize("lowering", ["target", "portable"])
def test_integer_steps_on_every_lowering(lowering, rng, monkeypatch):
    """dot4 / dot4_signed / dot4_scaled / madd16 / dot4_signed_scaled, and lookup32's code-book values, give the
    exact integers through the x86 intrinsics and through the portable IR that NEON and other targets get (forced
    here by hiding the target's features)."""
    if lowering == "portable":
        monkeypatch.setattr(int8, "target_features", lambda context: frozenset())
    steps = _compile_steps()
    for _ in range(5):
        u = rng.integers(0, 64, 32, dtype=np.uint8)  # Q6_K's 6-bit quants: the widest unsigned weights
        u[:4] = [0, 63, 1, 62]
        a = rng.integers(-128, 128, 32).astype(np.int8).view(np.uint8)  # Q8_0 weights, -128 included
        a[:2] = [0x80, 0x7F]
        s = rng.integers(-127, 128, 32).astype(np.int8).view(np.uint8)  # Q8 activations are within +-127
        a16 = rng.integers(-2032, 2033, 16).astype(np.int16)  # |bsums| <= 16 * 127
        codes = rng.integers(0, 256, 16, dtype=np.uint8)  # two 4-bit codes a byte, as IQ4_NL's qs
        out = np.empty(48, np.int32)
        steps(u, a, s, -37, 63, a16, iq4_nl.CODE_BOOK, codes, out)
        np.testing.assert_array_equal(out, _reference_steps(u, a, s, -37, 63, a16, iq4_nl.CODE_BOOK, codes))
    asm = steps.inspect_asm(steps.signatures[0])
    if lowering == "target" and X86:
        assert "vpmaddubsw" in asm or "vpdpbusd" in asm
    if lowering == "target" and X86:
        assert "vpshufb" in asm
    if lowering == "portable":
        assert "vpmaddubsw" not in asm and "vpsignb" not in asm and "vpshufb" not in asm


def _compile_k_scale_steps():
    """Q2_K's and Q3_K's steps: their scale vectors and the dots that take a pair of lanes of them (fresh, uncached,
    compiled under the lowering the test sets up)."""

    @njit
    def steps(u, h, s, block, a16, k, out):
        q2, q3 = int8.low_nibbles16(block, 0), int8.q3_k_scales16(block, 0)  # q3: its 12 scale bytes at 2..13
        int8.istore(out, 0, int8.dot4_scaled_lanes(int8.load32(u, 0), int8.load32(s, 0), q2, k))
        int8.istore(out, 8, int8.dot4_diff_scaled_lanes(int8.load32(u, 0), int8.load32(h, 0), int8.load32(s, 0),
                                                        q3, k))
        int8.istore(out, 16, int8.madd16_high_nibbles(a16, 0, block, 0))
        flipped = int8.bxor8(int8.load32(u, 0), 255)
        int8.istore(out, 24, int8.dot4(int8.band8(flipped, 7), int8.load32(s, 0)))

    return steps


def _q3_k_scales(block):
    """Q3_K's 16 scales minus 32, from its 12 scale bytes (``block[2:14]``), as dequantize_row_q3_K unpacks them."""
    sc = block[2:14].astype(np.int32)
    low = np.concatenate([sc[:8] & 15, sc[:8] >> 4])
    high = np.array([(sc[8 + k % 4] >> (2 * (k // 4))) & 3 for k in range(16)])
    return (low | (high << 4)) - 32


@pytest.mark.parametrize("lowering", ["target", "portable"])
def test_k_quant_scale_steps_on_every_lowering(lowering, rng, monkeypatch):
    """Q2_K / Q3_K's integer steps (scale vectors, a pair of their lanes times a 4-byte dot, Q3_K's difference of
    two dots, Q2_K's mins times block sums) give scalar integer arithmetic's values through the x86 intrinsics and
    through the portable IR."""
    if lowering == "portable":
        monkeypatch.setattr(int8, "target_features", lambda context: frozenset())
    steps = _compile_k_scale_steps()
    for k in (0, 6, 14):
        u = rng.integers(0, 8, 32, dtype=np.uint8)  # Q3_K's low 2 bits (Q2_K's 0..3) with room for the test's 7s
        h = (rng.integers(0, 2, 32) * 4).astype(np.uint8)  # 4 where a Q3_K high bit is clear
        s = rng.integers(-127, 128, 32).astype(np.int8).view(np.uint8)
        block = rng.integers(0, 256, 16, dtype=np.uint8)
        a16 = rng.integers(-2032, 2033, 16).astype(np.int16)
        out = np.empty(32, np.int32)
        steps(u, h, s, block, a16, k, out)
        ss, lane = s.view(np.int8).astype(np.int32), np.arange(8) >= 4
        pick = lambda scales: np.where(lane, scales[k + 1], scales[k])  # noqa: E731
        q2 = (block & 15).astype(np.int32)
        q3 = _q3_k_scales(block)
        expected = np.concatenate([
            (u.astype(np.int32) * ss).reshape(8, 4).sum(1) * pick(q2),
            ((u.astype(np.int32) - h) * ss).reshape(8, 4).sum(1) * pick(q3),
            (a16.astype(np.int32) * (block >> 4)).reshape(8, 2).sum(1),
            (((u ^ 255) & 7).astype(np.int32) * ss).reshape(8, 4).sum(1),
        ])
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("qtype", [t for t in INT_TYPES if t in untiled_int.MATMUL_INT], ids=lambda t: t.name)
def test_int_matmul_equals_the_matvec_per_token(qtype, rng, oracle):
    """The several-token kernel (measured for prefill) gives each token the mat-vec's output bit for bit."""
    w, rows = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, dispatch.MATVEC_MAX_TOKENS + 3, N_IN)
    yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
    together = np.full((x.shape[0], N_OUT), np.nan, np.float32)
    untiled_int.MATMUL_INT[qtype](w.rows, yq, yd, ya, together)
    one_by_one = dispatch.matmul(w, x[:1], "ggml")
    for t in range(1, x.shape[0]):
        one_by_one = np.vstack([one_by_one, dispatch.matmul(w, x[t : t + 1], "ggml")])
    np.testing.assert_array_equal(together, one_by_one)
    np.testing.assert_array_equal(dispatch.matmul_by_int_matvec(w, x), together)
    xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
    assert_matches_libggml(together, oracle.matmul(qtype, rows, x), dequantized(qtype, rows), xv)


@pytest.mark.parametrize("qtype", [t for t in dispatch.KERNELS.names() if dispatch.KERNELS.get(t).matvec_token],
                         ids=lambda t: t.name)
def test_one_token_fast_path_is_the_general_int_path(qtype, rng, monkeypatch):
    """A decode step's matmul (one contiguous token, 1-D or (1, K)) takes matvec_int_one_token (the type's
    ``token_<type>``: quantizer and mat-vec in one call), and gives what matmul_by_int_matvec gives for the same
    token, bit for bit, in the caller's shape."""
    monkeypatch.setattr(dispatch, "cpu_features", lambda: AVX2)
    w, _ = random_weight(qtype, N_OUT, N_IN, rng)
    x = random_activation(rng, 1, N_IN)
    taken = []
    real = dispatch.matvec_int_one_token
    monkeypatch.setattr(dispatch, "matvec_int_one_token", lambda *a: taken.append(1) or real(*a))
    general = dispatch.matmul_by_int_matvec(w, x)
    two_d, one_d = dispatch.matmul(w, x, "ggml"), dispatch.matmul(w, x[0], "ggml")
    assert len(taken) == 2 and two_d.shape == (1, N_OUT) and one_d.shape == (N_OUT,)
    np.testing.assert_array_equal(two_d, general)
    np.testing.assert_array_equal(one_d, general[0])


def test_every_integer_type_has_its_one_token_kernel():
    """A type with an integer mat-vec but no ``token_<type>`` would leave the decode fast path silently."""
    types = dispatch.KERNELS.names()
    assert [t for t in types if dispatch.KERNELS.get(t).matvec_int and not dispatch.KERNELS.get(t).matvec_token] == []


@njit(cache=False)
def _rows_ahead(w, step):
    return simd.rows_ahead(w, step)


@pytest.mark.parametrize("row_bytes", [612, 864, 1632, 5040, 9520])  # Q8_0 576 / 1536 / 8960 wide, Q4_0 1536 / 8960
@pytest.mark.parametrize("step", [1, 2, zmm.ROWS])
def test_prefetch_runs_ahead_of_the_rows_a_step_reads(row_bytes, step):
    """The mat-vec loops prefetch ``rows_ahead`` rows on from the first row of a step: never a row the step itself
    reads (the four-row loops prefetched into their own rows wherever a row was over 1 KB, and streamed from memory at
    half their speed: Q4_0 1536x8960 on one thread 442 -> 245 us), and about ``PREFETCH_BYTES`` ahead where rows are
    short."""
    ahead = _rows_ahead(np.zeros((64, row_bytes), np.uint8), step)
    assert ahead >= step
    assert ahead == max(step, simd.PREFETCH_BYTES // row_bytes)
