"""16 tokens a vector (ktiles): ggml's own ``mul_mat`` bit for bit on AVX-512 VNNI and on AVX2 (its tiled K-quant
mat-mul; its repacked Q4_0 gemm), and everywhere the same integers as the mat-vec, summed in another float order.

Shapes: rows at, past and not a multiple of the 8-row band (8, 37: the last band overlaps the one before; Q4_0: 40,
as llama.cpp repacks only rows a multiple of 8); token counts at ggml's floor (8), past it and not a multiple of the
16-token group (9, 31), two groups (32); rows of one and of seven super-blocks (the float state carried over many
blocks).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from numba import njit
from test_numba_inttiles import per_token_matvec
from test_numba_kernels import dequantized, random_activation, random_weight, summation_error

from inference_engine.backends.numba_kernels import dispatch, ktiles
from inference_engine.backends.numba_kernels.isa import tokens16, zmm
from inference_engine.backends.numba_kernels.isa.zmm import izero16
from inference_engine.backends.numba_kernels.ops import activations

KTILED_TYPES = [t for t, k in dispatch.KERNELS.items() if k.matmul_ktiled is not None]
SHAPES = [(8, 256), (37, 7 * 256)]  # Q4_0, IQ4_NL: 40 rows for 37 (llama.cpp repacks only rows a multiple of 8)
TOKEN_COUNTS = [8, 9, 31, 32]
TARGET = ktiles.compiled_target()
VNNI = TARGET == "avx512_vnni"
# the types the engine sends through ktiles on this compile target (AVX2: not Q4_1 / Q5_1, slower there, nor Q8_0,
# whose quants would saturate vpmaddubsw): where the kernels must be llama.cpp's mul_mat bit for bit
TARGET_TYPES = set(dispatch.KTILED_MIN_TOKENS.get(TARGET, {}))
# exact everywhere (dpbusd_row's AVX2 lowering holds weights below 129; Q8_0's are q + 128, IQ4_NL's up to 241)
EXACT_TYPES = [t for t in KTILED_TYPES if TARGET != "avx2" or t not in (T.Q8_0, T.IQ4_NL)]


def on_this_target(qtype):
    if qtype not in TARGET_TYPES:
        pytest.skip(f"ktiles is not used for {qtype.name} on this compile target ({TARGET})")


# |ktiled - vec_dot| / sum|w*a| per output: the same exact integers per super-block, float32 steps in another order
# (one rounding per super-block and output either way, plus vec_dot's final 8-lane sum). Measured worst 6e-8 on
# these shapes and scales, about one float32 epsilon; the ggml matmul tests' GGML_MATMUL_TOL for the same reason.
SUM_ORDER_TOL = 1e-6


def matvec_in_repacked_order(w):
    """Whether the one-token mat-vec (types/q4_0.py, types/iq4_nl.py) takes llama.cpp's repacked gemv order, which
    gives the repacked gemm's values: rows llama.cpp repacks, kernels compiled for AVX-512 VNNI or AVX2. (Whether a
    batch below ktiles' threshold runs per token is dispatch.repacked_order, AVX-512 VNNI only.)"""
    multiple = dispatch.REPACKED_ROWS.get(w.qtype)
    return multiple is not None and w.n_out % multiple == 0 and TARGET in ("avx512_vnni", "avx2")


def shape_for(qtype, shape):
    n_out, n_in = shape
    multiple = dispatch.REPACKED_ROWS.get(qtype, 1)
    return -(-n_out // multiple) * multiple, n_in


def llamacpp(oracle, qtype, rows, x):
    """ggml's mul_mat on the weight as a model holds it: Q4_0 and IQ4_NL repacked at load (llama.cpp's default)."""
    return oracle.mul_mat(qtype, rows, x, repacked=qtype in dispatch.REPACKED_ROWS)


def ktiled(w, yq, yd, ya):
    out = np.full((yq.shape[0], w.n_out), np.nan, np.float32)  # an output left unwritten stays NaN
    w.kernels.matmul_ktiled(w.rows, yq, yd, ya, out)
    return out


# the types ktiles multiplies in vec_dot's float order (ktiled_lanes): the same values as the 4-token tiles
VEC_DOT_ORDER = {T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def test_every_quantized_type_has_the_16_token_kernel():
    """Every K-quant (llama.cpp's tiled mat-mul takes them all), Q4_0 and IQ4_NL (which llama.cpp repacks) and the
    other 32-weight types (vec_dot's order); not IQ4_XS (llama.cpp multiplies it by vec_dot at every count)."""
    assert set(KTILED_TYPES) == {T.Q4_0, T.IQ4_NL, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K} | VEC_DOT_ORDER


@pytest.mark.parametrize("qtype", KTILED_TYPES, ids=lambda t: t.name)
def test_ktiled_is_llamacpp_mul_mat_bit_for_bit(qtype, rng, oracle):
    """On AVX-512 VNNI and on AVX2 alike: ggml's two micro-kernels sum the same integers with the same float steps
    (and so does its repacked Q4_0 gemm, and vec_dot's 8 lanes on both)."""
    on_this_target(qtype)
    for shape in SHAPES:
        n_out, n_in = shape_for(qtype, shape)
        w, rows = random_weight(qtype, n_out, n_in, rng)
        for n_tokens in TOKEN_COUNTS:
            for scale in (1e-3, 50.0):
                x = random_activation(rng, n_tokens, n_in, scale)
                yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
                np.testing.assert_array_equal(
                    ktiled(w, yq, yd, ya), llamacpp(oracle, qtype, rows, x), err_msg=f"{n_out}x{n_in}, T={n_tokens}"
                )


@pytest.mark.parametrize("qtype", EXACT_TYPES, ids=lambda t: t.name)
def test_ktiled_is_the_matvec_to_float_rounding(qtype, rng):
    """On any CPU (elsewhere than AVX-512 VNNI and AVX2 through portable IR): the mat-vec's sums, rounded another way
    (Q4_1, Q5_0, Q5_1, Q8_0: the same way, so the same bits; Q4_0 on AVX-512 VNNI and AVX2 too, where its one-token
    mat-vec takes the repacked gemv's order, test_numba_q4_0)."""
    n_out, n_in = shape_for(qtype, SHAPES[1])
    w, rows = random_weight(qtype, n_out, n_in, rng)
    for n_tokens in (9, 31):
        x = random_activation(rng, n_tokens, n_in)
        yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
        xv, _ = activations.prepare(x, "ggml", w.kernels.vec_dot_type, w.kernels.sub)
        ref = per_token_matvec(w, yq, yd, ya)
        ours = ktiled(w, yq, yd, ya)
        if qtype in VEC_DOT_ORDER or matvec_in_repacked_order(w):  # the same order (Q4_0: the repacked gemv's)
            np.testing.assert_array_equal(ours, ref)
            continue
        assert summation_error(ours, ref, dequantized(qtype, rows), xv) <= SUM_ORDER_TOL
        assert not np.array_equal(ours, ref), "the float steps are the tiled kernel's, not vec_dot's"


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_ktiled_results_do_not_depend_on_threads(qtype, rng, threads):
    w, _ = random_weight(qtype, 37, 512, rng)  # the last band overlaps the one before (also for Q4_0's kernel)
    yq, yd, ya = activations.quantize_int(random_activation(rng, 31, 512), w.kernels.int_activation)
    with threads(1):
        one = ktiled(w, yq, yd, ya)
    with threads(2):
        two = ktiled(w, yq, yd, ya)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("qtype", KTILED_TYPES, ids=lambda t: t.name)
def test_ggml_matmul_takes_the_tiled_path_from_its_threshold(qtype, rng, oracle):
    """dispatch.matmul from the type's KTILED_MIN_TOKENS for this target (AVX-512 VNNI: Q5_K, Q6_K from ggml's floor
    of 8; Q4_K 16, Q4_0 5, where it starts to pay; AVX2: 8 to 32): every token through ktiles (no remainder split
    off), the result llama.cpp's mul_mat's; below, the 4-token tiles (vec_dot's values), as ggml keeps vec_dot for
    the K-quants below 8 tokens. (Q4_K below its threshold: the 4-token tiles, which a model's repacked Q4_K in
    llama.cpp matches no better.)"""
    on_this_target(qtype)
    w, rows = random_weight(qtype, shape_for(qtype, (37, 512))[0], 512, rng)
    first = dispatch.KTILED_MIN_TOKENS[TARGET][qtype]
    below = "tiled"
    if dispatch.repacked_order(w):  # Q4_0 on AVX-512 VNNI: one mat-vec per token, in the repacked gemv's order
        below = "matvec"
    assert dispatch.int_kernel_for(w, first - 1) == below
    assert dispatch.int_kernel_for(w, first) == "ktiled"
    for n_tokens in (first, first + 9):  # + 9: not a whole number of 16-token groups
        x = random_activation(rng, n_tokens, 512)
        np.testing.assert_array_equal(dispatch.matmul(w, x, "ggml"), llamacpp(oracle, qtype, rows, x))
    if qtype in (T.Q3_K, T.Q5_K, T.Q6_K):  # below ggml's floor of 8: vec_dot's values (Q3_K's 4-token tiles too)
        x = random_activation(rng, 7, 512)
        np.testing.assert_array_equal(dispatch.matmul(w, x, "ggml"), oracle.mul_mat(qtype, rows, x))


def test_q4_0_rows_llamacpp_does_not_repack_keep_the_4_token_tiles(rng):
    w, _ = random_weight(T.Q4_0, 37, 512, rng)
    assert dispatch.int_kernel_for(w, 64) == "tiled"


def test_fewer_rows_than_a_band_keep_the_4_token_tiles(rng):
    w, _ = random_weight(T.Q6_K, ktiles.BAND - 1, 256, rng)
    assert dispatch.int_kernel_for(w, 64) == "tiled"


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_the_oracles_mul_mat_below_8_tokens_is_vec_dot(qtype, rng, oracle):
    """The oracle's graph path picks ggml's kernel as a model does: below 8 tokens, vec_dot (bit for bit)."""
    _, rows = random_weight(qtype, 16, 512, rng)
    x = random_activation(rng, 3, 512)
    np.testing.assert_array_equal(oracle.mul_mat(qtype, rows, x, n_threads=2), oracle.matmul(qtype, rows, x))


def _compile_row_dots():
    """A fresh, uncached function over the 16-token steps (so the test's lowering applies)."""

    @njit
    def dots(w, codes, bsums, k, out):
        a = tokens16.dpbusd_row(izero16(), w, 0, tokens16.codes64(codes, 0))
        a = tokens16.dpbusd_row(a, w, 4, tokens16.codes64(codes, 64))
        bs = tokens16.iload16(bsums, 0)
        zmm.istore16(out, 0, a)
        zmm.istore16(out, 16, tokens16.iscale_add(izero16(), a, tokens16.imul(bs, 32), k))
        zmm.istore16(out, 32, tokens16.imul_add(a, bs, k))

    return dots


# an AVX2 target as the intrinsics see it (the code still runs on this CPU: every AVX2 instruction is legal here)
AVX2_FEATURES = frozenset({"+avx", "+avx2", "+fma", "+f16c", "+bmi2"})


def use_lowering(monkeypatch, lowering):
    """Compile what follows for ``lowering``: "target" (this machine's), "avx2" (only AVX2's features shown) or
    "portable" (the target's features hidden)."""
    if lowering == "portable":
        monkeypatch.setattr(zmm, "target_features", lambda context: frozenset())
    if lowering == "avx2":
        monkeypatch.setattr(zmm, "target_features", lambda context: AVX2_FEATURES)


@pytest.mark.parametrize("lowering", ["target", "avx2", "portable"])
def test_16_token_steps_on_every_lowering(lowering, rng, monkeypatch):
    """dpbusd_row and the int32 scale steps give the exact integers through ``vpdpbusd`` (AVX-512 VNNI targets),
    ``vpmaddubsw`` + ``vpmaddwd`` (AVX2 targets, forced by showing only AVX2's features) and the portable IR (forced
    by hiding the target's features): weights 0 / 255 (AVX2: 0 / 128, its bound), activations +-127."""
    use_lowering(monkeypatch, lowering)
    w_max = 128 if lowering == "avx2" or (lowering == "target" and TARGET == "avx2") else 255
    dots = _compile_row_dots()
    for _ in range(5):
        w = rng.integers(0, w_max + 1, 8, dtype=np.uint8)
        w[:2] = [0, w_max]
        codes = rng.integers(-127, 128, 128).astype(np.int8)
        codes[:2] = [-127, 127]
        bsums = rng.integers(-16 * 127, 16 * 127 + 1, 16).astype(np.int32)
        k = int(rng.integers(-128, 128))
        out = np.empty(48, np.int32)
        dots(w, codes.view(np.uint8), bsums, k, out)
        tokens = codes.astype(np.int64).reshape(2, 16, 4)  # (4-position group, token, byte)
        ref = (tokens[0] * w[:4]).sum(1) + (tokens[1] * w[4:]).sum(1)
        np.testing.assert_array_equal(out[:16], ref)
        np.testing.assert_array_equal(out[16:32], (ref - 32 * bsums) * k)
        np.testing.assert_array_equal(out[32:], ref + bsums * k)
    asm = dots.inspect_asm(dots.signatures[0])
    if lowering == "target" and VNNI:
        assert "vpdpbusd" in asm and "zmm" in asm
    if lowering == "avx2":
        assert "vpmaddubsw" in asm and "vpdpbusd" not in asm
    if lowering == "portable":
        assert "vpdpbusd" not in asm and "vpmaddubsw" not in asm


# The child of compiled_for_haswell: each case's product by the kernels as compiled for an AVX2 target.
_HASWELL_CHILD = """
import sys, numpy as np
from gguf import GGMLQuantizationType as T
from inference_engine.backends import numba_kernels
from inference_engine.backends.numba_kernels import dispatch, ktiles
from inference_engine.backends.numba_kernels.ops import activations
numba_kernels.prepare()
assert ktiles.compiled_target() == "avx2", ktiles.compiled_target()


def ktiled(w, x):
    yq, yd, ya = activations.quantize_int(x, w.kernels.int_activation)
    out = np.full((x.shape[0], w.n_out), np.nan, np.float32)
    w.kernels.matmul_ktiled(w.rows, yq, yd, ya, out)
    return out


def one_token_each(w, x):
    return np.stack([dispatch.matmul(w, x[t], "ggml") for t in range(len(x))])


data = np.load(sys.argv[1])
product = globals()[sys.argv[3]]
for name in sys.argv[4:]:
    rows, x = data[name + "_rows"], data[name + "_x"]
    w = dispatch.pack_matrix(name, T[name], rows, (rows.shape[0], x.shape[1]))
    np.save(sys.argv[2] + "_" + name + ".npy", product(w, x))
"""


def compiled_for_haswell(tmp_path, product: str, cases: dict) -> dict:
    """``product`` ("ktiled": ktiles on every token at once; "one_token_each": ``dispatch.matmul`` a token at a time,
    as decode calls it) of each ``cases[qtype] = (rows, x)``, computed in a fresh process with Numba's CPU set to
    Haswell: AVX2 code, which runs on this CPU too."""
    import os
    import subprocess
    import sys

    arrays = {f"{t.name}_{k}": v for t, (rows, x) in cases.items() for k, v in (("rows", rows), ("x", x))}
    np.savez(tmp_path / "cases.npz", **arrays)
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=haswell_features())
    subprocess.run(
        [sys.executable, "-c", _HASWELL_CHILD, str(tmp_path / "cases.npz"), str(tmp_path / "out"), product,
         *(t.name for t in cases)],
        env=env,
        check=True,
        timeout=600,
    )
    return {t: np.load(tmp_path / f"out_{t.name}.npy") for t in cases}


def haswell_features() -> str:
    """``NUMBA_CPU_FEATURES`` for AVX2 code on this x86 CPU: its LLVM features with all that Haswell lacks off (the
    CPU name alone keeps the host's AVX-512 with Numba 0.68)."""
    import llvmlite.binding as llvm

    haswell = {
        "64bit",
        "aes",
        "avx",
        "avx2",
        "bmi",
        "bmi2",
        "cmov",
        "crc32",
        "cx16",
        "cx8",
        "f16c",
        "fma",
        "fsgsbase",
        "fxsr",
        "invpcid",
        "lzcnt",
        "mmx",
        "movbe",
        "pclmul",
        "popcnt",
        "rdrnd",
        "sahf",
        "sse",
        "sse2",
        "sse3",
        "sse4.1",
        "sse4.2",
        "ssse3",
        "x87",
        "xsave",
        "xsaveopt",
    }
    return ",".join(
        ("+" if on and name in haswell else "-") + name for name, on in llvm.get_host_cpu_features().items()
    )


@pytest.mark.skipif(
    not VNNI,
    reason="an AVX2 build is checked against this machine's AVX-512 VNNI results (on an "
    "AVX2 machine the tests above check it against llama.cpp's AVX2 build directly)",
)
def test_ktiles_compiled_for_avx2_gives_llamacpps_values(rng, oracle, tmp_path):
    """ktiles compiled for an AVX2 target (a fresh process with Numba's CPU set to Haswell: two 8-token halves a
    step, 16 registers) gives llama.cpp's mul_mat values bit for bit, one type of each kernel family (tiled K-quant,
    repacked Q4_0 blocks, vec_dot's lanes). (llama.cpp's AVX2 build gives these same values: its AVX2 tiled
    micro-kernel sums the same integers with the same float steps; checked against a build with
    ``-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF``, docs/PERFORMANCE.md.)"""
    cases = {}
    for qtype in (T.Q6_K, T.Q4_0, T.Q5_0):
        n_out, n_in = shape_for(qtype, (37, 3 * 256))
        _, rows = random_weight(qtype, n_out, n_in, rng)
        cases[qtype] = rows, random_activation(rng, 31, n_in, 50.0)
    for qtype, ours in compiled_for_haswell(tmp_path, "ktiled", cases).items():
        rows, x = cases[qtype]
        np.testing.assert_array_equal(ours, llamacpp(oracle, qtype, rows, x), err_msg=qtype.name)
